"""lab.pg.replication.ReplicationStream against a real PostgreSQL 18.

Runs on the session stack's PostgreSQL (``messages`` and ``load_test_pub`` come from its
schema). Every test uses a slot of its own and drops it; the rows the module inserts are
deleted at the end.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Iterator

import psycopg
import pytest
import uvloop

from lab.pg.messages import Begin, Commit, Insert
from lab.pg.pgoutput import Decoder
from lab.pg.replication import ReplicationStream
from lab.pg.walstream import parse_lsn
from lab.settings import Settings

pytestmark = pytest.mark.integration

PUBLICATION = "load_test_pub"
# the reference study: the slot is held by a walsender that pg_stat_replication reports as streaming.
STREAMING = """
    SELECT count(*) > 0 FROM pg_replication_slots AS s
    WHERE s.slot_name = %s AND s.active_pid IS NOT NULL AND s.restart_lsn IS NOT NULL
      AND EXISTS (SELECT FROM pg_stat_replication AS r
                  WHERE r.pid = s.active_pid AND r.state = 'streaming')
"""
SLOT = """
    SELECT s.active, s.active_pid, s.confirmed_flush_lsn::text, r.flush_lsn::text
    FROM pg_replication_slots AS s LEFT JOIN pg_stat_replication AS r ON r.pid = s.active_pid
    WHERE s.slot_name = %s
"""

Admin = psycopg.AsyncConnection[tuple[object, ...]]


@pytest.fixture(scope="module")
def dsn(stack: object, settings: Settings) -> Iterator[str]:
    """The session PostgreSQL's DSN; rows inserted by the module are deleted afterwards."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        before = conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0]  # type: ignore[index]
    yield settings.pg_dsn
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM messages WHERE id > %s", [before])


@pytest.fixture
def slot(dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A slot name for one test; the slot is dropped afterwards, whatever happened."""
    yield (name := re.sub(r"[^a-z0-9_]", "_", f"lab_test_{request.node.name[5:]}")[:63])
    with psycopg.connect(dsn, autocommit=True) as conn:
        where = " FROM pg_replication_slots WHERE slot_name = %s"
        conn.execute("SELECT pg_terminate_backend(active_pid)" + where, [name])
        for _ in range(50):
            try:
                conn.execute("SELECT pg_drop_replication_slot(slot_name)" + where, [name])
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.1)


async def until(check: Callable[[], Awaitable[bool]], what: str, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.1)


async def slot_state(admin: Admin, slot: str) -> tuple[bool, int | None, int, int | None]:
    """(active, active_pid, confirmed_flush_lsn, pg_stat_replication.flush_lsn)."""
    active, pid, confirmed, flushed = await (await admin.execute(SLOT, [slot])).fetchone()  # type: ignore[misc]
    return active, pid, parse_lsn(confirmed), parse_lsn(flushed) if flushed else None  # type: ignore[arg-type,return-value]


async def streaming(admin: Admin, slot: str) -> None:
    async def check() -> bool:
        return (await (await admin.execute(STREAMING, [slot])).fetchone()) == (True,)

    await until(check, f"slot {slot} is streaming")


async def insert(admin: Admin, contents: list[str]) -> list[tuple[object, ...]]:
    """One autocommit INSERT ... RETURNING per row, as the web service does."""
    rows = []
    for content in contents:
        cur = await admin.execute(
            "INSERT INTO messages (content) VALUES (%s) RETURNING id, content, created_at",
            [content],
        )
        rows.append(await cur.fetchone())
    return rows  # type: ignore[return-value]


async def read_commit(stream: ReplicationStream) -> int:
    """Read up to the next Commit; its end LSN."""
    decoder = Decoder()
    while True:
        frame = await stream.read(timeout=10)
        assert frame is not None
        if isinstance(msg := decoder.decode(frame.payload), Commit):
            return msg.end_lsn


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_streams_500_inserts_in_order_and_confirms(dsn: str, slot: str, loop: str) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
            stream = await ReplicationStream.connect(dsn)
            assert stream.server_version_num >= 180000
            consistent = await stream.create_slot(slot)
            assert (await slot_state(admin, slot))[::2] == (False, consistent)
            await stream.start(slot, PUBLICATION)  # proto 4 (from the server version), binary
            await streaming(admin, slot)

            written = await insert(admin, [f"message {i}" for i in range(500)])
            decoder, got, last, msg = Decoder(), [], 0, None
            while len(got) < 500 or not isinstance(msg, Commit):
                frame = await stream.read(timeout=30)
                assert frame is not None, f"stream stalled after {len(got)} inserts"
                msg = decoder.decode(frame.payload)
                if isinstance(msg, Insert):
                    got.append((frame.data_start, *msg.new))
                elif isinstance(msg, Begin):
                    assert msg.final_lsn > last
                stream.set_status(frame.wal_end)
                last = max(last, frame.wal_end)
            assert [row[1:] for row in got] == written  # id, content, created_at; in commit order
            lsns = [row[0] for row in got]
            assert lsns == sorted(set(lsns)) and lsns[0] >= consistent  # one position per row
            assert await stream.read(timeout=0.2) is None  # nothing more: a timeout, no error

            await stream.send_status()

            async def confirmed() -> bool:
                return (await slot_state(admin, slot))[2] >= last

            await until(confirmed, "confirmed_flush_lsn reaches the last commit")
            active, _, confirmed_lsn, flushed = await slot_state(admin, slot)
            assert active and confirmed_lsn == flushed == stream.status_lsn == last

            await stream.close()  # CopyDone; the walsender exits and releases the slot

            async def released() -> bool:
                return not (await slot_state(admin, slot))[0]

            await until(released, "the slot is inactive")
            assert stream.conn.closed and (await slot_state(admin, slot))[2] == last

    (uvloop.run if loop == "uvloop" else asyncio.run)(scenario())


def test_timeout_and_cancelled_read_lose_nothing(dsn: str, slot: str) -> None:
    """the reference study: a read that times out (or is cancelled) leaves the data for the next."""

    async def scenario() -> None:
        admin = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with admin, await ReplicationStream.connect(dsn) as stream:
            await stream.create_slot(slot)
            await stream.start(slot, [PUBLICATION])
            await streaming(admin, slot)
            assert await stream.read(timeout=0.3) is None
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(stream.read(timeout=60), 0.3)

            pending = asyncio.ensure_future(stream.read(timeout=60))  # waiting as the row comes
            ((row_id, _, _),) = await insert(admin, ["after the timeouts"])
            decoder = Decoder()
            first = await pending
            assert first is not None and isinstance(decoder.decode(first.payload), Begin)
            kinds = []
            while (frame := await stream.read(timeout=5)) is not None:
                msg = decoder.decode(frame.payload)
                kinds.append(type(msg).__name__)
                if isinstance(msg, Insert):
                    assert (msg["id"], msg["content"]) == (row_id, "after the timeouts")
            assert kinds == ["Relation", "Insert", "Commit"]

    asyncio.run(scenario())


@pytest.mark.parametrize("proto_version", [1, 4])
def test_keepalive_replies_keep_the_walsender(dsn: str, slot: str, proto_version: int) -> None:
    """wal_sender_timeout=1s and no periodic status: only keepalive replies keep it alive."""

    async def scenario() -> None:
        admin = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        stream = await ReplicationStream.connect(
            dsn, status_interval=3600, options="-c wal_sender_timeout=1s"
        )
        async with admin, stream:
            await stream.create_slot(slot)
            await stream.start(slot, PUBLICATION, proto_version, binary=proto_version > 1)
            await streaming(admin, slot)
            pid = (await slot_state(admin, slot))[1]
            assert await stream.read(timeout=3.0) is None  # 3 x wal_sender_timeout
            await insert(admin, ["still connected"])
            assert await read_commit(stream) > 0
            assert (await slot_state(admin, slot))[1] == pid  # the same walsender all along

    asyncio.run(scenario())


@pytest.mark.parametrize("settled", [True, False])
def test_a_settled_reader_confirms_what_a_keepalive_reports(dsn: str, slot: str, settled: bool) -> None:
    """Past the reader's last commit the server writes WAL none of its changes lie in (here a
    transactional message the stream did not ask for); a keepalive reports that position. A
    reader whose owner says it is settled confirms it (a fast shutdown of the server waits for
    exactly that); one that still holds rows stays at its last commit."""

    async def scenario() -> None:
        admin = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with admin, await ReplicationStream.connect(dsn, status_interval=3600) as stream:
            await stream.create_slot(slot)
            await stream.start(slot, PUBLICATION)
            await streaming(admin, slot)
            await insert(admin, ["before the unpublished WAL"])
            stream.set_status(end := await read_commit(stream))
            stream.settled = lambda: settled
            cur = await admin.execute("SELECT pg_logical_emit_message(true, 'lab-test', 'not published')::text")
            unpublished = parse_lsn((await cur.fetchone())[0])  # type: ignore[index]
            deadline = time.monotonic() + (10 if settled else 2)
            while stream.status_lsn <= unpublished and time.monotonic() < deadline:
                await stream.send_status(reply=True)  # the server answers with a keepalive
                assert await stream.read(timeout=0.3) is None  # an empty transaction is not sent
            await stream.send_status()

            async def reported() -> bool:
                return (await slot_state(admin, slot))[2] == stream.status_lsn

            await until(reported, "the slot confirms the reader's status")
            confirmed = (await slot_state(admin, slot))[2]
            if settled:
                assert confirmed > unpublished
            else:
                assert confirmed == end

    asyncio.run(scenario())


def test_periodic_status_confirms_without_send_status(dsn: str, slot: str) -> None:
    async def scenario() -> None:
        admin = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with admin, await ReplicationStream.connect(dsn, status_interval=0.5) as stream:
            await stream.create_slot(slot)
            await stream.start(slot, PUBLICATION)
            await streaming(admin, slot)
            await insert(admin, ["confirmed by the timer"])
            stream.set_status(end := await read_commit(stream))

            async def confirmed() -> bool:
                return (await slot_state(admin, slot))[2] == end

            await until(confirmed, "the timer's status update arrives", limit=10)

    asyncio.run(scenario())


def test_drop_slot_from_a_replication_connection(dsn: str, slot: str) -> None:
    async def scenario() -> None:
        async with await ReplicationStream.connect(dsn) as stream:
            await stream.create_slot(slot)
            await stream.drop_slot(slot)
        async with await psycopg.AsyncConnection.connect(dsn) as admin:
            cur = await admin.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", [slot]
            )
            assert await cur.fetchone() == (0,)

    asyncio.run(scenario())
