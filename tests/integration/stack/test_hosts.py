"""The netns host layout for real: created, used, removed, nothing left behind."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator

import pytest

from lab.settings import Settings
from lab.stack import hosts
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


def _netem() -> bool:
    probe = "fl-netem-probe"
    subprocess.run(["ip", "netns", "add", probe], check=True)
    try:
        done = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                               "delay", "1ms"], capture_output=True)
        return done.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", probe], check=True)


def test_a_link_delay_slows_every_round_trip_or_is_refused_in_one_line(netns_settings: Settings) -> None:
    """With netem (CONFIG_NET_SCH_NETEM) a round trip between two hosts takes two delays; a kernel
    without it refuses the delay in one line and leaves no host behind."""
    import time

    s = netns_settings.replace(link_delay_ms=5.0)
    lay = hosts.layout(s)
    try:
        if not _netem():
            with pytest.raises(StackError, match="no netem") as info:
                hosts.create(s)
            assert "\n" not in str(info.value) and not hosts.leftovers(s)
            return
        hosts.create(s)
        with hosts.entered(lay.namespaces["postgres"]):
            server = socket.create_server((s.address("postgres"), 0))
        with hosts.entered(lay.namespaces["consumers"]):
            c = socket.create_connection((s.address("postgres"), server.getsockname()[1]), timeout=5)
        conn, _ = server.accept()
        t0 = time.monotonic()
        for _ in range(5):
            c.sendall(b"x")
            conn.recv(1)
            conn.sendall(b"y")
            c.recv(1)
        assert (time.monotonic() - t0) / 5 >= 0.010  # 5 ms each way
        c.close(), conn.close(), server.close()
    finally:
        hosts.remove(s)
    assert not hosts.leftovers(s)
