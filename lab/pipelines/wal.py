"""``wal``: every consumer reads its own logical replication slot.

Each of the N consumers creates ``load_test_slot_<i>`` (pgoutput, no snapshot), streams the
publication ``load_test_pub`` with protocol 4 and binary tuples, decodes every Insert by column
name and claims batches of rows by WAL position in ``inbox_wal``. Every reader sees every row,
so exactly (N−1)·M claims are lost (``skipped``) and N·M/100 claim statements run.

Positions are confirmed through a :class:`~lab.workload.watermark.Watermark` over the stream order
(the reference confirmed each position as it went and could jump over unfinished work): the
slot's confirmed LSN only moves to the end of a transaction once every row streamed up to it was
worked on or lost its claim. Stream order is used rather than LSNs because transactions arrive in
commit order, so a Begin or an Insert LSN can be lower than
one already seen; only commit LSNs are what a slot's restart point is made of.

Per-row work is only what claiming needs (the reference study decodes every row; here only won rows
are): an Insert is kept as its raw payload and position, and its columns (by name, the
contract) are decoded after the claim, for the rows this reader won. With N readers each row is
claimed by one and lost by N-1, so the losers never decode it; Begin messages are not decoded at
all and a Commit only for its end LSN. Other messages (Relation, ...) go through the decoder,
which keeps the relations that the won rows are decoded with. Measured in docs/benchmarks.md.

Faults: a reader resumes. :meth:`WalSource.open` creates its slot only when it does
not exist yet (the runner drops every ``load_test_slot`` before a run), so a replacement
started with the same index after a kill streams the dead reader's slot from its confirmed
position, once the dead walsender has let go of it. When the stream breaks (its walsender
terminated), :meth:`WalSource.fill` reconnects and starts the slot again: the server resends
every transaction after the slot's confirmed position. Rows of those that this slot had claimed
already are claimed again (``inbox_wal`` returns a slot's own claims) and worked again: at-least-once,
the duplicates are counted by the runner. The watermark carries on over the new stream (new rows
get new sequence numbers; an older commit LSN never moves the reported position back).

The claim table: with ``Scenario.claim_retention`` ``behind-slots``, reader 0 also runs the pruner
(:class:`lab.workload.retention.ClaimPruner`) over the run's N slots; with ``never`` (the default)
nothing else runs beside the readers. :meth:`WalPipeline.prepare` empties the pruner's ledger and
:meth:`WalPipeline.teardown` reads what the table looked like at the run's end
(``pipeline_settings.claim_table``: rows left and at most, claims pruned).
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

from lab.pg.messages import Insert
from lab.pg.pgoutput import Decoder, commit_end_lsn, protocol_version
from lab.pg.replication import ReplicationStream
from lab.pg.slots import drop_slots, wait_streaming
from lab.pipelines.base import BacklogReader, Capabilities, Item, SharedResources
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import Stack
from lab.workload import retention
from lab.workload.inbox import CLAIMS_APPLICATION, claim_lsns
from lab.workload.retention import CREATE_LEDGER, LEDGER, ClaimPruner
from lab.workload.watermark import SlotWatermark

log = logging.getLogger(__name__)
SLOT_PREFIX = "load_test_slot"
PUBLICATION = "load_test_pub"
RESUME_TIMEOUT_S = 30.0  # a dead reader's walsender lets go of the slot within this
RESUME_PAUSE_S = 0.2
SLOT_HOLDER_SQL = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s"


def slot_name(index: int) -> str:
    return f"{SLOT_PREFIX}_{index}"


class WalPipeline:
    """Runner side: drop stale slots, gate on every slot streaming, drop them afterwards."""

    name: ClassVar[str] = "wal"
    capabilities: ClassVar[Capabilities] = Capabilities(fan_out=True, inbox_table="inbox_wal", consumer_slots=True)

    def __init__(self, scenario: Scenario, settings: Settings, stack: Stack) -> None:
        self.scenario = scenario
        self.settings = settings
        self.claim_table: dict[str, Any] | None = None  # read at teardown

    def describe(self) -> dict[str, Any]:
        return {
            "slots": [slot_name(i) for i in range(self.scenario.consumers)],
            "publication": PUBLICATION,
            "plugin": "pgoutput",
            "binary": True,
            "inbox": self.capabilities.inbox_table,
            "claim_retention": retention.describe(self.scenario.claim_retention),
            "claim_table": self.claim_table,
        }

    async def prepare(self) -> None:
        await asyncio.to_thread(drop_slots, self.settings.pg_dsn, SLOT_PREFIX)
        async with await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True) as conn:
            await conn.execute(CREATE_LEDGER)  # a server whose schema predates it
            await conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(LEDGER)))

    async def wait_ready(self) -> None:
        for i in range(self.scenario.consumers):
            await asyncio.to_thread(
                wait_streaming, self.settings.pg_dsn, slot_name(i),
                timeout=self.scenario.ready_timeout_s,
            )

    async def start_source(self) -> None:
        return None

    async def teardown(self) -> None:
        try:
            async with await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True) as conn:
                self.claim_table = await retention.table_state(conn)
        except Exception as exc:  # a reading: never the run's failure
            log.warning("claim table not read: %s", " ".join(str(exc).split()))
        await asyncio.to_thread(drop_slots, self.settings.pg_dsn, SLOT_PREFIX)

    def backlog(self, scratch: Path) -> BacklogReader | None:
        return None  # no broker: the backlog is the slots' WAL, which every fault run samples


class WalSource:
    """Consumer side: one slot, one replication connection, one claim connection."""

    def __init__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> None:
        self.settings = settings
        self.slot = self.slot_for(index)
        self.publication = PUBLICATION  # what the slot streams (wal-filtered: this reader's share)
        self.skipped = 0
        self.db_ops = 0
        self.decoded_bytes = 0
        self._stream: ReplicationStream | None = None
        self._claims: psycopg.AsyncConnection[Any] | None = None
        self._decoder = Decoder()
        self._marks = SlotWatermark()  # over stream sequence numbers
        self._sent_lsn = 0
        self.reconnects = 0  # streams restarted after the server ended one (a fault run)
        self.resumed = False  # open() found the slot: this reader replaces one that died
        self._broken: psycopg.Error | None = None  # a status update found the stream gone
        self.pruner = (ClaimPruner(settings.pg_dsn, [self.slot_for(i) for i in range(scenario.consumers)])
                       if scenario.claim_retention == "behind-slots" and index == 0 else None)

    @staticmethod
    def slot_for(index: int) -> str:
        """The slot this reader streams: ``load_test_slot_<index>``."""
        return slot_name(index)

    async def open(self) -> None:
        self._claims = await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True,
                                                             application_name=CLAIMS_APPLICATION)
        cur = await self._claims.execute(SLOT_HOLDER_SQL, (self.slot,))
        self.resumed = await cur.fetchone() is not None  # a replacement of a killed reader
        self._stream = await self._start(create=not self.resumed)
        if self.pruner is not None:
            await self.pruner.start()

    async def _start(self, *, create: bool) -> ReplicationStream:
        """Connect and stream the slot (created first if ``create``), retrying while another
        walsender still holds it (a killed reader's, or one being terminated)."""
        deadline = time.monotonic() + RESUME_TIMEOUT_S
        while True:
            stream = await ReplicationStream.connect(self.settings.pg_dsn)
            try:
                if create:
                    await stream.create_slot(self.slot, failover=self.settings.ha)
                    create = False
                await stream.start(self.slot, self.publication, protocol_version(stream.server_version_num),
                                   binary=True)
                stream.settled = self._marks.settled  # a shutdown's last WAL is confirmed when idle
                if self._stream is not None:  # carry the reported position over
                    stream.set_status(self._stream.status_lsn)
                return stream
            except psycopg.errors.ObjectInUse:
                await stream.close()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(RESUME_PAUSE_S)

    async def _reconnect(self, exc: psycopg.Error) -> None:
        log.warning("%s: replication stream ended (%s); reconnecting", self.slot, exc)
        old = self._stream
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()
        self._stream = await self._start(create=False)
        self._broken = None
        self._sent_lsn = 0  # the new walsender has not heard our position yet
        self.reconnects += 1

    async def fill(self, max_items: int, first_wait: float, flush_wait: float) -> list[Item]:
        """Up to ``max_items`` rows; after a broken stream, the rows read before it broke (they
        are committed rows: claimed and worked as usual) and a new stream for the next call."""
        batch: list[Item] = []
        if self._broken is not None:
            await self._reconnect(self._broken)
        try:
            await self._fill(batch, max_items, first_wait, flush_wait)
        except psycopg.OperationalError as exc:  # the walsender is gone (terminated, timed out)
            await self._reconnect(exc)
        return batch

    async def _fill(self, batch: list[Item], max_items: int, first_wait: float, flush_wait: float) -> None:
        assert self._stream is not None
        read, decode, marks, report = self._stream.read, self._decoder.decode, self._marks, self._report
        while len(batch) < max_items:
            x = await read(flush_wait if batch else first_wait)
            if x is None:
                return
            payload = x.payload
            self.decoded_bytes += len(payload)
            kind = payload[0]
            if kind == 0x49:  # 'I': decoded only if this reader wins its claim
                batch.append(Item(0, "", "", (x.data_start, marks.row(), payload)))
            elif kind == 0x43:  # 'C'
                if (lsn := marks.passed(commit_end_lsn(payload))) is not None:
                    report(lsn)
            else:
                marks.passed()
                if kind != 0x42:  # not 'B': Relation and the rest keep the decoder's state
                    decode(payload)

    async def claim(self, batch: list[Item]) -> list[Item]:
        assert self._claims is not None
        self.db_ops += 1
        won = await claim_lsns(self._claims, [it.pos[0] for it in batch], self.slot)
        mine = [batch[i] for i in won]
        for item in mine:  # the won rows' columns (a sharded reader decoded them already)
            if not item.created_at:
                self._decode_row(item)
        if len(mine) < len(batch):
            owned = set(won)
            for i, item in enumerate(batch):
                if i not in owned:
                    self.skipped += 1
                    self._report(self._marks.resolve(item.pos[1]))
        return mine

    def _decode_row(self, item: Item) -> None:
        """Fill ``item``'s columns, by name, from the Insert message kept in its position."""
        item.id, item.content, created_at = self.decode_row(item)
        item.created_at = created_at.isoformat()

    def decode_row(self, item: Item) -> tuple[int, str, datetime]:
        """The row (id, content, created_at) of the Insert message kept in ``item``'s position,
        its columns found by name in the relation the stream sent before it."""
        msg = self._decoder.decode(item.pos[2])
        assert type(msg) is Insert
        row, idx = msg.new, msg.relation.index
        return row[idx["id"]], row[idx["content"]], row[idx["created_at"]]  # type: ignore[return-value]

    def done(self, item: Item) -> None:
        self._report(self._marks.resolve(item.pos[1]))

    def _report(self, lsn: int | None) -> None:
        """Move the slot's status to the newest commit with nothing unresolved before it."""
        if lsn is not None:
            assert self._stream is not None
            self._stream.set_status(lsn)

    async def idle(self) -> None:
        stream = self._stream
        if stream is not None and stream.status_lsn > self._sent_lsn and self._broken is None:
            try:
                await stream.send_status()
                self._sent_lsn = stream.status_lsn
            except (psycopg.Error, RuntimeError) as exc:  # gone: the next fill reconnects
                self._broken = exc if isinstance(exc, psycopg.Error) else psycopg.OperationalError(str(exc))

    async def close(self) -> None:
        if self.pruner is not None:
            with contextlib.suppress(Exception):
                await self.pruner.stop()
        for closer in (self._stream, self._claims):
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer.close()
