"""``kafka-share``: Debezium Server → one Kafka topic → one share group of N (queues for Kafka).

The same Debezium source and topic as ``kafka`` (``dbzk.public.messages``, the Kafka sink's
slot), but the N consumers form a *share group*: the broker hands each record to one member
under a time-limited acquisition lock, the member acknowledges it record by record, and any
number of members may read the same partition. So the topic has one partition whatever N is,
the way ``rabbitmq`` has one queue: N competing consumers of one log, not N owners of 2N logs.

Runner side (:class:`KafkaSharePipeline`): the topic is recreated as for ``kafka`` (deleted,
awaited gone from cluster-wide metadata, created with :data:`PARTITIONS` partition, awaited),
the run's group id comes from the new topic's id (``dbz-kafka-share-<uuid>``), and the group's
``share.auto.offset.reset`` is set to ``earliest`` before any member exists: a share group
starts at the log's *end* by default, so every record Debezium wrote before a member's first
fetch would otherwise be skipped. Share groups need Kafka 4.2 or later
(:func:`share_groups_supported`): 4.1 ships them as a preview whose broker rejects every share
fetch of a member whose generated id holds a ``+`` (it decodes the id as URL-safe base64).

Consumer side (:class:`KafkaShareSource`): ``confluent_kafka.ShareConsumer`` in explicit
acknowledgement mode, the full Debezium envelope parsed with orjson, one ``inbox`` claim per
batch as ``dbz-kafka-share-<index>``. Each record is acknowledged ``ACCEPT`` after its work
call (or at once when it is not an insert, or when another consumer won its claim);
acknowledgements travel with the next fetch, and close commits what is left.

Deviations and choices, with their reasons:

* **One fetch per batch, no top-up.** In explicit mode every record of one ``poll`` must be
  acknowledged before the next ``poll``, so a batch cannot be topped up with a second read the
  way ``kafka`` waits ``flush_wait`` for more: a batch is what one share fetch returned (at
  most ``batch_size`` records, ``max.poll.records``; the bound is soft in librdkafka). ``poll(0)``
  on the event loop takes what the client already holds; only an empty answer goes to one
  worker-thread ``poll`` that waits up to ``first_wait``.
* **A failed work call releases its record.** The shared consumer loop drops an item whose work
  call failed (no ack). Here the record is released (``RELEASE``) before the next fetch, which
  the next ``poll`` requires anyway: the broker delivers it again, to any member, as ``kafka``
  would after a restart from the last committed offset.
* **No assignment gate.** confluent-kafka 2.16 can neither list nor describe share groups
  (:class:`~confluent_kafka.admin.AdminClient` knows consumer groups only), so the runner cannot
  see the members as the ``kafka`` gate does. The gate is each consumer's ready file, written
  after it subscribed and its first ``poll`` returned (that poll sends the group heartbeat that
  joins it). A member that joins later misses nothing (``earliest``, and Debezium starts only
  after the gate); it only starts work later.
* **The broker's backlog** under a fault is the share group's lag (:mod:`lab.pipelines.share_lag`,
  asked of the group's coordinator): a share group commits no offsets, so the lag ``kafka``
  reads of its consumer group would count every record ever written.
* **Teardown** deletes the topic and the run's share group (Kafka's own ``deleteShareGroups`` is
  the ``DeleteGroups`` request, which confluent-kafka sends for any group); a group that still had
  a member then (one killed without leaving) is deleted by the next run's ``prepare``, so at most
  one empty group is ever left on the broker.
* **Kafka's lock and session, set on the group and recorded.** ``share.record.lock.duration.ms``
  is 30 s and ``share.session.timeout.ms`` 45 s, Kafka 4.2's defaults (the production setting),
  set explicitly on the run's group (:data:`GROUP_CONFIG`) so that run.json records them as a
  choice; what the broker then reports for the group's ``share.*`` settings, and its bounds
  (``group.share.delivery.count.limit`` among them), is recorded too (``group_config_applied``).
  Under a fault, a record a member acquired and did not acknowledge comes back when the broker
  releases it: when the member's share session ends or its lock expires (a SIGSTOPped member keeps
  its connection: its records stay locked for up to 30 s, or until it acknowledges them once
  continued). One smoke ``consumer-kill`` run (docs/faults.md) had no message wait for either.
  A fault run's drain therefore
  waits the lock's length longer for work (its :attr:`~lab.pipelines.base.Capabilities.redelivery_s`) before it
  counts what is missing as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from confluent_kafka import AcknowledgeType, KafkaException, ShareConsumer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from lab.pipelines.base import BacklogReader, Capabilities, Item, SharedResources, claim_batch, row_parser
from lab.pipelines.kafka import TOPIC, KafkaPipeline
from lab.pipelines.kafka_admin import (
    METADATA_TIMEOUT,
    admin_client,
    group_id,
    partition_count,
    poll_until,
    settled,
)
from lab.pipelines.share_lag import ShareBacklog
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import Stack, StackError
from lab.stack.debezium import SLOT
from lab.workload.inbox import CLAIMS_APPLICATION, take_lease

log = logging.getLogger(__name__)

PARTITIONS = 1  # whatever N is: members of a share group read the same partitions
GROUP_PREFIX = "dbz-kafka-share-"
SHARE_MIN_VERSION = (4, 2)  # share groups generally available; 4.1's preview fails this client
OPEN_POLL_S = 0.5  # the first poll in open(): sends the heartbeat that joins the group
POLL_S = 0.2  # reading the group's settings back until the broker reports them
RECORD_LOCK_MS = 30_000  # Kafka's default acquisition lock (group.share.record.lock.duration.ms)
SESSION_TIMEOUT_MS = 45_000  # Kafka's default share-group session (group.share.session.timeout.ms)
GROUP_CONFIG = {
    "share.auto.offset.reset": "earliest",
    "share.record.lock.duration.ms": str(RECORD_LOCK_MS),
    "share.session.timeout.ms": str(SESSION_TIMEOUT_MS),
}
# the broker's bounds and limits of share groups that a fault run's outcome depends on
BROKER_SHARE_CONFIGS = ("group.share.delivery.count.limit", "group.share.min.record.lock.duration.ms",
                        "group.share.max.record.lock.duration.ms", "group.share.min.session.timeout.ms",
                        "group.share.max.session.timeout.ms")


def share_groups_supported(kafka_version: str) -> bool:
    """Whether Kafka ``kafka_version`` (``4.2.2``, ``4.3.0-rc1``) serves share groups to this client."""
    m = re.match(r"(\d+)\.(\d+)", kafka_version)
    return m is not None and (int(m[1]), int(m[2])) >= SHARE_MIN_VERSION


def share_consumer_config(settings: Settings, group: str | None, batch_size: int) -> dict[str, Any]:
    """The share consumer's settings: explicit per-record acknowledgement, ``batch_size`` per fetch."""
    return {
        "bootstrap.servers": settings.kafka_bootstrap,
        "group.id": group,
        "share.acknowledgement.mode": "explicit",
        "max.poll.records": batch_size,
    }


class KafkaSharePipeline(KafkaPipeline):
    """Runner side: recreate the one-partition topic, set the group's start, run Debezium."""

    name: ClassVar[str] = "kafka-share"
    capabilities: ClassVar[Capabilities] = Capabilities(
        cdc_sink="kafka", broker="kafka", redelivery_s=RECORD_LOCK_MS / 1000,
        stand_refusal="producer='direct' writes the kafka pipeline's topic (run it with --pipeline kafka)")

    def __init__(self, scenario: Scenario, settings: Settings, stack: Stack) -> None:
        super().__init__(scenario, settings, stack)
        self.partitions = PARTITIONS
        self.prefix = GROUP_PREFIX
        self.applied: dict[str, str] = {}  # the group's share.* settings and the broker's bounds, as read back

    def describe(self) -> dict[str, Any]:
        return {
            "producer": self.scenario.producer,
            "topic": self.topic,
            "partitions": self.partitions,
            "replication_factor": self.replication["replication_factor"],
            "min_insync_replicas": self.replication["min_insync_replicas"],
            "replicas_at_start": self.replicas,
            "group_id": self.group,
            "group_type": "share",
            "group_config": GROUP_CONFIG,
            "group_config_applied": self.applied,
            "consumer_config": {k: v for k, v in share_consumer_config(
                self.settings, self.group, self.scenario.batch_size).items() if k != "bootstrap.servers"},
            "ready_gate": "consumers' ready files (subscribed, first poll returned)",
            "debezium_sink": self.capabilities.cdc_sink,
            "debezium_slot": SLOT["kafka"],
            "source": "Debezium Server from the outbox table",
            "inbox": self.capabilities.inbox_table,
            "claim": self.scenario.claim,
            "acknowledgement": "per record (ACCEPT after the work), sent with the next fetch",
        }

    async def prepare(self) -> None:
        version = self.settings.kafka_version
        if not share_groups_supported(version):
            raise StackError(f"kafka-share needs Kafka {'.'.join(map(str, SHARE_MIN_VERSION))} or later "
                             f"(share groups); this stack runs {version} (LAB_KAFKA_VERSION)")
        await asyncio.to_thread(self._forget_previous_group)
        await asyncio.to_thread(self._recreate_topic)
        await asyncio.to_thread(self._configure_group)

    def _configure_group(self) -> None:
        assert self.group is not None  # set by _recreate_topic
        resource = ConfigResource("group", self.group, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in GROUP_CONFIG.items()])
        self.admin.incremental_alter_configs([resource], request_timeout=METADATA_TIMEOUT)[resource].result()
        self.applied = self._applied_configs()

    def _applied_configs(self) -> dict[str, str]:
        """The group's ``share.*`` settings and the broker's :data:`BROKER_SHARE_CONFIGS`, as the
        broker reports them once it reports :data:`GROUP_CONFIG` (a group's settings reach the
        broker's view a moment after they were set; asked for up to :data:`METADATA_TIMEOUT`);
        empty when it cannot say (the run records that, it does not fail on it)."""
        assert self.group is not None
        group = ConfigResource("group", self.group)
        deadline = time.monotonic() + METADATA_TIMEOUT
        try:
            broker = ConfigResource("broker", str(self.broker_id()))
            while True:
                found = self.admin.describe_configs([group, broker], request_timeout=METADATA_TIMEOUT)
                own = {k: e.value for k, e in found[group].result().items() if k.startswith("share.")}
                if all(own.get(k) == v for k, v in GROUP_CONFIG.items()) or time.monotonic() > deadline:
                    break
                time.sleep(POLL_S)
            bounds = found[broker].result()
        except KafkaException as exc:
            log.warning("share group %s: its settings could not be read back: %s", self.group, exc)
            return {}
        if differ := {k: own.get(k) for k, v in GROUP_CONFIG.items() if own.get(k) != v}:
            log.warning("share group %s: the broker reports %s, not what was set", self.group, differ)
        return dict(sorted(own.items())) | {k: bounds[k].value for k in BROKER_SHARE_CONFIGS if k in bounds}

    def broker_id(self) -> int:
        """A broker of the cluster (the group's settings are the same on every one)."""
        return min(self.admin.list_topics(timeout=METADATA_TIMEOUT).brokers)

    async def wait_ready(self) -> None:
        """Nothing to check on the broker (see the module's docstring): the ready files are the gate."""

    def _forget_previous_group(self) -> None:
        """Delete the share group of the run before (named after the topic this run replaces), whose
        own teardown could not: a member was still in it (killed without leaving; its session has
        long expired now). So at most one empty group outlives its run."""
        try:
            previous = group_id(self.admin, METADATA_TIMEOUT, self.topic, self.prefix)
        except Exception:  # no topic yet: no earlier run's group either
            return
        try:
            self._delete_group(previous)
            log.info("deleted the share group %s of an earlier run", previous)
        except Exception as exc:  # gone already (its own teardown deleted it), or never made
            log.debug("share group %s not deleted: %s", previous, exc)

    def backlog(self, scratch: Path) -> BacklogReader | None:
        """The share group's lag (:class:`lab.pipelines.share_lag.ShareBacklog`): a share group commits
        no offsets, so ``kafka``'s reader of the group's lag has nothing to read here."""
        return ShareBacklog(self.settings.kafka_bootstrap, self.group, self.topic, self.partitions)


class KafkaShareSource:
    """Consumer side: one share consumer in the run's group, one claim connection."""

    def __init__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> None:
        self.scenario = scenario
        self.settings = settings
        self.topic = TOPIC
        self.me = f"{GROUP_PREFIX}{index}"  # the inbox name
        self.claimant = self.me
        self.takeover = scenario.claim == "takeover"
        self._row = row_parser(scenario.producer)
        self.skipped = 0
        self.db_ops = 0
        self.decoded_bytes = 0
        self.group: str | None = None
        self._consumer: ShareConsumer | None = None
        self._claims: psycopg.AsyncConnection[Any] | None = None
        self._held: list[Any] = []  # records a poll returned before the loop asked (open's poll)
        self._open: dict[tuple[int, int], Any] = {}  # (partition, offset) -> record not yet acknowledged

    async def open(self) -> None:
        self._claims = await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True,
                                                             application_name=CLAIMS_APPLICATION)
        if self.takeover:
            self.claimant = await take_lease(self._claims, self.me)
        self.group = await asyncio.to_thread(self._find_group)
        consumer = ShareConsumer(share_consumer_config(self.settings, self.group, self.scenario.batch_size),
                                 logger=log)
        consumer.subscribe([self.topic])
        self._consumer = consumer
        self._held = list(await asyncio.to_thread(consumer.poll, OPEN_POLL_S))

    def _find_group(self) -> str:
        admin = admin_client(self.settings)
        deadline = time.monotonic() + self.scenario.ready_timeout_s
        poll_until(lambda: partition_count(admin, self.topic) is not None, deadline,
              f"topic {self.topic} does not exist; the runner creates it before the consumers start")
        return settled(lambda: group_id(admin, METADATA_TIMEOUT, self.topic, GROUP_PREFIX), deadline,
                       f"id of topic {self.topic}")

    async def fill(self, max_items: int, first_wait: float, flush_wait: float) -> list[Item]:
        consumer = self._consumer
        assert consumer is not None
        if self._open:  # work calls that failed: the broker delivers these again
            for record in self._open.values():
                consumer.acknowledge(record, AcknowledgeType.RELEASE)
            self._open.clear()
        records: Any
        if self._held:
            records, self._held = self._held, []
        else:
            records = consumer.poll(0)  # what the client already fetched: never blocks
            if not records:
                records = await asyncio.to_thread(consumer.poll, first_wait)
        batch: list[Item] = []
        if records:
            self._take(records, batch)
        return batch

    def _take(self, records: Any, batch: list[Item]) -> None:
        consumer, row_of, held = self._consumer, self._row, self._open
        assert consumer is not None
        for m in records:
            err = m.error()
            if err is not None:  # librdkafka has acknowledged it already (release or reject)
                if err.fatal():
                    raise KafkaException(err)
                log.warning("consumer %s: %s", self.me, err)
                continue
            value = m.value()
            self.decoded_bytes += len(value) if value else 0
            row = row_of(value) if value else None
            if row is None:  # not an insert: acknowledged at once, not counted
                consumer.acknowledge(m)
                continue
            held[m.partition(), m.offset()] = m
            batch.append(Item(*row, m))

    async def claim(self, batch: list[Item]) -> list[Item]:
        assert self._claims is not None
        mine, statements = await claim_batch(self._claims, batch, self.claimant, self.done,
                                             takeover=self.takeover)
        self.db_ops += statements
        self.skipped += len(batch) - len(mine)
        return mine

    def done(self, item: Item) -> None:
        m = item.pos
        if self._open.pop((m.partition(), m.offset()), None) is not None:
            assert self._consumer is not None
            self._consumer.acknowledge(m)

    async def idle(self) -> None:
        """Nothing to flush: the acknowledgements go with the next fetch, which follows at once."""

    async def close(self) -> None:
        consumer = self._consumer
        if consumer is not None:
            self._consumer = None
            with contextlib.suppress(Exception):
                await asyncio.to_thread(consumer.close)  # commits the acknowledgements, leaves the group
        if self._claims is not None:
            with contextlib.suppress(Exception):
                await self._claims.close()
