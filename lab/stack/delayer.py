"""The link delayer: every host's outgoing packets held for the link delay, in userspace.

Where the kernel has no netem (:mod:`lab.stack.linkdelay` chooses), a rule in each host's
namespace queues the packets that leave its ``eth0`` to queue 0 of that namespace (NFQUEUE), and
this one process holds them: it opens a ``NETLINK_NETFILTER`` socket in every host's namespace,
binds the queue (:mod:`lab.stack.nfqueue`), stamps each packet when it reads it, and once
``arrival + delay`` has passed accepts it. The delay is the same for every packet, so packets are
due in the order they came and one batch verdict per namespace releases everything due at once;
between two events the process sleeps in ``select`` until the earliest due time (microsecond
timeouts, unlike ``poll``'s milliseconds).

The delayer is lab infrastructure, not a participant: the runner leaves its CPU out of every
participant's and reports it beside the network's bytes. It asks for a real-time priority
(``SCHED_FIFO``) so that a busy participant does not make a packet wait longer than the delay,
as netem's timer, which runs in softirq, would not. SIGTERM releases every packet it holds, then
it exits; if it dies, the rule stays and queued packets are dropped: the run fails rather than
reporting undelayed figures (no ``--queue-bypass``).

Run as ``python -m lab.stack.delayer --delay-ms D --netns NS [--netns NS ...] --ready-file F``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import select
import signal
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from lab.stack import nfqueue
from lab.stack.netns import entered

log = logging.getLogger(__name__)

QUEUE = 0  # the queue number in each host's namespace (queues are per namespace)
MAXLEN = 65536  # packets one namespace may hold (the kernel's default is 1024)
SO_RCVBUFFORCE = 33  # not in Python's socket module
RCVBUF = 16 * 2**20  # the socket's receive buffer: a burst is queued, not dropped
DRAIN = 512  # packets read from one socket before the timers are looked at again
RECV = 256  # bytes read of each message: enough for its netlink header and the packet's id
PACKET = struct.pack("=H", nfqueue.NFNL_SUBSYS_QUEUE << 8 | nfqueue.NFQNL_MSG_PACKET)  # nlmsg_type
PACKET_HDR = struct.pack("=H", nfqueue.NFQA_PACKET_HDR)  # the first attribute's type
IDLE_S = 1.0  # the longest sleep with nothing held
STATS_EVERY_S = 1.0


class DelayQueue:
    """Packet ids, each with the queue (namespace) it came from, held until ``arrival + delay``;
    one queue for every namespace, as the delay is the same for all. Pure: the clock is passed in."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.held: deque[tuple[float, int, int]] = deque()  # (due, queue, id), due non-decreasing
        self.packets = 0
        self.late_s_sum = 0.0
        self.late_s_max = 0.0

    def push(self, now: float, queue: int, packet_id: int) -> None:
        self.held.append((now + self.delay_s, queue, packet_id))
        self.packets += 1

    def timeout(self, now: float, idle_s: float = IDLE_S) -> float:
        """How long to sleep: until the earliest due packet (0 if one is due), ``idle_s`` if none is held."""
        return max(0.0, self.held[0][0] - now) if self.held else idle_s

    def release(self, now: float) -> dict[int, int]:
        """Per queue the largest id due at ``now`` (every id of that queue before it is due too);
        forgets them."""
        last: dict[int, int] = {}
        held = self.held
        late_max = self.late_s_max
        while held and held[0][0] <= now:
            due, queue, last[queue] = held.popleft()
            late = now - due
            self.late_s_sum += late
            if late > late_max:
                late_max = late
        self.late_s_max = late_max
        return last

    def release_all(self) -> dict[int, int]:
        last: dict[int, int] = {}
        for _, queue, packet_id in self.held:
            last[queue] = packet_id
        self.held.clear()
        return last


class Stop(Exception):
    """SIGTERM or SIGINT: release what is held, then exit."""


def open_queue(netns: str, queue: int = QUEUE) -> socket.socket:
    """A netlink socket in namespace ``netns`` bound to its queue ``queue``; raises OSError with the
    kernel's errno when the bind is refused (EBUSY: another process holds the queue)."""
    with entered(netns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, nfqueue.NETLINK_NETFILTER)
    try:
        with contextlib.suppress(OSError):  # FORCE: past rmem_max (root)
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
        sock.bind((0, 0))
        sock.send(nfqueue.bind(queue, MAXLEN))
        reply = sock.recv(65536)
        code = nfqueue.error_code(reply)
        if code is None or code < 0:
            err = -(code or 0) or errno.EPROTO
            raise OSError(err, f"binding queue {queue} in {netns}: {os.strerror(err)}")
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _realtime() -> str:
    """Ask for SCHED_FIFO (a packet due is released even when participants keep every core busy);
    what was granted."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return "fifo:10"
    except OSError as exc:
        log.warning("no real-time priority (%s): the delay may be late under load", exc)
        return "other"


class Delayer:
    """The loop over every namespace's queue (sockets and clock injectable for tests)."""

    def __init__(self, socks: dict[str, socket.socket], delay_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.names = list(socks)
        self.socks = [socks[ns] for ns in self.names]
        self.queue = DelayQueue(delay_s)
        self.clock = clock
        self.errors = 0  # error replies to verdicts (none expected)
        self.overflows = 0  # ENOBUFS: the kernel dropped packets it could not hand over
        self._fds: list[int] = []
        self._index: dict[int, int] = {}

    def drain(self, i: int, now: float) -> None:
        """Read what namespace ``i``'s queue handed over (at most :data:`DRAIN` packets)."""
        sock, push = self.socks[i], self.queue.push
        for _ in range(DRAIN):
            try:
                data = sock.recv(RECV)  # the packet header is the first attribute: the rest may be cut
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.overflows += 1
                    continue
                raise
            if data[4:6] == PACKET and data[22:24] == PACKET_HDR:  # the usual message, read in place
                push(now, i, int.from_bytes(data[24:28], "big"))
                continue
            for at in nfqueue.messages(data):
                pid = nfqueue.packet_id(data, at)
                if pid is not None:
                    push(now, i, pid)
                elif nfqueue.error_code(data, at):
                    self.errors += 1

    def release(self, now: float) -> None:
        for i, last in self.queue.release(now).items():
            self.socks[i].send(nfqueue.accept_upto(QUEUE, last))

    def release_all(self) -> None:
        for i, last in self.queue.release_all().items():
            with contextlib.suppress(OSError):
                self.socks[i].send(nfqueue.accept_upto(QUEUE, last))

    def step(self) -> None:
        """One wait and what follows it: read what arrived, release what is due."""
        if not self._fds:
            self._fds = [s.fileno() for s in self.socks]
            self._index = {fd: i for i, fd in enumerate(self._fds)}
        ready, _, _ = select.select(self._fds, [], [], self.queue.timeout(self.clock()))
        now = self.clock()
        for fd in ready:
            self.drain(self._index[fd], now)
        self.release(self.clock())

    def stats(self) -> dict[str, object]:
        q = self.queue
        return {"packets": q.packets, "late_ms_mean": round(q.late_s_sum * 1000 / max(q.packets, 1), 4),
                "late_ms_max": round(q.late_s_max * 1000, 3), "errors": self.errors, "overflows": self.overflows}


def _write(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.stack.delayer",
                                     description="hold the hosts' packets for the link delay")
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--netns", action="append", required=True, help="a host's namespace (repeat)")
    parser.add_argument("--ready-file", type=Path, required=True, help="written once every queue is bound")
    parser.add_argument("--stats-file", type=Path, default=None, help="counters, rewritten every second")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s delayer %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    socks: dict[str, socket.socket] = {}
    try:
        for ns in args.netns:
            socks[ns] = open_queue(ns)
    except OSError as exc:
        log.error("%s", exc)
        return 1
    sched = _realtime()
    delayer = Delayer(socks, args.delay_ms / 1000)
    _write(args.ready_file, {"pid": os.getpid(), "delay_ms": args.delay_ms, "netns": args.netns, "sched": sched})
    log.info("delaying %s by %g ms (%s)", ", ".join(args.netns), args.delay_ms, sched)
    next_stats = 0.0
    try:
        while True:
            delayer.step()
            if args.stats_file is not None and time.monotonic() >= next_stats:
                _write(args.stats_file, delayer.stats())
                next_stats = time.monotonic() + STATS_EVERY_S
    except Stop as why:
        delayer.release_all()
        log.info("stopped by %s: %s", why, delayer.stats())
    finally:
        if args.stats_file is not None:
            with contextlib.suppress(OSError):
                _write(args.stats_file, delayer.stats())
        for sock in socks.values():
            sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
