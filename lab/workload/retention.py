"""Claim retention: how long the direct readers' claims stay in ``inbox_wal``.

``never`` (the default) is the reference study's: one row per message, kept, the table's autovacuum
off; the lab truncates it before each run, so a run's claims meet a table that grows from 0 to M.
``behind-slots`` keeps it small the way a team would: a pruner deletes the claims no reader can
meet again and vacuums the table.

**The rule** (:func:`prunable_below`). A claim is keyed by the WAL position of its row's Insert. A
reader meets that position again only when its slot sends the row's transaction again (after a
reconnect, for a transaction that committed after the slot's confirmed position), and a reader that
lags behind meets it for the first time later. So a claim may go once every slot has confirmed its
transaction's commit. The Insert's own position does not tell that: the senders' autocommit
INSERTs interleave, so a transaction whose Insert lies below a slot's ``confirmed_flush_lsn`` may
commit after it (another transaction's commit came in between) and be sent again. What bounds it is
the slot's ``restart_lsn``, the oldest WAL its consumer may still need: PostgreSQL moves it, at a
running-transactions record, to the start of the oldest transaction then in progress, and only
once the slot has confirmed past that record. Every Insert below it belongs to a transaction that
committed before a position the slot confirmed: the slot never sends it again, and its reader
resolved the row (worked it, or lost its claim) before confirming. Below the smallest
``restart_lsn`` of the run's slots no reader can meet a claim again. A slot that is missing, or has
no ``restart_lsn`` (invalidated), stops the pruning: nothing is deleted rather than a claim a reader
may still need.

PostgreSQL writes a running-transactions record every 15 s and at checkpoints, so on its own a
slot's ``restart_lsn`` moves that seldom. The pruner writes one itself each period
(``pg_log_standby_snapshot()``, PostgreSQL 16 and later): the slots' ``restart_lsn`` then trails
their confirmed position by one to two periods, and the table holds about that many seconds of
claims.

**The pruner** (:class:`ClaimPruner`) runs in the consumers' process beside reader 0 (a replacement
of reader 0 starts its own) on a connection of its own, named :data:`PRUNE_APPLICATION`: its
PostgreSQL side is the ``prune`` group of run.json's ``postgres_backends``, its Python side is in
``consumers``. Every :data:`PRUNE_EVERY_S` it reads the slots' ``restart_lsn``; deletes the claims
below the bound and, in the same statement, adds to the ledger ``inbox_wal_pruned`` how many claims
of each slot went (:data:`PRUNE`); runs ``VACUUM inbox_wal`` when it deleted any (autovacuum's 60 s
naptime would come after a run is over; a plain ``VACUUM`` sets nothing the next run's ``TRUNCATE``
does not reset, where ``ANALYZE`` would leave column statistics behind for the next ``never`` run);
and writes the record that gives the slots their next restart point. A run still counts every
claimed position: :func:`claim_counts` adds the ledger to the rows left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from lab.pg.pgoutput import format_lsn

log = logging.getLogger(__name__)
RETENTIONS = ("never", "behind-slots")  # lab.scenario.CLAIM_RETENTIONS
PRUNE_EVERY_S = 0.5
PRUNE_APPLICATION = "lab-prune"  # the pruner's connection in pg_stat_activity (lab.measure.pgbackends)
TABLE = "inbox_wal"
LEDGER = "inbox_wal_pruned"  # schema.sql; also created by the pipelines' prepare()

CREATE_LEDGER = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} (upto pg_lsn NOT NULL, slot varchar(64) NOT NULL, claims bigint NOT NULL, "
    "at timestamptz NOT NULL DEFAULT clock_timestamp())"
).format(sql.Identifier(LEDGER))
RESTART_LSNS = sql.SQL(
    "SELECT slot_name::text, (restart_lsn - '0/0'::pg_lsn)::int8 FROM pg_replication_slots "
    "WHERE slot_name::text = ANY(%s::text[])")
PRUNE = sql.SQL(
    "with gone as (delete from {t} where wal < %(upto)s::pg_lsn returning slot), "
    "counted as (insert into {l} (upto, slot, claims) select %(upto)s::pg_lsn, slot, count(*) from gone "
    "group by slot returning claims) "
    "select coalesce(sum(claims), 0)::int8 from counted"
).format(t=sql.Identifier(TABLE), l=sql.Identifier(LEDGER))
VACUUM = sql.SQL("VACUUM {}").format(sql.Identifier(TABLE))
NEXT_RESTART_POINT = sql.SQL("SELECT pg_log_standby_snapshot()")


def prunable_below(restart_lsns: Mapping[str, int | None], slots: Sequence[str]) -> int | None:
    """The WAL position below which no reader of ``slots`` can meet a claim again: the smallest
    ``restart_lsn`` among them (module docstring); None, and nothing may go, while any of them is
    missing or has none."""
    if not slots:
        return None
    found = [restart_lsns.get(s) for s in slots]
    if any(v is None for v in found):
        return None
    return min(v for v in found if v is not None)


def describe(mode: str) -> dict[str, Any]:
    """run.json's ``pipeline_settings.claim_retention``: the mode and, when it prunes, how."""
    if mode == "never":
        return {"mode": mode}
    return {"mode": mode, "rule": "claims below the smallest restart_lsn of the run's slots",
            "prune_every_s": PRUNE_EVERY_S, "vacuum": f"VACUUM {TABLE} after a prune that deleted claims",
            "restart_points": "pg_log_standby_snapshot() every period",
            "pruner": f"in reader 0's process; its PostgreSQL backend is {PRUNE_APPLICATION} (postgres_backends.prune)",
            "ledger": LEDGER}


async def claim_counts(conn: psycopg.AsyncConnection[Any], table: str) -> tuple[int, int, list[int]]:
    """``(rows, distinct keys, claims per owner ascending)`` of an inbox table over the whole run:
    for ``inbox_wal`` with the claims a retention pruned (:data:`LEDGER`, which the pipelines'
    ``prepare`` creates) added, per slot too. A pruned claim's position is distinct from every row
    left (the key is unique while a row holds it); a position claimed again after its claim was
    pruned, which the rule forbids, is a second claim, so the predicate's ``distinct_ids`` = M fails
    on it as on any double claim."""
    key, owner = ("wal", "slot") if table == TABLE else ("id", "consumer")
    t = sql.Identifier(table)
    cur = await conn.execute(sql.SQL("SELECT count(*), count(DISTINCT {}) FROM {}").format(sql.Identifier(key), t))
    one = await cur.fetchone()
    assert one is not None  # count(*) always answers
    rows, distinct = one
    per_owner = sql.SQL("SELECT {o}, count(*) FROM {t} GROUP BY 1").format(o=sql.Identifier(owner), t=t)
    owners: dict[str, int] = dict(await (await conn.execute(per_owner)).fetchall())
    if table == TABLE:
        ledger = sql.SQL("SELECT slot, sum(claims)::int8 FROM {} GROUP BY 1").format(sql.Identifier(LEDGER))
        for slot, n in await (await conn.execute(ledger)).fetchall():
            owners[slot] = owners.get(slot, 0) + n
            rows, distinct = rows + n, distinct + n
    return rows, distinct, sorted(owners.values())


class ClaimPruner:
    """Deletes the claims behind every one of ``slots`` every ``every_s`` (module docstring), on a
    connection of its own; :meth:`start` once reads began, :meth:`stop` when the reader closes. A
    failed prune (PostgreSQL away) is logged and tried again next period; it never ends the reader."""

    def __init__(self, dsn: str, slots: Sequence[str], every_s: float = PRUNE_EVERY_S) -> None:
        self.dsn = dsn
        self.slots = list(slots)
        self.every_s = every_s
        self.upto = 0  # the bound of the last prune: claims below it are gone
        self.pruned = 0
        self.prunes = 0
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._restart_points = True  # pg_log_standby_snapshot() exists (PostgreSQL 16+)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.prune()
            except psycopg.Error as exc:
                log.warning("claims not pruned: %s", " ".join(str(exc).split()))
                await self._drop()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=5,
                                                               application_name=PRUNE_APPLICATION)
        return self._conn

    async def prune(self) -> int:
        """One period: delete what no reader can meet again, vacuum, give the slots a new restart
        point. Returns the claims deleted."""
        conn = await self._connection()
        rows = await (await conn.execute(RESTART_LSNS, (self.slots,))).fetchall()
        upto = prunable_below(dict(rows), self.slots)
        deleted = 0
        if upto is not None and upto > self.upto:
            row = await (await conn.execute(PRUNE, {"upto": format_lsn(upto)})).fetchone()
            deleted = int(row[0]) if row else 0
            self.upto, self.pruned, self.prunes = upto, self.pruned + deleted, self.prunes + 1
            if deleted:
                await conn.execute(VACUUM)
        if self._restart_points:
            try:
                await conn.execute(NEXT_RESTART_POINT)
            except psycopg.errors.UndefinedFunction:
                self._restart_points = False  # the slots then move at PostgreSQL's own records
                log.warning("pg_log_standby_snapshot() is missing: restart points every 15 s only")
        return deleted

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def stop(self) -> None:
        """End the periods (a prune in flight is one statement: it commits whole or not at all)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        await self._drop()
