"""The native PostgreSQL service against a real PostgreSQL 18.

Flags, schema, publication, status and the refusals run against the session stack's PostgreSQL
(read-only, or with a slot they drop again). The restart test needs a cluster it may stop: one
throwaway instance of this module, in a dir under the session stack dir and on a port derived
from the session settings, stopped and purged even when the test fails. Dirs stay out of
pytest's basetemp: a root pytest session resets /tmp/pytest-of-root to 0700, which would lock
the unprivileged postgres account out.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from lab.settings import Settings
from lab.stack import proc
from lab.stack.base import StackError
from lab.stack.postgres import RELOADABLE, PostgresService

pytestmark = pytest.mark.integration

OWN_OFFSET = 100  # the module's throwaway instance: session ports + 100
SPARE_OFFSET = 101  # a port nothing listens on, for the refusals

# the reference study as the server must report it: (SHOW value, pg_settings setting, unit).
EXPECTED_FLAGS = {
    "wal_level": ("logical", "logical", None),
    "max_connections": ("400", "400", None),
    "max_replication_slots": ("64", "64", None),
    "max_wal_senders": ("64", "64", None),
    "idle_replication_slot_timeout": ("1h", "3600", "s"),
    "max_slot_wal_keep_size": ("4GB", "4096", "MB"),
    "max_wal_size": ("8GB", "8192", "MB"),
    "wal_sender_timeout": ("0", "0", "ms"),
}


@pytest.fixture(scope="module")
def scratch(stack: object, settings: Settings) -> Iterator[Callable[[str], Path]]:
    """Makes fresh dirs under the session stack dir; all removed at the end of the module."""
    made: list[Path] = []

    def make(name: str) -> Path:
        made.append(settings.stack_dir / f"pgtest-{name}-{uuid.uuid4().hex[:8]}")
        made[-1].mkdir(parents=True)
        return made[-1]

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def pg(stack: object) -> PostgresService:
    """The session stack's PostgreSQL (never stopped here)."""
    return stack.postgres  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="module")
def own(settings: Settings, scratch: Callable[[str], Path]) -> Iterator[PostgresService]:
    """The module's throwaway PostgreSQL (not started); stopped and purged whatever happens."""
    service = PostgresService(settings.replace(
        stack_dir=scratch("own"), pg_port=settings.pg_port + OWN_OFFSET
    ))
    try:
        yield service
    finally:
        service.stop(purge=True)


@pytest.fixture(scope="module")
def conn(pg: PostgresService, settings: Settings) -> Iterator[psycopg.Connection]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as c:
        yield c


def _pid(pg: PostgresService) -> int:
    [postmaster] = pg.processes()
    return postmaster.pid


def test_every_reference_flag_is_in_force(conn: psycopg.Connection) -> None:
    for name, (shown, setting, unit) in EXPECTED_FLAGS.items():
        assert conn.execute(f"SHOW {name}").fetchone() == (shown,), name
        row = conn.execute(
            "SELECT setting, unit, source FROM pg_settings WHERE name = %s", [name]
        ).fetchone()
        # a flag the faults lower for one run with ALTER SYSTEM is in data/lab.conf, not a -c
        source = "configuration file" if name in RELOADABLE else "command line"
        assert row == (setting, unit, source), name


def test_loopback_and_defaults_elsewhere(conn: psycopg.Connection, settings: Settings) -> None:
    assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
    assert conn.execute("SHOW port").fetchone() == (str(settings.pg_port),)
    assert conn.execute("SHOW fsync").fetchone() == ("on",)
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    assert conn.execute("SHOW server_version_num").fetchone()[0].startswith("18")


def test_postmaster_is_unprivileged(pg: PostgresService, settings: Settings) -> None:
    [postmaster] = pg.processes()
    uids, gids = postmaster.uids(), postmaster.gids()
    if os.geteuid() == 0:
        assert postmaster.username() == settings.pg_os_user
        assert 0 not in (uids.real, uids.effective, gids.real, gids.effective)
    else:
        assert uids.effective == os.geteuid()


def _columns(conn: psycopg.Connection, table: str) -> list[tuple]:
    return conn.execute(
        """SELECT column_name, data_type, character_maximum_length, is_nullable,
                  is_identity, identity_generation, column_default
           FROM information_schema.columns
           WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position""",
        [table],
    ).fetchall()


def _primary_key(conn: psycopg.Connection, table: str) -> tuple[str, list[str]]:
    return conn.execute(
        """SELECT c.conname, array_agg(a.attname ORDER BY k.ord)
           FROM pg_constraint c
           CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)
           JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
           WHERE c.conrelid = %s::regclass AND c.contype = 'p' GROUP BY c.conname""",
        [table],
    ).fetchone()


def test_schema_matches_the_reference(conn: psycopg.Connection) -> None:
    assert _columns(conn, "messages") == [
        ("id", "integer", None, "NO", "YES", "BY DEFAULT", None),
        ("content", "text", None, "NO", "NO", None, None),
        ("created_at", "timestamp with time zone", None, "NO", "NO", None, "now()"),
    ]
    assert _columns(conn, "inbox") == [
        ("id", "integer", None, "NO", "NO", None, None),
        ("consumer", "character varying", 64, "NO", "NO", None, None),
    ]
    assert _columns(conn, "inbox_wal") == [
        ("wal", "pg_lsn", None, "NO", "NO", None, None),
        ("slot", "character varying", 64, "NO", "NO", None, None),
    ]
    assert _primary_key(conn, "messages") == ("pk_messages", ["id"])
    assert _primary_key(conn, "inbox") == ("pk_inbox", ["id"])
    assert _primary_key(conn, "inbox_wal") == ("pk_inbox_wal", ["wal"])
    options = dict(conn.execute(
        "SELECT relname, reloptions FROM pg_class"
        " WHERE relname IN ('messages', 'inbox', 'inbox_wal')"
    ).fetchall())
    assert options == {
        "messages": None,
        "inbox": ["autovacuum_enabled=false"],
        "inbox_wal": ["autovacuum_enabled=false"],
    }


def test_publication_covers_messages_only(conn: psycopg.Connection) -> None:
    rows = conn.execute(
        "SELECT pubname, schemaname, tablename FROM pg_publication_tables"
    ).fetchall()
    assert rows == [("load_test_pub", "public", "messages")]
    assert conn.execute(
        "SELECT puballtables, pubinsert FROM pg_publication WHERE pubname = 'load_test_pub'"
    ).fetchone() == (False, True)


def test_replication_needs_the_password(settings: Settings, pg: PostgresService) -> None:
    with psycopg.connect(settings.pg_dsn, replication="database", autocommit=True) as c:
        assert c.execute("IDENTIFY_SYSTEM").fetchone()[3] == settings.pg_database
    assert "password=" not in settings.pg_dsn  # it comes from the 0600 passfile
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(settings.pg_dsn, password="x")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(settings.pg_dsn, password="lab")  # the old fixed password is gone


def test_status_reports_flags_and_inactive_slots(
    pg: PostgresService, conn: psycopg.Connection, settings: Settings
) -> None:
    conn.execute("SELECT pg_create_logical_replication_slot('load_test_slot_status', 'pgoutput')")
    try:
        status = pg.status()
    finally:
        conn.execute("SELECT pg_drop_replication_slot('load_test_slot_status')")
    assert status.state == "running"
    assert status.pids == [_pid(pg)]
    assert status.endpoint == f"127.0.0.1:{settings.pg_port}"
    assert status.version.startswith("18.")
    assert status.rss_mb is not None and status.rss_mb > 0
    assert {k: v for k, v in status.detail["settings"].items() if k in EXPECTED_FLAGS} == {
        k: shown for k, (shown, _, _) in EXPECTED_FLAGS.items()
    }
    [slot] = status.detail["inactive_slots"]
    assert slot["slot"] == "load_test_slot_status"
    assert isinstance(slot["retained_wal_bytes"], int) and slot["retained_wal_bytes"] >= 0
    assert pg.status().detail["inactive_slots"] == []


def test_start_twice_is_a_noop(pg: PostgresService) -> None:
    before = _pid(pg)
    pg.start()
    assert _pid(pg) == before


def test_same_stack_on_another_port_is_refused(pg: PostgresService, settings: Settings) -> None:
    other = PostgresService(settings.replace(pg_port=settings.pg_port + SPARE_OFFSET))
    with pytest.raises(StackError, match=f"already runs on port {settings.pg_port}"):
        other.start()


def test_data_dir_held_by_a_foreign_postmaster_is_refused(
    pg: PostgresService, settings: Settings, scratch: Callable[[str], Path]
) -> None:
    # Another stack dir whose data dir is ours: our postmaster is foreign to it.
    other_dir, spare = scratch("foreign"), settings.pg_port + SPARE_OFFSET
    (other_dir / "postgres").mkdir()
    (other_dir / "postgres" / "data").symlink_to(pg.data_dir)
    other = PostgresService(settings.replace(stack_dir=other_dir, pg_port=spare))
    pid = _pid(pg)
    with pytest.raises(StackError, match=f"in use by a foreign process pid {pid}"):
        other.start()
    assert other.processes() == []
    assert not proc.port_open(spare)
    assert _pid(pg) == pid
    with pytest.raises(StackError, match=f"foreign process pid {pid}"):
        other.stop(purge=True)
    assert (pg.data_dir / "PG_VERSION").exists()


def test_taken_port_is_refused(
    pg: PostgresService, settings: Settings, scratch: Callable[[str], Path]
) -> None:
    other = PostgresService(settings.replace(stack_dir=scratch("taken")))
    with pytest.raises(StackError, match=f"port {settings.pg_port} .*LAB_PG_PORT"):
        other.start()
    assert not other.data_dir.exists()


def test_stop_leaves_nothing_and_restart_keeps_data(own: PostgresService) -> None:
    s, service = own.settings, own
    assert not proc.port_open(s.pg_port)
    service.start()
    try:
        [postmaster] = service.processes()
        tree = [postmaster, *postmaster.children(recursive=True)]
        assert len(tree) > 3  # checkpointer, walwriter, ... belong to the recorded root
        with psycopg.connect(s.pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO messages (content) VALUES ('kept')")
        service.stop()
        assert not [p for p in tree if p.is_running()]
        assert service.processes() == [] and service.status().state == "stopped"
        assert not proc.port_open(s.pg_port)

        service.start()  # existing cluster: no initdb, schema and publication re-applied
        with psycopg.connect(s.pg_dsn, autocommit=True) as c:
            assert c.execute("SELECT content FROM messages").fetchall() == [("kept",)]
            assert c.execute("SELECT count(*) FROM pg_publication").fetchone() == (1,)
        [postmaster] = service.processes()
        tree = [postmaster, *postmaster.children(recursive=True)]
    finally:
        service.stop(purge=True)
    assert not [p for p in tree if p.is_running()]
    assert not service.state_dir.exists()
    assert not psutil.pid_exists(postmaster.pid) or not postmaster.is_running()
