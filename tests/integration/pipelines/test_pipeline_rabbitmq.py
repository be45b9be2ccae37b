"""``rabbitmq`` on the real native stack: Debezium → quorum queue → N competing consumers.

Whole runs through :func:`lab.runner.run_scenario` at N = 1, 2, 4, one after the other, so
each run also proves the previous one left no slot, queue or Debezium behind that it would trip
over. Then the consumer half on its own, fed with hand-made envelopes: non-inserts, lost claims
and a redelivered id are acked at once and never worked, and nothing stays unacked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import orjson
import psycopg
import pytest

from lab.pipelines.rabbitmq import EXCHANGE, QUEUE, ROUTING_KEY, RabbitPipeline, RabbitSource
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from tests.integration.checks import queue_exists, scalar

pytestmark = pytest.mark.integration

M = 2000


def assert_clean(settings: Settings, stack: Any) -> None:
    slots = "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'dbz\\_%'"
    assert scalar(settings, slots) == 0
    assert stack.debezium["rabbitmq"].processes() == []
    assert not asyncio.run(queue_exists(settings, QUEUE))


# N = 4 by default, as every pipeline's own test (N = 2 runs under ha and in the smoke report); 1 and 2
# are the matrix's
@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.matrix), pytest.param(2, marks=pytest.mark.matrix), 4])
def test_every_message_is_worked_once_and_nothing_is_left(
    settings: Settings, stack: Any, n: int
) -> None:
    scenario = Scenario(pipeline="rabbitmq", consumers=n, messages=M, cooldown_s=0)
    r = asyncio.run(run_scenario(scenario, settings))
    assert r["success"], r["error"]
    c = r["counters"]
    assert c["sent"] == c["processed"] == c["work_calls"] == c["work_distinct"] == M
    assert c["inbox_rows"] == c["distinct_ids"] == M
    assert c["skipped"] == 0  # competing consumers: the queue hands each message to one of them
    assert c["db_ops"] >= M // 100
    assert c["decoded_bytes"] > M * 100  # the full envelope, not just the row
    # the claimed ids are exactly this run's rows, claimed under the consumers' names
    assert scalar(settings, "SELECT count(*) FROM inbox JOIN messages USING (id)") == M
    with psycopg.connect(settings.pg_dsn) as conn:
        claims = dict(conn.execute("SELECT consumer, count(*) FROM inbox GROUP BY 1").fetchall())
    # round robin within the prefetch window: every consumer gets some
    assert set(claims) == {f"dbz-quorum-{i}" for i in range(n)}
    assert 0 < c["claims_min"] <= M / n <= c["claims_max"]
    assert sorted(x["processed"] for x in r["consumers"]) == sorted(claims.values())
    s = r["pipeline_settings"]
    assert (s["exchange"], s["queue"], s["routing_key"], s["queue_type"], s["prefetch"]) == (
        "load-dbz", "load-dbz-quorum", "quorum", "quorum", 1000)
    assert s["debezium_sink"] == "rabbitmq"
    assert r["cpu_s"]["debezium"] > 0 and r["cpu_s"]["rabbitmq"] > 0 and r["cpu_s"]["consumers"] > 0
    assert_clean(settings, stack)


def envelope(op: str, row_id: int) -> bytes:
    row = {"id": row_id, "content": f"c{row_id}", "created_at": "2026-01-02T03:04:05.123456Z"}
    return orjson.dumps({"before": None if op == "c" else row, "after": None if op == "d" else row,
                         "source": {"table": "messages"}, "op": op, "ts_ms": 0})


async def _consumer_half(settings: Settings, stack: Any) -> None:
    base = 2_000_000_000  # ids far above any run's, removed again below
    scenario = Scenario(pipeline="rabbitmq", consumers=1, messages=10, cooldown_s=0)
    pipeline = RabbitPipeline(scenario, settings, stack)
    await pipeline.prepare()
    source = RabbitSource(scenario, settings, 0)
    dsn = settings.pg_dsn
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as db:
            await db.execute("DELETE FROM inbox WHERE id >= %s", [base])
            await db.execute(
                "INSERT INTO inbox (id, consumer) VALUES (%s, 'someone-else')", [base + 2]
            )
        await source.open()
        await pipeline.wait_ready()  # our one consumer is registered
        bodies = [envelope("c", base + 1), envelope("u", base + 1), envelope("c", base + 2),
                  envelope("d", base + 3), envelope("c", base + 3), envelope("c", base + 1)]
        async with await aio_pika.connect(settings.amqp_url) as conn:
            channel = await conn.channel(publisher_confirms=True)
            exchange = await channel.get_exchange(EXCHANGE)
            for body in bodies:
                await exchange.publish(
                    aio_pika.Message(body), routing_key=ROUTING_KEY, mandatory=True
                )
        batch: list[Any] = []
        while len(batch) < 4:
            batch += await source.fill(100, 1.0, 0.05)
        expected = [(base + i, f"c{base + i}") for i in (1, 2, 3, 1)]
        assert [(x.id, x.content) for x in batch] == expected
        assert batch[0].created_at == "2026-01-02T03:04:05.123456Z"
        assert source.decoded_bytes == sum(map(len, bodies))
        mine = await source.claim(batch)
        assert [x.id for x in mine] == [base + 1, base + 3]  # base+2 is taken; base+1 only once
        assert (source.skipped, source.db_ops) == (2, 1)
        for item in mine:
            source.done(item)
        assert await source.fill(100, 0.2, 0.05) == []
    finally:
        await source.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as db:
            cur = await db.execute(
                "SELECT id - %s, consumer FROM inbox WHERE id >= %s ORDER BY id", [base, base]
            )
            owners = await cur.fetchall()
            await db.execute("DELETE FROM inbox WHERE id >= %s", [base])
    assert owners == [(1, "dbz-quorum-0"), (2, "someone-else"), (3, "dbz-quorum-0")]
    # every delivery was acked: once the broker has removed our consumer (the same step returns
    # a departed consumer's unacked messages to the queue), nothing is back in the queue
    async with await aio_pika.connect(settings.amqp_url) as conn:
        channel = await conn.channel()
        for _ in range(100):
            declared = (await channel.declare_queue(QUEUE, passive=True)).declaration_result
            if declared.consumer_count == 0:
                break
            await asyncio.sleep(0.1)
        assert (declared.consumer_count, declared.message_count) == (0, 0)
    await pipeline.teardown()
    assert not await queue_exists(settings, QUEUE)


def test_consumer_acks_non_inserts_lost_claims_and_duplicates_at_once(
    settings: Settings, stack: Any
) -> None:
    asyncio.run(_consumer_half(settings, stack))
