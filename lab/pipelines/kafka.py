"""``kafka``: Debezium Server → one Kafka topic → one consumer group of N.

Runner side (:class:`KafkaPipeline`): before the consumers start, ``dbzk.public.messages`` is
deleted, awaited until it is gone from *cluster-wide* metadata, re-created with 2N partitions
and replication factor 1, and awaited until the metadata shows exactly 2N partitions
(metadata is never requested by topic name, because the broker auto-creates topics:
:mod:`lab.pipelines.kafka_admin`). The readiness gate then requires every member of the run's
group to own exactly 2 partitions, 2N in all, on 3 consecutive checks 200 ms apart; only then
does Debezium start (its slot streaming is the last gate).

Consumer side (:class:`KafkaSource`): the consumer config of the reference study, the full JSON
envelope parsed with orjson (no SMT), one ``inbox`` claim per batch as
``dbz-kafka-<index>``.

Deviations and choices, with their reasons:

* **Group id.** One fresh group per run, ``dbz-kafka-<uuid>``, shared by the N consumers, as in
  the reference. The uuid is the topic id Kafka assigns when :meth:`KafkaPipeline.prepare`
  creates the topic: new on every run and readable by both halves from the broker
  (``describe_topics``), so nothing else has to carry it from the runner to the consumers.
* **Watermark.** Offsets go through one :class:`~lab.workload.watermark.Watermark` per assigned
  partition: held when read, resolved after the work or a lost claim, advanced for envelopes
  that are not inserts; ``confirmable + 1`` is stored. The measured reference stored each
  offset as it went, with no watermark; this is the article's fix.
  A partition gets a fresh watermark on every assignment, so a revoked partition's late
  resolutions never touch its next owner's positions.
* **When offsets are stored.** Once per batch (in :meth:`KafkaSource.idle`, and in
  :meth:`~KafkaSource.fill` when it returns empty) rather than after every message: M/100
  ``store_offsets`` calls instead of M. librdkafka commits stored offsets on its 5 s timer, on
  revocation and on close; revocation (served inside ``consume``) and close only happen between
  batches, after the batch's offsets were stored, and a revoked partition is stored once more
  in the callback.
* **Reads.** ``consume(100, 0)`` on the event loop takes what librdkafka already fetched
  without blocking; only a batch it leaves short goes to one worker-thread call that waits
  (100 ms for the first message, then until 100 or a 50 ms gap, as the reference study) with
  blocking ``consume`` calls. One thread hop per short batch, none for a full one. Measured
  with a bare consumer (no claim, no work; 2 cores, shared): 16-18 µs CPU per message at
  2000 msg/s and 3-5 µs on a backlog, against 106 µs and 65-77 µs for one ``to_thread`` hop
  per message and 128 µs and 79-88 µs for ``confluent_kafka.aio.AIOConsumer`` (2.16; every
  call is a thread-pool hop). A batch holds up to 100 *messages*; envelopes that are not
  inserts count toward it but are not returned.

Faults: a fault run (``scenario.fault``) gives each consumer a static group
membership, ``group.instance.id`` = its inbox name. A replacement started with the same index
after a kill then takes back the dead member's partitions at once, from their committed offsets,
instead of the group waiting for the dead member's session to time out and spreading its
partitions over the others: the reference's inbox claim (by consumer name, ``claim="owner"``)
lets only the same name re-work rows the dead one claimed, so the partitions must come back to
that name. With ``claim="takeover"`` (:mod:`lab.workload.inbox`) any consumer may re-work them
once the dead one's claim session is gone; static membership still saves the session timeout.
A stopped consumer (``consumer-dead``) keeps its partitions for as long as it stays within
``session.timeout.ms`` (45 s by default). Runs without a fault keep the reference's dynamic membership.

Broker-native stand (``scenario.producer == "direct"``): :mod:`lab.pipelines.producers`
writes the plain message JSON ``{"id", "content", "createdAt"}`` into topic ``messages``
(recreated per run the same way, 2N partitions) and no Debezium runs. The group and the inbox
names become ``kafka-<uuid>`` / ``kafka-<i>``; the source decides once, when it is built, which
of the two message parsers its read loop calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from lab.pipelines.backlog import KafkaBacklog
from lab.pipelines.base import BacklogReader, Capabilities, Item, SharedResources, claim_batch, row_parser
from lab.pipelines.kafka_admin import (
    METADATA_TIMEOUT,
    admin_client,
    delete_topic,
    group_id,
    partition_count,
    partitions_per_member,
    poll_until,
    recreate_topic,
    settled,
)
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import Stack
from lab.stack.debezium import SLOT, TOPIC_PREFIX
from lab.stack.kafka_broker import replication
from lab.workload.inbox import CLAIMS_APPLICATION, take_lease
from lab.workload.watermark import Watermark

log = logging.getLogger(__name__)

TOPIC = f"{TOPIC_PREFIX['kafka']}.public.messages"
DIRECT_TOPIC = "messages"  # the broker-native stand's topic (lab.pipelines.producers writes it)
PARTITIONS_PER_CONSUMER = 2
GROUP_PREFIX = "dbz-kafka-"
DIRECT_GROUP_PREFIX = "kafka-"
GATE_CHECKS = 3  # consecutive passing assignment checks
GATE_INTERVAL = 0.2


def consumer_config(settings: Settings, group: str | None, instance: str | None = None) -> dict[str, Any]:
    """The consumer settings of the reference study (plus a static ``group.instance.id`` when given)."""
    extra = {"group.instance.id": instance} if instance else {}
    return extra | {
        "bootstrap.servers": settings.kafka_bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
        "allow.auto.create.topics": False,
        "partition.assignment.strategy": "cooperative-sticky",
    }


def names(scenario: Scenario) -> tuple[str, str]:
    """(topic, group and consumer name prefix) for the scenario's producer."""
    if scenario.producer == "direct":
        return DIRECT_TOPIC, DIRECT_GROUP_PREFIX
    return TOPIC, GROUP_PREFIX


class KafkaPipeline:
    """Runner side: recreate the topic, gate on the group's assignment, run Debezium."""

    name: ClassVar[str] = "kafka"
    capabilities: ClassVar[Capabilities] = Capabilities(cdc_sink="kafka", broker="kafka")

    def __init__(self, scenario: Scenario, settings: Settings, stack: Stack) -> None:
        self.scenario = scenario
        self.settings = settings
        self.stack = stack
        self.partitions = PARTITIONS_PER_CONSUMER * scenario.consumers
        self.topic, self.prefix = names(scenario)
        self.direct = scenario.producer == "direct"
        self.replication = replication(settings)  # topology: 1 replica, or 3 with 2 in sync
        self.replicas: dict[str, int] | None = None
        self.group: str | None = None
        self.assignment: list[int] = []  # partitions per member when the gate passed
        self._admin_client: AdminClient | None = None

    @property
    def admin(self) -> AdminClient:
        if self._admin_client is None:
            self._admin_client = admin_client(self.settings)
        return self._admin_client

    def describe(self) -> dict[str, Any]:
        return {
            "producer": self.scenario.producer,
            "topic": self.topic,
            "partitions": self.partitions,
            "replication_factor": self.replication["replication_factor"],
            "min_insync_replicas": self.replication["min_insync_replicas"],
            "replicas_at_start": self.replicas,  # read back from the cluster once the topic exists
            "group_id": self.group,
            "consumer_config": {k: v for k, v in consumer_config(self.settings, self.group).items()
                                if k != "bootstrap.servers"},
            "assignment_gate": {"partitions_per_consumer": PARTITIONS_PER_CONSUMER,
                                "checks": GATE_CHECKS, "interval_s": GATE_INTERVAL,
                                "members": self.assignment},
            "debezium_sink": None if self.direct else self.capabilities.cdc_sink,
            "debezium_slot": None if self.direct else SLOT["kafka"],
            "source": ("lab.pipelines.producers straight into the topic (no outbox, no Debezium)"
                       if self.direct else "Debezium Server from the outbox table"),
            "inbox": self.capabilities.inbox_table,
            "claim": self.scenario.claim,
            "offsets": "per-partition watermark, stored once per batch",
            "membership": "static (group.instance.id = inbox name)" if self.scenario.fault else "dynamic",
        }

    async def prepare(self) -> None:
        await asyncio.to_thread(self._recreate_topic)

    def _recreate_topic(self) -> None:
        deadline = time.monotonic() + self.scenario.ready_timeout_s
        self.replicas, self.group = recreate_topic(self.admin, self.topic, self.partitions, self.replication,
                                                   self.prefix, deadline)

    def _delete_topic(self) -> None:
        delete_topic(self.admin, self.topic)

    def _members(self) -> list[int] | None:
        assert self.group is not None  # set by prepare()
        return partitions_per_member(self.admin, self.group, self.topic)

    async def wait_ready(self) -> None:
        """Every consumer owns exactly 2 partitions, 2N in all, on 3 checks in a row."""
        n = self.scenario.consumers
        want = [PARTITIONS_PER_CONSUMER] * n
        deadline = time.monotonic() + self.scenario.ready_timeout_s
        passes, seen = 0, None
        while passes < GATE_CHECKS:
            seen = await asyncio.to_thread(self._members)
            passes = passes + 1 if seen == want else 0
            if passes == GATE_CHECKS:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"group {self.group}: partitions per member {seen}, want {want} "
                                   f"after {self.scenario.ready_timeout_s:.0f} s")
            await asyncio.sleep(GATE_INTERVAL)
        self.assignment = want

    async def start_source(self) -> None:
        if not self.direct:  # the direct producer is the source; the runner starts it
            await asyncio.to_thread(self.stack.start_debezium, "kafka", durable=bool(self.scenario.fault))

    async def teardown(self) -> None:
        if not self.direct:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.stack.stop_debezium, "kafka")
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._delete_topic)
        if self.group is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._delete_group, self.group)

    def _delete_group(self, group: str) -> None:
        """Fails (and is ignored) while a member is alive, e.g. one killed without leaving."""
        self.admin.delete_consumer_groups([group], request_timeout=10)[group].result()

    def backlog(self, scratch: Path) -> BacklogReader | None:
        """The run's group's lag (:class:`lab.pipelines.backlog.KafkaBacklog`)."""
        return KafkaBacklog(self.settings, self.topic, self.group, self.partitions, scratch)


class _Partition:
    """One assigned partition: its watermark and the offset last stored for it."""

    __slots__ = ("marks", "number", "stored")

    def __init__(self, number: int) -> None:
        self.number = number
        self.marks = Watermark()
        self.stored = -1


class KafkaSource:
    """Consumer side: one confluent consumer in the run's group, one claim connection."""

    def __init__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> None:
        self.scenario = scenario
        self.settings = settings
        self.topic, prefix = names(scenario)
        self.me = f"{prefix}{index}"  # the inbox name and the static group.instance.id
        self.claimant = self.me  # with a lease for takeover claims
        self.takeover = scenario.claim == "takeover"
        self._prefix = prefix
        self._row = row_parser(scenario.producer)
        self.skipped = 0
        self.db_ops = 0
        self.decoded_bytes = 0
        self.group: str | None = None
        self._consumer: Consumer | None = None
        self._claims: psycopg.AsyncConnection[Any] | None = None
        self._parts: dict[int, _Partition] = {}
        self._dirty = False
        self._revoked_now = False  # a revocation was served during this fill

    async def open(self) -> None:
        self._claims = await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True,
                                                             application_name=CLAIMS_APPLICATION)
        if self.takeover:  # held by this session for its life
            self.claimant = await take_lease(self._claims, self.me)
        self.group = await asyncio.to_thread(self._find_group)
        instance = self.me if self.scenario.fault else None  # static membership in fault runs
        self._consumer = Consumer(consumer_config(self.settings, self.group, instance), logger=log)
        self._consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked,
                                 on_lost=self._lost)

    def _find_group(self) -> str:
        admin = admin_client(self.settings)
        deadline = time.monotonic() + self.scenario.ready_timeout_s
        poll_until(lambda: partition_count(admin, self.topic) is not None, deadline,
              f"topic {self.topic} does not exist; "
              "the runner creates it before the consumers start")
        return settled(lambda: group_id(admin, METADATA_TIMEOUT, self.topic, self._prefix), deadline,
                       f"id of topic {self.topic}")

    # rebalance callbacks: served inside consume(), i.e. between batches ------------------------
    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._parts[tp.partition] = _Partition(tp.partition)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with contextlib.suppress(KafkaException):
            self._store()  # librdkafka commits the revoked partitions' stored offsets next
        self._lost(consumer, partitions)

    def _lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._revoked_now = True
        for tp in partitions:
            self._parts.pop(tp.partition, None)

    # the read loop -------------------------------------------------------------------------
    async def fill(self, max_items: int, first_wait: float, flush_wait: float) -> list[Item]:
        assert self._consumer is not None
        self._revoked_now = False
        msgs = self._consumer.consume(max_items, 0)  # already fetched: never blocks
        if len(msgs) < max_items:
            msgs = await asyncio.to_thread(self._read, msgs, max_items, first_wait, flush_wait)
        batch: list[Item] = []
        if msgs:
            self._take(msgs, batch)
        if not batch and self._dirty:
            self._store()
        return batch

    def _read(self, msgs: list[Any], room: int, first_wait: float, flush_wait: float) -> list[Any]:
        """Blocking (worker thread): the first message within ``first_wait``, then more until
        ``room`` or until none arrives for ``flush_wait``."""
        assert self._consumer is not None
        consume = self._consumer.consume
        if not msgs:
            msgs = consume(1, first_wait)
        while msgs and len(msgs) < room and not self._revoked_now:  # hold what was read first
            more = consume(room - len(msgs), 0) or consume(1, flush_wait)
            if not more:
                break
            msgs.extend(more)
        return msgs

    def _take(self, msgs: list[Any], batch: list[Item]) -> None:
        parts, row_of = self._parts, self._row
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                log.warning("consumer %s: %s", self.me, err)  # librdkafka retries on its own
                continue
            value = m.value()
            number, offset = m.partition(), m.offset()
            part = parts.get(number)
            if part is None:  # revoked after it was read: worked if claimed, never stored
                part = _Partition(number)
            self.decoded_bytes += len(value) if value else 0
            row = row_of(value) if value else None
            if row is None:  # not an insert: acknowledged at once, not counted
                part.marks.advance(offset)
                self._dirty = True
                continue
            part.marks.hold(offset)
            batch.append(Item(*row, (part, offset)))

    async def claim(self, batch: list[Item]) -> list[Item]:
        assert self._claims is not None
        mine, statements = await claim_batch(self._claims, batch, self.claimant, self.done,  # lost: resolved too
                                             takeover=self.takeover)
        self.db_ops += statements
        self.skipped += len(batch) - len(mine)
        return mine

    def done(self, item: Item) -> None:
        part, offset = item.pos
        part.marks.resolve(offset)
        self._dirty = True

    async def idle(self) -> None:
        if self._dirty:
            self._store()

    def _store(self) -> None:
        """Store ``confirmable + 1`` of each assigned partition that moved (auto commit sends)."""
        self._dirty = False
        offsets = []
        for part in self._parts.values():
            upto = part.marks.confirmable
            if upto is not None and upto >= part.stored:
                part.stored = upto + 1
                offsets.append(TopicPartition(self.topic, part.number, upto + 1))
        if offsets:
            assert self._consumer is not None
            self._consumer.store_offsets(offsets=offsets)

    async def close(self) -> None:
        consumer = self._consumer
        if consumer is not None:
            with contextlib.suppress(Exception):
                self._store()
            self._consumer = None
            with contextlib.suppress(Exception):
                await asyncio.to_thread(consumer.close)  # commits stored offsets, leaves the group
        if self._claims is not None:
            with contextlib.suppress(Exception):
                await self._claims.close()
