"""The relay of ``wal-relay`` (:mod:`lab.pipelines.wal_relay`): the process's half, run by
``python -m lab.relay``. :class:`Relay` streams the one slot with :class:`RelayReader` (``wal``'s
reader on it), hands batches of rows over in the work table and confirms only what it handed over.

Faults: the relay outlives its walsender's termination and PostgreSQL's restart: its reader
(:class:`RelayReader`) and its hand-over connection connect again until :data:`RECONNECT_TIMEOUT_S`
has passed, and the slot streams again from its confirmed position, so what was streamed and not
yet handed over is streamed again (nothing lost; the copies are caught by the hand-over's ``ON
CONFLICT DO NOTHING`` and the inbox claim, :mod:`lab.pipelines.wal_relay`). A hand-over that
fails ends the stream at once (:meth:`RelayReader.let_go`), or a fast shutdown would wait for the
walsender. The work table is an ordinary table: it survives the restart. A consumer whose
connection broke exits and the lab replaces it (:mod:`lab.faults.supervision`); its open take
rolled back, so what it worked and had not committed is worked again: counted as duplicates.

Failover (the ``ha`` topology): the relay confirms its slot only behind hand-overs the standby
has flushed. ``synchronized_standby_slots`` keeps the walsender from sending a change the standby
lacks, but a hand-over is new WAL written after the decode, and the standby receives it
asynchronously: a slot confirmed as soon as the hand-over commits could be synced to the standby
past queued rows the standby never got, and a promotion after a crash would lose them. So under
``ha`` the positions the watermark resolves are held back (:meth:`RelayReader._report`); every
:data:`CONFIRM_EVERY_S` while some are held, one query on the hand-over connection
(:data:`STANDBY_FLUSH`) reads the server's WAL insert position, which is past every hand-over
committed so far, and the flushed position of the standbys the server names in
``synchronized_standby_slots`` (their physical slots' ``restart_lsn``, what the server's own
walsenders wait for); a position is confirmed once the standby has flushed the insert position
read after its hand-over (:func:`confirmable_behind`). A server that names no standby (the
promoted one) confirms at once. Only the slot's confirmation waits, never the hand-over: the
consumers see each row as soon as under the single topology, and the single topology runs no
extra statement. A reconnect of the stream forgets what was held (the hand-overs may be on a
server that is gone); the slot streams it again from its confirmed position, and it is handed over
again. After a promotion the relay's stream and hand-over connection reach the new primary through
the DSN's host list, and its slot is the synced copy.

Rejected: ``synchronous_standby_names`` with a per-transaction ``synchronous_commit`` on the
hand-over connection. Every hand-over would wait for the standby before any consumer can take
its rows (a commit waiting for its synchronous standby is not visible yet), which changes the
delivery latency being measured; the setting is the server's, ``pg_basebackup`` copies it to
the standby, where after a promotion every commit of that kind hangs until it is reset; and the
relay would still have to confirm only after the wait, which is what the deferred confirmation
does without slowing the hand-over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from lab.pg.replication import ReplicationStream
from lab.pipelines.base import Item, SharedResources
from lab.pipelines.wal import WalSource
from lab.pipelines.wal_relay import CHANNEL, QUEUE, RELAY_SLOT
from lab.scenario import Scenario
from lab.settings import Settings
from lab.workload.inbox import RELAY_APPLICATION

log = logging.getLogger(__name__)
# the relay retries a lost stream or hand-over connection this long before giving up: longer than
# PostgreSQL is away in a fault (a restart after 30 s in the full fault profile; a failover's stop
# and promotion, each bounded by 60 s)
RECONNECT_TIMEOUT_S = 180.0
RECONNECT_PAUSE_S = 0.2
# under ha, how often the relay reads the standby's flushed position while positions wait for it
CONFIRM_EVERY_S = 0.25


HAND_OVER = sql.SQL(
    "with handed as ("
    "insert into {q} (id, content, created_at) "
    "select * from unnest(%(ids)s::int[], %(contents)s::text[], %(created)s::timestamptz[]) "
    "on conflict do nothing returning 1) "
    "select count(*), pg_notify({ch}, '') from handed"
).format(q=sql.Identifier(QUEUE), ch=sql.Literal(CHANNEL))

# the WAL insert position (past every hand-over committed before it), the standbys the server's
# logical walsenders wait for (``synchronized_standby_slots``, plain slot names) and how many of
# them have a flushed position, and the lowest of those; LSNs as numbers
STANDBY_FLUSH = (
    "with standby as ("
    "select s.restart_lsn from unnest(string_to_array("
    "nullif(replace(current_setting('synchronized_standby_slots'), ' ', ''), ''), ',')) as n(name) "
    "left join pg_replication_slots s on s.slot_name = n.name and s.slot_type = 'physical') "
    "select (pg_current_wal_insert_lsn() - '0/0')::bigint, count(*), count(restart_lsn), "
    "(min(restart_lsn) - '0/0')::bigint from standby"
)


def hand_over_params(rows: list[tuple[int, str, datetime]]) -> dict[str, list[Any]]:
    """The :data:`HAND_OVER` parameters of decoded rows: one array per column."""
    return {"ids": [r[0] for r in rows], "contents": [r[1] for r in rows], "created": [r[2] for r in rows]}


def standby_flushed(named: int, known: int, lowest: int | None) -> int | None:
    """What the standbys have flushed, from :data:`STANDBY_FLUSH`'s counts: None when the server
    names no standby (nothing to wait for), 0 when one of those it names has no flushed position
    (missing or never streamed: wait), else the lowest flushed position."""
    if named == 0:
        return None
    if known < named or lowest is None:
        return 0
    return lowest


def confirmable_behind(pending: Sequence[tuple[int, int]], flushed: int | None) -> tuple[int | None, int]:
    """The slot position the relay may confirm and how many of ``pending`` that releases.

    ``pending``: (WAL insert position read after a hand-over committed, the slot position its
    watermark had resolved by then), both increasing. ``flushed``: the standbys' flushed position,
    None with no standby (everything is released). A position is confirmable once the standby
    has flushed the insert position read after it; the highest such one is returned (None: none).
    """
    upto: int | None = None
    n = 0
    for wal, position in pending:
        if flushed is not None and wal > flushed:
            break
        upto, n = position, n + 1
    return upto, n


class RelayReader(WalSource):
    """The relay's end of the slot: ``wal``'s reader on :data:`RELAY_SLOT`, which outlives
    PostgreSQL going away. A ``wal`` reader whose server is gone exits and the lab replaces it (a
    supervisor would); nothing replaces the relay, so it connects again until
    :data:`RECONNECT_TIMEOUT_S` has passed, and streams from the slot's confirmed position.

    ``behind_standby`` (the ``ha`` topology): resolved positions are held until
    :meth:`release` learns the standby flushed their hand-overs (module docstring)."""

    def __init__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> None:
        super().__init__(scenario, settings, index, run_dir=run_dir, shared=shared)
        self.behind_standby = settings.ha
        self._resolved = 0  # the highest position the watermark resolved (handed over)
        self._released = 0  # the highest position confirmed behind the standby
        self._pending: deque[tuple[int, int]] = deque()  # (WAL insert position, resolved position)

    @staticmethod
    def slot_for(index: int) -> str:
        return RELAY_SLOT

    @property
    def waiting(self) -> bool:
        """Positions were resolved that the slot may not confirm yet."""
        return self._resolved > self._released

    def _report(self, lsn: int | None) -> None:
        if not self.behind_standby:
            return super()._report(lsn)
        if lsn is not None and lsn > self._resolved:
            self._resolved = lsn
        return None

    def _settled(self) -> bool:
        """A keepalive's position may be confirmed: nothing read is unresolved and every
        resolved position is confirmed already (behind the standby)."""
        return self._marks.settled() and self._resolved <= self._released

    def release(self, wal: int, flushed: int | None) -> None:
        """Note the resolved position against the WAL insert position ``wal`` read after its
        hand-overs, and confirm what the standbys' ``flushed`` position covers; not while the
        stream is broken (the hand-overs held may be on a server that is gone)."""
        if self._broken is not None or self._stream is None:
            return
        if self._resolved > (self._pending[-1][1] if self._pending else self._released):
            self._pending.append((wal, self._resolved))
        upto, n = confirmable_behind(self._pending, flushed)
        for _ in range(n):
            self._pending.popleft()
        if upto is not None and upto > self._released:
            self._released = upto
            self._stream.set_status(upto)

    async def _start(self, *, create: bool) -> ReplicationStream:
        stream = await super()._start(create=create)
        if self.behind_standby:
            stream.settled = self._settled
        return stream

    async def let_go(self, exc: psycopg.Error) -> None:
        """End the stream now, its rows in hand not handed over (the server is going away): at a
        shutdown PostgreSQL waits for a logical walsender until its client confirmed all it was
        sent, which the relay cannot do before it hands those rows over; the next :meth:`fill`
        streams again from the confirmed position."""
        if self._broken is None and self._stream is not None:
            with contextlib.suppress(Exception):
                await self._stream.close()  # the confirmed position, then CopyDone: the walsender ends
            self._broken = exc

    async def _reconnect(self, exc: psycopg.Error) -> None:
        deadline = time.monotonic() + RECONNECT_TIMEOUT_S
        while True:
            try:
                await super()._reconnect(exc)
                break
            except psycopg.OperationalError as again:  # not up yet (restarting, not yet promoted)
                if time.monotonic() > deadline:
                    raise
                exc = again
                await asyncio.sleep(RECONNECT_PAUSE_S)
        # what was held for the standby is streamed again from the confirmed position
        self._pending.clear()
        self._resolved = self._released


class Relay:
    """Decode once, hand over in batches, confirm only what was handed over."""

    def __init__(self, scenario: Scenario, settings: Settings) -> None:
        self.scenario = scenario
        self.settings = settings
        self.reader = RelayReader(scenario, settings, 0)
        self.rows = 0  # rows decoded and handed over
        self.queued = 0  # of them, new in the queue (the rest were there already)
        self.statements = 0
        self.reconnects = 0  # hand-over connections opened again
        self.standby_polls = 0  # ha: reads of the standby's flushed position
        self._polled = 0.0  # monotonic
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def open(self) -> None:
        await self.reader.open()
        self._conn = await self._connect()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True,
                                                     application_name=RELAY_APPLICATION)

    async def step(self) -> int:
        """One batch: read (the consumers' batch size and waits), hand over, resolve, report."""
        s = self.scenario
        batch = await self.reader.fill(s.batch_size, s.poll_wait_ms / 1000, s.flush_wait_ms / 1000)
        if batch:
            await self.hand_over(batch)
        if self.reader.waiting and time.monotonic() - self._polled >= CONFIRM_EVERY_S:
            await self.confirm_behind_standby()
        await self.reader.idle()
        return len(batch)

    async def confirm_behind_standby(self) -> None:
        """Read the WAL insert position and the standbys' flushed one (:data:`STANDBY_FLUSH`) and
        release what they cover. A server gone ends the stream, as a failed hand-over does (a
        fast shutdown waits for the walsender otherwise)."""
        self._polled = time.monotonic()
        try:
            assert self._conn is not None
            row = await (await self._conn.execute(STANDBY_FLUSH)).fetchone()
        except psycopg.OperationalError as exc:
            log.warning("relay: reading the standby's position failed (%s); connecting again", exc)
            await self.reader.let_go(exc)
            await self._reopen()
            return
        assert row is not None
        self.standby_polls += 1
        self.reader.release(int(row[0]), standby_flushed(int(row[1]), int(row[2]), row[3]))

    async def _reopen(self) -> None:
        """Close the hand-over connection and try once to open it again (the next statement
        tries again if this failed)."""
        await asyncio.sleep(RECONNECT_PAUSE_S)
        with contextlib.suppress(Exception):
            await self._conn.close()  # type: ignore[union-attr]
        with contextlib.suppress(psycopg.OperationalError):
            self._conn = await self._connect()
            self.reconnects += 1

    async def hand_over(self, batch: list[Item]) -> None:
        decode = self.reader.decode_row
        params = hand_over_params([decode(item) for item in batch])
        deadline = time.monotonic() + RECONNECT_TIMEOUT_S
        while True:
            try:
                assert self._conn is not None
                cur = await self._conn.execute(HAND_OVER, params)
                row = await cur.fetchone()
                break
            except psycopg.OperationalError as exc:  # the server went away: the batch is not confirmed
                if time.monotonic() > deadline:
                    raise
                log.warning("relay: hand-over failed (%s); connecting again", exc)
                await self.reader.let_go(exc)  # a shutdown waits for the walsender otherwise
                await self._reopen()
        self.statements += 1
        self.rows += len(batch)
        self.queued += row[0] if row else 0
        done = self.reader.done
        for item in batch:  # durably queued: the watermark may now pass them
            done(item)

    def result(self, error: str | None) -> dict[str, Any]:
        return {"pid": os.getpid(), "rows": self.rows, "queued": self.queued, "statements": self.statements,
                "decoded_bytes": self.reader.decoded_bytes, "stream_reconnects": self.reader.reconnects,
                "hand_over_reconnects": self.reconnects, "standby_polls": self.standby_polls,
                "resumed": self.reader.resumed, "error": error}

    async def close(self) -> None:
        await self.reader.close()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
