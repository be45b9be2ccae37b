"""Participants on hosts of their own: network namespaces on a private bridge (``LAB_HOSTS=netns``).

Each participant group of :data:`lab.settings.NETNS_HOSTS` (PostgreSQL, Kafka, RabbitMQ, Debezium,
the web service with its senders, the consumers; under the ``ha`` topology also each further broker
node and the standby, :data:`lab.settings.HA_NETNS_HOSTS`) gets a network namespace with one
interface, ``eth0``, at its address in the stack's /24 (:attr:`Settings.hosts_subnet`). The ``eth0`` of every
host is one end of a veth pair whose other end is a port of a bridge; the bridge lives in a
namespace of its own (the switch), so the root namespace's packet filter (a Docker engine's
``FORWARD`` policy, applied to bridged frames by ``br_netfilter``) never sees the lab's traffic.
The runner stays in the root namespace and joins the bridge through one more veth pair, whose root
end carries the ``.1`` address. No namespace has a default route and nothing forwards between
the lab network and any other: a packet to an address outside the /24 has no route.

Every name carries the prefix ``fl`` and the stack's identity (:attr:`Settings.stack_id`), so
cleanup removes exactly this stack's namespaces and links, found by name, even after a crash
between two steps of :func:`create`. The layout is recorded in ``<stack_dir>/hosts.json`` before
anything is created; :func:`remove` (``lab stack down``) deletes whatever exists by those names.

The stack's own Docker engine (:mod:`lab.stack.remote_engine`) is one more host on the same bridge,
``fl-<id>-engine``, with a lifecycle of its own: while its namespace exists, :func:`leftovers` and
:func:`remove` leave it, its link, the switch and the runner's link alone (:meth:`Layout.engine_kept`).

A process is started inside a namespace by switching the starting thread into it
(``setns(2)``), forking, and switching back (:func:`lab.stack.netns.entered`): the child inherits the namespace,
and keeps its parent-death signal and pid. Byte counters of each host's link are read from the
switch side of its veth pair (:func:`link_bytes`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lab.settings import Settings
from lab.stack import linkdelay
from lab.stack.base import StackError
from lab.stack.netns import entered, kernel_route, pids_in, reachable, route_link, run_tool
from lab.stack.proc import deferred_signals

log = logging.getLogger(__name__)

PREFIX = "fl"
#: a short code per host, for link names (at most 15 bytes: ``fl`` + 6 hex + ``-`` + code + ``p``)
SHORT = {"postgres": "pg", "broker": "bk", "rabbitmq": "rmq", "debezium": "dz", "web": "web", "consumers": "con",
         "runner": "run", "engine": "eng", "broker-2": "bk2", "broker-3": "bk3", "rabbitmq-2": "rmq2",
         "rabbitmq-3": "rmq3", "postgres-standby": "pgs"}
#: the stack's own Docker engine (lab.stack.remote_engine): one more host on the bridge, with its own
#: lifecycle (``lab stack engine up|down``), so the participant hosts' create and remove leave it alone
ENGINE = "engine"
RECORD = "hosts.json"
NFT_TABLE = "fanoutlab"
IFNAMSIZ = 15


@dataclass(frozen=True)
class Layout:
    """The names and addresses of one stack's hosts (pure: derived from the settings alone)."""

    stack_id: str
    subnet: str  # 10.231.n.0/24
    switch: str  # the namespace holding the bridge
    bridge: str  # the bridge's name inside the switch
    namespaces: dict[str, str]  # host -> namespace
    links: dict[str, str]  # host (and "runner") -> the switch-side end of its veth pair
    addresses: dict[str, str]  # host (and "runner") -> address

    @property
    def prefix_ns(self) -> str:
        """What every namespace name of this stack begins with."""
        return f"{PREFIX}-{self.stack_id}-"

    @property
    def prefix_link(self) -> str:
        """What every link name of this stack begins with (in any namespace)."""
        return f"{PREFIX}{self.stack_id}-"

    def peer(self, host: str) -> str:
        """The host-side end of ``host``'s veth pair before it is moved and renamed ``eth0``
        (the runner's stays in the root namespace under this name)."""
        return self.links[host] + "p"

    @property
    def runner_link(self) -> str:
        return self.peer("runner")

    @property
    def engine_ns(self) -> str:
        """The namespace of the stack's own Docker engine."""
        return f"{self.prefix_ns}{ENGINE}"

    @property
    def engine_link(self) -> str:
        """The switch-side end of the engine's veth pair (its other end is the engine's ``eth0``)."""
        return f"{self.prefix_link}{SHORT[ENGINE]}"

    def engine_kept(self, namespaces: list[str]) -> set[str]:
        """What the participant hosts' :func:`leftovers` and :func:`remove` leave alone: while the
        engine's namespace exists, that namespace, its link and the switch with the runner's link
        it reaches the engine by (``namespaces``: the names that exist now)."""
        if self.engine_ns not in namespaces:
            return set()
        return {self.engine_ns, self.engine_link, self.engine_link + "p", self.switch, self.runner_link}

    def as_record(self) -> dict[str, object]:
        return {"stack_id": self.stack_id, "subnet": self.subnet, "switch": self.switch, "bridge": self.bridge,
                "namespaces": self.namespaces, "links": self.links, "addresses": self.addresses}


def layout(settings: Settings) -> Layout:
    """The layout of ``settings``' stack."""
    sid = settings.stack_id
    links = {h: f"{PREFIX}{sid}-{SHORT[h]}" for h in [*settings.netns_hosts, "runner"]}
    for name in links.values():
        assert len(name) + 1 <= IFNAMSIZ, name
    return Layout(
        stack_id=sid, subnet=settings.hosts_subnet, switch=f"{PREFIX}-{sid}-switch", bridge="br0",
        namespaces={h: f"{PREFIX}-{sid}-{h}" for h in settings.netns_hosts},
        links=links,
        addresses={h: settings.address(h) for h in [*settings.netns_hosts, "runner"]},
    )


def namespace(settings: Settings, host: str) -> str | None:
    """The namespace a participant of ``host`` runs in; None on loopback (this namespace)."""
    return layout(settings).namespaces[host] if settings.netns else None


def ours(names: list[str], prefix: str) -> list[str]:
    """The names among ``names`` that belong to the stack whose prefix is ``prefix``."""
    return sorted(n for n in names if n.startswith(prefix))


def plen(subnet: str) -> str:
    return subnet.rsplit("/", 1)[1]


# Reading the system -------------------------------------------------------------------------------
def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = run_tool(["ip", *args])
    except FileNotFoundError:  # no iproute2: no namespace of ours can exist either
        if check:
            raise StackError("LAB_HOSTS=netns needs the ip command (iproute2)") from None
        return subprocess.CompletedProcess(["ip", *args], 127, "", "")
    if check and done.returncode != 0:
        raise StackError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def netns_names() -> list[str]:
    """Every named network namespace (``ip netns list``)."""
    out = _ip("-j", "netns", "list", check=False).stdout.strip()
    return [n["name"] for n in json.loads(out)] if out else []


def link_names(netns: str | None = None) -> list[str]:
    """Every link of a namespace (None: this one)."""
    args = ["-n", netns] if netns else []
    out = _ip(*args, "-j", "link", "show", check=False).stdout.strip()
    return [link["ifname"] for link in json.loads(out)] if out else []


def leftovers(settings: Settings) -> list[str]:
    """This stack's namespaces and root-namespace links that exist now (not the engine's)."""
    lay = layout(settings)
    names = netns_names()
    kept = lay.engine_kept(names)
    return [n for n in [*ours(names, lay.prefix_ns), *ours(link_names(), lay.prefix_link)] if n not in kept]


def complete(settings: Settings) -> bool:
    """Whether every namespace, link and address of the layout is in place and up."""
    lay = layout(settings)
    if set(netns_names()) < {lay.switch, *lay.namespaces.values()}:
        return False
    try:
        for host, ns in lay.namespaces.items():
            if not _has_address(ns, "eth0", lay.addresses[host]):
                return False
        if not _has_address(None, lay.runner_link, lay.addresses["runner"]):
            return False
        ports = set(link_names(lay.switch))
    except StackError:
        return False
    return {lay.bridge, *lay.links.values()} <= ports


def _has_address(netns: str | None, dev: str, address: str) -> bool:
    args = ["-n", netns] if netns else []
    done = _ip(*args, "-j", "addr", "show", "dev", dev, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        return False
    info = json.loads(done.stdout)
    return bool(info) and "UP" in info[0].get("flags", []) and any(
        a.get("local") == address for a in info[0].get("addr_info", []))


def routed(settings: Settings) -> bool:
    """Whether the kernel sends a packet from here to every host of this stack's layout straight
    onto its own bridge (its runner link), policy rules and more specific routes included: only
    then may anything connect to the layout's addresses (:func:`lab.stack.netns.reachable`)."""
    lay = layout(settings)
    return all(route_link(kernel_route(address), address) == lay.runner_link
               for host, address in lay.addresses.items() if host != "runner")


NOT_UP = "the netns layout of this stack is not up: lab stack up --hosts netns"


def require_routed(settings: Settings) -> None:
    """Refuse, in one line and before anything connects, a command that reaches the layout's
    services while the layout is not there (never made, half made, removed)."""
    if settings.netns and not routed(settings):
        raise StackError(NOT_UP)
    if not reachable(settings.service_host):  # the stack's own engine's address, its bridge gone
        raise StackError(f"the services' host {settings.service_host} is on a lab bridge that is not up: "
                         "lab stack engine up")


# Creating and removing ----------------------------------------------------------------------------
def require_root() -> None:
    if os.geteuid() != 0:
        raise StackError("LAB_HOSTS=netns (--hosts netns) creates network namespaces and needs root; "
                         "run as root or use --hosts loopback")


def _subnet_taken(settings: Settings) -> str | None:
    """Another interface of this namespace with a route into our /24 (another stack's, a VPN)."""
    out = _ip("-j", "route", "show", "to", "match", settings.hosts_subnet, check=False).stdout.strip()
    runner = layout(settings).runner_link
    for route in json.loads(out) if out else []:
        if route.get("dst") != "default" and route.get("dev") != runner:
            return str(route.get("dev"))
    return None


def create(settings: Settings) -> Layout:
    """Create the stack's hosts (idempotent: a complete layout is kept, a partial one is removed
    and made again); on failure remove what this call made, then raise."""
    require_root()
    lay = layout(settings)
    if complete(settings):
        _nft(None, runner_guard(lay))  # a layout made before the guard existed gets it too
        delay(settings, lay)
        return lay
    if leftovers(settings):
        busy = {ns: sorted(pids) for ns in ours(netns_names(), lay.prefix_ns)
                if ns in lay.namespaces.values() and (pids := pids_in(ns))}
        if busy:  # removing it would leave them running where nothing reaches or finds them
            where = "; ".join(f"{ns}: pid {', '.join(map(str, pids[:3]))}" for ns, pids in busy.items())
            raise StackError(f"the host layout of this stack is half made and its namespaces still run processes "
                             f"({where}): stop them first (`lab stack down`), then start again")
        log.warning("removing an incomplete host layout of this stack: %s", ", ".join(leftovers(settings)))
        remove(settings)
    taken = _subnet_taken(settings)
    if taken:
        raise StackError(f"the subnet {lay.subnet} of this stack's hosts is routed via {taken} already; "
                         "give this stack another LAB_STACK_DIR")
    record(settings, lay)
    try:
        _build(lay)
        delay(settings, lay)
    except BaseException:
        with deferred_signals(), contextlib.suppress(Exception):  # a second SIGTERM does not cut it short
            remove(settings)
        raise
    log.info("hosts up: %s on %s", ", ".join(f"{h} {a}" for h, a in lay.addresses.items()), lay.subnet)
    return lay


def _build(lay: Layout) -> None:
    ensure_switch(lay)
    for host, ns in lay.namespaces.items():
        add_host(lay, ns, lay.links[host], lay.addresses[host])
    for host, ns in lay.namespaces.items():
        _nft(ns, counter_rules(lay, host))


def ensure_switch(lay: Layout) -> None:
    """The switch namespace with its bridge, and the runner's veth pair into it (what is missing
    of them; the engine may have made them already)."""
    sw, bits = lay.switch, plen(lay.subnet)
    if sw not in netns_names():
        _ip("netns", "add", sw)
        _sysctl(sw)
        _ip("-n", sw, "link", "add", lay.bridge, "type", "bridge")
        _ip("-n", sw, "link", "set", "lo", "up")
        _ip("-n", sw, "link", "set", lay.bridge, "up")
    _nft(None, runner_guard(lay))  # before the runner's link exists: no host ever reaches this machine's listeners
    if lay.runner_link in link_names():
        return
    # the runner's side: its end stays here, the other one is a port of the bridge
    _ip("link", "add", lay.runner_link, "type", "veth", "peer", "name", lay.links["runner"])
    _ip("link", "set", lay.links["runner"], "netns", sw)
    _no_ipv6(Path("/proc/sys/net/ipv6/conf") / lay.runner_link)
    _ip("addr", "add", f"{lay.addresses['runner']}/{bits}", "dev", lay.runner_link)
    _ip("link", "set", lay.runner_link, "up")
    _ip("-n", sw, "link", "set", lay.links["runner"], "master", lay.bridge)
    _ip("-n", sw, "link", "set", lay.links["runner"], "up")


def add_host(lay: Layout, ns: str, link: str, address: str) -> None:
    """A namespace ``ns`` whose ``eth0`` (at ``address``) is one end of a veth pair; the other
    end, ``link``, a port of the switch's bridge."""
    sw, bits = lay.switch, plen(lay.subnet)
    peer = link + "p"
    _ip("netns", "add", ns)
    _sysctl(ns)
    _ip("link", "add", link, "type", "veth", "peer", "name", peer)
    _ip("link", "set", link, "netns", sw)
    _ip("link", "set", peer, "netns", ns)
    _ip("-n", ns, "link", "set", peer, "name", "eth0")
    _ip("-n", ns, "addr", "add", f"{address}/{bits}", "dev", "eth0")
    _ip("-n", ns, "link", "set", "lo", "up")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", sw, "link", "set", link, "master", lay.bridge)
    _ip("-n", sw, "link", "set", link, "up")


def release_switch(settings: Settings) -> list[str]:
    """Delete the switch and the runner's link once no host of this stack uses them (neither a
    participant host nor the engine); returns what was deleted."""
    lay = layout(settings)
    if [n for n in ours(netns_names(), lay.prefix_ns) if n != lay.switch]:
        return []
    gone = []
    if lay.switch in netns_names() and _ip("netns", "del", lay.switch, check=False).returncode == 0:
        gone.append(lay.switch)
    if lay.runner_link in link_names() and _ip("link", "del", lay.runner_link, check=False).returncode == 0:
        gone.append(lay.runner_link)
    if lay.runner_link not in link_names():
        _drop_runner_guard(lay)
    return gone


def guard_table(lay: Layout) -> str:
    """The root namespace's nftables table that keeps this stack's hosts from this machine's listeners."""
    return f"{lay.prefix_link}guard"


def runner_guard(lay: Layout) -> str:
    """An nftables script for the root namespace: what arrives over the runner's link from the lab's
    hosts may answer the runner, never open anything here: a TCP connection's first packet (the
    host's sshd, anything on 0.0.0.0), UDP and SCTP, pings are dropped. Stateless (no conntrack, whose
    cost would land on every packet the runs measure); replaced whole, so it can be applied again."""
    table, link = guard_table(lay), lay.runner_link
    return (f"add table inet {table}\ndelete table inet {table}\n"
            f"add table inet {table}\n"
            f"add chain inet {table} input {{ type filter hook input priority 0; policy accept; }}\n"
            f'add rule inet {table} input iifname "{link}" tcp flags & (syn | ack) == syn counter drop\n'
            f'add rule inet {table} input iifname "{link}" meta l4proto {{ udp, sctp }} counter drop\n'
            f'add rule inet {table} input iifname "{link}" icmp type echo-request counter drop\n')


def _drop_runner_guard(lay: Layout) -> None:
    """Remove :func:`runner_guard`'s table (with the runner's link: nothing arrives over it any more)."""
    table = guard_table(lay)
    with contextlib.suppress(StackError, FileNotFoundError):
        _nft(None, f"add table inet {table}\ndelete table inet {table}\n")


def delay(settings: Settings, lay: Layout) -> str | None:
    """``settings.link_delay_ms`` on the way out of every host (:mod:`lab.stack.linkdelay`: netem,
    or the userspace delayer where the kernel has no netem): a packet from one host to another is
    delayed once, a round trip twice; 0 removes the delay. Returns the mechanism, None for none."""
    return linkdelay.apply(settings, list(lay.namespaces.values()), lay.subnet)


def counter_rules(lay: Layout, host: str) -> str:
    """An nftables script for ``host``'s namespace: one counter per other host (and the runner) on
    the packets it sends, so that each pair's bytes are known (IP packets, headers included)."""
    peers = [h for h in lay.addresses if h != host]
    rules = "".join(f"  add rule inet {NFT_TABLE} out ip daddr {lay.addresses[p]} counter comment \"{p}\"\n"
                    for p in peers)
    return (f"add table inet {NFT_TABLE}\n"
            f"add chain inet {NFT_TABLE} out {{ type filter hook output priority 0; policy accept; }}\n" + rules)


def _nft(ns: str | None, script: str) -> str:
    try:
        with entered(ns):
            done = run_tool(["nft", "-f", "-"] if script else ["nft", "-j", "list", "table", "inet", NFT_TABLE],
                            input=script or None)
    except FileNotFoundError:
        raise StackError("LAB_HOSTS=netns counts bytes per pair of hosts with the nft command (nftables), "
                         "which is not installed") from None
    if done.returncode != 0:
        raise StackError(f"nft in {ns or 'the root namespace'} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def parse_counters(listing: str) -> dict[str, int]:
    """Peer -> bytes from ``nft -j list table`` of :func:`counter_rules`' table."""
    out: dict[str, int] = {}
    for item in json.loads(listing).get("nftables", []):
        rule = item.get("rule")
        if not rule:
            continue
        counter = next((e["counter"] for e in rule.get("expr", []) if "counter" in e), None)
        if counter is not None and rule.get("comment"):
            out[rule["comment"]] = int(counter["bytes"])
    return out


def _sysctl(ns: str) -> None:
    """No IPv6 in the namespace (no link-local chatter in the byte counters)."""
    with entered(ns):
        _no_ipv6(Path("/proc/sys/net/ipv6/conf/all"))
        _no_ipv6(Path("/proc/sys/net/ipv6/conf/default"))


def _no_ipv6(conf: Path) -> None:
    """Write 1 to ``<conf>/disable_ipv6`` (absent when the kernel has no IPv6: nothing to do)."""
    with contextlib.suppress(FileNotFoundError):
        (conf / "disable_ipv6").write_text("1\n")


def remove(settings: Settings) -> list[str]:
    """Delete every namespace and link of this stack (found by its names); returns what was
    deleted. Processes must be stopped first: a namespace lives as long as a process in it."""
    lay = layout(settings)
    gone: list[str] = []
    errors: list[str] = []
    try:  # the delay first: its rules, and its delayer, which holds a socket in every host
        linkdelay.remove(settings, list(lay.namespaces.values()), lay.subnet)
    except Exception as exc:
        errors.append(f"link delay: {exc}")
    kept = lay.engine_kept(netns_names())  # the engine's, and the switch it needs, stay
    for ns in [n for n in ours(netns_names(), lay.prefix_ns) if n not in kept]:  # each host's eth0 and its pair
        done = _ip("netns", "del", ns, check=False)
        (gone if done.returncode == 0 else errors).append(ns if done.returncode == 0 else done.stderr.strip())
    for link in [n for n in ours(link_names(), lay.prefix_link) if n not in kept]:  # the runner's end, or a pair
        done = _ip("link", "del", link, check=False)
        if done.returncode == 0:
            gone.append(link)
        elif link in link_names():
            errors.append(done.stderr.strip())
    if errors:
        raise StackError("could not remove the hosts of this stack: " + "; ".join(errors))
    if lay.runner_link not in link_names():
        _drop_runner_guard(lay)
    (settings.stack_dir / RECORD).unlink(missing_ok=True)
    if gone:
        log.info("hosts removed: %s", ", ".join(gone))
    return gone


def record(settings: Settings, lay: Layout) -> None:
    """``<stack_dir>/hosts.json``: the layout, written before any of it exists."""
    settings.stack_dir.mkdir(parents=True, exist_ok=True)
    path = settings.stack_dir / RECORD
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(lay.as_record(), indent=1))
    tmp.replace(path)


def recorded(settings: Settings) -> bool:
    """Whether this stack dir holds a host layout (its record, or namespaces by its names)."""
    return (settings.stack_dir / RECORD).exists() or bool(leftovers(settings))


# Counters -----------------------------------------------------------------------------------------
def pair_bytes(settings: Settings) -> dict[str, int]:
    """``"<from>><to>"`` -> bytes sent so far from one host to another (or to the runner), as
    counted in the sending host's namespace."""
    lay = layout(settings)
    return {f"{host}>{peer}": n for host, ns in lay.namespaces.items()
            for peer, n in parse_counters(_nft(ns, "")).items()}


def link_bytes(settings: Settings) -> dict[str, dict[str, int]]:
    """Per host (and the runner): ``sent`` and ``received`` bytes so far, read on the switch side of
    its veth pair (what the switch receives from the host is what the host sent)."""
    lay = layout(settings)
    out = _ip("-n", lay.switch, "-j", "-s", "link", "show").stdout
    stats = {link["ifname"]: link.get("stats64", {}) for link in json.loads(out)}
    found: dict[str, dict[str, int]] = {}
    for host, name in lay.links.items():
        s = stats.get(name)
        if s is None:
            raise StackError(f"link {name} of host {host} is missing in {lay.switch}")
        found[host] = {"sent": int(s["rx"]["bytes"]), "received": int(s["tx"]["bytes"])}
    return found
