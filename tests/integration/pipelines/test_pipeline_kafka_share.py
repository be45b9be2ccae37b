"""``kafka-share`` on the real native stack: Debezium → one one-partition topic → a share group of N.

A whole run through :func:`lab.runner.run_scenario` at N = 4 (N = 1 and 16 in the matrix): every
message worked once though all N consumers read the same partition, and no slot or topic is left.
Then the consumer half on its own against the broker, fed with hand-made envelopes: a record
whose work failed is released by its consumer and delivered again, to either member, until it is
worked; a non-insert is acknowledged without work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from lab.pipelines.kafka import TOPIC
from lab.pipelines.kafka_admin import partition_count
from lab.pipelines.kafka_share import KafkaSharePipeline, KafkaShareSource
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings

pytestmark = pytest.mark.integration

M = 2000
_admins: dict[str, AdminClient] = {}


def admin(settings: Settings) -> AdminClient:
    """One client per bootstrap, kept alive: a collected client never resolves its futures."""
    boot = settings.kafka_bootstrap
    if boot not in _admins:
        _admins[boot] = AdminClient({"bootstrap.servers": boot})
    return _admins[boot]


@pytest.fixture(scope="module", autouse=True)
def _drop_admins() -> Iterator[None]:
    yield
    _admins.clear()


def dbz_slots(settings: Settings) -> list[str]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'dbz\\_%'").fetchall()
    return [r[0] for r in rows]


def claims_by_consumer(settings: Settings) -> dict[str, int]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return dict(conn.execute("SELECT consumer, count(*) FROM inbox GROUP BY consumer").fetchall())


def topic_gone(settings: Settings, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while partition_count(admin(settings), TOPIC) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.matrix), 4,
                               pytest.param(16, marks=pytest.mark.matrix)])
def test_every_message_is_worked_once_and_nothing_is_left(stack: object, settings: Settings, n: int,
                                                          record_property: Any) -> None:
    scenario = Scenario(pipeline="kafka-share", consumers=n, messages=M, cooldown_s=0)
    r = asyncio.run(run_scenario(scenario, settings))
    assert r["success"], r["error"]
    c = r["counters"]
    assert c["sent"] == c["processed"] == c["work_calls"] == c["work_distinct"] == M
    assert c["inbox_rows"] == c["distinct_ids"] == M
    assert c["failures"] == 0
    assert c["skipped"] <= M // 100  # a lost claim needs a redelivery: none expected on a quiet run
    assert c["decoded_bytes"] > M * 200  # the full envelope
    claims = claims_by_consumer(settings)
    assert sum(claims.values()) == M
    assert set(claims) <= {f"dbz-kafka-share-{i}" for i in range(n)}
    record_property("claims", claims)
    s = r["pipeline_settings"]
    assert s["topic"] == TOPIC and s["partitions"] == 1  # one partition whatever N is
    assert s["group_type"] == "share" and s["group_id"].startswith("dbz-kafka-share-")
    assert s["group_config"] == {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "30000",
                                 "share.session.timeout.ms": "45000"}  # set on the group: faults depend on them
    assert all(s["group_config_applied"].get(k) == v for k, v in s["group_config"].items())  # and the broker has them
    assert s["consumer_config"]["share.acknowledgement.mode"] == "explicit"
    assert r["cpu_s"]["debezium"] > 0 and r["cpu_s"]["kafka"] > 0 and r["cpu_s"]["consumers"] > 0
    assert dbz_slots(settings) == []
    assert topic_gone(settings)
    # the run's share group went with it (not one empty group left per run): deleting it again finds none
    group = s["group_id"]
    with pytest.raises(KafkaException, match="GROUP_ID_NOT_FOUND"):
        admin(settings).delete_consumer_groups([group], request_timeout=10)[group].result()


def envelope(i: int, op: str = "c") -> bytes:
    after = None if op == "d" else {"id": i, "content": f"m{i}", "created_at": "2026-01-01T00:00:00Z"}
    return orjson.dumps({"op": op, "after": after})


async def _release_and_redeliver(settings: Settings, stack: object, run_dir: Path) -> None:
    """Two members; the first leaves one record's work undone: released, delivered again, worked once."""
    scenario = Scenario(pipeline="kafka-share", consumers=2, messages=20, cooldown_s=0)
    pipeline = KafkaSharePipeline(scenario, settings, stack)  # type: ignore[arg-type]
    await pipeline.prepare()
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE inbox")
        ids = [conn.execute("INSERT INTO messages (content) VALUES ('x') RETURNING id").fetchone()[0]
               for _ in range(20)]
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    producer.produce(TOPIC, envelope(0, "d"))
    for i in ids:
        producer.produce(TOPIC, envelope(i))
    producer.flush(10)
    sources = [KafkaShareSource(scenario, settings, i, run_dir=run_dir) for i in range(2)]
    worked: list[int] = []
    failed_once: int | None = None
    try:
        await asyncio.gather(*(s.open() for s in sources))
        deadline = time.monotonic() + 60
        while len(worked) < len(ids) and time.monotonic() < deadline:
            for s in sources:
                batch = await s.fill(100, 0.2, 0.05)
                for item in await s.claim(batch) if batch else []:
                    if failed_once is None:  # this work call "failed": no done()
                        failed_once = item.id
                        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                            conn.execute("DELETE FROM inbox WHERE id = %s", [item.id])  # as if never claimed
                        continue
                    worked.append(item.id)
                    s.done(item)
                await s.idle()
        assert failed_once is not None
        assert sorted(worked) == sorted(ids)  # the failed one came back and was worked, once
        assert sum(s.skipped for s in sources) == 0
    finally:
        for s in sources:
            await s.close()
        await pipeline.teardown()


def test_a_released_record_is_delivered_again_and_worked_once(
    stack: object, settings: Settings, tmp_path: Path
) -> None:
    asyncio.run(_release_and_redeliver(settings, stack, tmp_path))
