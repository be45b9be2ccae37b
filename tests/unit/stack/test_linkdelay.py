"""The link delay's pure parts: the nfnetlink_queue messages, the delay queue on a fake clock, the
delayer's loop over fake sockets, the rule and the readings."""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest

from lab.measure.network import delayer_delta, network_block
from lab.settings import Settings, settings_env
from lab.stack import delayer, linkdelay, nfqueue
from lab.stack.delayer import IDLE_S, Delayer, DelayQueue


def packet_message(packet_id: int, queue: int = 0, *, first: bytes = b"") -> bytes:
    """An NFQNL_MSG_PACKET as the kernel sends it in copy-meta mode (``first``: attributes before the header)."""
    hdr = nfqueue.attr(nfqueue.NFQA_PACKET_HDR, struct.pack(">IHB", packet_id, 0x0800, 3))
    return nfqueue.message(nfqueue.NFQNL_MSG_PACKET, queue, first + hdr + nfqueue.attr(6, struct.pack(">I", 2)))


def test_the_bind_message_asks_for_metadata_gso_and_a_long_queue_and_an_acknowledgement() -> None:
    msg = nfqueue.bind(7, 4096, seq=3)
    length, kind, flags, seq, port = struct.unpack_from("=IHHII", msg)
    assert length == len(msg) and length % 4 == 0
    assert kind == 3 << 8 | 2 and flags == nfqueue.NLM_F_REQUEST | nfqueue.NLM_F_ACK and seq == 3 and port == 0
    assert msg[16:20] == bytes([0, 0, 0, 7])  # AF_UNSPEC, NFNETLINK_V0, queue 7 big-endian
    attrs, at = {}, 20
    while at < length:
        size, a = struct.unpack_from("=HH", msg, at)
        attrs[a] = msg[at + 4:at + size]
        at += (size + 3) & ~3
    assert attrs[nfqueue.NFQA_CFG_CMD] == bytes([1, 0, 0, 2])  # BIND, pad, AF_INET
    assert attrs[nfqueue.NFQA_CFG_PARAMS] == struct.pack(">IB", 0, 1)  # copy range 0, NFQNL_COPY_META (5 bytes)
    assert attrs[nfqueue.NFQA_CFG_QUEUE_MAXLEN] == struct.pack(">I", 4096)
    assert attrs[nfqueue.NFQA_CFG_FLAGS] == attrs[nfqueue.NFQA_CFG_MASK] == struct.pack(">I", 4)  # F_GSO


def test_a_batch_verdict_accepts_every_packet_up_to_an_id() -> None:
    msg = nfqueue.accept_upto(0, 0x01020304)
    assert msg == (struct.pack("=IHHII", 32, 3 << 8 | 3, 1, 0, 0) + bytes([0, 0, 0, 0])
                   + struct.pack("=HH", 12, 2) + struct.pack(">II", 1, 0x01020304))


def test_a_packet_id_is_read_wherever_its_header_is_and_other_messages_have_none() -> None:
    assert nfqueue.packet_id(packet_message(42)) == 42
    assert nfqueue.packet_id(packet_message(2**32 - 1, first=nfqueue.attr(3, b"\0\0\0\1"))) == 2**32 - 1
    ack = struct.pack("=IHHII", 36, nfqueue.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", 0) + bytes(16)
    assert nfqueue.packet_id(ack) is None and nfqueue.error_code(ack) == 0
    refused = ack[:16] + struct.pack("=i", -errno.EBUSY) + ack[20:]
    assert nfqueue.error_code(refused) == -errno.EBUSY and nfqueue.error_code(packet_message(1)) is None
    two = packet_message(5) + packet_message(6)
    assert [nfqueue.packet_id(two, at) for at in nfqueue.messages(two)] == [5, 6]


def test_packets_are_released_in_order_once_their_delay_has_passed() -> None:
    q = DelayQueue(0.005)
    assert q.release(100.0) == {} and q.timeout(100.0, idle_s=1.0) == 1.0
    q.push(10.000, 0, 1)
    q.push(10.001, 1, 70)
    q.push(10.002, 0, 2)
    q.push(10.004, 0, 3)
    assert q.timeout(10.001) == pytest.approx(0.004)  # until the earliest due packet
    assert q.release(10.0049) == {}  # nothing before its time
    assert q.release(10.0072) == {0: 2, 1: 70}  # per queue the last one due: 1 and 2 go together
    assert q.timeout(10.0072) == pytest.approx(0.0018)
    assert q.release(10.009) == {0: 3} and q.release(11.0) == {}
    assert q.timeout(12.0) == IDLE_S and q.timeout(8.0) == IDLE_S
    assert q.packets == 4 and q.late_s_max == pytest.approx(0.0022)
    q.push(20.0, 0, 4)
    q.push(20.0, 1, 71)
    q.push(20.0, 0, 5)
    assert q.timeout(30.0) == 0.0  # overdue: no sleep
    assert q.release_all() == {0: 5, 1: 71} and q.release(99.0) == {}


class FakeSocket:
    def __init__(self, datagrams: list[bytes | OSError]) -> None:
        self.datagrams = datagrams
        self.sent: list[bytes] = []

    def recv(self, size: int) -> bytes:
        if not self.datagrams:
            raise BlockingIOError
        item = self.datagrams.pop(0)
        if isinstance(item, OSError):
            raise item
        return item

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)


def test_the_delayer_reads_every_namespace_and_releases_each_with_one_verdict() -> None:
    odd = packet_message(3, first=nfqueue.attr(3, b"\0\0\0\1"))  # the header not first: read the slow way
    pg = FakeSocket([packet_message(1), packet_message(2), OSError(errno.ENOBUFS, "full"), odd])
    con = FakeSocket([packet_message(9)])
    d = Delayer({"pg": pg, "con": con}, 0.005, clock=lambda: 0.0)  # type: ignore[dict-item]
    d.drain(0, 1.000)
    d.drain(1, 1.002)
    assert d.overflows == 1 and d.queue.packets == 4
    d.release(1.004)
    assert pg.sent == [] and con.sent == []
    d.release(1.005)
    assert pg.sent == [nfqueue.accept_upto(0, 3)] and con.sent == []
    d.release(1.007)
    assert con.sent == [nfqueue.accept_upto(0, 9)]
    assert d.stats()["packets"] == 4 and d.stats()["errors"] == 0


def test_the_rule_queues_only_what_leaves_eth0_for_the_lab_network() -> None:
    assert linkdelay.rule("10.231.7.0/24") == ["OUTPUT", "-o", "eth0", "-d", "10.231.7.0/24", "-j", "NFQUEUE",
                                               "--queue-num", "0"]
    assert "--queue-bypass" not in linkdelay.rule("10.231.7.0/24")
    assert linkdelay.netem_argv(0.25)[-2:] == ["delay", "250us"]
    argv = linkdelay.delayer_argv(5.0, ["fl-a-postgres", "fl-a-web"], Path("/s/ready.json"), Path("/s/stats.json"))
    assert argv[1:5] == ["-m", "lab.stack.delayer", "--delay-ms", "5"]
    assert argv[5:9] == ["--netns", "fl-a-postgres", "--netns", "fl-a-web"]
    assert linkdelay.no_netem("Error: Specified qdisc kind is unknown.")
    assert not linkdelay.no_netem("Cannot find device \"eth0\"")
    assert delayer.QUEUE == linkdelay.QUEUE


def test_the_queues_status_gives_packets_and_drops() -> None:
    text = "    0  12345     3 1     0     2     5     4711  1\n    1  12346     0 2  4096     0     0       10  1\n"
    assert linkdelay.parse_queue_status(text) == [
        {"queue": 0, "held": 3, "dropped": 7, "packets": 4711},
        {"queue": 1, "held": 0, "dropped": 0, "packets": 10}]


def test_the_delayer_is_reported_beside_the_bytes_never_as_a_participant() -> None:
    d = delayer_delta({"cpu_s": 1.0, "packets": 100, "dropped": 0}, {"cpu_s": 1.5, "packets": 10_100, "dropped": 0})
    assert d == {"cpu_s": 0.5, "packets": 10_000, "dropped": 0, "cpu_us_per_packet": 50.0}
    counted = {"links": {}, "pairs": {"web>postgres": 1000}, "link_delay_ms": 5.0,
               "link_delay_mechanism": "nfqueue", "delayer": {**d, "late_ms_mean": 0.05}}
    block = network_block(counted, 10)
    assert block is not None
    assert block["link_delay_mechanism"] == "nfqueue" and block["delayer_cpu_s"] == 0.5
    assert block["delayer"]["cpu_us_per_packet"] == 50.0 and "cpu_s" not in block["delayer"]
    plain = network_block({"links": {}, "pairs": {}, "link_delay_ms": 0.0}, 10)
    assert plain is not None and plain["link_delay_mechanism"] is None and "delayer_cpu_s" not in plain


def test_the_mechanism_is_a_setting_children_see() -> None:
    s = Settings.from_env({"LAB_HOSTS": "netns", "LAB_LINK_DELAY": "5ms", "LAB_LINK_DELAY_VIA": "nfqueue"})
    assert s.link_delay_via == "nfqueue" and Settings.from_env(settings_env(s)).link_delay_via == "nfqueue"
    assert Settings().link_delay_via == "auto"
    with pytest.raises(ValueError, match="LAB_LINK_DELAY_VIA"):
        Settings(link_delay_via="tc")


def test_a_run_prints_its_delay_and_the_delayers_cost() -> None:
    from lab.study.presentation import delay_line

    assert delay_line(None) == "" and delay_line({"link_delay_ms": 0.0}) == ""
    assert delay_line({"link_delay_ms": 1.0, "link_delay_mechanism": "netem"}) == "link delay 1 ms (netem)"
    line = delay_line({"link_delay_ms": 5.0, "link_delay_mechanism": "nfqueue", "delayer_cpu_s": 0.5,
                       "delayer": {"packets": 10_000, "cpu_us_per_packet": 50.0, "dropped": 0}})
    assert line == ("link delay 5 ms (nfqueue): delayer 0.5 CPU-s (in no participant), 10000 packets, "
                    "50.0 us CPU/packet, 0 dropped")


def test_a_run_whose_delayer_died_says_so(tmp_path: Path) -> None:
    from lab.measure.network import NetWindow

    s = Settings(stack_dir=tmp_path, hosts="netns", link_delay_ms=5.0)
    assert NetWindow(s).lost_delay() is None  # no delay made yet: nothing to say
    linkdelay._record(s, {"mechanism": "nfqueue", "delay_ms": 5.0, "namespaces": {}})
    why = NetWindow(s).lost_delay()
    assert why is not None and "delayer is gone" in why and "\n" not in why
    linkdelay._record(s, {"mechanism": "netem", "delay_ms": 5.0, "namespaces": {}})
    assert NetWindow(s).lost_delay() is None  # netem has no process to lose


def test_the_system_tools_are_waited_for_a_bounded_time() -> None:
    """A held xtables lock, a busy umount, a hung `ip` or `nft`: an error naming the timeout, never a wait
    for ever (iptables's own lock wait is bounded too)."""
    import time

    from lab.stack import linkdelay, netns

    t0 = time.monotonic()
    done = netns.run_tool(["sleep", "30"], timeout=0.3)
    assert done.returncode == 124 and "did not finish within 0 s" in done.stderr
    assert time.monotonic() - t0 < 5
    argv = linkdelay.iptables_argv("-A", "10.231.83.0/24")
    assert argv[:3] == ["iptables", "-w", linkdelay.XTABLES_WAIT_S] and float(argv[2]) > 0
