"""The ``ha`` topology with every participant group, each broker node and the standby on a host of
its own (``--topology ha --hosts netns``), on a stack of their own. Heavy (three Kafka JVMs, three
Erlang VMs, two PostgreSQL servers): the matrix tier."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

from lab.pipelines import PIPELINES
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.stack import hosts
from lab.stack.kafka_broker import KafkaCluster
from lab.stack.native import NativeStack
from lab.stack.rabbitmq_cluster import RabbitMQCluster
from tests.conftest import test_settings as moved_settings

pytestmark = [pytest.mark.integration, pytest.mark.matrix,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]
OFFSET = 600
M = 500
BROKER_HOSTS = ("broker", "broker-2", "broker-3", "rabbitmq", "rabbitmq-2", "rabbitmq-3")


@pytest.fixture(scope="module")
def ha_hosts() -> Iterator[NativeStack]:
    settings = moved_settings(OFFSET, "test-hosts-ha", topology="ha", hosts="netns")
    stack = NativeStack(settings)
    stack.down(purge=True)
    try:
        with pytest.MonkeyPatch.context() as mp:  # three more JVMs on two shared cores
            mp.setattr("lab.stack.debezium.START_TIMEOUT", 300.0)
            mp.setattr("lab.stack.rabbitmq_broker.START_TIMEOUT", 300.0)
            mp.setattr("lab.stack.kafka_broker.HA_START_TIMEOUT", 300.0)
            stack.up()
            yield stack
    finally:
        from lab.measure.cgroups import remove_scope

        stack.down(purge=True)
        remove_scope(settings)
        assert not hosts.leftovers(settings)


def _run(stack: NativeStack, pipeline: str) -> dict[str, Any]:
    r = asyncio.run(run_scenario(Scenario(pipeline=pipeline, messages=M, cooldown_s=0, consumers=2), stack.settings))
    assert r["success"], r["error"]
    c = r["counters"]
    assert c["sent"] == c["work_calls"] == c["work_distinct"] == M
    return r


def _inode(path: str) -> int:
    return os.stat(path).st_ino


def test_each_node_runs_on_its_own_host(ha_hosts: NativeStack) -> None:
    lay = hosts.layout(ha_hosts.settings)
    kafka, rabbitmq = ha_hosts.kafka, ha_hosts.rabbitmq
    assert isinstance(kafka, KafkaCluster) and isinstance(rabbitmq, RabbitMQCluster)
    nodes: dict[str, Any] = {"postgres-standby": ha_hosts.standby,
                             **dict(zip(BROKER_HOSTS, [*kafka.nodes, *rabbitmq.nodes], strict=True))}
    for host, service in nodes.items():
        procs = service.processes()
        assert procs, host
        for p in procs:
            assert _inode(f"/proc/{p.pid}/ns/net") == _inode(f"/run/netns/{lay.namespaces[host]}"), host
    assert rabbitmq.clustered()


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_ha_on_hosts_runs_and_counts_the_replication(ha_hosts: NativeStack, pipeline: str) -> None:
    r = _run(ha_hosts, pipeline)
    pairs = r["network"]["pairs"]
    hops = {k: v["bytes_per_msg"] for k, v in r["network"]["hops"].items()}
    # whatever the pipeline, the standby streams every row (and every claim) from the primary
    assert pairs["postgres>postgres-standby"]["bytes_per_msg"] > 50
    sink = PIPELINES[pipeline].capabilities.cdc_sink
    if sink is None:  # the rows reach the consumers from PostgreSQL itself
        assert hops["postgres → consumers"] > 50
        assert hops["debezium → broker"] == hops["broker → consumers"] == 0
        return
    assert hops["debezium → broker"] > 50 and hops["broker → consumers"] > 50
    first = "broker" if sink == "kafka" else "rabbitmq"
    nodes = (first, f"{first}-2", f"{first}-3")
    # every row reaches two nodes of the broker's cluster from a third (replicas, quorum followers):
    # which node leads is the cluster's choice
    received = {n: sum(v["bytes"] for k, v in pairs.items() if k.endswith(f">{n}") and k.split(">")[0] in nodes)
                for n in nodes}
    assert sum(b > 50 * M for b in received.values()) >= 2, received


def _fault_run(stack: NativeStack, pipeline: str, fault: str, messages: int) -> dict[str, Any]:
    r = asyncio.run(run_scenario(Scenario(pipeline=pipeline, messages=messages, cooldown_s=0, consumers=2,
                                          rate=200, claim="takeover", fault=fault, drain_timeout_s=300),
                                 stack.settings))
    acc = r["fault"]["accounting"] or {}
    assert r["success"], r["error"]
    assert acc["adds_up"] and acc["lost"] == 0, acc
    return r


def test_a_broker_node_killed_on_its_host_is_started_there_again(ha_hosts: NativeStack) -> None:
    lay = hosts.layout(ha_hosts.settings)
    node = ha_hosts.service("kafka-2")
    (before,) = node.processes()[:1]
    r = _fault_run(ha_hosts, "kafka", "broker-node-kill:2@3s+5s", 1600)
    whats = [e["what"] for e in r["fault"]["events"]]
    assert whats[0] == "node killed" and "node started" in whats
    (after,) = node.processes()[:1]
    assert after.pid != before.pid
    assert _inode(f"/proc/{after.pid}/ns/net") == _inode(f"/run/netns/{lay.namespaces['broker-2']}")


@pytest.mark.parametrize("pipeline", ["wal", "wal-relay"])
def test_a_postgres_failover_on_hosts_fails_back_into_the_hosts(ha_hosts: NativeStack, pipeline: str) -> None:
    """The readers (and the relay) find the promoted standby at its host's address; afterwards the
    primary and a rebuilt standby run in their own hosts again."""
    lay = hosts.layout(ha_hosts.settings)
    r = _fault_run(ha_hosts, pipeline, "postgres-failover@12s", 6000)
    whats = [e["what"] for e in r["fault"]["events"]]
    assert "standby promoted" in whats
    assert pipeline != "wal-relay" or "slot held again" in whats  # the relay streams its synced slot there
    assert ha_hosts.standby is not None and not ha_hosts.standby.promoted()
    for host, service in (("postgres", ha_hosts.postgres), ("postgres-standby", ha_hosts.standby)):
        procs = service.processes()
        assert procs, host
        assert _inode(f"/proc/{procs[0].pid}/ns/net") == _inode(f"/run/netns/{lay.namespaces[host]}"), host
