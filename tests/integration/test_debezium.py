"""Debezium Server end to end: a row inserted into ``messages`` arrives as a JSON envelope.

Runs against its own PostgreSQL, Kafka and RabbitMQ (own state dir and ports), started once for
this module and stopped and purged afterwards.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from lab import slots
from lab.settings import Settings
from lab.stack import debezium, proc
from lab.stack.base import NativeService, StackError
from lab.stack.debezium import DebeziumService
from lab.stack.kafka import KafkaService
from lab.stack.postgres import PostgresService
from lab.stack.rabbitmq import RabbitMQService

pytestmark = pytest.mark.integration

TOPIC = "dbzk.public.messages"
EXCHANGE, QUEUE, ROUTING_KEY = "load-dbz", "load-dbz-quorum", "quorum"


@pytest.fixture(scope="module")
def dbz_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    settings = Settings.from_env().replace(
        stack_dir=Path(tmp_path_factory.mktemp("dbz-stack")),
        pg_port=25632, kafka_port=29192, kafka_controller_port=29193, amqp_port=25773,
        rabbitmq_dist_port=25774, rabbitmq_epmd_port=24469, rabbitmq_node="fanoutlab-dbz@localhost",
        debezium_kafka_http_port=28183, debezium_rabbitmq_http_port=28184,
    )
    services: list[NativeService] = [
        PostgresService(settings), KafkaService(settings), RabbitMQService(settings)
    ]
    started: list[NativeService] = []
    try:
        for service in services:
            service.provision()
            started.append(service)
            service.start()
        DebeziumService(settings, "kafka").provision()
        yield settings
    finally:
        for service in reversed(started):
            service.stop(purge=True)


def _insert(settings: Settings, content: str) -> int:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        cur = conn.execute("INSERT INTO messages (content) VALUES (%s) RETURNING id", (content,))
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


def _assert_envelope(body: bytes, row_id: int, content: str) -> None:
    envelope = json.loads(body)
    assert "schema" not in envelope and "payload" not in envelope  # schemas.enable=false
    assert envelope["op"] == "c"
    assert envelope["before"] is None
    after = envelope["after"]
    assert after["id"] == row_id
    assert after["content"] == content
    assert isinstance(after["created_at"], str) and after["created_at"].endswith("Z")


def _stop_and_check(service: DebeziumService, caplog: pytest.LogCaptureFixture) -> None:
    (jvm,) = service.processes()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lab.slots"):
        service.stop()
    # the graceful stop let Debezium drop its own slot (slot.drop.on.stop): nothing left for us
    assert not [r for r in caplog.records if service.slot in r.getMessage()]
    assert not jvm.is_running()
    assert service.processes() == []
    assert service.status().state == "stopped"
    assert not slots.slot_exists(service.settings.pg_dsn, service.slot)
    assert not proc.port_open(service.http_port)


def _started(service: DebeziumService) -> None:
    status = service.status()
    assert status.state == "running"
    assert status.endpoint.endswith(f":{service.http_port}")
    assert status.version == service.settings.debezium_version
    assert status.rss_mb is not None and status.rss_mb > 100
    assert service.last_start_s is not None
    assert status.detail["start_to_streaming_s"] == service.last_start_s
    assert slots.is_streaming(service.settings.pg_dsn, service.slot)
    assert proc.port_open(service.http_port)


def test_kafka_sink_delivers_the_envelope(
    dbz_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    admin = AdminClient({"bootstrap.servers": dbz_settings.kafka_bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(30)
    service = DebeziumService(dbz_settings, "kafka")
    service.start()
    try:
        _started(service)
        (jvm,) = service.processes()
        service.start()  # idempotent
        assert [p.pid for p in service.processes()] == [jvm.pid]

        content = f"kafka-{uuid.uuid4().hex[:8]}"
        row_id = _insert(dbz_settings, content)
        consumer = Consumer({
            "bootstrap.servers": dbz_settings.kafka_bootstrap, "group.id": f"test-{uuid.uuid4()}",
            "auto.offset.reset": "earliest", "allow.auto.create.topics": False,
        })
        try:
            consumer.subscribe([TOPIC])
            deadline, msg = time.monotonic() + 60, None
            while msg is None and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
            assert msg is not None, "no record on the topic within 60 s"
            assert msg.error() is None, msg.error()
            key, value = msg.key(), msg.value()
            assert key is not None and value is not None
            assert json.loads(key) == {"id": row_id}
            _assert_envelope(value, row_id, content)
        finally:
            consumer.close()
    finally:
        if service.processes():
            _stop_and_check(service, caplog)


async def _declare_topology(url: str) -> None:
    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel()
        exchange = await channel.declare_exchange(
            EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True
        )
        queue = await channel.declare_queue(
            QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.bind(exchange, routing_key=ROUTING_KEY)


async def _get_one(url: str) -> aio_pika.abc.AbstractIncomingMessage:
    """The first message of the queue, polled with basic.get (the caller bounds the wait)."""
    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel()
        queue = await channel.declare_queue(QUEUE, passive=True)
        while True:
            message = await queue.get(fail=False)
            if message is not None:
                await message.ack()
                return message
            await asyncio.sleep(0.2)


def test_rabbitmq_sink_delivers_the_envelope(
    dbz_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    asyncio.run(_declare_topology(dbz_settings.amqp_url))  # before Debezium: no `mandatory`
    service = DebeziumService(dbz_settings, "rabbitmq")
    service.start()
    try:
        _started(service)
        content = f"rabbit-{uuid.uuid4().hex[:8]}"
        row_id = _insert(dbz_settings, content)
        message = asyncio.run(asyncio.wait_for(_get_one(dbz_settings.amqp_url), 60))
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.routing_key == ROUTING_KEY
        _assert_envelope(message.body, row_id, content)
    finally:
        if service.processes():
            _stop_and_check(service, caplog)


def test_stop_drops_leftover_dbz_slots(dbz_settings: Settings) -> None:
    with psycopg.connect(dbz_settings.pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('dbz_leftover', 'pgoutput')")
    assert slots.slot_exists(dbz_settings.pg_dsn, "dbz_leftover")
    DebeziumService(dbz_settings, "kafka").stop()  # nothing running: still drops dbz_* slots
    assert not slots.slot_exists(dbz_settings.pg_dsn, "dbz_leftover")


def test_start_without_postgres_names_what_to_start(dbz_settings: Settings) -> None:
    closed = dbz_settings.replace(pg_port=25639)
    assert not proc.port_open(closed.pg_port)
    service = DebeziumService(closed, "kafka")
    with pytest.raises(StackError, match=r"PostgreSQL is not reachable at 127\.0\.0\.1:25639"):
        service.start()
    assert service.processes() == []


def test_a_jvm_that_dies_fails_start_with_its_log(
    dbz_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(debezium, "JAVA_OPTS", (*debezium.JAVA_OPTS, "-XX:+NoSuchLabFlag"))
    service = DebeziumService(dbz_settings, "kafka")
    with pytest.raises(StackError, match=r"exited during start-up.*NoSuchLabFlag"):
        service.start()
    assert service.processes() == []
    assert not slots.slot_exists(dbz_settings.pg_dsn, service.slot)


def test_unknown_sink_is_a_stack_error() -> None:
    with pytest.raises(StackError, match="unknown Debezium sink 'pulsar'"):
        DebeziumService(Settings.from_env(), "pulsar")
