"""The native Kafka service: a real KRaft broker provisioned from Maven Central.

Produce/consume, idempotent start and status run against the session stack's broker (topics
created here are deleted again). Stop and warm restart need a broker that may be stopped: one
throwaway broker of this module, under the session stack dir on ports derived from the session
settings, stopped and purged even when the test fails.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from lab.settings import Settings
from lab.stack import proc
from lab.stack.kafka_broker import KafkaService
from tests.integration.checks import delete_group, delete_topics

pytestmark = pytest.mark.integration

OWN_OFFSET = 100  # the module's throwaway broker: session ports + 100


@pytest.fixture(scope="module")
def kafka(stack: object) -> KafkaService:
    """The session stack's broker (never stopped here)."""
    return stack.kafka  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="module")
def own_kafka(stack: object, settings: Settings) -> Iterator[KafkaService]:
    """A throwaway broker of this module's own; stopped and purged whatever happens."""
    service = KafkaService(settings.replace(
        stack_dir=settings.stack_dir / "own-kafka",
        kafka_port=settings.kafka_port + OWN_OFFSET,
        kafka_controller_port=settings.kafka_controller_port + OWN_OFFSET,
    ))
    try:
        service.start()
        yield service
    finally:
        service.stop(purge=True)
        shutil.rmtree(service.settings.stack_dir, ignore_errors=True)


@pytest.fixture
def topics(kafka: KafkaService) -> Iterator[list[str]]:
    """Topics a test creates on the shared broker; deleted (and gone from metadata) afterwards."""
    made: list[str] = []
    yield made
    if made:
        delete_topics(_admin(kafka), made)


def _admin(kafka: KafkaService) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.settings.kafka_bootstrap})


def _wait_for_partitions(admin: AdminClient, topic: str, partitions: int) -> None:
    """Poll cluster-wide metadata (never by topic name: that could auto-create it)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = admin.list_topics(timeout=5).topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == partitions:
            return
        time.sleep(0.2)
    pytest.fail(f"topic {topic} never showed {partitions} partitions in cluster metadata")


def _create_topic(kafka: KafkaService, partitions: int, made: list[str] | None = None) -> str:
    topic = f"test-{uuid.uuid4().hex[:8]}"
    if made is not None:
        made.append(topic)  # recorded first: cleaned up even if the creation fails half way
    admin = _admin(kafka)
    new = NewTopic(topic, num_partitions=partitions, replication_factor=1)
    admin.create_topics([new])[topic].result(timeout=30)
    _wait_for_partitions(admin, topic, partitions)
    return topic


def test_produce_and_consume_through_a_consumer_group(
    kafka: KafkaService, topics: list[str]
) -> None:
    topic = _create_topic(kafka, partitions=4, made=topics)
    bootstrap = kafka.settings.kafka_bootstrap
    errors: list[KafkaError] = []

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce(
            topic, key=str(i), value=json.dumps({"id": i}),
            on_delivery=lambda err, _msg: err and errors.append(err),
        )
    assert producer.flush(30) == 0
    assert errors == []

    group = f"test-{uuid.uuid4()}"
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "allow.auto.create.topics": False,
        "partition.assignment.strategy": "cooperative-sticky",
    })
    ids: list[int] = []
    partitions: set[int] = set()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(ids) < 100 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            ids.append(json.loads(msg.value())["id"])
            partitions.add(msg.partition())
    finally:
        consumer.close()
        delete_group(_admin(kafka), group)

    assert sorted(ids) == list(range(100))
    assert partitions == {0, 1, 2, 3}  # 100 distinct keys over 4 partitions hit every one


def test_start_twice_is_a_no_op(kafka: KafkaService) -> None:
    before = kafka.processes()
    kafka.start()
    after = kafka.processes()
    assert len(before) == 1
    assert [p.pid for p in after] == [p.pid for p in before]


def test_status_reports_the_running_broker(kafka: KafkaService) -> None:
    status = kafka.status()
    (java,) = kafka.processes()
    assert status.state == "running"
    assert status.pids == [java.pid]
    assert status.endpoint == kafka.settings.kafka_bootstrap
    assert status.version == kafka.settings.kafka_version
    assert status.rss_mb is not None and status.rss_mb > 50
    assert "kafka.Kafka" in java.cmdline()
    assert (kafka.libs_dir / f"kafka_2.13-{kafka.settings.kafka_version}.jar").is_file()


def test_stop_ends_the_process_and_restart_keeps_topics(own_kafka: KafkaService) -> None:
    kafka = own_kafka
    topic = _create_topic(kafka, partitions=2)
    (java,) = kafka.processes()
    cluster_id = kafka.status().detail["cluster_id"]

    kafka.stop()
    assert not psutil.pid_exists(java.pid) or not java.is_running()
    assert kafka.processes() == []
    assert kafka.status().state == "stopped"
    assert not proc.port_open(kafka.settings.kafka_port)
    assert not proc.port_open(kafka.settings.kafka_controller_port)

    kafka.start()  # warm start: storage is already formatted, so it is reused
    assert kafka.status().detail["cluster_id"] == cluster_id
    _wait_for_partitions(_admin(kafka), topic, 2)
