"""WAL generated over a run's window: ``pg_stat_wal`` and the LSN distance.

At both edges of the window (where the runner reads the disk and network windows) one query over
a connection of its own reads ``pg_current_wal_lsn()`` and ``pg_stat_wal``'s ``wal_records``,
``wal_fpi`` and ``wal_bytes``. run.json's ``wal`` holds the differences:

* ``lsn_bytes``: the distance between the two insert positions, exact; it includes what every
  session wrote in the window (autovacuum, the disk guard's and the runner's own readings write
  none) and the pages' headers (24 bytes per 8 kB page, 40 at a segment's start);
* ``wal_bytes``, ``records``, ``fpi`` (full-page images): the cumulative statistics, which a
  backend reports when it goes idle, at most once a second and otherwise within
  ``PGSTAT_IDLE_INTERVAL`` (10 s): a figure read right after the drain may miss what the last
  busy backends had not yet reported. ``per_msg`` is therefore ``lsn_bytes`` per message, and
  ``stats_per_msg`` (``wal_bytes`` per message) is beside it for comparison;
* ``server_changed``: a failover or a restart inside the window (the promoted standby's positions
  continue the old primary's, its statistics do not; a restart may reset them): the statistics'
  differences are then None.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psycopg

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5
QUERY = ("SELECT pg_current_wal_lsn()::text, w.wal_records, w.wal_fpi, w.wal_bytes::bigint, "
         "inet_server_port() || ' ' || pg_postmaster_start_time()::text FROM pg_stat_wal w")


def parse_lsn(text: str) -> int:
    """A ``pg_lsn`` (``16/B374D848``) as a byte position."""
    hi, sep, lo = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(hi, 16) << 32) + int(lo, 16)


def read(dsn: str) -> dict[str, Any]:
    """One reading: ``lsn`` (bytes), ``records``, ``fpi``, ``wal_bytes``, ``server`` (its port and
    start time: another server, or the same one restarted, has other statistics)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        row = conn.execute(QUERY).fetchone()
    assert row is not None  # pg_stat_wal has one row
    lsn, records, fpi, wal_bytes, server = row
    return {"lsn": parse_lsn(lsn), "records": int(records), "fpi": int(fpi), "wal_bytes": int(wal_bytes),
            "server": server}


def wal_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The window's differences (module docstring); the statistics' are None across a failover or a restart."""
    same = before.get("server") == after.get("server")
    return {"lsn_bytes": after["lsn"] - before["lsn"],
            "wal_bytes": after["wal_bytes"] - before["wal_bytes"] if same else None,
            "records": after["records"] - before["records"] if same else None,
            "fpi": after["fpi"] - before["fpi"] if same else None,
            "server_changed": not same}


def wal_block(counted: Mapping[str, Any] | None, messages: int) -> dict[str, Any] | None:
    """run.json's ``wal``: the differences and ``per_msg`` (LSN bytes per message),
    ``stats_per_msg`` (``wal_bytes`` per message), ``records_per_msg``, ``fpi_per_msg``; None when
    not read."""
    if not counted or messages <= 0:
        return None

    def per(v: int | None) -> float | None:
        return round(v / messages, 2) if v is not None else None

    return {**counted, "messages": messages, "per_msg": per(counted["lsn_bytes"]),
            "stats_per_msg": per(counted.get("wal_bytes")), "records_per_msg": per(counted.get("records")),
            "fpi_per_msg": per(counted.get("fpi"))}


class WalWindow:
    """The WAL counters at the window's two edges; a reading that fails is a warning and leaves
    the block None (a measurement never fails a run)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.edges: list[dict[str, Any]] = []
        self.error: str | None = None

    def _read(self) -> dict[str, Any] | None:
        try:
            return read(self.dsn)
        except (psycopg.Error, OSError) as exc:
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.warning("WAL counters not read: %s", self.error)
            return None

    def start(self) -> None:
        first = self._read()
        self.edges = [first] if first is not None else []

    def stop(self) -> None:
        if len(self.edges) == 1 and (last := self._read()) is not None:
            self.edges.append(last)

    def record(self) -> dict[str, Any] | None:
        if len(self.edges) != 2:
            return None
        return wal_delta(self.edges[0], self.edges[1])
