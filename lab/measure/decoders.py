"""Decode-only slots: what decoding the WAL costs one slot, with nothing published and nothing worked.

Every direct reader owns a logical slot, and its walsender decodes the whole WAL for it whatever the
reader then keeps. To measure that cost alone, a run can add ``Scenario.decode_slots`` = k extra
slots on :data:`PUBLICATION`, whose row filter (``WHERE (id < 0)``) matches no row of ``messages``:
their walsenders read and decode every change and send nothing (pgoutput skips empty transactions),
and their readers, a few lines in the runner process, only answer keepalives, confirming everything.
Their walsenders' CPU, per slot, is in run.json's ``postgres_backends`` (:mod:`lab.measure.pgbackends`,
slots named :data:`SLOT_PREFIX`); the readers' own CPU is in ``runner``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg import sql

from lab.pg.pgoutput import protocol_version
from lab.pg.replication import ReplicationStream
from lab.pg.slots import drop_slots

log = logging.getLogger(__name__)

PUBLICATION = "decode_only_pub"
SLOT_PREFIX = "decode_only_"
TABLE = "messages"


async def ensure_publication(dsn: str) -> None:
    """Create :data:`PUBLICATION` (every change of ``messages`` decoded, no row published) once."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,))
        if await cur.fetchone() is None:
            await conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WHERE (id < 0)").format(
                sql.Identifier(PUBLICATION), sql.Identifier(TABLE)))


class DecodeOnly:
    """k decode-only slots and their readers, for the span of one run."""

    def __init__(self, dsn: str, slots: int) -> None:
        self.dsn = dsn
        self.names = [f"{SLOT_PREFIX}{i}" for i in range(slots)]
        self._streams: list[ReplicationStream] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Create the publication and the slots, and start streaming them."""
        if not self.names:
            return
        await ensure_publication(self.dsn)
        for name in self.names:
            stream = await ReplicationStream.connect(self.dsn)
            self._streams.append(stream)
            await stream.create_slot(name)
            await stream.start(name, PUBLICATION, protocol_version(stream.server_version_num), binary=True)
            stream.settled = lambda: True  # nothing is ever held: every keepalive confirms its position
            self._tasks.append(asyncio.create_task(self._pump(stream), name=f"decode-only {name}"))

    @staticmethod
    async def _pump(stream: ReplicationStream) -> None:
        while True:
            msg = await stream.read(1.0)
            if msg is not None:  # a row the filter let through, or a Relation: confirm it too
                stream.set_status(msg.wal_end)

    async def stop(self) -> None:
        """Stop the readers, close their streams and drop the slots (also a crashed run's)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for stream in self._streams:
            with contextlib.suppress(Exception):
                await stream.close()
        self._tasks, self._streams = [], []
        await asyncio.to_thread(drop_slots, self.dsn, SLOT_PREFIX)
