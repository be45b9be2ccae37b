"""Debezium Server end to end: a row inserted into ``messages`` arrives as a JSON envelope.

Runs against the session stack's PostgreSQL, Kafka and RabbitMQ, through the stack's own
Debezium instances (``stack.debezium[sink]``). What a test creates there (the topic, the
exchange and queue, the rows, the slots) is removed again, so the shared stack is left as it
was found.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterator

import aio_pika
import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from lab.pg import slots
from lab.settings import Settings
from lab.stack import debezium, proc
from lab.stack.base import StackError
from lab.stack.debezium import SLOT, DebeziumService
from tests.integration.checks import delete_group, delete_topics

pytestmark = pytest.mark.integration

TOPIC = "dbzk.public.messages"
EXCHANGE, QUEUE, ROUTING_KEY = "load-dbz", "load-dbz-quorum", "quorum"
CLOSED_OFFSET = 107  # session PostgreSQL port + this: a port nothing listens on


@pytest.fixture(scope="module")
def dbz_settings(stack: object, settings: Settings) -> Iterator[Settings]:
    """The session settings, with the stack up; every row the module inserts is deleted after."""
    for service in stack.debezium.values():  # type: ignore[attr-defined]
        service.provision()
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        before = conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0]  # type: ignore[index]
    try:
        yield settings
    finally:
        for sink in stack.debezium:  # type: ignore[attr-defined]
            stack.stop_debezium(sink)  # type: ignore[attr-defined]
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM messages WHERE id > %s", [before])


@pytest.fixture
def kafka_topic(dbz_settings: Settings) -> Iterator[str]:
    """``dbzk.public.messages``, created for the test and deleted (gone from metadata) after."""
    admin = AdminClient({"bootstrap.servers": dbz_settings.kafka_bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(30)
    try:
        yield TOPIC
    finally:
        delete_topics(admin, [TOPIC])


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
    with caplog.at_level(logging.INFO, logger="lab.pg.slots"):
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
    assert status.version == debezium.debezium_version(service.settings)  # with the suite's JVM options
    assert status.version.startswith(service.settings.debezium_version)
    assert status.rss_mb is not None and status.rss_mb > 100
    assert service.last_start_s is not None
    assert status.detail["start_to_streaming_s"] == service.last_start_s
    assert slots.is_streaming(service.settings.pg_dsn, service.slot)
    assert proc.port_open(service.http_port)


def test_kafka_sink_delivers_the_envelope(
    stack: object, dbz_settings: Settings, kafka_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    started = stack.start_debezium("kafka")  # type: ignore[attr-defined]
    service = stack.debezium["kafka"]  # type: ignore[attr-defined]
    assert started.sink == "kafka" and list(started.pids) == [p.pid for p in service.processes()]
    assert service.settings == dbz_settings
    try:
        _started(service)
        (jvm,) = service.processes()
        service.start()  # idempotent
        assert [p.pid for p in service.processes()] == [jvm.pid]

        content = f"kafka-{uuid.uuid4().hex[:8]}"
        row_id = _insert(dbz_settings, content)
        group = f"test-{uuid.uuid4()}"
        consumer = Consumer({
            "bootstrap.servers": dbz_settings.kafka_bootstrap, "group.id": group,
            "auto.offset.reset": "earliest", "allow.auto.create.topics": False,
        })
        try:
            consumer.subscribe([kafka_topic])
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
            delete_group(AdminClient({"bootstrap.servers": dbz_settings.kafka_bootstrap}), group)
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


async def _exchange_exists(url: str) -> bool:
    async with await aio_pika.connect(url) as conn:
        try:
            await (await conn.channel()).get_exchange(EXCHANGE, ensure=True)  # passive declare
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return False
        return True


async def _delete_topology(url: str, exchange: bool) -> None:
    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel()
        await channel.queue_delete(QUEUE)
        if exchange:
            await channel.exchange_delete(EXCHANGE)


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
    stack: object, dbz_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    url = dbz_settings.amqp_url
    had_exchange = asyncio.run(_exchange_exists(url))
    try:
        asyncio.run(_declare_topology(url))  # before Debezium: no `mandatory`
        stack.start_debezium("rabbitmq")  # type: ignore[attr-defined]
        service = stack.debezium["rabbitmq"]  # type: ignore[attr-defined]
        assert service.settings == dbz_settings
        try:
            _started(service)
            content = f"rabbit-{uuid.uuid4().hex[:8]}"
            row_id = _insert(dbz_settings, content)
            message = asyncio.run(asyncio.wait_for(_get_one(url), 60))
            assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
            assert message.routing_key == ROUTING_KEY
            _assert_envelope(message.body, row_id, content)
        finally:
            if service.processes():
                _stop_and_check(service, caplog)
    finally:
        asyncio.run(_delete_topology(url, exchange=not had_exchange))


def test_stop_drops_its_own_slot_only(stack: object, dbz_settings: Settings) -> None:
    """Stopping one Debezium (even when it is not running) drops its slot, not the other sink's."""
    dsn = dbz_settings.pg_dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in (SLOT["kafka"], SLOT["rabbitmq"]):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    try:
        stack.stop_debezium("kafka")  # type: ignore[attr-defined]
        assert not slots.slot_exists(dsn, SLOT["kafka"])
        assert slots.slot_exists(dsn, SLOT["rabbitmq"])
    finally:
        slots.drop_slots(dsn, "dbz_")


def test_start_without_postgres_names_what_to_start(dbz_settings: Settings) -> None:
    closed = dbz_settings.replace(pg_port=dbz_settings.pg_port + CLOSED_OFFSET)
    assert not proc.port_open(closed.pg_port)
    service = DebeziumService(closed, "kafka")
    with pytest.raises(
        StackError, match=rf"PostgreSQL is not reachable at 127\.0\.0\.1:{closed.pg_port}"
    ):
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


def test_unknown_sink_is_a_stack_error(settings: Settings) -> None:
    with pytest.raises(StackError, match="unknown Debezium sink 'pulsar'"):
        DebeziumService(settings, "pulsar")
