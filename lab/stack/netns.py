"""Entering a network namespace: the one primitive every part of the host layout shares.

A thread is switched into a namespace with ``setns(2)`` and back afterwards (:func:`entered`):
sockets it opens and processes it starts belong there, and a child keeps its pid (so pid files,
cgroups and CPU accounting work as on loopback) and its parent-death signal.

The addresses of a netns layout (``10.231.n.0/24``) exist only on the lab's own bridge. While a
layout is not there (never made, half made, removed) the machine's default route would carry a
packet to one of them off the machine, so nothing may be sent to a layout address unless the kernel
says that a packet to it leaves by the lab's bridge (:func:`kernel_route`, :func:`route_link`,
:func:`reachable`): a stack's runner link in the root namespace, or any interface inside a namespace
the lab made. The kernel is asked (``ip route get``) rather than the main table read, so that a
policy rule (a VPN's) or a more specific route to one address is seen as the packet would see it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from lab.settings import SUBNET_PREFIX, stack_subnet
from lab.stack.base import StackError

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
IP_TIMEOUT_S = 10.0  # an `ip` call that hangs (a held rtnl lock) is an error, not a wait for ever
TOOL_TIMEOUT_S = 30.0  # any other call of a system tool (run_tool)
#: every address a netns layout can have (each stack's /24 is one of these)
LAB_NETWORK = ipaddress.IPv4Network(f"{SUBNET_PREFIX}.0.0/16")
#: the runner's end of a stack's veth pair into its bridge, in the root namespace:
#: ``fl<stack id>-runp`` (:attr:`lab.stack.hosts.Layout.runner_link`)
RUNNER_LINK = re.compile(r"fl([0-9a-f]{6})-runp")
#: the prefix of every namespace the lab makes (:attr:`lab.stack.hosts.Layout.prefix_ns`)
NS_PREFIX = "fl-"


def run_tool(argv: list[str], *, input: str | None = None,
             timeout: float = TOOL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """One of the system's tools (``ip``, ``nft``, ``tc``, ``iptables``, ``umount``) with a deadline,
    in this thread's namespace: a call that hangs (a held lock, a busy mount) ends as a failure whose
    error names the timeout (status 124), never a wait for ever. A missing tool raises as ever."""
    try:
        return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} did not finish within {timeout:.0f} s")


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


def pids_in(netns: str) -> set[int]:
    """The processes whose network namespace is the named one (none when it does not exist)."""
    target = inode(netns)
    if target is None:
        return set()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns" / "net").st_ino == target:
                    found.add(int(entry.name))
    return found


# Where a packet to a layout address goes ---------------------------------------------------------
def kernel_route(address: str) -> str:
    """The kernel's own answer to where a packet to ``address`` would go from this thread's network
    namespace (``ip -j route get``): after every policy rule (``ip rule``, as VPN clients install),
    in whichever table, the most specific route; ``""`` when it has none (unreachable, prohibited)
    or cannot be asked."""
    try:
        done = subprocess.run(["ip", "-j", "route", "get", address], capture_output=True, text=True,
                              timeout=IP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def route_link(answer: str, address: str) -> str | None:
    """The runner link of the stack whose bridge the kernel's ``answer`` (:func:`kernel_route`)
    sends ``address`` onto: a unicast route for exactly that address, directly (no gateway) out of
    the runner link (:data:`RUNNER_LINK`) of the stack whose /24 holds it; None for anything else
    (a default route, a VPN's device, another stack's bridge, no route)."""
    try:
        routes = json.loads(answer)
    except ValueError:
        return None
    if not isinstance(routes, list) or len(routes) != 1 or not isinstance(routes[0], dict):
        return None
    route = routes[0]
    if route.get("type", "unicast") != "unicast" or "gateway" in route or route.get("dst") != address:
        return None
    found = RUNNER_LINK.fullmatch(str(route.get("dev", "")))
    if found is None or ipaddress.IPv4Address(address) not in ipaddress.IPv4Network(stack_subnet(found.group(1))):
        return None
    return found.group(0)


def in_lab(address: str) -> bool:
    """Whether ``address`` is one a netns layout can have (``10.231.0.0/16``); a name is not."""
    try:
        return ipaddress.IPv4Address(address) in LAB_NETWORK
    except ValueError:
        return False


def in_lab_namespace() -> bool:
    """Whether this thread is inside a namespace the lab made (a host, the switch, the engine)."""
    try:
        here = os.stat("/proc/thread-self/ns/net").st_ino
        names = [n for n in os.listdir(NETNS_DIR) if n.startswith(NS_PREFIX)]
    except OSError:
        return False
    return any(inode(n) == here for n in names)


def addresses(host: str) -> list[str]:
    """The IPv4 addresses ``host`` stands for: itself when it is one, else what it resolves to (a
    name such as ``LAB_SERVICES_HOST`` may resolve into the lab's network); none when it does not
    resolve."""
    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})


def reachable(host: str) -> bool:
    """Whether a packet to ``host`` stays on this machine's lab network or is none of its business:
    False when ``host`` is, or resolves to, a layout address (:func:`in_lab`) that the kernel does
    not route from this thread's namespace straight onto a lab bridge (:func:`route_link`, policy
    rules and more specific routes included); inside a namespace the lab made, whose only links are
    the bridge's, always True."""
    lab = [a for a in addresses(host) if in_lab(a)]
    if not lab or in_lab_namespace():
        return True
    return all(route_link(kernel_route(a), a) is not None for a in lab)
