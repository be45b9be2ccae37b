"""The ``ha`` topology's PostgreSQL standby: physical streaming with failover slots.

A direct reader's counterpart of a replicated broker is a hot standby that carries every logical
slot, so that a promoted standby lets the readers and Debezium resume where they were
(PostgreSQL 17+). The pieces, all from PostgreSQL 18's documentation (logical replication
failover, ``sync_replication_slots``):

* on the primary, a physical slot :data:`STANDBY_SLOT` the standby streams from, and
  ``synchronized_standby_slots`` naming it, so no logical walsender of a failover slot sends a
  change the standby has not flushed yet (set with ``ALTER SYSTEM`` and a reload, and reset under
  the single topology, so switching topology never restarts the primary);
* the standby: a ``pg_basebackup`` copy of the primary made at every start (no stale WAL
  position to recover from), ``standby.signal``, ``primary_conninfo`` with a ``dbname`` (the
  slot-sync worker needs one), ``primary_slot_name``, ``hot_standby_feedback=on`` and
  ``sync_replication_slots=on``; the primary's server flags otherwise (a hot standby needs
  ``max_connections`` and friends at least as high as its primary's, and slot sync needs
  ``wal_level=logical``);
* the readers' and Debezium's logical slots are created with ``failover`` under ``ha``
  (:mod:`lab.pipelines.wal`, Debezium's ``slot.failover``).

Replication is asynchronous (no ``synchronous_standby_names``): a sender's commit does not wait
for the standby, only the logical walsenders do. Memory: PostgreSQL's defaults (128 MB of shared
buffers), like the primary's. The standby is a participant of its own, ``postgres-standby``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lab.settings import Settings, child_env, write_private
from lab.stack import proc
from lab.stack.base import ServiceStatus, StackError
from lab.stack.hosts import namespace
from lab.stack.postgres import SUN_PATH_MAX, PostgresService, bin_dir, server_argv, unrouted_status

log = logging.getLogger(__name__)

STANDBY_SLOT = "lab_standby"
APPLICATION_NAME = "lab_standby"
BASEBACKUP_TIMEOUT = 300.0
STREAMING_TIMEOUT = 120.0
PROMOTE_TIMEOUT = 60.0
_SYNCED = ("SELECT slot_name, synced, failover, temporary, confirmed_flush_lsn::text FROM pg_replication_slots "
           "ORDER BY slot_name")


def standby_flags(settings: Settings, passfile: Path) -> dict[str, str]:
    """What the standby adds to the primary's server flags."""
    conninfo = make_conninfo(
        "", host=settings.pg_host, port=settings.pg_port, user=settings.pg_user,
        dbname=settings.pg_database, passfile=str(passfile), application_name=APPLICATION_NAME,
    )
    return {
        "primary_conninfo": conninfo,
        "primary_slot_name": STANDBY_SLOT,
        "hot_standby": "on",
        "hot_standby_feedback": "on",
        "sync_replication_slots": "on",
        "synchronized_standby_slots": "",  # the primary's, copied by pg_basebackup: not ours
    }


def configure_primary(settings: Settings) -> None:
    """The primary's side of the topology: under ``ha`` the standby's physical slot and
    ``synchronized_standby_slots``; under ``single`` neither (a failover slot would otherwise wait
    for a standby that is not there). Applied with a reload, no restart."""
    with psycopg.connect(settings.pg_primary_dsn, autocommit=True, connect_timeout=5) as conn:
        current = conn.execute("SELECT current_setting('synchronized_standby_slots')").fetchone()
        if settings.ha:
            exists = conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                                  (STANDBY_SLOT,)).fetchone()
            if exists is None:
                conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (STANDBY_SLOT,))
            if current is None or current[0] != STANDBY_SLOT:
                conn.execute(sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {}").format(
                    sql.Literal(STANDBY_SLOT)))
                conn.execute("SELECT pg_reload_conf()")
        else:
            if current is not None and current[0]:
                conn.execute("ALTER SYSTEM RESET synchronized_standby_slots")
                conn.execute("SELECT pg_reload_conf()")
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = %s AND NOT active", (STANDBY_SLOT,))


class PostgresStandby(PostgresService):
    """A hot standby of the lab's PostgreSQL on ``settings.pg_standby_port``, rebuilt at start."""

    name = "postgres-standby"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.state_dir = settings.stack_dir / self.name
        self.data_dir = self.state_dir / "data"
        self.socket_dir = self.state_dir / "socket"
        self.log_path = self.state_dir / "postgres.log"
        self.passfile = self.state_dir / "pgpass"
        self.port = settings.pg_standby_port
        self.last_start_s: float | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.settings.pg_standby_host}:{self.port}"

    def _dsn(self, dbname: str | None = None) -> str:
        return make_conninfo(self.settings.pg_primary_dsn, host=self.settings.pg_standby_host, port=self.port,
                             dbname=dbname or self.settings.pg_database, connect_timeout=5,
                             application_name="fanout-lab stack")

    def start(self) -> None:
        """Copy the primary, start the standby, return once it streams from its slot. A running
        standby that was promoted (a ``postgres-failover`` run that never failed back) is stopped
        and rebuilt: it is no standby any more."""
        if proc.running(self.state_dir) is not None:
            if not self.promoted():
                return
            log.warning("the PostgreSQL standby runs promoted (a failover was not undone): rebuilding it")
            self.stop()
        t0 = time.monotonic()
        host = self.settings.pg_standby_host
        proc.require_free(self.port, "the PostgreSQL standby", "LAB_PG_PORT + 1", host)
        self._check_lock()
        self._check_binaries()
        configure_primary(self.settings)
        self._basebackup()
        socket_dir = self.socket_dir if len(f"{self.socket_dir}/.s.PGSQL.{self.port}") <= SUN_PATH_MAX else None
        argv = server_argv(bin_dir() / "postgres", self.data_dir, self.port, socket_dir, host)
        for name, value in standby_flags(self.settings, self.passfile).items():
            argv += ["-c", f"{name}={value}"]
        postmaster = proc.spawn(argv, state_dir=self.state_dir, log_path=self.log_path, env=child_env(),
                                cwd=self.state_dir, user=self.os_user,
                                netns=namespace(self.settings, "postgres-standby"))
        log.info("PostgreSQL standby started, pid %d, %s", postmaster.pid, self.endpoint)
        try:
            proc.wait_until(self._accepts, timeout=60, what="the PostgreSQL standby",
                            proc=postmaster, log_path=self.log_path)
            proc.wait_until(self._streaming, timeout=STREAMING_TIMEOUT,
                            what="the PostgreSQL standby's streaming", proc=postmaster, log_path=self.log_path)
        except BaseException:
            proc.terminate(self.state_dir, timeout=60, sig=signal.SIGINT)
            raise
        self.last_start_s = round(time.monotonic() - t0, 2)
        log.info("PostgreSQL standby streaming after %.1f s", self.last_start_s)

    def _basebackup(self) -> None:
        """A fresh copy of the primary in ``data/`` through the standby's slot, as the cluster's
        OS user; the password comes from a 0600 passfile of that user, never the command line."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir.mkdir(mode=0o700)
        self.socket_dir.mkdir(mode=0o750, exist_ok=True)
        esc = self.settings.secret("pg").replace("\\", "\\\\").replace(":", "\\:")
        write_private(self.passfile, f"{self.settings.pg_host}:{self.settings.pg_port}:*:"
                                     f"{self.settings.pg_user}:{esc}\n")
        if self.os_user:
            uid, gid = self._account()
            for path in (self.data_dir, self.socket_dir, self.passfile):
                os.chown(path, uid, gid)
        argv = [str(bin_dir() / "pg_basebackup"), "-D", str(self.data_dir), "-h", self.settings.pg_host,
                "-p", str(self.settings.pg_port), "-U", self.settings.pg_user, "-S", STANDBY_SLOT,
                "-X", "stream", "-c", "fast", "--no-password"]
        res = subprocess.run(
            argv, capture_output=True, text=True, env=child_env(PGPASSFILE=str(self.passfile)),
            cwd=self.state_dir, check=False, timeout=BASEBACKUP_TIMEOUT, **self._as_user(),
        )
        if res.returncode != 0:
            lines = (res.stderr or res.stdout).strip().splitlines()[-3:]
            raise StackError(f"pg_basebackup of the primary into {self.data_dir} failed: {' | '.join(lines)}")
        signal_file = self.data_dir / "standby.signal"
        signal_file.touch()
        if self.os_user:
            os.chown(signal_file, self.data_dir.stat().st_uid, self.data_dir.stat().st_gid)

    def _accepts(self) -> bool:
        with psycopg.connect(self._dsn("postgres"), connect_timeout=2):
            return True

    def _streaming(self) -> bool:
        with psycopg.connect(self.settings.pg_primary_dsn, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT 1 FROM pg_stat_replication WHERE application_name = %s "
                               "AND state = 'streaming'", (APPLICATION_NAME,)).fetchone()
        return row is not None

    def promoted(self) -> bool:
        """Whether the running standby left recovery (``pg_promote``); False when it is not
        running or does not answer."""
        if proc.running(self.state_dir) is None:
            return False
        try:
            with psycopg.connect(self._dsn(), autocommit=True, connect_timeout=3) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        except psycopg.Error:
            return False
        return row is not None and not row[0]

    def promote(self, timeout: float = PROMOTE_TIMEOUT) -> float:
        """``pg_promote``: end recovery, become a primary on a new timeline; returns the seconds
        it took. Its synced failover slots are the readers' and Debezium's from then on."""
        t0 = time.monotonic()
        with psycopg.connect(self._dsn(), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_promote(true, %s)", (int(timeout),)).fetchone()
        if row is None or not row[0]:
            raise StackError(f"the PostgreSQL standby did not finish its promotion within {timeout:.0f} s; "
                             f"last log lines: {proc.tail(self.log_path)}")
        return round(time.monotonic() - t0, 3)

    def slots(self) -> list[dict[str, object]]:
        """The standby's replication slots (``synced``: copied from the primary by slot sync;
        ``confirmed_flush``: the position a reader resumes from after a promotion)."""
        with psycopg.connect(self._dsn(), autocommit=True) as conn:
            rows = conn.execute(_SYNCED).fetchall()
        return [{"slot": r[0], "synced": r[1], "failover": r[2], "temporary": r[3], "confirmed_flush": r[4]}
                for r in rows]

    def status(self) -> ServiceStatus:
        postmaster = proc.running(self.state_dir)
        if postmaster is None:
            return ServiceStatus(self.name, "stopped", endpoint=self.endpoint)
        detail: dict[str, object] = {"primary_slot": STANDBY_SLOT, "start_s": self.last_start_s}
        version = ""
        unrouted = unrouted_status(self, "the standby", self.settings.pg_standby_host, postmaster, detail)
        if unrouted is not None:
            return unrouted
        try:
            with psycopg.connect(self._dsn(), autocommit=True) as conn:
                version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
                row = conn.execute("SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text").fetchone()
                assert row is not None
                detail["in_recovery"], detail["replay_lsn"] = row
            detail["slots"] = self.slots()
        except psycopg.Error as exc:
            detail["error"] = f"cannot query the standby: {str(exc).strip()}"
        return ServiceStatus(self.name, "running", pids=[postmaster.pid], endpoint=self.endpoint,
                             version=version, rss_mb=proc.tree_rss_mb([postmaster]), detail=detail)

    def processes(self) -> list[psutil.Process]:
        postmaster = proc.running(self.state_dir)
        return [postmaster] if postmaster is not None else []
