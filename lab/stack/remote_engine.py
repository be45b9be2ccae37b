"""The stack's own Docker engine on a host of its own: ``lab stack engine up|down|status``.

A second ``dockerd`` (with a ``containerd`` of its own) runs in a network namespace of the stack,
``fl-<id>-engine``, one more host on the bridge of :mod:`lab.stack.hosts` at the address
``Settings.address("engine")`` (``10.231.n.7``). It listens on tcp at that address and nowhere
else (no unix socket, so the host's engine at ``/var/run/docker.sock`` is never touched), with
mutual TLS: it answers only a client presenting the stack's client certificate, whose key only
root can read (:mod:`lab.stack.enginetls`). An engine's API is root on the machine: any uid of
this machine, and any host on the bridge, can open a connection to the address, none of them but
root can authenticate. Pointing the compose backend at it (``LAB_DOCKER_HOST=tcp://10.231.n.7:2376``,
which it then reaches with that certificate) exercises everything a remote engine changes: every
docker and compose call crosses the network, the services' ports are reached at the engine's
address, not 127.0.0.1.

Everything of the engine is its own: ``--data-root`` (``<stack_dir>/engine/data``, kept by
``down`` unless purged, so the images are copied once), ``--exec-root`` and containerd's state
(``/run/fanout-lab/engine-<id>``: runtime state, short enough for unix socket paths),
``--pidfile``, ``--cgroup-parent`` (``/fl-<id>-engine``, absolute: a relative parent would be
taken below dockerd's own cgroup in each hierarchy, which need not be the same in all of them;
its containers' cgroups are apart from the host engine's), and containerd's socket, given with
``--containerd`` (dockerd 20.10 would otherwise share a system containerd at
``/run/containerd/containerd.sock`` when one runs, and both engines would meet in its ``moby``
namespace). Inside the namespace dockerd makes its own
``docker0`` bridge and iptables rules: the namespace has its own netfilter tables, so none of it
reaches the root namespace.

The daemons are started by switching the starting thread into the namespace (``setns``, as the
participant hosts are), not with ``ip netns exec``, which also mounts a fresh ``/sys`` and so
hides the cgroup hierarchies dockerd needs.

``down`` stops dockerd (which stops its containers) and containerd by pid, then whatever a crash
left: processes in the namespace (shims, proxies), processes in the engine's cgroups (the
containers themselves), mounts under its data and exec roots, the namespace and its link, and the
switch once no other host of the stack uses it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from lab.settings import ENGINE_PORT, Settings, claim_stack_dir
from lab.stack import enginetls, hosts, netns, proc
from lab.stack.base import StackError
from lab.stack.engine import own_engine_client

log = logging.getLogger(__name__)
Say = Callable[[str], None]

RUN_DIR = Path("/run/fanout-lab")
CGROUP = Path("/sys/fs/cgroup")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 45.0  # dockerd stops its containers first (their own stop timeouts, 10 s by default)
SOCKET_MAX = 100  # sun_path is 108 bytes; containerd's sockets sit below its state dir


@dataclass(frozen=True)
class EngineLayout:
    """Names, addresses and paths of one stack's engine (pure: from the settings alone)."""

    namespace: str
    link: str  # the switch-side end of its veth pair
    address: str
    url: str  # what LAB_DOCKER_HOST is set to
    state_dir: Path  # <stack_dir>/engine: data root, logs, pid records
    exec_root: Path  # /run/fanout-lab/engine-<id>: dockerd's exec root and containerd's state
    cgroup_parent: str
    tls_dir: Path  # <stack_dir>/secrets/engine: the CA, dockerd's and the client's certificates and keys

    @property
    def data_root(self) -> Path:
        return self.state_dir / "data"

    @property
    def containerd_root(self) -> Path:
        return self.state_dir / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.exec_root / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_state / "containerd.sock"

    @property
    def dockerd_exec_root(self) -> Path:
        return self.exec_root / "docker"

    @property
    def pidfile(self) -> Path:
        """dockerd's own ``--pidfile`` (beside the lab's record of it, which also keeps its start time)."""
        return self.state_dir / "dockerd.pid"

    @property
    def containerd_config(self) -> Path:
        return self.state_dir / "containerd.toml"


def engine_layout(settings: Settings) -> EngineLayout:
    lay = hosts.layout(settings)
    return EngineLayout(
        namespace=lay.engine_ns, link=lay.engine_link, address=settings.address("engine"),
        url=settings.engine_url, state_dir=settings.stack_dir / "engine",
        exec_root=RUN_DIR / f"engine-{settings.stack_id}", cgroup_parent=f"/{hosts.PREFIX}-{settings.stack_id}-engine",
        tls_dir=settings.engine_tls_dir,
    )


def containerd_config(e: EngineLayout) -> str:
    """containerd's configuration: its own root, state and socket; no CRI plugin (as dockerd's
    own supervised containerd runs)."""
    return (
        "version = 2\n"
        f'root = "{e.containerd_root}"\n'
        f'state = "{e.containerd_state}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        "[grpc]\n"
        f'  address = "{e.containerd_socket}"\n'
        "[ttrpc]\n"
        f'  address = "{e.containerd_state / "containerd.sock.ttrpc"}"\n'
        '[plugins."io.containerd.internal.v1.opt"]\n'
        f'  path = "{e.containerd_root / "opt"}"\n'
    )


def dockerd_command(e: EngineLayout, dockerd: str = "dockerd") -> list[str]:
    """dockerd on tcp at the engine's address only, verifying every client's certificate against the
    stack's CA (``--tlsverify``), with its own data root, exec root, pid file, containerd and cgroup
    parent."""
    tls = e.tls_dir
    return [
        dockerd, "--host", f"tcp://{e.address}:{ENGINE_PORT}", "--tlsverify", "--tlscacert", str(tls / "ca.pem"),
        "--tlscert", str(tls / "server-cert.pem"), "--tlskey", str(tls / "server-key.pem"),
        "--data-root", str(e.data_root), "--exec-root", str(e.dockerd_exec_root),
        "--pidfile", str(e.pidfile), "--containerd", str(e.containerd_socket),
        "--cgroup-parent", e.cgroup_parent,
    ]


def _exe(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        raise StackError(f"the lab's own engine needs {name} (Debian: apt-get install docker.io)")
    return found


# Lifecycle ----------------------------------------------------------------------------------------
def up(settings: Settings, *, say: Say = log.info) -> EngineLayout:
    """Start the engine (idempotent: a running one is kept) and copy the local images into it
    when missing; on failure stop what this call started, then raise."""
    hosts.require_root()
    e = engine_layout(settings)
    if len(str(e.containerd_socket)) + 20 > SOCKET_MAX:
        raise StackError(f"the engine's socket path {e.containerd_socket} is too long for a unix socket")
    client = _client(e, timeout=5)
    if client is None:
        _start(settings, e, say)
        client = _client(e, timeout=START_TIMEOUT, watch=True)
    assert client is not None
    from lab.stack.images import copy_images

    try:
        copy_images(settings.replace(docker_host=""), client, say=say)
    except StackError as exc:
        say(f"local images not copied: {exc}")
    return e


def _start(settings: Settings, e: EngineLayout, say: Say) -> None:
    lay = hosts.layout(settings)
    if leftovers(settings):  # a crashed engine: clean up first, keep its data root
        say("removing what a stopped engine left: " + ", ".join(leftovers(settings)))
        down(settings)
    if hosts._subnet_taken(settings) and lay.switch not in hosts.netns_names():
        raise StackError(f"the subnet {lay.subnet} of this stack is routed elsewhere already; "
                         "give this stack another LAB_STACK_DIR")
    containerd, dockerd = _exe("containerd"), _exe("dockerd")
    claim_stack_dir(settings.stack_dir)
    enginetls.ensure(e.tls_dir, e.address)  # before dockerd reads them; a running one keeps its own
    try:
        hosts.ensure_switch(lay)
        hosts.add_host(lay, e.namespace, e.link, e.address)
        for d in (e.data_root, e.containerd_root, e.containerd_state, e.dockerd_exec_root):
            d.mkdir(parents=True, exist_ok=True)
        e.containerd_config.write_text(containerd_config(e))
        proc.spawn([containerd, "--config", e.containerd_config], state_dir=e.state_dir / "containerd.run",
                   log_path=e.state_dir / "containerd.log", netns=e.namespace)
        _wait(e.containerd_socket.exists, 20, "containerd's socket", e)
        proc.spawn(dockerd_command(e, dockerd), state_dir=e.state_dir / "dockerd.run",
                   log_path=e.state_dir / "dockerd.log", netns=e.namespace)
    except BaseException:
        with contextlib.suppress(Exception):
            down(settings)
        raise
    say(f"engine starting in {e.namespace} at {e.url}")


def _wait(ready: Callable[[], bool], timeout: float, what: str, e: EngineLayout) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.running(e.state_dir / "containerd.run") is None:
            raise StackError(f"containerd exited: {proc.tail(e.state_dir / 'containerd.log')}")
        if time.monotonic() > deadline:
            raise StackError(f"{what} not there after {timeout:.0f} s")
        time.sleep(0.1)


def _client(e: EngineLayout, *, timeout: float, watch: bool = False) -> Any | None:
    """A pinged SDK client of the engine, or None when it does not answer within ``timeout``
    (``watch``: StackError as soon as dockerd has exited, naming its log's last lines)."""
    deadline = time.monotonic() + timeout
    while True:
        if not netns.reachable(e.address):  # its bridge is gone: the address would lead off the machine
            if watch:
                raise StackError(f"the engine's address {e.address} is not routed onto its lab bridge")
            return None
        try:
            client = own_engine_client(e.url, e.tls_dir)
            client.ping()
            return client
        except Exception:
            pass
        if watch and proc.running(e.state_dir / "dockerd.run") is None:
            raise StackError(f"dockerd exited: {proc.tail(e.state_dir / 'dockerd.log')}")
        if time.monotonic() > deadline:
            if watch:
                raise StackError(f"the engine did not answer at {e.url} within {timeout:.0f} s "
                                 f"(log: {e.state_dir / 'dockerd.log'})")
            return None
        time.sleep(0.2)


def exists(settings: Settings) -> bool:
    """Whether anything of the stack's engine is there: a recorded daemon still running, or what
    :func:`leftovers` finds (``lab stack down --purge`` takes it down before deleting its data root)."""
    e = engine_layout(settings)
    running = any(proc.running(e.state_dir / f"{name}.run") for name in ("dockerd", "containerd"))
    return running or bool(leftovers(settings))


def leftovers(settings: Settings) -> list[str]:
    """What of the engine exists now: its namespace, processes, mounts."""
    e = engine_layout(settings)
    found = [n for n in hosts.netns_names() if n == e.namespace]
    found += [f"pid {p}" for p in sorted(_namespace_pids(e) | _cgroup_pids(e))]
    found += [f"mount {m}" for m in _mounts(e)]
    return found


def down(settings: Settings, *, purge: bool = False) -> list[str]:
    """Stop the engine and remove everything it made, also after a crash; ``purge``: its data
    root too (images, volumes). Returns what was removed or stopped."""
    e = engine_layout(settings)
    done: list[str] = []
    # dockerd first: SIGTERM stops its containers (their stop timeouts), then itself
    for name in ("dockerd", "containerd"):
        if proc.terminate(e.state_dir / f"{name}.run", timeout=STOP_TIMEOUT):
            done.append(name)
    e.pidfile.unlink(missing_ok=True)
    killed = 0
    for pid in sorted(_namespace_pids(e) | _cgroup_pids(e)):  # a crash's shims, proxies, containers
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    if killed:
        done.append(f"{killed} processes left by a stopped engine killed")
    proc.wait_gone(_procs(_namespace_pids(e) | _cgroup_pids(e)), timeout=10)
    unmounted = 0
    for path in _mounts(e):  # overlays, shm and netns files of containers dockerd never stopped
        unmounted += netns.run_tool(["umount", "-l", path]).returncode == 0
    if unmounted:
        done.append(f"{unmounted} mounts left by a stopped engine unmounted")
    _remove_cgroups(e)
    errors = []
    if e.namespace in hosts.netns_names():  # takes its eth0 and with it its veth pair
        res = netns.run_tool(["ip", "netns", "del", e.namespace])
        if res.returncode == 0:
            done.append(e.namespace)
        else:
            errors.append(res.stderr.strip())
    lay = hosts.layout(settings)
    if lay.switch in hosts.netns_names() and e.link in hosts.link_names(lay.switch):  # a half-made pair
        netns.run_tool(["ip", "-n", lay.switch, "link", "del", e.link])
    done += hosts.release_switch(settings)
    shutil.rmtree(e.exec_root, ignore_errors=True)
    with contextlib.suppress(OSError):  # /run/fanout-lab, once no other stack's engine uses it
        e.exec_root.parent.rmdir()
    if purge:
        shutil.rmtree(e.state_dir, ignore_errors=True)
        done.append(f"purged {e.state_dir}")
    if errors:
        raise StackError("could not remove the engine: " + "; ".join(errors))
    if done:
        log.info("engine down: %s", ", ".join(done))
    return done


def status(settings: Settings) -> dict[str, Any]:
    """The engine's state: running or not, its URL, pids, version, images and containers."""
    e = engine_layout(settings)
    pids = {name: (p.pid if (p := proc.running(e.state_dir / f"{name}.run")) else None)
            for name in ("dockerd", "containerd")}
    out: dict[str, Any] = {"url": e.url, "namespace": e.namespace, "data_root": str(e.data_root),
                           "exec_root": str(e.exec_root), "cgroup_parent": e.cgroup_parent, "pids": pids,
                           "namespace_exists": e.namespace in hosts.netns_names()}
    client = _client(e, timeout=0) if pids["dockerd"] else None
    out["state"] = "running" if client is not None else ("starting" if pids["dockerd"] else "stopped")
    if client is not None:
        from lab.stack.engine import engine_version

        out["version"] = engine_version(client)
        out["images"] = sorted(t for i in client.images.list() for t in i.tags)
        out["containers"] = sorted(c.name for c in client.containers.list(all=True))
    return out


def status_text(info: dict[str, Any]) -> str:
    lines = [f"engine {info['state']} at {info['url']} (namespace {info['namespace']})"]
    pids = ", ".join(f"{k} {v}" for k, v in info["pids"].items() if v)
    if pids:
        lines.append(f"  pids: {pids}")
    if "version" in info:
        lines.append(f"  docker {info['version']}; data root {info['data_root']}")
        lines.append(f"  images: {', '.join(info['images']) or '-'}")
        lines.append(f"  containers: {', '.join(info['containers']) or '-'}")
    return "\n".join(lines) + "\n"


# What a crash leaves ------------------------------------------------------------------------------
def _procs(pids: set[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(psutil.Process(pid))
    return out


def _namespace_pids(e: EngineLayout) -> set[int]:
    """Processes whose network namespace is the engine's (its daemons, shims, proxies)."""
    return netns.pids_in(e.namespace)


def _cgroup_dirs(e: EngineLayout) -> list[Path]:
    """The engine's cgroup parent in every hierarchy (cgroup v1 controllers, or v2's one tree)."""
    roots = [CGROUP] + [p for p in CGROUP.iterdir() if p.is_dir()] if CGROUP.is_dir() else []
    rel = e.cgroup_parent.lstrip("/")
    return [r / rel for r in roots if (r / rel).is_dir()]


def _cgroup_pids(e: EngineLayout) -> set[int]:
    """Processes in the engine's containers' cgroups (they have network namespaces of their own)."""
    found: set[int] = set()
    for d in _cgroup_dirs(e):
        for procs in d.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                found |= {int(x) for x in procs.read_text().split()}
    return found


def _remove_cgroups(e: EngineLayout) -> None:
    for d in _cgroup_dirs(e):
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            d.rmdir()


def mounts_below(mountinfo: str, roots: list[Path]) -> list[str]:
    """Mount points of ``mountinfo`` (``/proc/self/mountinfo``'s text) at or below any of
    ``roots``, deepest first (the order they can be unmounted in)."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        if any(point == str(r) or point.startswith(str(r).rstrip("/") + "/") for r in roots):
            found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def _mounts(e: EngineLayout) -> list[str]:
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    return mounts_below(text, [e.data_root, e.exec_root])
