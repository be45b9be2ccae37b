"""Claim retention: how long the direct readers' claims stay in ``inbox_wal``.

``never`` (the default) is the reference study's: one row per message, kept, the table's autovacuum
off; the lab truncates it before each run, so a run's claims meet a table that grows from 0 to M.
``behind-slots`` keeps it small the way a team would: a pruner deletes the claims no reader can
meet again and vacuums the table.

**The rule** (:func:`advance`). A claim is keyed by the WAL position of its row's Insert. A reader
meets that position again only when its slot sends the row's transaction again (after a reconnect,
for a transaction that committed after the slot's ``confirmed_flush_lsn``), and a reader that lags
behind meets it for the first time later. So a claim may go once every slot has confirmed its
transaction's commit. The Insert's own position does not tell that: the senders' autocommit
INSERTs interleave, so a transaction whose Insert lies below a slot's confirmed position may commit
after it (another transaction's commit came in between) and be sent again. The pruner therefore
bounds the commits, not the Inserts, with what PostgreSQL says at each period (:class:`Reading`):

1. it reads the WAL insert position (a *mark*), then a snapshot: every transaction that wrote below
   the mark has a transaction id below the snapshot's ``xmax`` (an id is assigned before the first
   write);
2. at a later period whose snapshot's ``xmin`` has passed that ``xmax`` (every one of them has ended),
   the WAL insert position read after that snapshot is past all their commits: the mark is *sealed*
   with it;
3. once every slot of the run has confirmed past a sealed mark's commits, no reader can meet a claim
   below the mark again: the slot never sends those transactions again, and its reader resolved
   their rows (worked, or lost the claim) before confirming.

A slot that is missing or has no confirmed position stops the pruning: nothing is deleted rather than
a claim a reader may still need. So the table holds the claims of about the readers' confirmation
lag plus one or two periods. (A slot's ``restart_lsn`` is a safe bound too, but PostgreSQL moves it
only at a running-transactions record the slot has confirmed, and takes the next candidate only
after that: measured here, it trailed the confirmed position by 3 to 8 s at 1,000 msg/s where this
rule's bound trails by the confirmation lag.)

**The pruner** (:class:`ClaimPruner`) runs in the consumers' process beside reader 0 (a replacement
of reader 0 starts its own) on a connection of its own, named :data:`PRUNE_APPLICATION`: its
PostgreSQL side is the ``prune`` group of run.json's ``postgres_backends``, its Python side is in
``consumers``. Every :data:`PRUNE_EVERY_S` it reads (:data:`MARK`, :data:`SEAL`), advances the rule
and, when the bound moved, deletes the claims below it and, in the same statement, adds to the
ledger ``inbox_wal_pruned`` how many claims of each slot went and how many rows the table held
before (:data:`PRUNE`; the table only grows between two prunes, so that count at each prune and the
rows left at the end give its largest size, ``claim_table.rows_max``: a count of a small table,
which a team's pruner would not need); then runs ``VACUUM (TRUNCATE false) inbox_wal``. Why this
vacuum: autovacuum's 60 s naptime would come after a run is over; a plain ``VACUUM`` sets nothing
the next run's ``TRUNCATE`` does not reset, where ``ANALYZE`` would leave column statistics behind
for the next ``never`` run; and a vacuum allowed to truncate, finding empty pages at the table's end,
waits up to 5 s for an exclusive lock that the readers' claims never leave free, and blocks every
claim while it holds one. A run still counts every claimed position: :func:`claim_counts` adds the
ledger to the rows left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from lab.pg.walstream import format_lsn

log = logging.getLogger(__name__)
RETENTIONS = ("never", "behind-slots")  # lab.scenario.CLAIM_RETENTIONS
PRUNE_EVERY_S = 0.5
PRUNE_APPLICATION = "lab-prune"  # the pruner's connection in pg_stat_activity (lab.measure.pgbackends)
TABLE = "inbox_wal"
LEDGER = "inbox_wal_pruned"  # schema.sql; also created by the pipelines' prepare()

CREATE_LEDGER = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} (upto pg_lsn NOT NULL, slot varchar(64) NOT NULL, claims bigint NOT NULL, "
    "rows_before bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
).format(sql.Identifier(LEDGER))
MARK = "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8"
# the snapshot is the statement's, taken before the insert position in its target list is read
SEAL = ("SELECT pg_snapshot_xmin(s)::text::int8, pg_snapshot_xmax(s)::text::int8, "
        "(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8, "
        "(SELECT coalesce(json_object_agg(slot_name, (confirmed_flush_lsn - '0/0'::pg_lsn)::int8), '{}') "
        "FROM pg_replication_slots WHERE slot_name::text = ANY(%s::text[])) "
        "FROM pg_current_snapshot() AS s")
PRUNE = sql.SQL(  # rows_before: the statement's snapshot, taken before its delete
    "with gone as (delete from {t} where wal < %(upto)s::pg_lsn returning slot), "
    "counted as (insert into {l} (upto, slot, claims, rows_before) "
    "select %(upto)s::pg_lsn, slot, count(*), (select count(*) from {t}) from gone group by slot returning claims) "
    "select coalesce(sum(claims), 0)::int8 from counted"
).format(t=sql.Identifier(TABLE), l=sql.Identifier(LEDGER))
VACUUM = sql.SQL("VACUUM (TRUNCATE false) {}").format(sql.Identifier(TABLE))


@dataclass(frozen=True)
class Reading:
    """What one period reads, in this order: the WAL insert position (``mark``); a snapshot's
    ``xmin`` (every transaction id below it has ended) and ``xmax`` (every id assigned so far is
    below it); the WAL insert position after that snapshot (``after``); each slot's confirmed
    position (None: it has none)."""

    mark: int
    xmin: int
    xmax: int
    after: int
    confirmed: Mapping[str, int | None]


@dataclass(frozen=True)
class Retention:
    """The rule's state: marks whose writers may still run (``open``: mark, xmax), marks whose
    writers all committed below a known position (``sealed``: mark, commits below), and the bound
    below which every claim may go (``upto``, 0: none yet)."""

    open: tuple[tuple[int, int], ...] = ()
    sealed: tuple[tuple[int, int], ...] = ()
    upto: int = 0


def advance(state: Retention, reading: Reading, slots: Sequence[str]) -> Retention:
    """One period of the rule (module docstring): open this reading's mark, seal the marks whose
    transactions have all ended, and move the bound to the highest sealed mark that every one of
    ``slots`` has confirmed past (never back). A slot missing from ``reading.confirmed`` or without a
    confirmed position holds the bound where it is."""
    marks = (*state.open, (reading.mark, reading.xmax))
    still = tuple((m, x) for m, x in marks if x > reading.xmin)
    sealed = (*state.sealed, *((m, reading.after) for m, x in marks if x <= reading.xmin))
    found = [reading.confirmed.get(s) for s in slots]
    if not slots or any(c is None for c in found):
        return Retention(still, sealed, state.upto)
    low = min(c for c in found if c is not None)
    upto = max([state.upto, *(m for m, w in sealed if w <= low)])
    return Retention(still, tuple((m, w) for m, w in sealed if m > upto), upto)


def describe(mode: str) -> dict[str, Any]:
    """run.json's ``pipeline_settings.claim_retention``: the mode and, when it prunes, how."""
    if mode == "never":
        return {"mode": mode}
    return {"mode": mode,
            "rule": "claims below a WAL mark whose writers all committed below every slot's confirmed_flush_lsn",
            "prune_every_s": PRUNE_EVERY_S, "vacuum": f"VACUUM (TRUNCATE false) {TABLE} after a prune that deleted",
            "pruner": f"in reader 0's process; its PostgreSQL backend is {PRUNE_APPLICATION} (postgres_backends.prune)",
            "ledger": LEDGER}


STATE = sql.SQL(
    "SELECT (SELECT count(*) FROM {t}), (SELECT coalesce(sum(claims), 0)::int8 FROM {l}), "
    "(SELECT count(DISTINCT upto) FROM {l}), (SELECT coalesce(max(rows_before), 0)::int8 FROM {l})"
).format(t=sql.Identifier(TABLE), l=sql.Identifier(LEDGER))


async def table_state(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """run.json's ``pipeline_settings.claim_table``, read after the consumers exited: ``rows`` left
    (``count(*)``), ``rows_max`` (the most it held: ``rows``, or the largest count a prune found
    before it deleted; the table only grows between prunes), ``pruned`` claims and ``prunes``. Its
    bytes and index depth are in run.json's ``vacuum.sizes`` (:mod:`lab.measure.vacuum`)."""
    row = await (await conn.execute(STATE)).fetchone()
    assert row is not None  # aggregates always answer
    rows, pruned, prunes, before = (int(v) for v in row)
    return {"rows": rows, "rows_max": max(rows, before), "pruned": pruned, "prunes": prunes}


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
    """Deletes the claims no reader of ``slots`` can meet again, every ``every_s`` (module
    docstring), on a connection of its own; :meth:`start` once reads began, :meth:`stop` when the
    reader closes. A failed period (PostgreSQL away) is logged and tried again; it never ends the
    reader. A new connection starts the rule afresh: what it held is only the past's marks."""

    def __init__(self, dsn: str, slots: Sequence[str], every_s: float = PRUNE_EVERY_S) -> None:
        self.dsn = dsn
        self.slots = list(slots)
        self.every_s = every_s
        self.state = Retention()
        self.pruned_upto = 0  # the bound of the last delete: claims below it are gone
        self.pruned = 0
        self.prunes = 0
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None

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

    async def read(self, conn: psycopg.AsyncConnection[Any]) -> Reading:
        mark = await (await conn.execute(MARK)).fetchone()
        seal = await (await conn.execute(SEAL, (self.slots,))).fetchone()
        assert mark is not None and seal is not None  # one row each, always
        xmin, xmax, after, confirmed = seal
        return Reading(int(mark[0]), int(xmin), int(xmax), int(after), confirmed)

    async def prune(self) -> int:
        """One period: read, advance the rule, delete below a bound that moved, vacuum. Returns
        the claims deleted."""
        conn = await self._connection()
        self.state = advance(self.state, await self.read(conn), self.slots)
        if self.state.upto <= self.pruned_upto:
            return 0
        row = await (await conn.execute(PRUNE, {"upto": format_lsn(self.state.upto)})).fetchone()
        deleted = int(row[0]) if row else 0
        self.pruned_upto, self.pruned, self.prunes = self.state.upto, self.pruned + deleted, self.prunes + 1
        if deleted:
            await conn.execute(VACUUM)
        return deleted

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.state = Retention(upto=self.state.upto)  # marks read on a server that may be gone
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
