"""Bytes on the wire per hop, under ``LAB_HOSTS=netns`` (each participant group a host of its own).

At both edges of a run's window the runner reads, for every host, the bytes its link sent and
received (the switch side of its veth pair, Ethernet frames) and, for every pair of hosts, the
bytes one sent to the other (an nftables counter in the sender's namespace, IP packets); run.json's
``network`` holds the differences and each divided by the run's messages.

Under a link delay it also records how the delay was made (``link_delay_mechanism``: ``netem`` or
``nfqueue``, :mod:`lab.stack.linkdelay`) and, for the userspace delayer, its CPU over the same
window (``delayer_cpu_s``: lab infrastructure, in no participant's CPU), the packets it held and
the packets the queues dropped (``delayer``, with the delayer's own counters since it started:
how late after their due time it released packets, on average and at most). The delayer must be
alive at both edges: a run whose delayer died fails instead of reporting figures that were not
delayed as asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.settings import Settings
from lab.stack import hosts, linkdelay
from lab.stack.base import StackError

#: the hosts a broker node runs on: Kafka's (``broker``, and under ``ha`` ``broker-2``, ``broker-3``)
#: and RabbitMQ's (``rabbitmq``, ``rabbitmq-2``, ``rabbitmq-3``); a run's pipeline uses one broker, the
#: other one exchanges nothing with Debezium or the consumers
BROKERS = ("broker", "broker-2", "broker-3", "rabbitmq", "rabbitmq-2", "rabbitmq-3")

#: the hops named in results: label -> the pairs of hosts (from, to) whose bytes it sums. "broker"
#: is the run's broker, whichever host it runs on.
HOPS: dict[str, tuple[tuple[str, str], ...]] = {
    "postgres → consumers": (("postgres", "consumers"),),  # the WAL readers under wal
    "postgres → debezium": (("postgres", "debezium"),),
    "debezium → broker": tuple(("debezium", b) for b in BROKERS),
    "broker → consumers": tuple((b, "consumers") for b in BROKERS),
    "consumers → postgres": (("consumers", "postgres"),),
    "consumers → web": (("consumers", "web"),),
    "web → postgres": (("web", "postgres"),),
}


class NetWindow:
    """The counters read at the two edges of a run's window."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.edges: list[dict[str, Any]] = []

    def read(self) -> dict[str, Any]:
        s = self.settings
        edge: dict[str, Any] = {"links": hosts.link_bytes(s), "pairs": hosts.pair_bytes(s)}
        if s.link_delay_ms > 0 and linkdelay.mechanism(s) == "nfqueue":
            linkdelay.check(s)
            edge["delayer"] = {"cpu_s": linkdelay.delayer_cpu_s(s) or 0.0,
                               **linkdelay.queue_counters(list(hosts.layout(s).namespaces.values()))}
        return edge

    def start(self) -> None:
        self.edges = [self.read()]

    def stop(self) -> None:
        if len(self.edges) == 1:
            self.edges.append(self.read())

    def lost_delay(self) -> str | None:
        """Why the delay the settings ask for is not in force (its delayer died), for a run that
        failed; None when it is."""
        try:
            linkdelay.check(self.settings)
        except StackError as exc:
            return str(exc)
        return None

    def record(self) -> dict[str, Any] | None:
        """The counters' differences over the window (None: not both edges read)."""
        if len(self.edges) != 2:
            return None
        s = self.settings
        out = {**delta(self.edges[0], self.edges[1]), "link_delay_ms": s.link_delay_ms,
               "link_delay_mechanism": linkdelay.mechanism(s) if s.link_delay_ms > 0 else None}
        before, after = self.edges[0].get("delayer"), self.edges[1].get("delayer")
        if before and after:
            out["delayer"] = {**delayer_delta(before, after), "since_start": linkdelay.delayer_stats(s)}
        return out


def delayer_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The delayer over a window: its CPU, the packets it held, what the queues dropped, and its CPU
    per packet in microseconds."""
    cpu = after["cpu_s"] - before["cpu_s"]
    packets = after["packets"] - before["packets"]
    return {"cpu_s": round(cpu, 4), "packets": packets, "dropped": after["dropped"] - before["dropped"],
            "cpu_us_per_packet": round(cpu * 1e6 / packets, 2) if packets > 0 else None}


def delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """Per link its ``sent``/``received`` bytes, per pair its bytes, between two readings."""
    links = {h: {k: after["links"][h][k] - v for k, v in c.items()}
             for h, c in before["links"].items() if h in after["links"]}
    pairs = {p: after["pairs"][p] - n for p, n in before["pairs"].items() if p in after["pairs"]}
    return {"links": links, "pairs": pairs}


def network_block(counted: Mapping[str, Any] | None, messages: int) -> dict[str, Any] | None:
    """run.json's ``network``: every hop with bytes and bytes per message (``hops``: the named
    ones, ``pairs``: every pair that carried bytes) and every link per direction; None without
    hosts."""
    if not counted or messages <= 0:
        return None

    def per(n: int) -> dict[str, Any]:
        return {"bytes": n, "bytes_per_msg": round(n / messages, 1)}

    pairs = {p: per(n) for p, n in sorted(counted["pairs"].items()) if n > 0}
    hops = {label: per(sum(counted["pairs"].get(f"{a}>{b}", 0) for a, b in pairs)) for label, pairs in HOPS.items()}
    links = {h: {d: per(n) for d, n in c.items()} for h, c in sorted(counted["links"].items())}
    delayer = counted.get("delayer")
    return {"messages": messages, "link_delay_ms": counted.get("link_delay_ms", 0.0),
            "link_delay_mechanism": counted.get("link_delay_mechanism"),
            **({"delayer_cpu_s": delayer["cpu_s"], "delayer": {k: v for k, v in delayer.items() if k != "cpu_s"}}
               if delayer else {}),
            "hops": hops, "pairs": pairs, "links": links}
