"""The broker-native producers: S tasks write exactly M messages straight into
the transport, with no web service, no outbox and no Debezium in between.

Run by the runner, in place of :mod:`lab.workload.senders`, as the measured participant ``senders``::

    python -m lab.pipelines.producers --target kafka --messages 20000 --producers 200 \\
        --start-file RUN/start --out RUN/senders.json

Same protocol as the senders: nothing is sent before ``--start-file`` exists (20 ms ``stat``
poll), the result is a :class:`~lab.workload.senders.SendResult` written once and atomically to ``--out``
(also after a crash), ``--progress`` optionally rewrites a counter file each second. Each task
is a closed loop: take the next id, write, await the broker's acknowledgement, count; **no
retries** (a failed write is ``send_failed``). The window starts at the first acknowledged write.

Targets, each faithful to the reference stand (``LoadTest/*Scenarios.cs`` on branch
"queue-load-test") and as lean as the client allows:

* ``kafka``: one confluent-kafka ``Producer`` shared by all tasks (one librdkafka instance, as
  the reference's one ``IProducer``) with ``acks=all`` and ``linger.ms=10`` (librdkafka's
  defaults otherwise), topic ``messages``, key = the message id. Delivery reports are served by
  one thread blocked in ``poll()``; it hands every report a ``poll()`` returned to the event
  loop in one ``call_soon_threadsafe``, so a linger batch costs one loop wake-up, not one per
  message.
* ``rabbitmq``: one aiormq connection and one channel with publisher confirms, shared by all
  tasks (the reference also used one confirming channel); default exchange, routing key =
  quorum queue ``messages``, ``delivery_mode=2`` (persistent), no ``mandatory``. Each publish
  awaits its own ``basic.ack``; a ``basic.nack`` is a failed send. ``message_id`` is the id
  (aiormq would otherwise generate a uuid for every message).
* ``pg``: at most :data:`PG_CONNECTIONS` (100) autocommit psycopg connections, opened before
  the gate; task k writes on connection ``k % 100``, so with 200 tasks two share each session
  (psycopg serializes them on the connection). 100 is the reference stand's pool size (Npgsql's
  default ``Max Pool Size``), and it has to be below 200 here anyway: the web service, which
  still serves ``/send-email``, keeps its 220 sessions and ``max_connections`` is 400. No pool
  object: a fixed assignment is the leanest closed loop. Each write is one
  ``INSERT INTO messages (content, created_at) VALUES (%s, now())`` (id from the identity). With
  ``--reset discard`` (the default) it is sent as the reference's ``NpgsqlDataSource`` command
  was: unprepared, after ``DISCARD ALL`` in the same round trip (every command takes a pooled
  connection and hands it back, so every write after a connection's first is a reuse); the two
  tasks of a connection then take turns under a lock, as a pipeline cannot be shared.
  ``--reset none`` is the earlier path: a prepared INSERT, no reset.

Messages to the brokers carry ids 1..M (the inbox is truncated every run) and the JSON body
``{"id", "content": "helloworld", "createdAt"}`` (UTC, ISO-8601), serialized with orjson.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from lab.pipelines.kafka import DIRECT_TOPIC as TOPIC
from lab.pipelines.rabbitmq import DIRECT_QUEUE as QUEUE
from lab.settings import Settings, get_settings
from lab.workload.senders import (
    SendResult,
    Tally,
    add_gate_options,
    gated,
    run_and_write,
    send_phase,
    tally_result,
)

TARGETS = ("kafka", "rabbitmq", "pg")
CONTENT = "helloworld"
INSERT = b"INSERT INTO messages (content, created_at) VALUES (%s, now())"
DISCARD = b"DISCARD ALL"
RESETS = ("discard", "none")
KAFKA_CONFIG = {"acks": "all", "linger.ms": 10}
PG_CONNECTIONS = 100
POLL_S = 0.1  # delivery-report thread: poll() returns at once when reports are queued
Send = Callable[[int], Awaitable[None]]


def body(i: int) -> bytes:
    """The message as the reference's producers wrote it."""
    return orjson.dumps({"id": i, "content": CONTENT, "createdAt": datetime.now(UTC)})


async def _closed_loop(send: Send, t: Tally) -> None:
    clock = time.monotonic
    while t.remaining > 0:
        t.remaining -= 1
        t.next_id += 1
        t0 = clock()
        try:
            await send(t.next_id)
        except Exception as e:  # any failure is a failed send, never retried
            t.failed += 1
            if t.first_error is None:
                t.first_error = f"{type(e).__name__}: {e}"
            continue
        t1 = clock()
        t.sent += 1
        t.latency.append(t1 - t0)
        t.last_mono, t.last_wall = t1, time.time()
        if t.first_mono is None:
            t.first_mono, t.first_wall = t1, t.last_wall


class _Kafka:
    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import KafkaException, Producer

        self._error = KafkaException
        self._producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, **KAFKA_CONFIG})
        self._reports: collections.deque[tuple[asyncio.Future[Any], Any]] = collections.deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="delivery-reports", daemon=True)
        self.url = f"kafka://{settings.kafka_bootstrap}/{TOPIC}"

    async def open(self, producers: int) -> None:
        self._loop = asyncio.get_running_loop()
        # cluster-wide metadata (never by topic name: the broker auto-creates topics) opens the
        # connection before the gate
        await asyncio.to_thread(self._producer.list_topics, timeout=10)
        self._thread.start()

    def _serve(self) -> None:
        poll, reports, stop = self._producer.poll, self._reports, self._stop
        while not stop.is_set():
            poll(POLL_S)  # delivery callbacks run here and append to reports
            if reports:
                batch = [reports.popleft() for _ in range(len(reports))]
                self._loop.call_soon_threadsafe(_settle, batch)

    def sender(self, k: int) -> Send:
        produce, report = self._producer.produce, self._reports.append
        new_future = self._loop.create_future
        error = self._error

        async def send(i: int) -> None:
            done = new_future()
            produce(TOPIC, body(i), str(i).encode(),
                    on_delivery=lambda err, msg: report((done, err)))
            err = await done
            if err is not None:
                raise error(err)
        return send

    async def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self._producer.flush, 5)


def _settle(batch: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, err in batch:
        if not future.done():
            future.set_result(err)


class _Rabbit:
    def __init__(self, settings: Settings) -> None:
        self._url = settings.amqp_url
        self.url = f"amqp://{settings.rabbitmq_host}:{settings.amqp_endpoint_port}/{QUEUE}"
        self._conn: Any = None

    async def open(self, producers: int) -> None:
        import aiormq

        self._conn = await aiormq.connect(self._url)
        self._channel = await self._conn.channel(publisher_confirms=True)

    def sender(self, k: int) -> Send:
        from aiormq import spec

        publish, ack, props = self._channel.basic_publish, spec.Basic.Ack, spec.Basic.Properties

        async def send(i: int) -> None:
            confirm = await publish(body(i), exchange="", routing_key=QUEUE, wait=False,
                                    properties=props(delivery_mode=2, message_id=str(i)))
            if type(confirm) is not ack:
                raise RuntimeError(f"broker answered {type(confirm).__name__} to publish {i}")
        return send

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()


class _Pg:
    def __init__(self, settings: Settings, reset: str = "discard") -> None:
        self._dsn = settings.pg_dsn
        self.url = f"postgresql://{settings.service_host}:{settings.pg_port}/{settings.pg_database}/messages"
        self._conns: list[Any] = []
        self._locks: list[asyncio.Lock] = []
        self._used: list[bool] = []
        self._reset = reset == "discard"

    async def open(self, producers: int) -> None:
        import psycopg

        connect = psycopg.AsyncConnection.connect
        self._conns = list(await asyncio.gather(
            *(connect(self._dsn, autocommit=True) for _ in range(min(producers, PG_CONNECTIONS)))))

    def sender(self, k: int) -> Send:
        conn = self._conns[k % len(self._conns)]
        cursor = conn.cursor()
        params = (CONTENT,)
        if not self._reset:
            async def send(i: int) -> None:
                await cursor.execute(INSERT, params, prepare=True)
            return send
        if len(self._locks) < len(self._conns):
            self._locks = [asyncio.Lock() for _ in self._conns]
            self._used = [False] * len(self._conns)
        c = k % len(self._conns)
        lock, used = self._locks[c], self._used

        async def send_reset(i: int) -> None:
            async with lock:
                if not used[c]:  # a connection's first command is no reuse
                    used[c] = True
                    await cursor.execute(INSERT, params, prepare=False)
                    return
                async with conn.pipeline():
                    await cursor.execute(DISCARD, prepare=False)
                    await cursor.execute(INSERT, params, prepare=False)
        return send_reset

    async def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(Exception):
                await conn.close()


_CLIENTS: dict[str, Callable[[Settings], Any]] = {"kafka": _Kafka, "rabbitmq": _Rabbit, "pg": _Pg}


async def run_producers(
    target: str, settings: Settings, messages: int, producers: int,
    gate: asyncio.Event | None = None, *, progress: Path | None = None, reset: str = "discard",
) -> SendResult:
    """Write exactly ``messages`` into ``target`` from ``producers`` closed loops.

    Connections are opened before ``gate`` (if given) is awaited; nothing is written before it.
    ``reset`` applies to ``pg`` only (see the module docstring).
    """
    client = _Pg(settings, reset) if target == "pg" else _CLIENTS[target](settings)
    t = Tally(messages)
    try:
        await client.open(producers)
        if gate is not None:
            await gate.wait()
        gate_at, cpu = await send_phase(
            t, progress, asyncio.gather(*(_closed_loop(client.sender(k), t) for k in range(producers))))
    finally:
        await client.close()
    return tally_result(t, url=client.url, messages=messages, senders=producers, gate_at=gate_at, cpu=cpu)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a bad value exits with status 2 and one line on stderr."""
    p = argparse.ArgumentParser(prog="python -m lab.pipelines.producers", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, choices=TARGETS, help="where messages are written")
    p.add_argument("--messages", type=int, required=True, help="M, exactly this many writes")
    p.add_argument("--producers", type=int, default=200, help="S concurrent closed loops")
    p.add_argument("--reset", choices=RESETS, default="discard",
                   help="pg: DISCARD ALL + unprepared INSERT per write (default) or a prepared INSERT")
    add_gate_options(p)
    a = p.parse_args(argv)
    if a.messages < 1 or a.producers < 1:
        p.error(f"--messages and --producers must be at least 1, "
                f"got {a.messages} and {a.producers}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    return run_and_write(lambda: gated(
        a.start_file,
        lambda gate: run_producers(a.target, get_settings(), a.messages, a.producers, gate,
                                   progress=a.progress, reset=a.reset),
        lambda error: SendResult(url=a.target, messages=a.messages, senders=a.producers, sent=0,
                                 send_failed=0, error=error),
    ), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
