"""A private RabbitMQ node from Debian's ``rabbitmq-server`` package.

Which package: ``LAB_RABBITMQ_VERSION`` (``Settings.rabbitmq_version``). ``4.0`` (the default,
closest to the reference's 4.3) is Debian 13's 4.0.x on Erlang 27, which needs a newer C library
than Debian 12 has, so it runs from a minimal Debian 13 root the lab builds in its cache
(:mod:`lab.stack.rootfs`) and enters by ``chroot`` in a private mount namespace, with the node's
state directory bind-mounted at its own path. ``3.10`` is the host's Debian 12 package, as before.
Both share the host's network and pids, so ports, pid files and stop work the same.

Under ``LAB_HOSTS=netns`` the node runs on the ``rabbitmq`` host of :mod:`lab.stack.hosts`: epmd,
the node and every CLI call (``rabbitmqctl``, ``erl_call``) are started inside that network
namespace, where the node name ``@localhost``, epmd and the distribution port stay on the host's own
loopback, while the AMQP listener binds the host's address (:attr:`Settings.rabbitmq_host`), which
Debezium's RabbitMQ sink, the consumers and the runner connect to.

The node shares nothing with a system node that the package may have started: its own node
name, AMQP/distribution/epmd ports, ``HOME`` (hence its own ``.erlang.cookie``), config, data,
log and plugin files, all under ``<stack_dir>/rabbitmq``; every listener binds 127.0.0.1 (AMQP:
its host's address under ``LAB_HOSTS=netns``).

Choices written down here:

* We call the package's real scripts in ``/usr/lib/rabbitmq/bin`` (the ``/usr/sbin`` wrappers
  switch to the ``rabbitmq`` system user and its ``/var/lib/rabbitmq``). ``rabbitmq-server``
  runs in its foreground mode: the recorded pid is that ``sh`` script, whose only child is
  ``beam.smp``; SIGTERM to the script stops the node gracefully.
* We start ``epmd`` ourselves (foreground, loopback, our port, its own pid file) and pass
  ``-start_epmd false`` to the node and to the CLI, so no stray daemonised epmd is ever left.
* No plugins are enabled (``enabled_plugins`` is ``[].``): no management UI, no statistics
  collection, no Prometheus endpoint; RabbitMQ 3.10 has no telemetry, so nothing phones home.
* ``guest`` is never created: the lab user is the node's default user, and a definitions file
  (user with administrator tag, vhost ``/``, full permissions) is imported on every boot, which
  makes user creation idempotent without a ``rabbitmqctl`` call per item.

Under the ``ha`` topology a :class:`RabbitMQService` is one node ``rabbitmq-<i>`` of
the cluster :mod:`lab.stack.rabbitmq_cluster` forms: its own state dir, node name and ports
(:attr:`Settings.rabbitmq_nodes`), node 1's epmd shared by all three, one Erlang cookie for all,
and a memory high watermark of :data:`HA_MEMORY_WATERMARK` per node.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from string import Template

import psutil

from lab.settings import Settings, child_env, is_root, node_host, write_private
from lab.stack import proc, rootfs
from lab.stack.base import ServiceStatus, StackError
from lab.stack.hosts import namespace
from lab.stack.netns import NETNS_DIR, entered

log = logging.getLogger(__name__)

SCRIPTS = Path("/usr/lib/rabbitmq/bin")
TEMPLATE = Path(__file__).parent / "templates" / "rabbitmq.conf"
START_TIMEOUT = 120.0
#: Under ``ha``, each node's memory alarm threshold (``vm_memory_high_watermark.absolute``). The
#: default, 0.6 of the host's RAM, would let each of three nodes on a 24 GB machine count on
#: 14 GB; 2 GB each (6 GB for the cluster) leaves room for three 1 GiB Kafka heaps, Debezium,
#: PostgreSQL and its standby. A single node keeps RabbitMQ's default.
HA_MEMORY_WATERMARK = "2GB"
STOP_TIMEOUT = 60.0
#: LAB_RABBITMQ_VERSION -> (Debian suite, packages) of the root it runs from; None: the host's.
RELEASES: dict[str, tuple[str, tuple[str, ...]] | None] = {
    "4.0": ("trixie", ("rabbitmq-server",)),
    "3.10": None,
}


def cluster_config() -> str:
    """What a node of the ``ha`` cluster adds to ``rabbitmq.conf``: its memory limit. No peer
    discovery: the first start joins nodes 2 and 3 to node 1 (``join_cluster``,
    :mod:`lab.stack.rabbitmq_cluster`), and a node that restarts finds its peers in its own
    database, as every clustered node does."""
    return ("\n# ha topology: one of three clustered nodes, each with its own memory limit\n"
            f"vm_memory_high_watermark.absolute = {HA_MEMORY_WATERMARK}\n")


def cluster_cookie(settings: Settings) -> str:
    """The ``ha`` cluster's Erlang cookie: generated once into the stack's secrets dir (0600)."""
    path = settings.secrets_dir / "erlang.cookie"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        value = secrets.token_hex(20).upper()
        settings.write_secret(path.name, value)
        return value


def write_cookie(path: Path, value: str) -> None:
    """``path`` holds ``value`` with mode 0400 (Erlang refuses a cookie others can read): created
    with that mode and renamed into place, never readable by others for an instant."""
    with contextlib.suppress(FileNotFoundError):
        if path.read_text() == value and path.stat().st_mode & 0o777 == 0o400:
            return
    write_private(path, value, mode=0o400)


#: how to get the host's package for ``LAB_RABBITMQ_VERSION=3.10``: the script installs it without
#: starting the distribution's broker, and stops, disables and masks that service
INSTALL_310 = ("install it with `sudo LAB_RABBITMQ_VERSION=3.10 bash scripts/system-deps.sh` "
               "(`LAB_RABBITMQ_VERSION=3.10 make setup` does the same)")


def root_needed(version: str, host_installed: bool) -> str | None:
    """Why a user without root cannot run RabbitMQ ``version`` here, or None when it can: 4.0 runs
    from the lab's Debian root by ``chroot`` in a private mount namespace (root only); 3.10 runs
    the host's package as a private node, once it is installed."""
    if RELEASES.get(version) is not None:
        return (f"RabbitMQ {version} runs from a Debian root by chroot (LAB_RABBITMQ_VERSION=3.10 runs the "
                "host's rabbitmq-server package without root)")
    if not host_installed:
        return f"RabbitMQ {version} is not installed ({SCRIPTS / 'rabbitmq-server'}): {INSTALL_310}"
    return None


def user_definitions(settings: Settings) -> dict[str, object]:
    """RabbitMQ definitions of the lab user (administrator, full permissions on vhost ``/``) with a
    salted hash of its password, never the password: imported at every boot, they make the node
    seed no default user (``guest`` never exists). The native node's and the compose container's."""
    # rabbit_password_hashing_sha256: base64(salt + sha256(salt + password)), 4-byte salt
    salt = secrets.token_bytes(4)
    digest = hashlib.sha256(salt + settings.secret("rabbitmq").encode()).digest()
    return {
        "users": [{
            "name": settings.rabbitmq_user,
            "password_hash": base64.b64encode(salt + digest).decode(),
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": ["administrator"],
        }],
        "vhosts": [{"name": "/"}],
        "permissions": [{"user": settings.rabbitmq_user, "vhost": "/",
                         "configure": ".*", "write": ".*", "read": ".*"}],
    }


def erlang_address(address: str) -> str:
    """An IPv4 address as an Erlang tuple: ``10.231.5.8`` -> ``{10,231,5,8}``."""
    return "{" + ",".join(str(int(part)) for part in address.split(".")) + "}"


def inetrc(settings: Settings) -> str:
    """Erlang's resolver configuration (``ERL_INETRC``) of a spread cluster's node and its CLI
    calls: each node's host name at its host's address, looked up before the system's resolver
    (the Debian root's ``/etc/hosts`` knows only ``localhost``)."""
    entries = "".join(f'{{host, {erlang_address(settings.rabbitmq_node_host(i))}, ["{node_host("rabbitmq", i)}"]}}.\n'
                      for i, _, _, _ in settings.rabbitmq_nodes)
    return entries + "{lookup, [file, native]}.\n"


class RabbitMQService:
    """The lab's own RabbitMQ node: the ``single`` topology's broker (``node=None``), or node
    ``rabbitmq-<node>`` (1-3) of the ``ha`` cluster (start that with :class:`RabbitMQCluster`)."""

    name: str = "rabbitmq"

    def __init__(self, settings: Settings, node: int | None = None) -> None:
        self.settings = settings
        self.index = node
        self.name = "rabbitmq" if node is None else f"rabbitmq-{node}"
        if node is None:
            self.node_name, self.amqp_port, self.dist_port = (
                settings.rabbitmq_node, settings.amqp_port, settings.rabbitmq_dist_port)
        else:
            _, self.node_name, self.amqp_port, self.dist_port = settings.rabbitmq_nodes[node - 1]
        self.dir = settings.stack_dir / self.name
        #: a cluster node on a host of its own (ha under netns): its own epmd, reached by its peers
        self.spread = settings.rabbitmq_spread
        #: node 1 starts and stops the epmd every node of the cluster registers with (each node its
        #: own when spread)
        self.owns_epmd = node in (None, 1) or self.spread
        self.epmd_dir = (self.dir if node is None or self.spread else settings.stack_dir / "rabbitmq-1") / "epmd"
        self.etc = self.dir / "etc"
        self.home = self.dir / "home"
        self.logs = self.dir / "log"
        self.console_log = self.logs / "console.log"
        self.last_start_seconds: float | None = None
        #: the network namespace the node, its epmd and its CLI calls run in (None: loopback), and
        #: the address its AMQP listener binds
        self.netns = namespace(settings, node_host("rabbitmq", node or 1))
        self.host = settings.rabbitmq_node_host(node or 1)
        if settings.rabbitmq_version not in RELEASES:
            raise StackError(
                f"unknown LAB_RABBITMQ_VERSION {settings.rabbitmq_version!r}: "
                f"choose one of {', '.join(RELEASES)}"
            )
        release = RELEASES[settings.rabbitmq_version]
        #: the Debian root the node runs from (None: the host's own package)
        self.root = None if release is None else rootfs.root_path(settings, *release)
        #: one database per release: a 4.0 database cannot be opened by 3.10 (no schema downgrade)
        self.mnesia = self.dir / ("mnesia" if release is None else f"mnesia-{settings.rabbitmq_version}")

    def _installed(self) -> bool:
        if self.root is None:
            return (SCRIPTS / "rabbitmq-server").exists()
        return rootfs.is_built(self.root)

    def _argv(self, *argv: str | Path) -> list[str]:
        """``argv`` as run on the host, or inside the Debian root with our state dir mounted."""
        if self.root is None:
            return [str(a) for a in argv]
        return rootfs.chroot_argv(self.root, argv, binds=[self.dir])

    def root_needed(self) -> str | None:
        """Why this node cannot start as the current user (:func:`root_needed`); None as root."""
        return None if is_root() else root_needed(self.settings.rabbitmq_version,
                                                  (SCRIPTS / "rabbitmq-server").exists())

    # NativeService -------------------------------------------------------------------
    def provision(self) -> None:
        """Build the Debian root (4.0), or check that the host's package (3.10) is installed; starts
        nothing. The lab never installs a package itself: ``scripts/system-deps.sh`` does, under a
        ``policy-rc.d`` that keeps the distribution's broker from starting, and masks its service."""
        if self._installed():
            return
        release = RELEASES[self.settings.rabbitmq_version]
        if release is not None:
            rootfs.debian_root(self.settings, *release)
            return
        raise StackError(f"RabbitMQ 3.10 is not installed ({SCRIPTS / 'rabbitmq-server'} is missing): "
                         f"{INSTALL_310}")

    def start(self) -> None:
        """Start epmd and the node, wait until the ``rabbit`` app runs; no-op when running."""
        if proc.running(self.dir) is not None:
            return
        t0 = time.monotonic()
        try:
            self.wait_ready(self.spawn())
        except BaseException:
            self._kill()
            raise
        self.last_start_seconds = round(time.monotonic() - t0, 2)
        log.info("RabbitMQ %s up in %.1f s", self.node_name, self.last_start_seconds)

    def spawn(self) -> psutil.Process:
        """Check the ports, write the config, start epmd (node 1) and the node; no waiting."""
        if not self._installed():
            self.provision()
        if self._orphan_beam() is not None:  # a VM of ours that lost its script
            self._kill()
        hint = "" if self.index is None else f" + {self.amqp_port - self.settings.amqp_port}"
        what = "RabbitMQ" if self.index is None else f"RabbitMQ node {self.name}"
        proc.require_free(self.amqp_port, f"{what} AMQP", "LAB_AMQP_PORT" + hint, self.host)
        with entered(self.netns):  # the distribution port is on the node's own loopback
            proc.require_free(self.dist_port, f"{what} distribution", "LAB_RABBITMQ_DIST_PORT" + hint)
        self._write_config()
        if self.owns_epmd:
            self._start_epmd()
        elif not self._local_port_open(self.settings.rabbitmq_epmd_port):
            raise StackError(f"{self.name} needs the epmd of rabbitmq-1 on port "
                             f"{self.settings.rabbitmq_epmd_port}; start the cluster together")
        return proc.spawn(
            self._argv(SCRIPTS / "rabbitmq-server"), state_dir=self.dir, log_path=self.console_log,
            env=self._env(), cwd=self.dir, netns=self.netns,
        )

    def _local_port_open(self, port: int) -> bool:
        """Whether ``port`` of the loopback the node sees (its host's own under netns) listens."""
        with entered(self.netns):
            return proc.port_open(port)

    def wait_ready(self, node: psutil.Process) -> None:
        """Until the node listens on its AMQP port and its ``rabbit`` app runs."""
        proc.wait_until(
            lambda: proc.port_open(self.amqp_port, self.host), timeout=START_TIMEOUT,
            what=f"RabbitMQ node {self.node_name}", proc=node, log_path=self.console_log,
        )
        try:
            self.ctl("await_startup", "--timeout", str(int(START_TIMEOUT)), timeout=START_TIMEOUT + 10)
        except StackError as exc:
            tail = proc.tail(self.logs / "rabbit.log")
            raise StackError(f"{exc}; last log lines: {tail}") from None

    def stop(self, *, purge: bool = False) -> None:
        """``rabbitmqctl stop`` (graceful), then make sure node, its children and epmd are gone.
        ``purge`` (the data goes too): by pid only, SIGTERM to the node's script, which asks nothing
        of the node's name or ports (a nested stack is purged with settings that are not its own)."""
        node = proc.running(self.dir)
        if node is not None and purge:
            self._kill()
        elif node is not None:
            tree = [node]
            with contextlib.suppress(psutil.Error):
                tree += node.children(recursive=True)
            try:
                self.ctl("stop", timeout=STOP_TIMEOUT)
                alive = proc.wait_gone(tree, timeout=STOP_TIMEOUT)
            except StackError as exc:
                log.warning("graceful RabbitMQ stop failed (%s); terminating by pid", exc)
                alive = tree
            self._kill()
            for p in alive:  # e.g. inet_gethost helpers the terminated tree left behind
                with contextlib.suppress(psutil.Error):
                    if p.is_running():
                        p.kill()
            proc.wait_gone(alive, timeout=5)
        else:
            self._kill()
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)

    def status(self) -> ServiceStatus:
        s = self.settings
        roots = self.processes()
        running = bool(roots)
        pids = [p.pid for root in roots for p in [root, *self._beams(root)]]
        return ServiceStatus(
            name=self.name,
            state="running" if running else "stopped",
            pids=pids,
            endpoint=f"amqp://{s.rabbitmq_user}@{self.host}:{self.amqp_port}/",
            version=self.version(),
            rss_mb=proc.tree_rss_mb(roots) if running else None,
            detail={
                "node": self.node_name,
                "dist_port": self.dist_port,
                "epmd_port": s.rabbitmq_epmd_port,
                "netns": self.netns,
                "state_dir": str(self.dir),
                "log": str(self.logs / "rabbit.log"),
                "last_start_seconds": self.last_start_seconds,
                "root": str(self.root) if self.root is not None else None,
                "memory_high_watermark": HA_MEMORY_WATERMARK if self.index is not None else "0.6 (default)",
            },
        )

    def processes(self) -> list[psutil.Process]:
        """Our node's root (the ``rabbitmq-server`` script over ``beam.smp``) and our epmd
        (node 1's, under ``ha``)."""
        node = proc.running(self.dir)
        if node is None:
            return []
        epmd = proc.running(self.epmd_dir) if self.owns_epmd else None
        return [node] if epmd is None else [node, epmd]

    def erl_call(self) -> tuple[list[str], dict[str, str]] | None:
        """``(argv, env)`` that evaluate the Erlang expressions on stdin on our node with ``erl_call``
        (Erlang's ``erl_interface``: a small C program, no VM to boot, unlike ``rabbitmqctl``); the
        cookie is read from our ``HOME``, the node found through our epmd. The host's program, also
        for a node in the Debian root (the distribution protocol is the same), and inside the node's
        network namespace under netns (``nsenter --net``: no fresh ``/sys``); None without it."""
        found = shutil.which("erl_call") or next(
            (str(p) for p in (Path("/usr/lib/erlang/bin/erl_call"),) if p.exists()), None)
        if found is None:
            return None
        env = child_env(HOME=str(self.home), ERL_EPMD_PORT=str(self.settings.rabbitmq_epmd_port))
        argv = [found, "-sname", self.node_name, "-e"]
        if self.netns is not None:
            argv = ["nsenter", f"--net={NETNS_DIR / self.netns}", *argv]
        return argv, env

    # Helpers -------------------------------------------------------------------------
    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl`` against our node (same env, cookie and epmd); return stdout."""
        return self.cli("rabbitmqctl", *args, timeout=timeout)

    def cli(self, tool: str, *args: str, timeout: float = 60.0) -> str:
        """Run a CLI tool of the package (``rabbitmqctl``, ``rabbitmq-queues``) against this node."""
        argv = self._argv(SCRIPTS / tool, "-n", self.node_name, "-q", *args)
        # its own process group: on a timeout the CLI's Erlang VM goes too, not only the wrapper;
        # in the node's network namespace (its epmd and distribution port are on that loopback)
        with entered(self.netns):
            p = subprocess.Popen(argv, env=self._env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        with p:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                raise StackError(f"{tool} {args[0]} timed out after {timeout:.0f} s") from None
        if p.returncode != 0:
            msg = " ".join((err or out).split())[:300]
            raise StackError(f"{tool} {args[0]} failed ({p.returncode}): {msg}")
        return out

    def version(self) -> str:
        """The packaged RabbitMQ version, read from the install path (no VM start)."""
        lib = Path("/usr/lib/rabbitmq/lib") if self.root is None else self.root / "usr/lib/rabbitmq/lib"
        for d in sorted(lib.glob("rabbitmq_server-*")):
            m = re.search(r"rabbitmq_server-([\w.+-]+)", d.name)
            if m:
                return m.group(1)
        return ""

    def _env(self) -> dict[str, str]:
        s, d = self.settings, self.dir
        # the distribution on the host's own loopback; a spread node's on its host's address, where
        # its peers reach it, their names resolved from the node's inetrc (:func:`inetrc`)
        interface = erlang_address(self.host if self.spread else "127.0.0.1")
        env = child_env(
            HOME=str(self.home),
            RABBITMQ_NODENAME=self.node_name,
            RABBITMQ_CONF_ENV_FILE=str(self.etc / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(self.etc / "rabbitmq.conf"),
            RABBITMQ_CONFIG_FILES=str(self.etc / "conf.d"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.etc / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.etc / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(self.mnesia),
            RABBITMQ_LOG_BASE=str(self.logs),
            RABBITMQ_LOGS=str(self.logs / "rabbit.log"),
            RABBITMQ_PID_FILE=str(d / "beam.pid"),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                f"-start_epmd false -kernel inet_dist_use_interface {interface}"
            ),
            RABBITMQ_CTL_ERL_ARGS="-start_epmd false",
            ERL_EPMD_PORT=str(s.rabbitmq_epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_CRASH_DUMP=str(self.logs / "erl_crash.dump"),
            NOTIFY_SOCKET="",  # never let the script think it runs under systemd
        )
        if self.spread:
            env["ERL_INETRC"] = str(self.etc / "inetrc")
        return env

    def _write_config(self) -> None:
        s = self.settings
        for path in (self.etc / "conf.d", self.home, self.logs, self.mnesia):
            path.mkdir(parents=True, exist_ok=True)
        definitions = self.etc / "definitions.json"
        values = {"amqp_host": self.host, "amqp_port": self.amqp_port, "user": s.rabbitmq_user,
                  "definitions": definitions}
        conf = Template(TEMPLATE.read_text()).substitute(values)
        if self.index is not None:
            conf += cluster_config()
        (self.etc / "rabbitmq.conf").write_text(conf)
        (self.etc / "rabbitmq-env.conf").write_text("# empty: settings come from the environment\n")
        (self.etc / "enabled_plugins").write_text("[].\n")
        if self.spread:
            (self.etc / "inetrc").write_text(inetrc(s))
        write_private(definitions, json.dumps(user_definitions(s), indent=2))  # a password hash: 0600
        cookie = self.home / ".erlang.cookie"
        if self.index is not None:  # the cluster's nodes and CLI calls share one cookie
            write_cookie(cookie, cluster_cookie(s))
        elif not cookie.exists():
            write_private(cookie, secrets.token_hex(20).upper(), mode=0o400)

    def _start_epmd(self) -> None:
        s = self.settings
        if proc.running(self.epmd_dir) is not None:
            return
        with entered(self.netns):
            proc.require_free(s.rabbitmq_epmd_port, "RabbitMQ's epmd", "LAB_RABBITMQ_EPMD_PORT")
        epmd = "/usr/bin/epmd" if self.root is not None else shutil.which("epmd") or "/usr/bin/epmd"
        p = proc.spawn(
            self._argv(epmd, "-port", str(s.rabbitmq_epmd_port), "-address",
                       "127.0.0.1" + (f",{self.host}" if self.spread else "")),
            state_dir=self.epmd_dir, log_path=self.logs / "epmd.log", env=self._env(), netns=self.netns,
        )
        proc.wait_until(
            lambda: self._local_port_open(s.rabbitmq_epmd_port), timeout=15, what="epmd",
            proc=p, log_path=self.logs / "epmd.log",
        )

    @staticmethod
    def _beams(root: psutil.Process) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return [p for p in root.children(recursive=True) if p.name().startswith("beam")]
        return []

    def _kill(self) -> None:
        """Terminate node and (ours) epmd by pid (node first: epmd must outlive its registrations)."""
        proc.terminate(self.dir, timeout=STOP_TIMEOUT)
        orphan = self._orphan_beam()
        if orphan is not None:  # the script died but its VM did not
            log.warning("killing orphaned RabbitMQ VM pid %d", orphan.pid)
            orphan.terminate()
            if proc.wait_gone([orphan], timeout=STOP_TIMEOUT):
                orphan.kill()
        if self.owns_epmd:  # nodes 2 and 3 leave node 1's epmd to node 1
            proc.terminate(self.epmd_dir, timeout=10)
        (self.dir / "beam.pid").unlink(missing_ok=True)

    def _orphan_beam(self) -> psutil.Process | None:
        """The VM named in RabbitMQ's own pid file, if it is alive and runs our node."""
        try:
            p = psutil.Process(int((self.dir / "beam.pid").read_text().strip()))
            ours = p.environ().get("RABBITMQ_MNESIA_BASE", "").startswith(str(self.dir / "mnesia"))
        except (OSError, ValueError, psutil.Error):
            return None
        return p if ours else None
