"""``kafka`` on the real native stack: Debezium → one topic with 2N partitions → a group of N.

Whole runs through :func:`lab.runner.run_scenario` at N = 1, 2, 4, one after the other, so each
run also proves that the previous one left no slot, topic or group member behind and that the
topic is recreated cleanly. A run where a third consumer process (the same ``lab.consumer``
loop) joins the group while the stream drains shows that a rebalance neither loses nor repeats
work. Then the consumer half on its own, fed with hand-made envelopes: a non-insert and a lost
claim are acknowledged without work, and the committed offsets stop at unfinished work.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import psycopg
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from lab.pipelines.kafka import TOPIC, KafkaPipeline, KafkaSource
from lab.pipelines.kafka_admin import partition_count
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from tests.conftest import lab_env

pytestmark = pytest.mark.integration

M = 2000
REFERENCE_CONFIG = {  # the reference study
    "auto.offset.reset": "earliest",
    "enable.auto.commit": True,
    "enable.auto.offset.store": False,
    "allow.auto.create.topics": False,
    "partition.assignment.strategy": "cooperative-sticky",
}


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
    _admins.clear()  # before the session's stack goes down


def dbz_slots(settings: Settings) -> list[str]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT slot_name FROM pg_replication_slots "
                            "WHERE slot_name LIKE 'dbz\\_%'").fetchall()
    return [r[0] for r in rows]


def claims_by_consumer(settings: Settings) -> dict[str, int]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT consumer, count(*) FROM inbox GROUP BY consumer").fetchall()
    return dict(rows)


def topic_gone(settings: Settings, timeout: float = 30) -> bool:
    """Absent from cluster-wide metadata (never asked by name: the broker auto-creates)."""
    a = admin(settings)
    deadline = time.monotonic() + timeout
    while partition_count(a, TOPIC) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def group_members(settings: Settings, group: str) -> int:
    desc = admin(settings).describe_consumer_groups([group], request_timeout=10)[group].result(30)
    return len(desc.members)


def listed_groups(settings: Settings) -> set[str]:
    return {g.group_id for g in admin(settings).list_consumer_groups().result(30).valid}


def run(settings: Settings, progress: Any = None, **kw: Any) -> dict[str, Any]:
    scenario = Scenario(**{"pipeline": "kafka", "messages": M, "cooldown_s": 0, **kw})
    return asyncio.run(run_scenario(scenario, settings, progress=progress))


class Runs(dict[int, dict[str, Any]]):
    """One run per N, made when a test first asks for it (so a tier that skips N = 1 does not pay
    for its run); what each left behind is read before the next one starts."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def __missing__(self, n: int) -> dict[str, Any]:
        r = run(self.settings, consumers=n)
        group = r["pipeline_settings"]["group_id"]
        self[n] = {
            "result": r,
            "claims": claims_by_consumer(self.settings),
            "slots": dbz_slots(self.settings),
            "topic_gone": topic_gone(self.settings),
            "members": group_members(self.settings, group) if group else None,
            "groups": listed_groups(self.settings),
        }
        return self[n]


@pytest.fixture(scope="module")
def runs(stack: object, settings: Settings) -> Runs:
    return Runs(settings)


# every N is a further cell: the default tier's kafka runs are the joining consumer's below and the
# smoke report's (N = 1 and 2, every message worked once by the Success predicate)
N_CASES = [pytest.param(n, marks=pytest.mark.matrix) for n in (1, 2, 4)]


@pytest.mark.parametrize("n", N_CASES)
def test_every_message_is_worked_once(runs: dict[int, dict[str, Any]], n: int,
                                      record_property: Any) -> None:
    r = runs[n]["result"]
    c = r["counters"]
    assert r["success"], r["error"]
    assert c["sent"] == c["processed"] == c["work_calls"] == c["work_distinct"] == M
    assert c["inbox_rows"] == c["distinct_ids"] == M
    assert c["skipped"] == 0 and c["failures"] == 0  # one group: nobody sees another's rows
    assert M // 100 <= c["db_ops"] <= M  # one claim per batch of at most 100
    assert c["decoded_bytes"] > M * 200  # the full envelope, not just the row
    claims = runs[n]["claims"]
    assert set(claims) == {f"dbz-kafka-{i}" for i in range(n)}
    assert sum(x["processed"] for x in r["consumers"]) == M
    # 2 partitions each, keyed by id: every consumer gets a fair share
    record_property("claims_min_max", (c["claims_min"], c["claims_max"]))
    assert c["claims_min"] >= 0.6 * M / n and c["claims_max"] <= 1.4 * M / n
    assert r["cpu_s"]["debezium"] > 0 and r["cpu_s"]["kafka"] > 0 and r["cpu_s"]["consumers"] > 0


@pytest.mark.parametrize("n", N_CASES)
def test_settings_are_the_reference_ones(runs: dict[int, dict[str, Any]], n: int) -> None:
    s = runs[n]["result"]["pipeline_settings"]
    assert s["topic"] == TOPIC == "dbzk.public.messages"
    assert s["partitions"] == 2 * n and s["replication_factor"] == 1
    assert s["group_id"].startswith("dbz-kafka-") and len(s["group_id"]) == len("dbz-kafka-") + 36
    assert s["consumer_config"] == {"group.id": s["group_id"], **REFERENCE_CONFIG}
    assert s["assignment_gate"]["members"] == [2] * n
    assert s["debezium_sink"] == "kafka" and s["debezium_slot"] == "dbz_kafka_slot"


@pytest.mark.parametrize("n", N_CASES)
def test_nothing_is_left_behind(runs: dict[int, dict[str, Any]], n: int) -> None:
    assert runs[n]["slots"] == []
    assert runs[n]["topic_gone"]
    assert runs[n]["members"] == 0  # every consumer closed and left its group
    assert runs[n]["result"]["pipeline_settings"]["group_id"] not in runs[n]["groups"]  # deleted


@pytest.mark.matrix  # it needs the runs at N = 2 and 4; the group's name is asserted fresh (uuid) above
def test_each_run_has_its_own_group(runs: dict[int, dict[str, Any]]) -> None:
    groups = {runs[n]["result"]["pipeline_settings"]["group_id"] for n in (2, 4)}
    assert len(groups) == 2


def test_a_consumer_joining_mid_run_loses_and_repeats_nothing(
    stack: object, settings: Settings, tmp_path: Path, record_property: Any
) -> None:
    """A third ``lab.consumer`` process joins the group of two while the stream drains."""
    shape = {"consumers": 2, "rate": 150.0}  # about 13 s of sends: time to join and rebalance
    scenario = Scenario(pipeline="kafka", messages=M, cooldown_s=0, **shape)
    extra: dict[str, Any] = {}

    def progress(phase: str, info: dict[str, Any]) -> None:
        if phase == "drain" and info["processed"] > 0 and "proc" not in extra:
            extra["joined_at"] = info["processed"]
            argv = ["-m", "lab.consumer", "--pipeline", "kafka", "--index", "2",
                    "--run-dir", str(tmp_path), "--scenario", json.dumps(scenario.as_parameters())]
            with open(tmp_path / "consumer-2.log", "wb") as out:
                extra["proc"] = psutil.Popen(
                    [sys.executable, *argv], env=lab_env(settings), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT,
                )

    try:
        r = run(settings, progress=progress, **shape)
    finally:
        p = extra.get("proc")
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    assert "proc" in extra, "the drain never reported progress"
    joined = json.loads((tmp_path / "consumer-2.json").read_text())
    c = r["counters"]
    record_property("rebalance", {"joined_after": extra["joined_at"], "joiner": joined,
                                  "run": {k: c[k] for k in ("processed", "skipped", "db_ops")}})
    log = (tmp_path / "consumer-2.log").read_text()
    assert joined["error"] is None, log
    assert extra["joined_at"] < M
    assert joined["processed"] > 0, "the joining consumer never got a partition"
    # nothing lost, nothing worked twice, although the run's own two consumers processed < M
    assert c["sent"] == c["work_calls"] == c["work_distinct"] == M
    assert c["inbox_rows"] == c["distinct_ids"] == M
    assert c["processed"] + joined["processed"] == M
    assert c["failures"] == joined["failures"] == 0
    claims = claims_by_consumer(settings)
    assert sum(claims.values()) == M and claims.get("dbz-kafka-2") == joined["processed"]
    assert dbz_slots(settings) == []


# the consumer half on its own ------------------------------------------------------------------
def envelope(row_id: int | None) -> bytes:
    after = None if row_id is None else {"id": row_id, "content": "helloworld",
                                         "created_at": "2026-01-01T00:00:00.000000Z"}
    return orjson.dumps({"before": None, "after": after, "source": {"table": "messages"},
                         "op": "c" if after else "d", "ts_ms": 0})


async def fill_all(source: KafkaSource, count: int) -> list[Any]:
    items: list[Any] = []
    deadline = time.monotonic() + 60
    while len(items) < count:
        assert time.monotonic() < deadline, f"read {len(items)} of {count}"
        items += await source.fill(100, 0.1, 0.05)
    return items


def test_source_acks_through_the_watermark(stack: object, settings: Settings) -> None:
    base = 2_000_000_000
    scenario = Scenario(pipeline="kafka", consumers=1, messages=10)
    pipeline = KafkaPipeline(scenario, settings, stack)

    async def main() -> dict[str, Any]:
        await pipeline.prepare()  # 2 partitions, a fresh group
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
        # partition 0: ids base+0..base+4; partition 1: a non-insert, then base+5..base+9
        for i in range(5):
            producer.produce(TOPIC, envelope(base + i), partition=0)
        producer.produce(TOPIC, envelope(None), partition=1)
        for i in range(5, 10):
            producer.produce(TOPIC, envelope(base + i), partition=1)
        assert producer.flush(30) == 0
        producer.close()
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM inbox WHERE id >= %s", (base,))
            conn.execute("INSERT INTO inbox (id, consumer) VALUES (%s, 'dbz-kafka-9')", (base + 7,))
        first = KafkaSource(scenario, settings, 0)
        await first.open()
        try:
            items = await fill_all(first, 10)
            assert first.group == pipeline.group
            assert sorted(it.id for it in items) == [base + i for i in range(10)]  # no non-insert
            mine = await first.claim(items)
            assert first.skipped == 1 and first.db_ops == 1
            assert sorted(it.id for it in mine) == [base + i for i in range(10) if i != 7]
            held = next(it for it in mine if it.id == base + 1)  # partition 0, offset 1
            for it in mine:
                if it is not held:
                    first.done(it)
            await first.idle()
        finally:
            await first.close()  # commits what was stored and leaves the group
        committed = admin(settings).list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(pipeline.group, [TopicPartition(TOPIC, 0),
                                                           TopicPartition(TOPIC, 1)])]
        )[pipeline.group].result(timeout=30)
        # the next owner re-reads from the unfinished message; its own claim is still valid
        second = KafkaSource(scenario, settings, 0)
        await second.open()
        try:
            again = await fill_all(second, 4)
            reclaimed = await second.claim(again)
        finally:
            await second.close()
        return {"committed": {tp.partition: tp.offset for tp in committed.topic_partitions},
                "again": sorted(it.id for it in again),
                "reclaimed": sorted(it.id for it in reclaimed)}

    try:
        out = asyncio.run(main())
    finally:
        asyncio.run(pipeline.teardown())
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM inbox WHERE id >= %s", (base,))
    # partition 0 stops at offset 1 (held); partition 1 covers the non-insert and the lost claim
    assert out["committed"] == {0: 1, 1: 6}
    assert out["again"] == [base + 1, base + 2, base + 3, base + 4]
    assert out["reclaimed"] == out["again"]  # already ours: the crash re-read branch
    assert topic_gone(settings)
