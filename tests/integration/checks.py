"""Small helpers the integration tests share: one value from PostgreSQL, a queue's existence,
cleaning topics and consumer groups off the shared Kafka broker."""

from __future__ import annotations

import time
from typing import Any

import aio_pika
import psycopg
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from lab.settings import Settings


def scalar(settings: Settings, query: str) -> Any:
    """The first column of the first row of ``query`` (None without a row)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return row[0] if row else None


async def queue_exists(settings: Settings, name: str) -> bool:
    """Whether RabbitMQ has the queue ``name`` (a passive declare)."""
    async with await aio_pika.connect(settings.amqp_url) as conn:
        channel = await conn.channel()
        try:
            await channel.declare_queue(name, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return False
        return True


def delete_topics(admin: AdminClient, names: list[str]) -> None:
    """Delete topics from the shared broker (absent is fine), then wait until cluster-wide metadata
    no longer lists them (never asked by name: that could auto-create them)."""
    for future in admin.delete_topics(names, operation_timeout=30).values():
        try:
            future.result()
        except KafkaException as exc:  # never created
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
    deadline = time.monotonic() + 30
    while set(names) & set(admin.list_topics(timeout=5).topics):
        assert time.monotonic() < deadline, f"topics {names} still listed after delete"
        time.sleep(0.2)


def delete_group(admin: AdminClient, group: str) -> None:
    """Delete a test's consumer group from the shared broker (absent is fine)."""
    try:
        admin.delete_consumer_groups([group], request_timeout=30)[group].result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:
            raise
