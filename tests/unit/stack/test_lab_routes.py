"""Whether a layout address is routed onto the lab's own bridge: a pure reading of a route table."""

from __future__ import annotations

import json
from pathlib import Path

from lab.settings import Settings, stack_subnet
from lab.stack import hosts
from lab.stack.netns import RUNNER_LINK, in_lab, lab_link, parse_routes, route_to

HEAD = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
# this stack: id 4ab2c0, its /24 10.231.83.0/24; another stack: id 093181, 10.231.10.0/24
OURS, OTHER = "fl4ab2c0-runp", "fl093181-runp"
DEFAULT = "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"  # default via 192.0.2.1
LOCAL = ("eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # 192.0.2.0/24
         "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n")  # 172.17.0.0/16
OUR_24 = f"{OURS}\t0053E70A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # 10.231.83.0/24
OTHER_24 = f"{OTHER}\t000AE70A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # 10.231.10.0/24

UP = HEAD + DEFAULT + OUR_24 + LOCAL
ABSENT = HEAD + DEFAULT + LOCAL
ABSENT_ONLY_DEFAULT = HEAD + DEFAULT
OTHER_STACK = HEAD + DEFAULT + OTHER_24 + LOCAL

UP_JSON = json.dumps([
    {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0", "flags": []},
    {"dst": "10.231.83.0/24", "dev": OURS, "protocol": "kernel", "scope": "link", "prefsrc": "10.231.83.1",
     "flags": []},
    {"dst": "172.17.0.0/16", "dev": "docker0", "protocol": "kernel", "scope": "link", "prefsrc": "172.17.0.1",
     "flags": ["linkdown"]},
    {"dst": "192.0.2.0/24", "dev": "eth0", "protocol": "kernel", "scope": "link", "prefsrc": "192.0.2.2",
     "flags": []},
])
ABSENT_JSON = json.dumps([{"dst": "default", "gateway": "192.0.2.1", "dev": "eth0", "flags": []}])


def test_the_stack_ids_of_these_tables_have_the_subnets_they_route() -> None:
    assert stack_subnet("4ab2c0") == "10.231.83.0/24" and stack_subnet("093181") == "10.231.10.0/24"


def test_a_layout_that_is_up_routes_its_addresses_onto_its_runner_link() -> None:
    for table in (UP, UP_JSON):
        assert lab_link(table, "10.231.83.2") == OURS  # postgres
        assert lab_link(table, "10.231.83.13") == OURS  # the ha standby


def test_without_the_layout_its_addresses_follow_the_default_route_off_the_machine() -> None:
    for table in (ABSENT, ABSENT_ONLY_DEFAULT, ABSENT_JSON):
        assert route_to(parse_routes(table), "10.231.83.2").dev == "eth0"  # type: ignore[union-attr]
        assert lab_link(table, "10.231.83.2") is None
    assert lab_link(HEAD, "10.231.83.2") is None  # no route at all
    assert lab_link("", "10.231.83.2") is None


def test_another_stacks_bridge_carries_only_its_own_24() -> None:
    assert lab_link(OTHER_STACK, "10.231.83.2") is None  # ours is not up: default route
    assert lab_link(OTHER_STACK, "10.231.10.2") == OTHER  # a bridge the lab made, not this stack's
    assert lab_link(HEAD + DEFAULT + OTHER_24 + OUR_24, "10.231.83.2") == OURS


def test_only_a_direct_route_of_the_stacks_own_24_on_its_runner_link_counts() -> None:
    vpn = "tun0\t0053E70A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # 10.231.83.0/24 via a VPN
    assert lab_link(HEAD + DEFAULT + vpn, "10.231.83.2") is None
    gateway = f"{OURS}\t0053E70A\t0100080A\t0003\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # via 10.8.0.1
    assert lab_link(HEAD + DEFAULT + gateway, "10.231.83.2") is None
    wide = f"{OURS}\t0000E70A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"  # 10.231.0.0/16 on it
    assert lab_link(HEAD + DEFAULT + wide, "10.231.83.2") is None
    wrong_id = f"{OTHER}\t0053E70A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # 093181 is not .83
    assert lab_link(HEAD + DEFAULT + wrong_id, "10.231.83.2") is None
    host = "eth0\t0553E70A\t00000000\t0005\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n"  # 10.231.83.5/32 off the bridge
    assert lab_link(UP + host, "10.231.83.5") is None  # the longer prefix wins
    assert lab_link(UP + host, "10.231.83.2") == OURS
    down = f"{OURS}\t0053E70A\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # not RTF_UP
    assert lab_link(ABSENT + down, "10.231.83.2") is None
    unreachable = json.dumps([{"type": "unreachable", "dst": "10.231.83.0/24", "flags": []}])
    assert lab_link(unreachable, "10.231.83.2") is None


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


def test_of_two_routes_of_one_prefix_the_lower_metric_wins() -> None:
    backup = "tun0\t0053E70A\t00000000\t0001\t0\t0\t50\t00FFFFFF\t0\t0\t0\n"  # metric 50
    assert lab_link(UP + backup, "10.231.83.2") == OURS
    preferred = "tun0\t0053E70A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    ours_behind = f"{OURS}\t0053E70A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
    assert lab_link(HEAD + DEFAULT + preferred + ours_behind, "10.231.83.2") is None
