"""Small readers the integration tests share: one value from PostgreSQL, a queue's existence."""

from __future__ import annotations

from typing import Any

import aio_pika
import psycopg

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
