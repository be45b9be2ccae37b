"""The Kafka pipelines' bookkeeping on the cluster, through confluent-kafka's ``AdminClient``: a
topic deleted and created afresh, awaited in *cluster-wide* metadata (never requested by name: the
broker auto-creates topics), the run's group id from the topic's id, the replicas in sync, and a
consumer group's partitions per member.

A broker that has not yet applied a new topic's metadata answers "unknown topic" while another
broker already lists it (KRaft propagates metadata to each broker on its own; seen on the
three-node topology): such an answer means "not yet", never "failed" (:func:`settled`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TypeVar

from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

from lab.settings import Settings

log = logging.getLogger(__name__)
METADATA_TIMEOUT = 10.0  # seconds per cluster-wide metadata request
POLL_INTERVAL = 0.5  # topic absent / partitions present
T = TypeVar("T")
_MASK64 = (1 << 64) - 1
_NOT_YET = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE})


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap, "logger": log})  # type: ignore[dict-item]


def partition_count(admin: AdminClient, topic: str) -> int | None:
    """Partitions of ``topic`` in cluster-wide metadata (never by name); None if absent."""
    meta = admin.list_topics(timeout=METADATA_TIMEOUT).topics.get(topic)
    return None if meta is None or meta.error is not None else len(meta.partitions)


def group_id(admin: AdminClient, timeout: float, topic: str, prefix: str) -> str:
    """``<prefix><uuid>`` from the topic id Kafka gave ``topic`` when it was created: new on every
    run and readable by the runner and the consumers alike, so nothing else has to carry it."""
    desc = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic].result()
    tid = desc.topic_id
    msb, lsb = tid.get_most_significant_bits(), tid.get_least_significant_bits()
    bits = (msb & _MASK64) << 64 | lsb & _MASK64
    return f"{prefix}{uuid.UUID(int=bits)}"


def replica_counts(admin: AdminClient, topic: str, timeout: float = METADATA_TIMEOUT) -> dict[str, int]:
    """The fewest replicas and in-sync replicas of any partition of ``topic``, as Kafka reports them."""
    desc = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic].result()
    return {"replicas_min": min(len(p.replicas) for p in desc.partitions),
            "isr_min": min(len(p.isr) for p in desc.partitions)}


def _not_yet(exc: KafkaException) -> bool:
    return bool(exc.args) and isinstance(exc.args[0], KafkaError) and exc.args[0].code() in _NOT_YET


def settled(fetch: Callable[[], T], deadline: float, what: str) -> T:
    """``fetch()``, asked again while a broker still answers that the topic is unknown."""
    while True:
        try:
            return fetch()
        except KafkaException as exc:
            if not _not_yet(exc):
                raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {exc}") from exc
        time.sleep(POLL_INTERVAL)


def poll_until(check: Callable[[], bool], deadline: float, what: str) -> None:
    """Ask ``check`` (:func:`settled`) until it holds; TimeoutError saying ``what`` after ``deadline``."""
    while not settled(check, deadline, what):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(POLL_INTERVAL)


def delete_topic(admin: AdminClient, topic: str) -> None:
    """Delete ``topic``; one that does not exist is no error."""
    try:
        admin.delete_topics([topic], operation_timeout=30)[topic].result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise


def recreate_topic(admin: AdminClient, topic: str, partitions: int, replication: Mapping[str, int], prefix: str,
                   deadline: float) -> tuple[dict[str, int], str]:
    """Delete ``topic``, await it gone from cluster-wide metadata, create it with ``partitions``
    partitions and ``replication`` (``replication_factor``, ``min_insync_replicas``), await the
    partitions and every replica in sync; the replica counts the cluster reports and the run's
    group id (``<prefix><topic id>``)."""
    while True:
        delete_topic(admin, topic)
        poll_until(lambda: partition_count(admin, topic) is None, deadline,
                   f"topic {topic} still in cluster metadata after delete")
        new = NewTopic(topic, partitions, replication["replication_factor"],
                       config={"min.insync.replicas": str(replication["min_insync_replicas"])})
        future = admin.create_topics([new])[topic]
        try:
            future.result()
            break
        except KafkaException as exc:  # deletion not finished yet, or recreated meanwhile
            exists = exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
            if not exists or time.monotonic() > deadline:
                raise
    poll_until(lambda: partition_count(admin, topic) == partitions, deadline,
               f"topic {topic} does not show {partitions} partitions in cluster metadata")
    rf = replication["replication_factor"]
    poll_until(lambda: replica_counts(admin, topic)["isr_min"] >= rf, deadline,
               f"topic {topic} has partitions with fewer than {rf} replicas in sync")
    replicas = settled(lambda: replica_counts(admin, topic), deadline, f"replicas of topic {topic}")
    group = settled(lambda: group_id(admin, METADATA_TIMEOUT, topic, prefix), deadline, f"id of topic {topic}")
    log.info("topic %s: %d partitions, %s, group %s", topic, partitions, replicas, group)
    return replicas, group


def partitions_per_member(admin: AdminClient, group: str, topic: str) -> list[int] | None:
    """Partitions of ``topic`` per member of consumer group ``group`` when the group is stable;
    None otherwise (or when the broker does not answer)."""
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=METADATA_TIMEOUT)[group].result()
    except KafkaException:
        return None
    if desc.state != ConsumerGroupState.STABLE:
        return None
    owned = [{tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic} for m in desc.members]
    if len(set().union(*owned)) != sum(map(len, owned)):
        return None  # a partition listed twice: mid-rebalance
    return sorted(len(o) for o in owned)
