"""Runs with every participant group on a host of its own (``--hosts netns``), on a stack of their own."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack import hosts, linkdelay
from lab.stack.native import NativeStack
from lab.stack.proc import same_process, start_ticks
from tests.conftest import test_settings as moved_settings

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]
OFFSET = 500
M = 500


@pytest.fixture(scope="module")
def netns_stack() -> Iterator[NativeStack]:
    settings = moved_settings(OFFSET, "test-hosts", hosts="netns")
    stack = NativeStack(settings)
    stack.down(purge=True)
    rabbitmq: list[dict[str, object]] = []  # its script, epmd, beam.smp and helpers
    try:
        with pytest.MonkeyPatch.context() as mp:
            # a second stack on two shared cores: Debezium once needed more than its 120 s to stream
            mp.setattr("lab.stack.debezium.START_TIMEOUT", 300.0)
            stack.up()
            rabbitmq += [{"pid": p.pid, "start_ticks": start_ticks(p.pid)} for r in stack.rabbitmq.processes()
                         for p in [r, *r.children(recursive=True)]]
            yield stack
    finally:
        from lab.measure.cgroups import remove_scope

        stack.down(purge=True)
        remove_scope(settings)
        assert not hosts.leftovers(settings)
        assert linkdelay.delayer(settings) is None  # no delayer (its rules went with the namespaces)
        assert not [r for r in rabbitmq if same_process(r) is not None]


def run(settings: Settings, **kw: Any) -> dict[str, Any]:
    return asyncio.run(run_scenario(Scenario(**{"messages": M, "cooldown_s": 0, "consumers": 2, **kw}), settings))


def _netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def _listeners(netns: str | None) -> list[str]:
    argv = ["ss", "-ltnH"] if netns is None else ["ip", "netns", "exec", netns, "ss", "-ltnH"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if line.strip()]


def test_each_service_runs_in_its_host_and_listens_on_its_address_only(netns_stack: NativeStack) -> None:
    s = netns_stack.settings
    lay = hosts.layout(s)
    for host, procs in (("postgres", netns_stack.postgres.processes()), ("broker", netns_stack.kafka.processes()),
                        ("rabbitmq", netns_stack.rabbitmq.processes())):
        assert procs, host
        for p in [q for r in procs for q in [r, *r.children(recursive=True)]]:  # beam.smp too
            assert _netns_inode(f"/proc/{p.pid}/ns/net") == _netns_inode(f"/run/netns/{lay.namespaces[host]}")
    own_ports = {str(p) for p in (s.pg_port, s.kafka_port, s.kafka_controller_port, s.amqp_port,
                                  s.rabbitmq_dist_port, s.rabbitmq_epmd_port)}
    # nothing of this stack listens in the runner's namespace, and in its host only on its own address
    assert not [a for a in _listeners(None) if a.rsplit(":", 1)[1] in own_ports]
    for host, ns in lay.namespaces.items():
        for addr in _listeners(ns):
            assert addr.rsplit(":", 1)[0] in (s.address(host), "127.0.0.1"), (host, addr)
    # RabbitMQ: AMQP on its host's address, epmd and the distribution on that host's own loopback
    assert {f"{s.address('rabbitmq')}:{s.amqp_port}", f"127.0.0.1:{s.rabbitmq_epmd_port}",
            f"127.0.0.1:{s.rabbitmq_dist_port}"} <= set(_listeners(lay.namespaces["rabbitmq"]))


def _check(r: dict[str, Any], settings: Settings) -> dict[str, Any]:
    assert r["success"], r["error"]
    c = r["counters"]
    assert c["sent"] == c["work_calls"] == c["work_distinct"] == M
    net = r["network"]
    assert net["messages"] == M and net["link_delay_ms"] == 0.0
    hops = {k: v["bytes_per_msg"] for k, v in net["hops"].items()}
    # the web's inserts and every work call cross a link: at least a row's or a request's bytes
    assert hops["web → postgres"] > 50 and hops["consumers → web"] > 50
    stored = json.loads((Path(settings.data_dir) / "runs" / r["run_id"] / "run.json").read_text())
    assert stored["network"] == net
    return hops


def test_wal_at_n2_on_hosts_measures_bytes_per_hop(netns_stack: NativeStack) -> None:
    s = netns_stack.settings
    r = run(s, pipeline="wal")
    hops = _check(r, s)
    assert hops["postgres → consumers"] > 2 * 50  # each of two readers streams every row
    assert hops["postgres → debezium"] == hops["debezium → broker"] == hops["broker → consumers"] == 0
    assert r["cpu_s"]["postgres"] > 0 and r["cpu_s"]["consumers"] > 0 and r["cpu_s"]["web"] > 0


@pytest.mark.matrix
def test_kafka_at_n2_on_hosts_measures_bytes_per_hop(netns_stack: NativeStack) -> None:
    s = netns_stack.settings
    r = run(s, pipeline="kafka")
    hops = _check(r, s)
    for hop in ("postgres → debezium", "debezium → broker", "broker → consumers"):
        assert hops[hop] > 50, hop
    assert r["cpu_s"]["debezium"] > 0 and r["cpu_s"]["kafka"] > 0


def test_rabbitmq_at_n2_on_hosts_measures_bytes_per_hop(netns_stack: NativeStack) -> None:
    s = netns_stack.settings
    r = run(s, pipeline="rabbitmq")
    hops = _check(r, s)
    for hop in ("postgres → debezium", "debezium → broker", "broker → consumers"):
        assert hops[hop] > 50, hop
    pairs = r["network"]["pairs"]  # the broker's bytes are RabbitMQ's host's: Kafka, idle, exchanged none
    assert pairs["debezium>rabbitmq"]["bytes"] == r["network"]["hops"]["debezium → broker"]["bytes"]
    assert pairs["rabbitmq>consumers"]["bytes"] == r["network"]["hops"]["broker → consumers"]["bytes"]
    assert "debezium>broker" not in pairs and "broker>consumers" not in pairs
    assert r["cpu_s"]["debezium"] > 0 and r["cpu_s"]["rabbitmq"] > 0


def test_wal_with_a_5ms_link_delay_is_later_by_its_hops_and_reports_the_delay(netns_stack: NativeStack) -> None:
    """Every host's packets leave 5 ms late (netem, or the userspace delayer where the kernel has no
    netem): a message crosses postgres → consumers (the WAL), consumers → postgres → consumers (its
    claim) and consumers → web (the work call), four delays, 20 ms, on top of what it takes at 0."""
    s = netns_stack.settings.replace(link_delay_ms=5.0)
    r = run(s, pipeline="wal", rate=250.0)
    assert r["success"], r["error"]
    net = r["network"]
    assert net["link_delay_ms"] == 5.0 and net["link_delay_mechanism"] in ("netem", "nfqueue")
    assert r["latency_ms"]["p50"] >= 20.0
    if net["link_delay_mechanism"] == "nfqueue":
        assert net["delayer_cpu_s"] > 0 and net["delayer"]["packets"] > M and net["delayer"]["dropped"] == 0
        assert "delayer" not in r["cpu_s"]  # lab infrastructure, in no participant
