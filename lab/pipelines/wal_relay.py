"""``wal-relay``: one slot decoded once by a relay process; N competing consumers through PostgreSQL.

The relay (``python -m lab.relay``, started by the runner as the participant
``relay``, a helper in :attr:`RelayPipeline.capabilities`) streams the one slot ``load_test_slot_relay`` with
``wal``'s reader (:class:`lab.pipelines.wal.WalSource`: the same stream, reconnects and watermark),
decodes every Insert once and hands batches of rows over in the work table ``relay_queue``: one
``INSERT … SELECT unnest(…) ON CONFLICT DO NOTHING`` per batch, which also sends one
``NOTIFY relay_queue`` at its commit. Only then are the batch's positions resolved in the watermark,
so the slot's confirmed position never passes a row that is not durably in the queue: a relay that
dies loses nothing; its replacement streams from the confirmed position and inserts again what was
already handed over (``ON CONFLICT DO NOTHING`` while the row is still queued, a second copy once a
consumer took the first, which the inbox claim then catches).

Each consumer (:class:`RelaySource`) listens on ``relay_queue`` and, when woken (while its last take
came back full, and at least every :data:`RECHECK_S` without a notice), takes a batch in one
statement: ``DELETE … WHERE id IN (SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED) RETURNING …``
and, in the same statement, the ``inbox`` claim of the taken ids (:data:`TAKE`). The transaction
stays open while the batch is worked and commits in :meth:`RelaySource.idle`, after the last work
call: a consumer that dies mid-batch rolls its take and its claims back, the rows return to the
queue and another consumer works them (the ones already worked, again: at-least-once). A row whose
id the inbox holds already is a relay's duplicate: taken, deleted, not worked (``skipped``).

The relay itself, how it outlives PostgreSQL going away and how it confirms its slot behind the
standby under ``ha``: :mod:`lab.pipelines.relay_stream`.

What replaces ``wal``'s per-reader decode: the relay's CPU, the queue's insert and delete (heap,
index, WAL, one ``NOTIFY`` per batch) and its vacuum. :meth:`RelayPipeline.teardown` reads the
queue's counters (``pg_stat_user_tables``) into ``pipeline_settings.queue``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from lab.pg.slots import drop_slots, wait_streaming
from lab.pipelines.base import BacklogReader, Capabilities, Item, SharedResources
from lab.pipelines.wal import PUBLICATION
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import Stack
from lab.workload.inbox import CLAIMS_APPLICATION

log = logging.getLogger(__name__)
HELPER = "relay"  # the relay's participant name and its files in the run dir
RELAY_SLOT = "load_test_slot_relay"  # under the runner's load_test_slot prefix: dropped with the readers'
QUEUE = "relay_queue"
CHANNEL = "relay_queue"
# a consumer not woken by the relay takes anyway after this long: rows a dead consumer's take gave
# back arrive with no notice
RECHECK_S = 1.0
# as schema.sql; also run by prepare(), for a server whose data directory predates the table
CREATE_QUEUE = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {q} (id integer NOT NULL, content text NOT NULL, "
    "created_at timestamptz NOT NULL, CONSTRAINT {pk} PRIMARY KEY (id))"
).format(q=sql.Identifier(QUEUE), pk=sql.Identifier(f"pk_{QUEUE}"))

TAKE = sql.SQL(
    "with taken as ("
    "delete from {q} where id in ("
    "select id from {q} order by id limit %(n)s for update skip locked) "
    "returning id, content, created_at), "
    "claimed as ("
    "insert into inbox (id, consumer) select id, %(me)s from taken on conflict do nothing returning id) "
    "select t.id, t.content, t.created_at, c.id is not null from taken t left join claimed c using (id) "
    "order by t.id"
).format(q=sql.Identifier(QUEUE))

LISTEN = sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL))

QUEUE_STATS = sql.SQL(
    "select n_tup_ins, n_tup_del, (select count(*) from {q}), n_dead_tup, vacuum_count, autovacuum_count, "
    "pg_total_relation_size(relid) from pg_stat_user_tables where relname = {name}"
).format(q=sql.Identifier(QUEUE), name=sql.Literal(QUEUE))
# rows_left is counted (n_live_tup is an estimate); the rest are the statistics system's counters
STAT_FIELDS = ("inserted", "deleted", "rows_left", "dead_tuples", "vacuums", "autovacuums", "bytes")
WAL_BYTES = "select wal_bytes from pg_stat_wal"


def taken_items(rows: list[tuple[int, str, datetime, bool]]) -> tuple[list[Item], int]:
    """The rows of one :data:`TAKE` as items, and how many of them lost their inbox claim (an id
    already claimed: a copy the relay handed over twice). An item's position is whether it won."""
    items = [Item(i, content, created.isoformat(), won) for i, content, created, won in rows]
    return items, sum(1 for it in items if not it.pos)


def queue_stats(row: tuple[Any, ...] | None, before: tuple[Any, ...] | None) -> dict[str, int] | None:
    """``pipeline_settings.queue``: the run's inserts, deletes, vacuums (differences against
    ``before``) and the dead and live tuples and size at the end; None when either is unknown."""
    if row is None or before is None:
        return None
    end, start = dict(zip(STAT_FIELDS, row, strict=True)), dict(zip(STAT_FIELDS, before, strict=True))
    out = {k: int(end[k]) for k in STAT_FIELDS}
    for k in ("inserted", "deleted", "vacuums", "autovacuums"):
        out[k] = int(end[k]) - int(start[k])
    return out


class RelayPipeline:
    """Runner side: reset the queue and the slot, gate on the relay's slot streaming, read the
    queue's counters, drop the slot. The relay process is a helper the runner starts and stops."""

    name: ClassVar[str] = "wal-relay"
    # one slot, the relay's, streamed by a process of its own; its consumers read the work table
    capabilities: ClassVar[Capabilities] = Capabilities(helpers={HELPER: "lab.relay"}, helper_slot=RELAY_SLOT)

    def __init__(self, scenario: Scenario, settings: Settings, stack: Stack) -> None:
        self.scenario = scenario
        self.settings = settings
        self._before: tuple[Any, ...] | None = None
        self._wal_before: int | None = None
        self.queue: dict[str, int] | None = None
        self.wal_bytes: int | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "slots": [RELAY_SLOT],
            "publication": PUBLICATION,
            "plugin": "pgoutput",
            "binary": True,
            "inbox": self.capabilities.inbox_table,
            "work_table": QUEUE,
            "relay_batch": self.scenario.batch_size,
            "queue": self.queue,  # read at teardown
            "wal_bytes": self.wal_bytes,  # the whole server's, from prepare to teardown
        }

    async def prepare(self) -> None:
        await asyncio.to_thread(drop_slots, self.settings.pg_dsn, RELAY_SLOT)
        async with await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True) as conn:
            await conn.execute(CREATE_QUEUE)
            await conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(QUEUE)))
            self._before = await self._stats(conn)
            row = await (await conn.execute(WAL_BYTES)).fetchone()
            self._wal_before = int(row[0]) if row else None

    @staticmethod
    async def _stats(conn: psycopg.AsyncConnection[Any]) -> tuple[Any, ...] | None:
        await conn.execute("select pg_stat_force_next_flush()")
        await conn.execute("select pg_stat_clear_snapshot()")
        return await (await conn.execute(QUEUE_STATS)).fetchone()

    async def wait_ready(self) -> None:
        await asyncio.to_thread(wait_streaming, self.settings.pg_dsn, RELAY_SLOT,
                                timeout=self.scenario.ready_timeout_s)

    async def start_source(self) -> None:
        return None

    async def teardown(self) -> None:
        with contextlib.suppress(Exception):
            async with await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True) as conn:
                self.queue = queue_stats(await self._stats(conn), self._before)
                row = await (await conn.execute(WAL_BYTES)).fetchone()
                if row is not None and self._wal_before is not None:
                    self.wal_bytes = int(row[0]) - self._wal_before
        with contextlib.suppress(Exception):
            await asyncio.to_thread(drop_slots, self.settings.pg_dsn, RELAY_SLOT)

    def backlog(self, scratch: Path) -> BacklogReader | None:
        return None  # no broker: the backlog waits in the slot and the work table


class RelaySource:
    """Consumer side: take a batch from the queue and claim it in one statement, commit after the work."""

    def __init__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> None:
        self.settings = settings
        self.me = f"relay-{index}"
        self.skipped = 0
        self.db_ops = 0
        self.decoded_bytes = 0  # the relay decodes, the consumers never do
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._more = True  # the last take came back full: take again without waiting
        self._last_take = 0.0  # monotonic

    async def open(self) -> None:
        self._conn = await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=False,
                                                           application_name=CLAIMS_APPLICATION)
        await self._conn.execute(LISTEN)
        await self._conn.commit()

    async def fill(self, max_items: int, first_wait: float, flush_wait: float) -> list[Item]:
        """Up to ``max_items`` rows taken and claimed, in a transaction left open until :meth:`idle`;
        waits up to ``first_wait`` for the relay's notice unless the last take was full, and takes
        without one every :data:`RECHECK_S` (rows a dead consumer gave back). Returns at once with
        what the queue had: the relay batched already."""
        conn = self._conn
        assert conn is not None
        if not self._more:
            woken = False
            async for _ in conn.notifies(timeout=first_wait, stop_after=1):
                woken = True
            if not woken and time.monotonic() - self._last_take < RECHECK_S:
                return []
        self._last_take = time.monotonic()
        cur = await conn.execute(TAKE, {"n": max_items, "me": self.me})
        rows = await cur.fetchall()
        self.db_ops += 1
        self._more = len(rows) >= max_items
        if not rows:
            await conn.commit()
            return []
        items, lost = taken_items(rows)
        self.skipped += lost
        return items

    async def claim(self, batch: list[Item]) -> list[Item]:
        """The take claimed already: the items that won."""
        return [item for item in batch if item.pos]

    def done(self, item: Item) -> None:
        return None  # the batch's transaction commits in idle()

    async def idle(self) -> None:
        """The batch is worked: commit its take and claims."""
        conn = self._conn
        if conn is not None and conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.commit()

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()  # an open take rolls back: its rows go back to the queue
