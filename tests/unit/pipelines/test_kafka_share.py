"""``kafka-share``: what the client here offers, which brokers serve it, and the per-record acknowledgements."""

from __future__ import annotations

import asyncio

import confluent_kafka
import orjson
import pytest
from confluent_kafka import AcknowledgeType, Message

from lab.pipelines import PIPELINES, check
from lab.pipelines.kafka_share import (
    GROUP_CONFIG,
    PARTITIONS,
    KafkaSharePipeline,
    KafkaShareSource,
    share_consumer_config,
    share_groups_supported,
)
from lab.scenario import Scenario
from lab.settings import Settings


def test_the_installed_client_has_the_share_consumer() -> None:
    """The pipeline stands on confluent-kafka's ShareConsumer (2.15+, librdkafka 2.15+): if a
    client version without it is installed, this says so before any run does."""
    for member in ("subscribe", "poll", "acknowledge", "commit_async", "commit_sync", "close"):
        assert hasattr(confluent_kafka.ShareConsumer, member), member
    assert {t.name for t in AcknowledgeType} >= {"ACCEPT", "RELEASE", "REJECT"}
    version, _ = confluent_kafka.libversion()
    assert tuple(int(x) for x in version.split(".")[:2]) >= (2, 15)


@pytest.mark.parametrize(("version", "ok"), [
    ("4.2.2", True), ("4.2.0", True), ("4.3.1", True), ("4.10.0", True), ("5.0.0", True),
    ("4.1.1", False), ("4.1.2", False), ("4.0.0", False), ("3.9.1", False), ("latest", False),
])
def test_share_groups_need_kafka_4_2(version: str, ok: bool) -> None:
    assert share_groups_supported(version) is ok


def test_the_default_kafka_serves_share_groups() -> None:
    assert share_groups_supported(Settings().kafka_version)


def test_consumer_config_is_explicit_with_the_batch_size() -> None:
    conf = share_consumer_config(Settings(), "g", 100)
    assert conf["share.acknowledgement.mode"] == "explicit"
    assert conf["max.poll.records"] == 100
    assert conf["group.id"] == "g"
    assert PARTITIONS == 1


def test_the_group_sets_kafkas_lock_and_session_and_the_drain_waits_out_the_lock() -> None:
    """Kafka 4.2's defaults, set on the run's group so that run.json records them; a fault run's
    drain waits one lock longer than elsewhere before it counts a missing record lost."""
    assert GROUP_CONFIG == {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "30000",
                            "share.session.timeout.ms": "45000"}
    caps = KafkaSharePipeline.capabilities
    assert caps.redelivery_s == 30.0 and caps.fault_refusal is None
    assert {name: p.capabilities.redelivery_s for name, p in PIPELINES.items()
            if p.capabilities.redelivery_s} == {"kafka-share": 30.0}


def test_no_broker_native_stand() -> None:
    """The pipelines' check refuses it (the scenario itself knows no pipeline's rules)."""
    with pytest.raises(ValueError, match="kafka-share has no broker-native stand"):
        check(Scenario(pipeline="kafka-share", producer="direct"))
    check(Scenario(pipeline="kafka-share"))
    check(Scenario(pipeline="kafka", producer="direct"))


class Recorder:
    """Stands in for the broker connection: records acknowledgements, hands out prepared polls."""

    def __init__(self, polls: list[list[Message]]) -> None:
        self.polls = polls
        self.acks: list[tuple[int, AcknowledgeType]] = []

    def poll(self, timeout: float) -> list[Message]:
        return self.polls.pop(0) if self.polls else []

    def acknowledge(self, m: Message, ack_type: AcknowledgeType = AcknowledgeType.ACCEPT) -> None:
        self.acks.append((m.offset(), ack_type))


def envelope(i: int, op: str = "c") -> bytes:
    after = None if op == "d" else {"id": i, "content": f"m{i}", "created_at": "2026-01-01T00:00:00Z"}
    return orjson.dumps({"op": op, "after": after})


def record(offset: int, value: bytes) -> Message:
    return Message(topic="dbzk.public.messages", partition=0, offset=offset, value=value)


def source_with(polls: list[list[Message]]) -> tuple[KafkaShareSource, Recorder]:
    source = KafkaShareSource(Scenario(pipeline="kafka-share"), Settings(), 0)
    recorder = Recorder(polls)
    source._consumer = recorder  # type: ignore[assignment]
    return source, recorder


def test_inserts_wait_for_their_work_and_the_rest_is_accepted_at_once() -> None:
    source, rec = source_with([[record(0, envelope(1)), record(1, envelope(9, "d")), record(2, envelope(2))]])
    batch = asyncio.run(source.fill(100, 0.0, 0.0))
    assert [item.id for item in batch] == [1, 2]
    assert rec.acks == [(1, AcknowledgeType.ACCEPT)]  # the delete: no work, acknowledged
    source.done(batch[1])
    source.done(batch[0])
    source.done(batch[0])  # a second resolution of one record acknowledges nothing more
    assert rec.acks == [(1, AcknowledgeType.ACCEPT), (2, AcknowledgeType.ACCEPT), (0, AcknowledgeType.ACCEPT)]


def test_a_record_whose_work_failed_is_released_before_the_next_fetch() -> None:
    source, rec = source_with([[record(0, envelope(1)), record(1, envelope(2))], [record(2, envelope(3))]])
    first = asyncio.run(source.fill(100, 0.0, 0.0))
    source.done(first[0])  # the work call for id 2 failed: never done
    second = asyncio.run(source.fill(100, 0.0, 0.0))
    assert [item.id for item in second] == [3]
    assert rec.acks == [(0, AcknowledgeType.ACCEPT), (1, AcknowledgeType.RELEASE)]


def test_records_polled_while_opening_are_the_first_batch() -> None:
    source, rec = source_with([[record(7, envelope(4))]])
    source._held = [record(5, envelope(3))]
    assert [item.id for item in asyncio.run(source.fill(100, 0.0, 0.0))] == [3]
    assert [item.id for item in asyncio.run(source.fill(100, 0.0, 0.0))] == [4]
    assert rec.acks == [(5, AcknowledgeType.RELEASE)]  # the first batch was never worked

