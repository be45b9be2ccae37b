"""No packet to a layout address leaves the lab's bridge while the netns layout is not there.

In the root namespace an iptables rule drops and counts every packet to ``10.231.0.0/16`` that
would go out of an interface other than a lab runner link (``fl<id>-runp``): the default route, a
VPN. With ``LAB_HOSTS=netns`` and the layout never made, or half made (its runner link gone),
`lab stack down` must clean up and `lab run` refuse in one line, and the counter must stay 0; so
too with the layout up but one of its addresses sent elsewhere by a policy rule or a host route.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import SUBNET_PREFIX, Settings
from lab.stack import hosts, netns, proc
from lab.stack.base import StackError
from tests.conftest import lab_env
from tests.conftest import test_settings as moved_settings

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and iptables need root"),
              pytest.mark.skipif(shutil.which("iptables") is None, reason="no iptables command")]
LAB = [sys.executable, "-m", "lab"]
OFFSET = 750
COMMENT = f"fanout-lab-test-guard-{os.getpid()}"
RULE = ["OUTPUT", "-d", f"{SUBNET_PREFIX}.0.0/16", "!", "-o", f"{hosts.PREFIX}+",
        "-m", "comment", "--comment", COMMENT, "-j", "DROP"]


@contextlib.contextmanager
def _dead_end_link() -> Iterator[str]:
    """A veth link of this namespace whose other end lies in a namespace with no address: whatever is
    routed onto it leaves nowhere (as a VPN's link would take it elsewhere). Removed at the end, its
    routes with it."""
    ns, link = f"guard-test-{os.getpid()}", f"gd{os.getpid() % 10**8}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", link + "p", "netns", ns],
                       check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", link + "p", "up"], check=True)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        yield link
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True)  # its routes go with it
        subprocess.run(["ip", "netns", "del", ns], check=True)


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True)


def _dropped() -> int:
    """Packets the rule has dropped (and counted) so far."""
    out = _iptables("-L", "OUTPUT", "-n", "-v", "-x").stdout
    lines = [line for line in out.splitlines() if f"/* {COMMENT} */" in line]
    assert len(lines) == 1, out
    return int(lines[0].split()[0])


@pytest.fixture
def counted() -> Iterator[None]:
    """The counting rule, first in the root namespace's OUTPUT chain, removed whatever happens."""
    done = _iptables("-I", *RULE[:1], "1", *RULE[1:])
    if done.returncode != 0:
        pytest.skip(f"cannot add an iptables rule here: {done.stderr.strip()}")
    try:
        yield
    finally:
        while _iptables("-D", *RULE).returncode == 0:
            pass
        assert COMMENT not in _iptables("-S", "OUTPUT").stdout


@pytest.fixture
def guard_settings() -> Iterator[Settings]:
    s = moved_settings(OFFSET, "hosts-guard", hosts="netns")
    hosts.remove(s)
    try:
        yield s
    finally:
        hosts.remove(s)
        shutil.rmtree(s.stack_dir, ignore_errors=True)


def _lab(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAB, *args], env=lab_env(settings), capture_output=True, text=True, timeout=120)


def _no_contact_without_the_layout(s: Settings) -> None:
    assert not hosts.routed(s)
    before = _dropped()
    assert not proc.port_open(s.pg_port, s.pg_host)  # refused here, not by the rule
    down = _lab(s, "stack", "down")
    assert down.returncode == 0, down.stderr
    assert not hosts.leftovers(s)
    run = _lab(s, "run", "--pipeline", "wal", "--consumers", "1", "--messages", "10")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"lab: error: {hosts.NOT_UP}"]
    # a notebook or a script calls the runner without the CLI: it refuses as well
    with pytest.raises(StackError, match="lab stack up"):
        asyncio.run(run_scenario(Scenario(pipeline="wal", consumers=1, messages=10), s))
    assert _dropped() == before == 0


def test_nothing_leaves_without_a_layout_and_the_rule_counts_what_would(
        counted: None, guard_settings: Settings) -> None:
    s = guard_settings
    _no_contact_without_the_layout(s)
    # the control: the stack's /24 routed onto a link that is not the lab's (as a VPN would), whose
    # other end is in a namespace with no address (nothing can leave through it): the guard refuses,
    # and a connect around the guard is what the rule counts
    with _dead_end_link() as link:
        subprocess.run(["ip", "route", "add", s.hosts_subnet, "dev", link], check=True)
        assert not hosts.routed(s) and not proc.port_open(s.pg_port, s.pg_host)
        assert _dropped() == 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as raw:
            raw.settimeout(1)
            assert raw.connect_ex((s.pg_host, s.pg_port)) != 0
        assert _dropped() >= 1


def test_nothing_leaves_when_half_a_layout_is_left(counted: None, guard_settings: Settings) -> None:
    s = guard_settings
    lay = hosts.create(s)
    assert hosts.routed(s)
    subprocess.run(["ip", "link", "del", lay.runner_link], check=True)  # its route goes with it
    assert set(hosts.leftovers(s)) >= set(lay.namespaces.values())
    _no_contact_without_the_layout(s)


@pytest.mark.parametrize("how", ["policy rule", "host route"])
def test_a_layout_address_sent_elsewhere_by_a_rule_or_a_host_route_is_refused(
        how: str, counted: None, guard_settings: Settings) -> None:
    """The layout is up and its /24 is on the bridge, but one address leads elsewhere: an `ip rule`
    looking it up in a table of its own (as a VPN client installs), or a /32 route in the main table.
    The kernel's answer for that address is what counts: the guard refuses, nothing connects, the
    counter stays 0; a connect around the guard is what the rule counts."""
    s = guard_settings
    hosts.create(s)
    assert hosts.routed(s)
    target = s.pg_host
    table, priority = str(20000 + os.getpid() % 10000), str(900 + os.getpid() % 90)
    rule = ["ip", "rule", "add", "to", f"{target}/32", "lookup", table, "priority", priority]
    with _dead_end_link() as link:
        try:
            if how == "policy rule":
                subprocess.run(["ip", "route", "add", f"{target}/32", "dev", link, "table", table], check=True)
                subprocess.run(rule, check=True)
            else:
                subprocess.run(["ip", "route", "add", f"{target}/32", "dev", link], check=True)
            assert json.loads(subprocess.run(["ip", "-j", "route", "get", target], capture_output=True,
                                             text=True, check=True).stdout)[0]["dev"] == link  # where it goes
            assert not hosts.routed(s)
            assert not netns.reachable(target) and not proc.port_open(s.pg_port, target)
            with pytest.raises(StackError, match="lab stack up"):
                hosts.require_routed(s)
            run = _lab(s, "run", "--pipeline", "wal", "--consumers", "1", "--messages", "10")
            assert run.returncode == 2 and run.stderr.strip().splitlines() == [f"lab: error: {hosts.NOT_UP}"]
            assert _dropped() == 0
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as raw:
                raw.settimeout(1)
                assert raw.connect_ex((target, s.pg_port)) != 0
            assert _dropped() >= 1
        finally:
            if how == "policy rule":
                subprocess.run(["ip", "rule", "del", *rule[3:]], capture_output=True)
                subprocess.run(["ip", "route", "flush", "table", table], capture_output=True)
    assert f"lookup {table}" not in subprocess.run(["ip", "rule"], capture_output=True, text=True).stdout


def test_a_host_cannot_open_a_connection_to_this_machines_listeners(guard_settings: Settings) -> None:
    """A listener of the root namespace on every interface (as the host's sshd) is not reachable from
    a lab host through the runner's address; the runner's own connections to the hosts still work."""
    s = guard_settings
    lay = hosts.create(s)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with hosts.entered(lay.namespaces["consumers"]), socket.socket(socket.AF_INET, socket.SOCK_STREAM) as c:
            c.settimeout(1.5)
            assert c.connect_ex((lay.addresses["runner"], port)) != 0  # dropped: timed out
        with hosts.entered(lay.namespaces["web"]):  # a host's own listener, reached from the runner
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            server.bind((lay.addresses["web"], 0))
            server.listen()
            assert proc.port_open(server.getsockname()[1], lay.addresses["web"])
        finally:
            server.close()
