"""The netns host layout for real: created, used, removed, nothing left behind."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from lab.settings import Settings
from lab.stack import hosts, linkdelay
from lab.stack.base import StackError
from tests.conftest import test_settings as moved_settings

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]


@pytest.fixture
def netns_settings() -> Iterator[Settings]:
    s = moved_settings(name="hosts-layout", hosts="netns")
    yield s
    shutil.rmtree(s.stack_dir, ignore_errors=True)  # only the layout's record was ever in it


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_a_layout_is_created_idempotently_connects_its_hosts_and_is_removed_without_trace(
        netns_settings: Settings) -> None:
    s = netns_settings
    lay = hosts.layout(s)
    try:
        hosts.create(s)
        hosts.create(s)  # a second call keeps it
        assert hosts.complete(s)
        assert (s.stack_dir / hosts.RECORD).exists()
        assert set(lay.namespaces.values()) | {lay.switch} <= set(_ip("netns", "list").split())
        with hosts.entered(lay.namespaces["postgres"]):
            server = socket.create_server((s.address("postgres"), 0))
        port = server.getsockname()[1]
        before, pairs = hosts.link_bytes(s), hosts.pair_bytes(s)
        with hosts.entered(lay.namespaces["consumers"]):  # host to host through the bridge
            with socket.create_connection((s.address("postgres"), port), timeout=5) as c:
                conn, _ = server.accept()
                c.sendall(b"x" * 100_000)
                got = 0
                while got < 100_000:
                    got += len(conn.recv(65536))
                conn.close()
            with pytest.raises(OSError):  # no route beyond the lab's /24
                socket.create_connection(("192.0.2.1", 9), timeout=2)
        server.close()
        after = hosts.link_bytes(s)
        assert after["consumers"]["sent"] - before["consumers"]["sent"] >= 100_000
        assert after["postgres"]["received"] - before["postgres"]["received"] >= 100_000
        moved = {p: n - pairs[p] for p, n in hosts.pair_bytes(s).items()}
        assert moved["consumers>postgres"] >= 100_000 and moved["consumers>web"] == 0
        assert 0 < moved["postgres>consumers"] < 100_000  # the acknowledgements
        # a crash half-way: one more namespace by this stack's names, and the record gone
        (s.stack_dir / hosts.RECORD).unlink()
        _ip("netns", "add", lay.prefix_ns + "stray")
        assert not hosts.create(s) or hosts.complete(s)  # the partial layout is made whole again
    finally:
        hosts.remove(s)
    assert not hosts.leftovers(s)
    netns, links = _ip("netns", "list"), _ip("link")
    assert lay.prefix_ns not in netns and lay.prefix_link not in links
    assert not (s.stack_dir / hosts.RECORD).exists()


def _round_trip_s(s: Settings, lay: hosts.Layout, n: int = 5, client: str = "consumers",
                  server_host: str = "postgres") -> float:
    """The mean time of a one-byte exchange from ``client``'s host to ``server_host``'s and back."""
    with hosts.entered(lay.namespaces[server_host]):
        server = socket.create_server((s.address(server_host), 0))
    with hosts.entered(lay.namespaces[client]):
        c = socket.create_connection((s.address(server_host), server.getsockname()[1]), timeout=5)
    conn, _ = server.accept()
    t0 = time.monotonic()
    for _ in range(n):
        c.sendall(b"x")
        conn.recv(1)
        conn.sendall(b"y")
        c.recv(1)
    elapsed = (time.monotonic() - t0) / n
    c.close(), conn.close(), server.close()
    return elapsed


def _delayers() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if "lab.stack.delayer" in (p.info["cmdline"] or [])]


def test_a_link_delay_slows_every_round_trip_and_goes_with_the_hosts(netns_settings: Settings) -> None:
    """5 ms on every host's way out: a round trip between two hosts takes two delays, by netem or,
    on a kernel without it, by the userspace delayer, whose death fails the check a run makes at
    its window's edges; 0 removes the delay, and removing the hosts leaves no delayer and no rule."""
    s = netns_settings.replace(link_delay_ms=5.0)
    lay = hosts.layout(s)
    before = {p.pid for p in _delayers()}
    try:
        hosts.create(s)
        via = linkdelay.mechanism(s)
        assert via in ("netem", "nfqueue")
        assert _round_trip_s(s, lay) >= 0.010  # 5 ms each way
        if via == "nfqueue":
            delayer = linkdelay.delayer(s)
            assert delayer is not None
            hosts.create(s)  # the same delay: kept
            assert linkdelay.delayer(s) == delayer
            counted = linkdelay.queue_counters(list(lay.namespaces.values()))
            assert counted["packets"] >= 10 and counted["dropped"] == 0  # the exchange: 5 round trips and the handshake
            hosts.create(s.replace(link_delay_ms=0.0))  # 0 removes it
            assert linkdelay.delayer(s) is None and linkdelay.mechanism(s) is None
            assert _round_trip_s(s, lay) < 0.005
            hosts.create(s)
            linkdelay.check(s)
            killed = linkdelay.delayer(s)
            assert killed is not None
            killed.kill()
            killed.wait(5)
            with pytest.raises(StackError, match="delayer is gone") as info:
                linkdelay.check(s)
            assert "\n" not in str(info.value)
    finally:
        hosts.remove(s)
    assert not hosts.leftovers(s)
    assert linkdelay.delayer(s) is None and {p.pid for p in _delayers()} <= before
    assert not (linkdelay.state_dir(s) / linkdelay.RECORD).exists()


def test_a_link_delay_reaches_every_host_of_the_ha_layout(netns_settings: Settings) -> None:
    """Under ``ha`` the delay is on every host, RabbitMQ's and each further node's included: a round
    trip from any host to the standby's takes two delays (one would mean a host left undelayed)."""
    s = netns_settings.replace(link_delay_ms=5.0, topology="ha")
    lay = hosts.layout(s)
    assert {"rabbitmq", "rabbitmq-2", "broker-3", "postgres-standby"} <= set(lay.namespaces)
    try:
        hosts.create(s)
        took = {h: _round_trip_s(s, lay, n=2, client=h, server_host="postgres-standby")
                for h in lay.namespaces if h != "postgres-standby"}
        took["postgres-standby"] = _round_trip_s(s, lay, n=2, client="postgres-standby", server_host="rabbitmq")
        assert {h: t for h, t in took.items() if t < 0.010} == {}
    finally:
        hosts.remove(s)
    assert not hosts.leftovers(s)
    assert linkdelay.delayer(s) is None
