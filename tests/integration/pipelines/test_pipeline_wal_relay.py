"""``wal-relay`` on the real native stack.

Whole runs through :func:`lab.runner.run_scenario` (N = 4 in the default tier, 1 and 16 in the
matrix), and the two halves on their own: a relay that dies before it confirmed what it handed over
loses nothing, and the copies its replacement hands over again are caught by the inbox claim; a
consumer that dies mid-batch gives its rows back to the queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from lab.pipelines.relay_stream import Relay
from lab.pipelines.wal_relay import RELAY_SLOT, RelayPipeline, RelaySource
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from tests.integration.checks import scalar

pytestmark = pytest.mark.integration

M = 2000
OUR_SLOTS = "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'load\\_test\\_slot%'"


def run(settings: Settings, consumers: int) -> dict[str, Any]:
    scenario = Scenario(pipeline="wal-relay", consumers=consumers, messages=M, cooldown_s=0)
    return asyncio.run(run_scenario(scenario, settings))


@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.matrix), 4,
                               pytest.param(16, marks=pytest.mark.matrix)])
def test_a_run_delivers_every_message_once_and_leaves_nothing(settings: Settings, stack: object, n: int) -> None:
    result = run(settings, n)
    assert result["success"], result["error"]
    c = result["counters"]
    assert c["inbox_rows"] == c["distinct_ids"] == M and c["skipped"] == 0
    assert result["cpu_s"]["relay"] > 0  # its own participant
    relay = result["helpers"]["relay"]
    assert relay["error"] is None and relay["rows"] == relay["queued"] == M
    assert 0 < relay["statements"] <= M
    queue = result["pipeline_settings"]["queue"]
    assert queue["inserted"] == queue["deleted"] == M and queue["rows_left"] == 0
    assert result["slots"][RELAY_SLOT]["total_txns"] >= M  # one slot, decoded once
    assert list(result["slots"]) == [RELAY_SLOT]
    assert result["postgres_backends"]["processes"]["relay"] == 1
    assert scalar(settings, "SELECT count(*) FROM relay_queue") == 0
    assert scalar(settings, OUR_SLOTS) == 0


async def _insert(conn: psycopg.AsyncConnection[Any], n: int) -> list[int]:
    ids = []
    for i in range(n):
        cur = await conn.execute("INSERT INTO messages (content) VALUES (%s) RETURNING id", [f"m{i}"])
        row = await cur.fetchone()
        assert row is not None
        ids.append(row[0])
    return ids


async def _hand_over(relay: Relay, n: int) -> int:
    """Read and hand over ``n`` rows without reporting a position to the server."""
    got = 0
    for _ in range(50):
        batch = await relay.reader.fill(100, 0.5, 0.1)
        if batch:
            await relay.hand_over(batch)
            got += len(batch)
        if got >= n:
            break
    return got


async def _take_all(source: RelaySource, expect: int) -> tuple[list[int], int]:
    """Take, claim and commit until ``expect`` rows were taken; the ids won and the rows taken."""
    won, taken = [], 0
    for _ in range(50):
        batch = await source.fill(100, 0.5, 0.05)
        taken += len(batch)
        won += [item.id for item in await source.claim(batch)]
        await source.idle()
        if taken >= expect:
            break
    return won, taken


async def _relay_crash(settings: Settings, stack: object) -> None:
    scenario = Scenario(pipeline="wal-relay", consumers=1, messages=20, cooldown_s=0)
    pipeline = RelayPipeline(scenario, settings, stack)  # type: ignore[arg-type]
    await pipeline.prepare()
    first, second = Relay(scenario, settings), Relay(scenario, settings)
    source = RelaySource(scenario, settings, 0)
    try:
        async with await psycopg.AsyncConnection.connect(settings.pg_dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE inbox, messages")
            await first.open()
            await source.open()
            await pipeline.wait_ready()
            ids = await _insert(conn, 20)
            assert await _hand_over(first, 20) == 20
            won, _ = await _take_all(source, 20)
            assert sorted(won) == ids
            # the relay dies: its connections end without another status update
            assert first.reader._stream is not None and first._conn is not None
            await first.reader._stream.conn.close()
            await first._conn.close()
            await first.close()
            await second.open()  # resumes the slot from its confirmed position
            assert second.reader.resumed
            assert await _hand_over(second, 20) == 20  # the same rows again: nothing was confirmed
            again, taken = await _take_all(source, 20)
            assert (again, taken, source.skipped) == ([], 20, 20)  # every copy caught by the inbox claim
            assert await (await conn.execute("SELECT count(*) FROM inbox")).fetchone() == (20,)
            assert await (await conn.execute("SELECT count(*) FROM relay_queue")).fetchone() == (0,)
    finally:
        await source.close()
        await second.close()
        await first.close()
        await pipeline.teardown()
    assert scalar(settings, OUR_SLOTS) == 0


def test_a_relay_crash_loses_nothing_and_its_copies_are_caught(settings: Settings, stack: object) -> None:
    asyncio.run(_relay_crash(settings, stack))


async def _consumer_death(settings: Settings, stack: object) -> None:
    scenario = Scenario(pipeline="wal-relay", consumers=2, messages=30, cooldown_s=0)
    pipeline = RelayPipeline(scenario, settings, stack)  # type: ignore[arg-type]
    await pipeline.prepare()
    relay = Relay(scenario, settings)
    dying, other = RelaySource(scenario, settings, 0), RelaySource(scenario, settings, 1)
    try:
        async with await psycopg.AsyncConnection.connect(settings.pg_dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE inbox, messages")
            await relay.open()
            await pipeline.wait_ready()
            for s in (dying, other):
                await s.open()
            ids = await _insert(conn, 30)
            assert await _hand_over(relay, 30) == 30
            batch = await dying.fill(10, 0.5, 0.05)
            held = [item.id for item in await dying.claim(batch)]
            assert held == ids[:10]  # in id order
            rest, _ = await _take_all(other, 20)  # the held rows are skipped, not waited for
            assert sorted(rest) == ids[10:]
            await dying.close()  # dies mid-batch: its take and its claims roll back
            back, _ = await _take_all(other, 10)
            assert sorted(back) == held and other.skipped == 0
            assert await (await conn.execute("SELECT count(*) FROM inbox WHERE consumer = 'relay-1'")
                          ).fetchone() == (30,)
    finally:
        for s in (dying, other):
            await s.close()
        await relay.close()
        await pipeline.teardown()


def test_a_consumer_that_dies_mid_batch_gives_its_rows_back(settings: Settings, stack: object) -> None:
    asyncio.run(_consumer_death(settings, stack))
