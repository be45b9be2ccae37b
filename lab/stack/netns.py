"""Entering a network namespace: the one primitive every part of the host layout shares.

A thread is switched into a namespace with ``setns(2)`` and back afterwards (:func:`entered`):
sockets it opens and processes it starts belong there, and a child keeps its pid (so pid files,
cgroups and CPU accounting work as on loopback) and its parent-death signal.

The addresses of a netns layout (``10.231.n.0/24``) exist only on the lab's own bridge. While a
layout is not there (never made, half made, removed) the machine's default route would carry a
packet to one of them off the machine, so nothing may be sent to a layout address unless the route
to it leads onto the lab's bridge (:func:`lab_link`, :func:`reachable`): a stack's runner link in
the root namespace, or any interface inside a namespace the lab made.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import re
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lab.settings import SUBNET_PREFIX, stack_subnet
from lab.stack.base import StackError

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
#: this thread's routes (``/proc/net`` would show the main thread's namespace's)
ROUTE_TABLE = Path("/proc/thread-self/net/route")
#: every address a netns layout can have (each stack's /24 is one of these)
LAB_NETWORK = ipaddress.IPv4Network(f"{SUBNET_PREFIX}.0.0/16")
#: the runner's end of a stack's veth pair into its bridge, in the root namespace:
#: ``fl<stack id>-runp`` (:attr:`lab.stack.hosts.Layout.runner_link`)
RUNNER_LINK = re.compile(r"fl([0-9a-f]{6})-runp")
#: the prefix of every namespace the lab makes (:attr:`lab.stack.hosts.Layout.prefix_ns`)
NS_PREFIX = "fl-"
RTF_UP, RTF_GATEWAY = 0x1, 0x2


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise StackError(f"cannot enter a network namespace: {os.strerror(err)}")


@contextlib.contextmanager
def entered(netns: str | None) -> Iterator[None]:
    """Within the block this thread is in network namespace ``netns`` (None: stays where it is):
    sockets it opens and processes it starts belong there. Back in its own one afterwards."""
    if netns is None:
        yield
        return
    try:
        target = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StackError(f"network namespace {netns} does not exist; start the stack "
                         "(`lab stack up --hosts netns`)") from None
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def inode(netns: str) -> int | None:
    """The identity of a named namespace (its inode), None when it does not exist: a namespace
    removed and made again under the same name is another one."""
    try:
        return (NETNS_DIR / netns).stat().st_ino
    except FileNotFoundError:
        return None


# Where a packet to a layout address goes ---------------------------------------------------------
@dataclass(frozen=True)
class Route:
    """One IPv4 route: its destination network, its device, whether it goes via a gateway."""

    network: ipaddress.IPv4Network
    dev: str
    via_gateway: bool
    metric: int = 0


def parse_routes(table: str) -> list[Route]:
    """The unicast routes of ``/proc/net/route``'s text or of ``ip -j route``'s output."""
    text = table.strip()
    if text.startswith("["):
        return [_json_route(r) for r in json.loads(text) if r.get("type", "unicast") == "unicast" and "dev" in r]
    routes = []
    for line in text.splitlines()[1:]:  # the first line names the columns
        f = line.split()
        if len(f) < 8 or not int(f[3], 16) & RTF_UP:
            continue
        dst, mask = (socket.inet_ntoa(struct.pack("<I", int(h, 16))) for h in (f[1], f[7]))
        routes.append(Route(ipaddress.IPv4Network(f"{dst}/{mask}", strict=False), f[0],
                            bool(int(f[3], 16) & RTF_GATEWAY), int(f[6])))
    return routes


def _json_route(r: dict[str, object]) -> Route:
    dst = str(r["dst"])
    network = ipaddress.IPv4Network("0.0.0.0/0" if dst == "default" else dst, strict=False)
    return Route(network, str(r["dev"]), "gateway" in r, int(str(r.get("metric", 0))))


def route_to(routes: list[Route], address: str) -> Route | None:
    """The route the kernel picks for ``address`` from one table: the longest matching prefix, of
    those the lowest metric."""
    addr = ipaddress.IPv4Address(address)
    matching = [r for r in routes if addr in r.network]
    return max(matching, key=lambda r: (r.network.prefixlen, -r.metric)) if matching else None


def lab_link(table: str, address: str) -> str | None:
    """The runner link of the stack whose bridge ``table`` (``/proc/net/route`` or ``ip -j route``)
    routes ``address`` onto: the route the kernel picks is that stack's /24, directly on its runner
    link (:data:`RUNNER_LINK`); None when it leads anywhere else (a default route, another device)."""
    route = route_to(parse_routes(table), address)
    if route is None or route.via_gateway:
        return None
    found = RUNNER_LINK.fullmatch(route.dev)
    if found is None or route.network != ipaddress.IPv4Network(stack_subnet(found.group(1))):
        return None
    return route.dev


def in_lab(address: str) -> bool:
    """Whether ``address`` is one a netns layout can have (``10.231.0.0/16``); a name is not."""
    try:
        return ipaddress.IPv4Address(address) in LAB_NETWORK
    except ValueError:
        return False


def route_table() -> str:
    """This thread's IPv4 routes (its network namespace's), as ``/proc/net/route`` shows them."""
    try:
        return ROUTE_TABLE.read_text()
    except OSError:
        return ""


def in_lab_namespace() -> bool:
    """Whether this thread is inside a namespace the lab made (a host, the switch, the engine)."""
    try:
        here = os.stat("/proc/thread-self/ns/net").st_ino
        names = [n for n in os.listdir(NETNS_DIR) if n.startswith(NS_PREFIX)]
    except OSError:
        return False
    return any(inode(n) == here for n in names)


def reachable(address: str) -> bool:
    """Whether a packet to ``address`` stays on this machine's lab network or is none of its
    business: False only for a layout address (:func:`in_lab`) that this thread's namespace does
    not route onto a lab bridge (from the root namespace: :func:`lab_link`; inside a namespace the
    lab made, whose only links are the bridge's, always)."""
    if not in_lab(address):
        return True
    return lab_link(route_table(), address) is not None or in_lab_namespace()
