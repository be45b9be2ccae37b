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
IDLE_S = 1.0  # the longest sleep with nothing held
STATS_EVERY_S = 1.0


class DelayQueue:
    """Packet ids held until ``arrival + delay``; pure, with the clock passed in."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.held: deque[tuple[float, int]] = deque()  # (due, id), due non-decreasing
        self.packets = 0
        self.late_s_sum = 0.0
        self.late_s_max = 0.0

    def push(self, now: float, packet_id: int) -> None:
        self.held.append((now + self.delay_s, packet_id))
        self.packets += 1

    def next_due(self) -> float | None:
        return self.held[0][0] if self.held else None

    def release(self, now: float) -> int | None:
        """The largest id due at ``now`` (every id before it is due too), or None; forgets them."""
        last = None
        held = self.held
        while held and held[0][0] <= now:
            due, last = held.popleft()
            late = now - due
            self.late_s_sum += late
            if late > self.late_s_max:
                self.late_s_max = late
        return last

    def release_all(self) -> int | None:
        last = self.held[-1][1] if self.held else None
        self.held.clear()
        return last


def timeout(queues: Sequence[DelayQueue], now: float, idle_s: float = IDLE_S) -> float:
    """How long to sleep: until the earliest due packet (0 if one is due), ``idle_s`` if none is held."""
    dues = [d for d in (q.next_due() for q in queues) if d is not None]
    return max(0.0, min(dues) - now) if dues else idle_s


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
        self.socks = socks
        self.queues = {ns: DelayQueue(delay_s) for ns in socks}
        self.clock = clock
        self.errors = 0  # error replies to verdicts (none expected)
        self.overflows = 0  # ENOBUFS: the kernel dropped packets it could not hand over

    def drain(self, ns: str, now: float) -> None:
        sock, q = self.socks[ns], self.queues[ns]
        for _ in range(DRAIN):
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.overflows += 1
                    continue
                raise
            for at in nfqueue.messages(data):
                pid = nfqueue.packet_id(data, at)
                if pid is not None:
                    q.push(now, pid)
                elif nfqueue.error_code(data, at):
                    self.errors += 1

    def release(self, now: float) -> None:
        for ns, q in self.queues.items():
            last = q.release(now)
            if last is not None:
                self.socks[ns].send(nfqueue.accept_upto(QUEUE, last))

    def release_all(self) -> None:
        for ns, q in self.queues.items():
            last = q.release_all()
            if last is not None:
                with contextlib.suppress(OSError):
                    self.socks[ns].send(nfqueue.accept_upto(QUEUE, last))

    def step(self) -> None:
        """One wait and what follows it: read what arrived, release what is due."""
        by_fd = {s.fileno(): ns for ns, s in self.socks.items()}
        ready, _, _ = select.select(list(by_fd), [], [], timeout(list(self.queues.values()), self.clock()))
        now = self.clock()
        for fd in ready:
            self.drain(by_fd[fd], now)
        self.release(self.clock())

    def stats(self) -> dict[str, object]:
        qs = list(self.queues.values())
        packets = sum(q.packets for q in qs)
        return {"packets": packets, "late_ms_mean": round(sum(q.late_s_sum for q in qs) * 1000 / max(packets, 1), 4),
                "late_ms_max": round(max((q.late_s_max for q in qs), default=0.0) * 1000, 3),
                "errors": self.errors, "overflows": self.overflows}


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
