"""Whether a layout address is routed onto the lab's own bridge: a pure reading of the kernel's
answer to ``ip -j route get <address>`` (answers as iproute2 prints them)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from lab.settings import Settings, stack_subnet
from lab.stack import hosts, netns
from lab.stack.netns import RUNNER_LINK, addresses, in_lab, route_link

# this stack: id 4ab2c0, its /24 10.231.83.0/24; another stack: id 093181, 10.231.10.0/24
OURS, OTHER = "fl4ab2c0-runp", "fl093181-runp"


def answer(dst: str, dev: str, **extra: object) -> str:
    return json.dumps([{"dst": dst, "dev": dev, "prefsrc": "10.231.83.1", "flags": [], "uid": 0, "cache": [],
                        **extra}])


def test_the_stack_ids_of_these_answers_have_the_subnets_they_route() -> None:
    assert stack_subnet("4ab2c0") == "10.231.83.0/24" and stack_subnet("093181") == "10.231.10.0/24"


def test_a_layout_that_is_up_routes_its_addresses_onto_its_runner_link() -> None:
    assert route_link(answer("10.231.83.2", OURS), "10.231.83.2") == OURS  # postgres
    assert route_link(answer("10.231.83.13", OURS), "10.231.83.13") == OURS  # the ha standby


def test_without_the_layout_its_addresses_follow_the_default_route_off_the_machine() -> None:
    # what this machine answers with no layout: via its default gateway
    off = json.dumps([{"dst": "10.231.83.2", "gateway": "192.0.2.1", "dev": "eth0", "prefsrc": "192.0.2.2",
                       "flags": [], "uid": 0, "cache": []}])
    assert route_link(off, "10.231.83.2") is None
    assert route_link("", "10.231.83.2") is None  # no route at all: `ip` failed ("Network is unreachable")
    assert route_link("not json", "10.231.83.2") is None


def test_only_a_direct_route_of_the_stacks_own_24_on_its_runner_link_counts() -> None:
    assert route_link(answer("10.231.83.2", "tun0"), "10.231.83.2") is None  # a VPN's device (a policy rule's)
    assert route_link(answer("10.231.83.2", "gd1234"), "10.231.83.2") is None  # a /32 onto another link
    assert route_link(answer("10.231.83.2", OURS, gateway="10.8.0.1"), "10.231.83.2") is None
    assert route_link(answer("10.231.83.2", OTHER), "10.231.83.2") is None  # 093181's link is not .83's
    assert route_link(answer("10.231.10.2", OTHER), "10.231.10.2") == OTHER  # a bridge the lab made, its own /24
    assert route_link(answer("10.231.83.5", OURS), "10.231.83.2") is None  # an answer about another address
    local = answer("10.231.83.1", "lo", type="local", table="local")
    assert route_link(local, "10.231.83.1") is None
    assert route_link(answer("10.231.83.2", OURS, type="blackhole"), "10.231.83.2") is None
    two = json.dumps([*json.loads(answer("10.231.83.2", OURS)), *json.loads(answer("10.231.83.2", OURS))])
    assert route_link(two, "10.231.83.2") is None


def test_the_guarded_addresses_are_the_lab_network_only() -> None:
    assert in_lab("10.231.83.2") and in_lab("10.231.0.1") and in_lab("10.231.255.254")
    assert not in_lab("127.0.0.1") and not in_lab("10.232.0.1") and not in_lab("192.0.2.1")
    assert not in_lab("localhost") and not in_lab("::1")


def test_the_runner_link_pattern_names_what_the_layout_creates() -> None:
    s = Settings(stack_dir=Path("/x/stack"), hosts="netns")
    lay = hosts.layout(s)
    found = RUNNER_LINK.fullmatch(lay.runner_link)
    assert found is not None and found.group(1) == s.stack_id
    assert stack_subnet(found.group(1)) == lay.subnet == s.hosts_subnet
    assert lay.prefix_ns.startswith("fl-")


def test_a_name_is_guarded_by_what_it_resolves_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """`LAB_SERVICES_HOST=db.lab` resolving to a layout address is guarded like the address itself."""
    def resolve(host: str, *args: object) -> list[tuple[object, ...]]:
        if host == "db.lab":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.231.83.2", 0))]
        raise socket.gaierror(host)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    assert addresses("db.lab") == ["10.231.83.2"] and addresses("10.231.83.2") == ["10.231.83.2"]
    assert addresses("nowhere.invalid") == []
    asked: list[str] = []
    monkeypatch.setattr(netns, "in_lab_namespace", lambda: False)
    monkeypatch.setattr(netns, "kernel_route", lambda a: asked.append(a) or "")  # not routed
    assert not netns.reachable("db.lab") and asked == ["10.231.83.2"]
    monkeypatch.setattr(netns, "kernel_route", lambda a: answer(a, OURS))
    assert netns.reachable("db.lab")
    assert netns.reachable("nowhere.invalid")  # resolves to nothing: no packet can be sent to it
