"""``poll``: no change data capture; N consumers claim batches straight from the outbox.

Nothing decodes WAL and there is no slot: each consumer runs one transaction per batch on its own
connection,

1. ``BEGIN`` and ``SELECT id, content, created_at FROM messages ORDER BY id LIMIT <batch>
   FOR UPDATE SKIP LOCKED`` (:data:`READ`): the oldest rows no other consumer holds;
2. the inbox claim every broker pipeline runs (:data:`lab.workload.inbox.CLAIM_IDS`, one
   statement), inside the same transaction;
3. the work calls, one at a time, while the transaction holds the rows' locks;
4. ``DELETE`` the finished rows from ``messages``, moving them to ``messages_done`` in the same
   statement (:data:`FINISH`), and ``COMMIT``.

Why delete-on-done. The mature PostgreSQL queues take a row with ``FOR UPDATE SKIP LOCKED`` and
remove it when it is finished: pgmq's ``read`` claims with ``SKIP LOCKED`` and its consumer calls
``delete`` (or ``archive``, which moves the row into the queue's ``a_`` table); graphile-worker's
``complete_job`` deletes the job; river keeps a finished job as ``completed`` and a cleaner deletes
it later, which costs the same delete plus an update per row. A processed flag keeps every finished
row in the table and in the index the claim scans; it would also need a column in the lab's
outbox, which every pipeline shares (and the WAL readers would decode). A separate queue table
would need a second insert per message (a trigger) on the insert path every pipeline shares.

Why ``messages_done``. The run's accounting, latency and Success predicate read every message's
id and ``created_at`` from the outbox after the window (the view ``outbox_record``); the finished
rows are moved, like pgmq's ``archive``, so that they can. The move is one heap insert per row
(``messages_done`` has no index) inside the delete statement; it is counted in this pipeline's
cost.

Why one transaction per batch. The claim (the row locks), the inbox write and the delete commit
together: if a consumer dies (process killed, connection lost) PostgreSQL rolls its transaction
back, the rows' locks go, and the next read of any consumer gets them again, inbox claim included.
A work call made before the death is made again by whoever reads the row next: at-least-once, as the fault
runs count it. There is no lease and no visibility timeout to tune (pgmq, graphile-worker and
river hold a claim across transactions, so they need one); the price is an open transaction per
busy consumer, which holds back the xmin horizon for about one batch's work.

Connection loss (a PostgreSQL restart, a terminated backend): the open transaction is gone with
its locks, inbox claims and deletes, so its rows return to the outbox; a batch whose claim or
commit failed is dropped on this side (its work calls may have been made: at-least-once), and
the next read connects again.

Reads. An empty read is repeated every ``flush_wait`` (50 ms, the wait a WAL reader tops a batch up
with) until ``first_wait`` (100 ms) has passed; there is no notification (the outbox insert is the
one every pipeline shares). A read returns at once what it found: topping a batch up would hold
the first rows' locks while waiting.

Costs that grow with N: each consumer's read walks the primary key from its head past the rows
other consumers have locked (SKIP LOCKED skips them one by one) and past the index entries of
deleted rows that vacuum has not removed yet; every message leaves a dead tuple in ``messages``
for autovacuum (the runner records the tables' counters and autovacuum's CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from psycopg import sql

from lab.pipelines.base import BacklogReader, Capabilities, Item, SharedResources, claim_batch
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import Stack
from lab.workload.inbox import CLAIMS_APPLICATION

log = logging.getLogger(__name__)
OUTBOX = "messages"
DONE = "messages_done"  # schema.sql: where finished rows go (no index)

READ = sql.SQL(
    "SELECT id, content, created_at FROM {outbox} ORDER BY id LIMIT %(n)s FOR UPDATE SKIP LOCKED"
).format(outbox=sql.Identifier(OUTBOX))
FINISH = sql.SQL(
    "WITH finished AS (DELETE FROM {outbox} WHERE id = ANY(%(ids)s::int[]) "
    "RETURNING id, content, created_at) "
    "INSERT INTO {done} (id, content, created_at) SELECT id, content, created_at FROM finished"
).format(outbox=sql.Identifier(OUTBOX), done=sql.Identifier(DONE))
BEGIN = sql.SQL("BEGIN")
COMMIT = sql.SQL("COMMIT")
ROLLBACK = sql.SQL("ROLLBACK")
RECONNECT_TIMEOUT_S = 30.0  # a restarted server (postgres-restart) accepts connections again within this
RECONNECT_PAUSE_S = 0.2


def consumer_name(index: int) -> str:
    """What the claim writes into ``inbox.consumer``."""
    return f"poll-{index}"


def read_plan(first_wait: float, flush_wait: float) -> int:
    """How many reads :meth:`PollSource.fill` makes at most before it returns empty: one at once,
    then one every ``flush_wait`` until ``first_wait`` has passed."""
    if flush_wait <= 0:
        return 1
    return 1 + int(first_wait / flush_wait + 1e-9)


class PollPipeline:
    """Runner side: nothing to prepare (the runner empties the tables), no source to start."""

    name: ClassVar[str] = "poll"
    capabilities: ClassVar[Capabilities] = Capabilities(consumes_outbox=True)

    def __init__(self, scenario: Scenario, settings: Settings, stack: Stack) -> None:
        self.scenario = scenario

    def describe(self) -> dict[str, Any]:
        return {
            "outbox": OUTBOX,
            "finished_to": DONE,
            "read": "ORDER BY id LIMIT batch_size FOR UPDATE SKIP LOCKED",
            "finish": "delete-on-done, one transaction per batch",
            "inbox": self.capabilities.inbox_table,
            "consumers": [consumer_name(i) for i in range(self.scenario.consumers)],
        }

    async def prepare(self) -> None:
        return None

    async def wait_ready(self) -> None:
        return None  # a consumer is ready once its connection is open (its ready file)

    async def start_source(self) -> None:
        return None

    async def teardown(self) -> None:
        return None

    def backlog(self, scratch: Path) -> BacklogReader | None:
        return None  # no broker: the backlog waits in the outbox table


class PollSource:
    """Consumer side: one connection; a transaction from :meth:`fill` to :meth:`idle`."""

    def __init__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> None:
        self.settings = settings
        self.me = consumer_name(index)
        self.skipped = 0
        self.db_ops = 0
        self.decoded_bytes = 0
        self.reads = 0  # read statements, empty ones included
        self.reconnects = 0
        self._broken = False
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._open_tx = False
        self._finished: list[int] = []

    async def open(self) -> None:
        self._conn = await self._connect()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self.settings.pg_dsn, autocommit=True, application_name=CLAIMS_APPLICATION)

    async def _reconnect(self) -> None:
        """A new connection, retried while the server does not accept one yet."""
        old, self._conn, self._open_tx, self._finished = self._conn, None, False, []
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()
        deadline = time.monotonic() + RECONNECT_TIMEOUT_S
        while True:
            try:
                self._conn = await self._connect()
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(RECONNECT_PAUSE_S)
            else:
                self.reconnects += 1
                return

    def _lost(self, exc: psycopg.Error) -> None:
        """The connection broke: the transaction and its rows are PostgreSQL's again."""
        log.warning("%s: connection lost (%s); the open batch returns to the outbox", self.me, exc)
        self._broken, self._open_tx, self._finished = True, False, []

    async def fill(self, max_items: int, first_wait: float, flush_wait: float) -> list[Item]:
        """Up to ``max_items`` rows locked by this consumer's open transaction; [] (and no
        transaction) when every read in ``first_wait`` found nothing, or the connection broke."""
        if self._broken:
            await self._reconnect()
            self._broken = False
        if self._open_tx:  # never two batches in one transaction
            await self.idle()
        conn = self._conn
        assert conn is not None
        try:
            for attempt in range(read_plan(first_wait, flush_wait)):
                if attempt:
                    await asyncio.sleep(flush_wait)
                async with conn.pipeline():
                    await conn.execute(BEGIN)
                    cur = await conn.execute(READ, {"n": max_items})
                rows = await cur.fetchall()
                self.reads += 1
                if rows:
                    self._open_tx = True
                    return [Item(i, content, created.isoformat(), None) for i, content, created in rows]
                await conn.execute(ROLLBACK)
        except psycopg.OperationalError as exc:
            self._lost(exc)
        return []

    async def claim(self, batch: list[Item]) -> list[Item]:
        assert self._conn is not None
        try:
            mine, statements = await claim_batch(self._conn, batch, self.me, self.done)  # lost: finished at once
        except psycopg.OperationalError as exc:
            self._lost(exc)
            return []
        self.db_ops += statements
        self.skipped += len(batch) - len(mine)
        return mine

    def done(self, item: Item) -> None:
        self._finished.append(item.id)

    async def idle(self) -> None:
        """The batch is over: delete what was finished and commit (a row whose work call failed
        stays in the outbox, its inbox claim committed: the next reader loses the claim and
        deletes it, as a broker's consumer acks a lost claim)."""
        if not self._open_tx:
            return
        conn = self._conn
        assert conn is not None
        ids, self._finished = self._finished, []
        try:
            async with conn.pipeline():
                if ids:
                    await conn.execute(FINISH, {"ids": ids})
                await conn.execute(COMMIT)
        except psycopg.OperationalError as exc:
            self._lost(exc)
            return
        self._open_tx = False

    async def close(self) -> None:
        """Close the connection; an open transaction is rolled back with it (its rows return)."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
