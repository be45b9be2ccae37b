"""``rabbitmq``: Debezium Server publishes every row into one quorum queue.

Runner side: before the consumers start, declare the direct exchange ``load-dbz``, delete and
re-declare the quorum queue ``load-dbz-quorum`` (the declare is retried: a Raft group of the
same name sometimes does not come up right after a delete) and bind it with ``quorum``. All
three exist before Debezium starts, because its sink publishes without ``mandatory`` and an
unroutable record would vanish. The gate is the queue's consumer count
reaching N; then Debezium starts and the runner waits for ``dbz_quorum_slot`` to stream.

Consumer side: one channel per consumer, on its own AMQP connection (``processes`` layout) or on
one connection shared by the process's consumers (``tasks``, as the reference), prefetch 1000, and a
delivery callback that only appends ``(body, delivery tag)`` to an in-memory buffer (push turned
into pull); ``fill`` pulls from it, parses the full JSON envelope (no SMT),
and the batch is claimed by message id in ``inbox`` as ``dbz-quorum-<i>``. Lost claims and
non-inserts are acked at once; claimed messages are acked one by one after their work. There is
no position to confirm, so no watermark.

Choices written down here:

* The consumer uses aiormq (aio-pika's own protocol layer) directly rather than aio-pika's
  ``Queue.consume``: aio-pika wraps every delivery in an ``IncomingMessage`` and a second task
  and awaits a socket drain per ack.
* An ack is a 21-byte ``basic.ack`` frame packed here and put on aiormq's write queue without a
  task per ack (``tests/unit/test_rabbitmq_ack_frame.py`` checks the bytes against pamqp). When
  that bounded queue is full the ack falls back to ``Channel.basic_ack`` in a task.
  Consumer CPU to take 20 000 envelopes from a quorum queue, parse and ack each one (uvloop,
  median of 3 interleaved rounds on the 2-core dev box): aio-pika ``Queue.consume`` +
  ``message.ack()`` 254 µs/msg; aiormq ``basic_consume`` + ``basic_ack`` in a task 174;
  + pamqp-marshalled frame on the write queue 163; + this packed frame 145.
* Acks are sent one by one right after each work call, as the reference study does. That is one
  socket write per message in the consumer and one settlement per message in the quorum queue.
  In a trial (N=1, 20 000 messages, one run), sending a batch's acks as a single write when the
  batch finished cut consumer CPU from about 12 s to 6.6 s and RabbitMQ from 9.2 s to 1.9 s.
  It is left out because it changes when acks are sent.
* A batch that carries the same id twice (a redelivery) keeps the first copy; the second is
  acked and counted as skipped, so one claim never leads to two work calls.
* ``claim="takeover"``: when a consumer dies, RabbitMQ requeues its unacked deliveries
  to any consumer; with the reference's claim by name the one that gets a message its dead
  predecessor had claimed loses the claim and acks it unworked (lost). The takeover claim
  (:mod:`lab.workload.inbox`) lets it take the row over once the dead consumer's claim session is
  gone.

Broker-native stand (``scenario.producer == "direct"``): :mod:`lab.pipelines.producers`
publishes the plain message JSON ``{"id", "content", "createdAt"}`` through the default
exchange straight into the quorum queue ``messages`` (deleted and re-declared per run like the
Debezium one, bound to nothing else); no exchange of ours, no Debezium. Inbox names become
``rabbitmq-<i>``. The source picks its message parser once, when it is built.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

import aio_pika
import aiormq
import psycopg
from aiormq.abc import ChannelFrame, DeliveredMessage

from lab.pipelines.backlog import RabbitBacklog
from lab.pipelines.base import BacklogReader, Capabilities, Item, SharedResources, claim_batch, row_parser
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import Stack, StackError
from lab.stack.debezium import RABBITMQ_EXCHANGE, RABBITMQ_ROUTING_KEY, SLOT
from lab.workload.inbox import CLAIMS_APPLICATION, take_lease

log = logging.getLogger(__name__)

EXCHANGE = RABBITMQ_EXCHANGE  # "load-dbz": Debezium's sink publishes here
ROUTING_KEY = RABBITMQ_ROUTING_KEY  # "quorum"
QUEUE = "load-dbz-quorum"
DIRECT_QUEUE = "messages"  # the broker-native stand's queue (lab.pipelines.producers publishes to it)
QUEUE_ARGUMENTS = {"x-queue-type": "quorum"}
# ha: a member on each of the three nodes, the leader on node 1, where every client connects
HA_QUEUE_ARGUMENTS = {**QUEUE_ARGUMENTS, "x-quorum-initial-group-size": 3, "x-queue-leader-locator": "client-local"}
PREFETCH = 1000
DECLARE_ATTEMPTS = 6
DECLARE_PAUSE_S = 2.0
POLL_S = 0.5

# AMQP 0-9-1 method frame basic.ack (class 60, method 80), multiple=false:
# type, channel, payload size 13, class, method, delivery tag, flags, frame end.
_ACK = struct.Struct(">BHIHHQBB")


def ack_frame(channel: int, tag: int) -> bytes:
    """The wire bytes of ``basic.ack(tag, multiple=false)`` on ``channel``."""
    return _ACK.pack(1, channel, 13, 60, 80, tag, 0, 0xCE)


def consumer_name(index: int, producer: str = "web") -> str:
    return f"rabbitmq-{index}" if producer == "direct" else f"dbz-quorum-{index}"


def queue_name(scenario: Scenario) -> str:
    return DIRECT_QUEUE if scenario.producer == "direct" else QUEUE


def queue_arguments(settings: Settings) -> dict[str, Any]:
    """The quorum queue's declare arguments: one member on the single node, three under ``ha``."""
    return dict(HA_QUEUE_ARGUMENTS if settings.ha else QUEUE_ARGUMENTS)


SINK = "rabbitmq"  # the Debezium instance this pipeline reads from


class RabbitPipeline:
    """Runner side: topology before consumers, consumer-count gate, Debezium, queue delete."""

    name: ClassVar[str] = "rabbitmq"
    capabilities: ClassVar[Capabilities] = Capabilities(cdc_sink=SINK, broker="rabbitmq")

    def __init__(self, scenario: Scenario, settings: Settings, stack: Stack) -> None:
        self.scenario = scenario
        self.settings = settings
        self.stack = stack
        self.direct = scenario.producer == "direct"
        self.queue = queue_name(scenario)
        self.replicas: dict[str, Any] | None = None  # ha: members and leader once declared

    def describe(self) -> dict[str, Any]:
        direct, producer = self.direct, self.scenario.producer
        return {
            "producer": producer,
            "source": ("lab.pipelines.producers straight into the queue (no outbox, no Debezium)"
                       if direct else "Debezium Server from the outbox table"),
            "exchange": "" if direct else EXCHANGE, "exchange_type": "direct", "queue": self.queue,
            "routing_key": self.queue if direct else ROUTING_KEY, "queue_type": "quorum",
            "queue_arguments": queue_arguments(self.settings),
            "replicas_at_start": self.replicas,  # ha: read back from the cluster once declared
            "prefetch": PREFETCH, "ack": "basic.ack per message after work, multiple=false",
            "consumer_names": [consumer_name(i, producer) for i in range(self.scenario.consumers)],
            "inbox": self.capabilities.inbox_table, "claim": self.scenario.claim,
            "debezium_sink": None if direct else self.capabilities.cdc_sink,
            "slot": None if direct else SLOT["rabbitmq"],
            "client": f"aiormq {version('aiormq')} (consumers), "
                      f"aio-pika {version('aio-pika')} (topology)",
        }

    async def prepare(self) -> None:
        async with await aio_pika.connect(self.settings.amqp_url) as conn:
            channel = await conn.channel()
            args = queue_arguments(self.settings)
            if self.direct:  # the default exchange routes by queue name: nothing to bind
                await channel.queue_delete(self.queue)
                await _declare_queue(conn, self.queue, args)
            else:
                exchange = await channel.declare_exchange(
                    EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True
                )
                await channel.queue_delete(QUEUE)
                queue = await _declare_queue(conn, QUEUE, args)
                await queue.bind(exchange, routing_key=ROUTING_KEY)
        control = self.stack.control
        if self.settings.ha and control is not None:  # the cluster's members; before the window: rabbitmqctl
            self.replicas = await asyncio.to_thread(control.queue_replicas, self.queue)

    async def wait_ready(self) -> None:
        n, timeout = self.scenario.consumers, self.scenario.ready_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with await aio_pika.connect(self.settings.amqp_url) as conn:
            channel = await conn.channel()
            while True:
                queue = await channel.declare_queue(self.queue, passive=True)
                count = queue.declaration_result.consumer_count
                if count == n:
                    return
                if loop.time() > deadline:
                    raise TimeoutError(
                        f"queue {self.queue} has {count} consumers, expected {n}, "
                        f"after {timeout:.0f} s"
                    )
                await asyncio.sleep(POLL_S)

    async def start_source(self) -> None:
        if not self.direct:  # the direct producer is the source; the runner starts it
            await asyncio.to_thread(self.stack.start_debezium, SINK, durable=bool(self.scenario.fault))

    async def teardown(self) -> None:
        if not self.direct:
            try:
                await asyncio.to_thread(self.stack.stop_debezium, SINK)
            except Exception as exc:
                log.warning("could not stop Debezium (%s sink): %s", SINK, exc)
        try:
            async with await aio_pika.connect(self.settings.amqp_url) as conn:
                channel = await conn.channel()
                await channel.queue_delete(self.queue)
        except Exception as exc:
            log.warning("could not delete queue %s: %s", self.queue, exc)

    def backlog(self, scratch: Path) -> BacklogReader | None:
        """The quorum queue's ready + unacknowledged messages (:class:`lab.pipelines.backlog.RabbitBacklog`),
        asked of its Raft member on the node where the stack can (``erl_call``), else by a passive declare."""
        control = self.stack.control
        return RabbitBacklog(self.settings, control.erl_call() if control is not None else None, self.queue)


async def _declare_queue(
    conn: aio_pika.abc.AbstractConnection, name: str = QUEUE, arguments: dict[str, Any] | None = None,
) -> aio_pika.abc.AbstractQueue:
    """Declare the quorum queue, retrying on a fresh channel (a failed declare closes it)."""
    for attempt in range(1, DECLARE_ATTEMPTS + 1):
        channel = await conn.channel()
        try:
            return await channel.declare_queue(
                name, durable=True, exclusive=False, auto_delete=False,
                arguments=QUEUE_ARGUMENTS if arguments is None else arguments,  # type: ignore[arg-type]
            )
        except aio_pika.exceptions.AMQPError as exc:
            if attempt == DECLARE_ATTEMPTS:
                raise StackError(
                    f"could not declare quorum queue {name} after {attempt} attempts: {exc}"
                ) from None
            log.info("declaring %s failed (%s); retry %d in %.0f s",
                     name, exc, attempt, DECLARE_PAUSE_S)
            await asyncio.sleep(DECLARE_PAUSE_S)
    raise AssertionError("unreachable")


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class RabbitSource:
    """Consumer side: deliveries buffered by the callback, pulled in batches by ``fill``."""

    def __init__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> None:
        self.settings = settings
        self._shared = shared  # tasks layout: one AMQP connection for all, a channel each
        self.me = consumer_name(index, scenario.producer)  # the claimant, with a lease for takeover
        self.takeover = scenario.claim == "takeover"
        self.queue = queue_name(scenario)
        self._row = row_parser(scenario.producer)
        self.skipped = 0
        self.db_ops = 0
        self.decoded_bytes = 0
        self._buf: collections.deque[tuple[bytes, int]] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._conn: aiormq.abc.AbstractConnection | None = None
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._claims: psycopg.AsyncConnection[Any] | None = None
        self._fallback: set[asyncio.Task[None]] = set()
        self._write: Any = None  # the channel's write queue put_nowait
        self._number = 0  # the channel number

    async def open(self) -> None:
        self._claims = await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True,
                                                             application_name=CLAIMS_APPLICATION)
        if self.takeover:  # held by this session for its life
            self.me = await take_lease(self._claims, self.me)
        if self._shared is None:
            self._conn = await aiormq.connect(self.settings.amqp_url)
            conn = self._conn
        else:
            url = self.settings.amqp_url
            conn = await self._shared.get("amqp", lambda: aiormq.connect(url))
        self._channel = channel = await conn.channel()
        # aiormq's own write queue: the pre-packed ack frame goes straight onto it
        self._write, self._number = channel.write_queue.put_nowait, channel.number  # type: ignore[attr-defined]
        await channel.basic_qos(prefetch_count=PREFETCH)
        await channel.basic_consume(self.queue, self._on_delivery, no_ack=False)

    async def _on_delivery(self, message: DeliveredMessage) -> None:
        self._buf.append((message.body, message.delivery_tag or 0))  # always set on a basic.deliver
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, seconds: float) -> None:
        """Until a delivery arrives or ``seconds`` pass (a timer, not a task per wait)."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(seconds, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    async def fill(self, max_items: int, first_wait: float, flush_wait: float) -> list[Item]:
        buf, row_of, ack = self._buf, self._row, self._ack
        batch: list[Item] = []
        while len(batch) < max_items:
            if not buf:
                await self._wait(flush_wait if batch else first_wait)
                if not buf:
                    if not batch and self._channel is not None and self._channel.is_closed:
                        raise ConnectionError(f"AMQP channel to {self.queue} closed")
                    return batch
            body, tag = buf.popleft()
            self.decoded_bytes += len(body)
            row = row_of(body)
            if row is None:  # not an insert: acked at once
                ack(tag)
                continue
            batch.append(Item(*row, tag))
        return batch

    async def claim(self, batch: list[Item]) -> list[Item]:
        assert self._claims is not None
        mine, statements = await claim_batch(self._claims, batch, self.me, self.done,  # lost: acked at once
                                             takeover=self.takeover)
        self.db_ops += statements
        self.skipped += len(batch) - len(mine)
        return mine

    def done(self, item: Item) -> None:
        self._ack(item.pos)

    def _ack(self, tag: int) -> None:
        try:
            self._write(ChannelFrame(ack_frame(self._number, tag), False))
        except asyncio.QueueFull:
            assert self._channel is not None
            task = asyncio.ensure_future(self._channel.basic_ack(tag))
            self._fallback.add(task)
            task.add_done_callback(self._fallback.discard)

    async def idle(self) -> None:
        return None

    async def close(self) -> None:
        if self._fallback:
            with contextlib.suppress(Exception):
                await asyncio.wait(self._fallback, timeout=5)
        for closer in (self._channel, self._conn, self._claims):
            if closer is not None:
                with contextlib.suppress(Exception):  # closing must never raise
                    await closer.close()
