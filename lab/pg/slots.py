"""Logical replication slots: the streaming gate and the cleanup by prefix.

Used for Debezium's slots (``dbz_kafka_slot``, ``dbz_quorum_slot``) and the direct readers'
(``load_test_slot_<i>``). Every function takes either an open connection or a DSN; a DSN gets a
short-lived autocommit connection of its own.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

import psycopg
from psycopg import errors
from psycopg.pq import TransactionStatus

log = logging.getLogger(__name__)

# A slot counts as ready only when a walsender holds it and reports 'streaming': a running
# client is not yet a streaming slot, and rows committed before that are never delivered.
STREAMING_SQL = """
SELECT count(*) FROM pg_replication_slots s
WHERE s.slot_name = %s AND s.active_pid IS NOT NULL AND s.restart_lsn IS NOT NULL
  AND EXISTS (SELECT 1 FROM pg_stat_replication r
              WHERE r.pid = s.active_pid AND r.state = 'streaming')
"""
TERMINATE_SQL = (
    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
    "WHERE slot_name LIKE %s AND active_pid IS NOT NULL"
)
DROP_SQL = (
    "SELECT slot_name, pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
    "WHERE slot_name LIKE %s"
)
_BY_NAME = "FROM pg_replication_slots WHERE slot_name = %s"
POLL_INTERVAL = 0.5
DROP_ATTEMPTS = 20
DROP_RETRY_DELAY = 0.2

Conn = psycopg.Connection | str


@contextlib.contextmanager
def _connected(conn_or_dsn: Conn) -> Iterator[psycopg.Connection]:
    if isinstance(conn_or_dsn, psycopg.Connection):
        yield conn_or_dsn
        return
    with psycopg.connect(conn_or_dsn, autocommit=True, connect_timeout=5) as conn:
        yield conn


def _scalar(conn: psycopg.Connection, query: str, *params: object) -> object:
    opened = not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
    try:
        row = conn.execute(query, params).fetchone()
    finally:
        if opened:
            conn.rollback()  # end the transaction this read opened, never a caller's own
    return row[0] if row else None


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching names that start with ``prefix`` literally (``_`` is no wildcard)."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def is_streaming(conn_or_dsn: Conn, slot: str) -> bool:
    """True when ``slot`` is held by a walsender in state ``streaming``."""
    with _connected(conn_or_dsn) as conn:
        return bool(_scalar(conn, STREAMING_SQL, slot))


def slot_exists(conn_or_dsn: Conn, slot: str) -> bool:
    with _connected(conn_or_dsn) as conn:
        return bool(_scalar(conn, f"SELECT count(*) {_BY_NAME}", slot))


def active_pid(conn_or_dsn: Conn, slot: str) -> int | None:
    """The pid of the walsender holding ``slot``, or None (also when the slot does not exist)."""
    with _connected(conn_or_dsn) as conn:
        pid = _scalar(conn, f"SELECT active_pid {_BY_NAME}", slot)
    return int(pid) if pid is not None else None  # type: ignore[call-overload]


def wait_streaming(
    conn_or_dsn: Conn,
    slot: str,
    *,
    timeout: float,
    interval: float = POLL_INTERVAL,
    watch: Callable[[], None] | None = None,
) -> float:
    """Poll until ``slot`` streams; return the seconds waited.

    ``watch`` is called before each poll and may raise to abort early (e.g. the client died).
    Raises :class:`TimeoutError` after ``timeout`` seconds.
    """
    start = time.monotonic()
    with _connected(conn_or_dsn) as conn:
        while True:
            if watch is not None:
                watch()
            if _scalar(conn, STREAMING_SQL, slot):
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"replication slot {slot} not streaming after {timeout:.0f} s")
            time.sleep(interval)


def drop_slots(dsn: str, prefix: str) -> list[str]:
    """Terminate the walsenders of slots named ``prefix*``, then drop those slots.

    A just-terminated walsender may still hold its slot for a moment, so the drop is retried
    (SQLSTATE 55006 object_in_use). Returns the names dropped.
    """
    pattern = like_prefix(prefix)
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        for attempt in range(1, DROP_ATTEMPTS + 1):
            conn.execute(TERMINATE_SQL, (pattern,))  # again on retry: a client may reconnect
            try:
                dropped = [row[0] for row in conn.execute(DROP_SQL, (pattern,)).fetchall()]
            except errors.ObjectInUse:
                if attempt == DROP_ATTEMPTS:
                    raise
                time.sleep(DROP_RETRY_DELAY)
                continue
            if dropped:
                log.info("dropped replication slots %s", ", ".join(dropped))
            return dropped
    return []  # unreachable
