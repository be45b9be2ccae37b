"""The closed-loop HTTP senders of a run: S tasks that POST exactly M messages.

Run as its own measured process::

    python -m lab.workload.senders --url http://127.0.0.1:28080 --messages 100000 --senders 200 \\
        --start-file RUN/start --out RUN/senders.json

Faithful to the reference: one shared keep-alive pool of at most ``senders + 16`` connections, body
``{"content":"helloworld"}`` with only Host, Content-Type and Content-Length headers (like .NET
HttpClient's bare request), 30 s timeout, **no retries** and no warm-up request (connections are
opened by the first real sends). ``--client raw`` (the default) is :mod:`lab.workload.rawhttp`,
a raw asyncio protocol that sends prebuilt request bytes and reads only the status, at a quarter of
aiohttp's CPU per request (``lab bench harness``); ``--client aiohttp`` is one aiohttp session.
The raw client keeps all 200 requests queued at the web's insert listener, which is why the web
answers the work and stats calls on a listener and process of its own (:mod:`lab.workload.web`).
A 2xx response counts as sent, anything else (status or exception) as send_failed. The window
starts at the wall-clock time of the first successful completion.

Start gate: the process polls for ``--start-file`` every 20 ms (one ``stat`` per tick, nothing
else runs before the gate) and starts sending once it exists; the runner creates the file when the
consumers are ready. The measured process is silent: no progress output; ``--progress PATH``
optionally rewrites a tiny JSON counter file at most once per second. The result is written once,
atomically (temp file + rename), to ``--out``, also when every send failed or the run crashed.

``--rate-steps R1,R2,... --step-s S`` is the open loop as a staircase: step i sends
``round(Ri * S)`` messages, message j due at ``gate + i * S + j / Ri`` (:func:`lab.scenario.step_plan`;
``--messages`` must be their sum). ``--stop-file PATH`` ends the staircase early: it is looked at
once per step boundary (one ``stat``), and once it exists no further step starts; ``planned`` and
``steps_sent`` in the result say how many messages and steps were meant to go. Nothing is added per
message. ``--warm-s W`` first sends at the top rate for W seconds (:func:`lab.scenario.warm_plan`) and
rests :func:`lab.scenario.warm_rest_s` before the first step (whose offsets move by both); the warm
phase is not a step (``steps_sent`` leaves it out, the stop file is not looked at before it), but its
messages are in ``--messages`` and ``planned``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import resource
import time
from array import array
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from lab.scenario import parse_rate_steps, step_plan, warm_plan
from lab.workload.rawhttp import RawPost

BODY = b'{"content":"helloworld"}'
TIMEOUT_S = 30.0
GATE_POLL_S = 0.02


@dataclass(frozen=True)
class SendResult:
    """What one senders run did; times are epoch s (``*_at``) or CLOCK_MONOTONIC (``*_mono``)."""

    url: str
    messages: int
    senders: int
    sent: int
    send_failed: int
    rate: float = 0.0  # 0: closed loop; > 0: open loop at this many msg/s
    gate_opened_at: float | None = None
    first_send_at: float | None = None  # window start: first successful send completion
    last_send_at: float | None = None
    first_send_mono: float | None = None
    last_send_mono: float | None = None
    send_p50_ms: float | None = None
    send_p95_ms: float | None = None
    send_max_ms: float | None = None
    cpu_s: float | None = None  # this process's CPU from the gate to the end (self-reported)
    rate_steps: str = ""  # a staircase (lab.scenario.step_plan): its rates, comma-separated
    step_s: float = 0.0  # ... and how long each is held
    warm_s: float = 0.0  # staircase: seconds at its top rate before the first step (0: none)
    # staircase: messages of the warm phase and of the steps that were started (< M if stopped early)
    planned: int | None = None
    steps_sent: int | None = None  # staircase: steps started (fewer than its rates if stopped early)
    first_error: str | None = None
    error: str | None = None  # set when the run itself crashed

    @property
    def ok(self) -> bool:
        expected = self.messages if self.planned is None else self.planned
        return self.error is None and self.send_failed == 0 and self.sent == expected

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def load(cls, path: Path) -> SendResult:
        return cls(**json.loads(Path(path).read_text()))


class Tally:
    """Counters of a send phase, shared by its tasks (one event loop, no locks)."""

    __slots__ = ("failed", "first_error", "first_mono", "first_wall", "last_mono", "last_wall",
                 "latency", "next_id", "remaining", "sent", "steps")

    def __init__(self, messages: int) -> None:
        self.remaining, self.next_id = messages, 0
        self.sent = self.failed = 0
        self.steps = 0  # staircase: steps started
        self.first_wall: float | None = None
        self.last_wall: float | None = None
        self.first_mono: float | None = None
        self.last_mono: float | None = None
        self.first_error: str | None = None
        self.latency = array("d")


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _quantile(sorted_values: list[float], q: float) -> float:
    return round(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] * 1000, 3)


async def _send(post: Callable[[], Awaitable[int]], t: Tally, t0: float) -> None:
    """One POST, never retried; latency is measured from ``t0`` (start, or due time)."""
    clock = time.monotonic
    try:
        status = await post()
        ok = 200 <= status < 300
        if not ok and t.first_error is None:
            t.first_error = f"HTTP {status}"
    except Exception as e:  # any failure is a failed send, never retried
        ok = False
        if t.first_error is None:
            t.first_error = f"{type(e).__name__}: {e}"
    t1 = clock()
    if ok:
        t.sent += 1
        t.latency.append(t1 - t0)
        t.last_mono, t.last_wall = t1, time.time()
        if t.first_mono is None:
            t.first_mono, t.first_wall = t1, t.last_wall
    else:
        t.failed += 1


async def _closed_loop(post: Callable[[], Awaitable[int]], t: Tally) -> None:
    clock = time.monotonic
    while t.remaining > 0:
        t.remaining -= 1
        await _send(post, t, clock())


async def _open_loop(post: Callable[[], Awaitable[int]], t: Tally, rate: float) -> None:
    """Start message i at ``start + i / rate`` whatever the responses do (latency mode): a
    staircase of one step.

    Latency counts from the due time, so waiting for a free connection (at most
    ``senders + 16``) is included and a slow server cannot hide behind a slower schedule.
    """
    await _staircase(post, t, [(rate, 0.0, t.remaining)], None)


async def _staircase(post: Callable[[], Awaitable[int]], t: Tally,
                     steps: list[tuple[float, float, int]], stop_file: Path | None, warm: int = 0) -> None:
    """The open loop of :func:`_open_loop` step by step (``(rate, offset_s, messages)`` each, as
    :func:`lab.scenario.step_plan`), counting the steps started in ``t.steps``. The first ``warm``
    entries are the warm phase: not counted, always sent. Before each step after the first, one
    ``stat`` of ``stop_file``: once it exists the staircase ends there."""
    clock, inflight = time.monotonic, set()
    start = clock()
    for k, (rate, offset, n) in enumerate(steps):
        if k > warm and stop_file is not None and stop_file.exists():
            break
        if k >= warm:
            t.steps += 1
        t0 = start + offset
        for j in range(n):
            due = t0 + j / rate
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            t.remaining -= 1
            task = asyncio.create_task(_send(post, t, due))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
    t.remaining = 0
    await asyncio.gather(*inflight)


async def _progress(path: Path, t: Tally) -> None:
    tmp = path.with_name(path.name + ".tmp")
    while True:
        await asyncio.sleep(1.0)
        tmp.write_bytes(b'{"sent":%d,"send_failed":%d}' % (t.sent, t.failed))
        tmp.replace(path)


CLIENTS = ("raw", "aiohttp")  # the first is the default
DEFAULT_CLIENT = CLIENTS[0]
HEADERS = {"Content-Type": "application/json"}
SKIP_HEADERS = ("User-Agent", "Accept", "Accept-Encoding")  # like .NET HttpClient's bare request


class _AiohttpPost:
    """``await post()`` -> status, over one aiohttp session (``--client aiohttp``)."""

    def __init__(self, target: str, limit: int) -> None:
        self.target = target
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_S), cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False, headers=HEADERS, skip_auto_headers=SKIP_HEADERS,
        )

    async def post(self) -> int:
        async with self.session.post(self.target, data=BODY) as resp:
            await resp.read()
            return resp.status

    async def aclose(self) -> None:
        await self.session.close()


async def run_senders(
    url: str, messages: int, senders: int, gate: asyncio.Event | None = None,
    *, rate: float = 0.0, progress: Path | None = None, client: str = DEFAULT_CLIENT,
    rate_steps: str = "", step_s: float = 0.0, stop_file: Path | None = None, warm_s: float = 0.0,
) -> SendResult:
    """POST exactly ``messages`` times to ``url``/load/messages from ``senders`` closed loops.

    Waits for ``gate`` (if given) before the first request; no request is made before it.
    ``rate > 0`` switches to open-loop sends at ``rate`` msg/s over ``senders + 16`` connections;
    ``rate_steps`` (with ``step_s``, and ``warm_s`` for a warm phase) to the open-loop staircase
    (module docstring).
    """
    rates = parse_rate_steps(rate_steps) if rate_steps else ()
    warm = warm_plan(rates, warm_s) if rates else []
    steps = step_plan(rates, step_s, warm_s) if rates else []
    if steps and sum(n for _, _, n in warm + steps) != messages:
        raise ValueError(f"--messages {messages} is not the staircase's {sum(n for _, _, n in warm + steps)}")
    if client not in CLIENTS:
        raise ValueError(f"unknown client {client!r}: choose one of {', '.join(CLIENTS)}")
    target = url.rstrip("/") + "/load/messages"
    t = Tally(messages)
    c: RawPost | _AiohttpPost = (RawPost(target, BODY, limit=senders + 16, timeout=TIMEOUT_S)
                                 if client == "raw" else _AiohttpPost(target, senders + 16))
    try:
        if gate is not None:
            await gate.wait()
        work = (_staircase(c.post, t, warm + steps, stop_file, len(warm)) if steps
                else _open_loop(c.post, t, rate) if rate > 0
                else asyncio.gather(*(_closed_loop(c.post, t) for _ in range(senders))))
        gate_at, cpu = await send_phase(t, progress, work)
    finally:
        if isinstance(c, RawPost):
            c.close()
        else:
            await c.aclose()
    result = tally_result(t, url=url, messages=messages, senders=senders, rate=rate, gate_at=gate_at, cpu=cpu)
    if not steps:
        return result
    return dataclasses.replace(result, rate_steps=rate_steps, step_s=step_s, warm_s=warm_s, steps_sent=t.steps,
                               planned=sum(n for _, _, n in warm + steps[:t.steps]))


async def send_phase(t: Tally, progress: Path | None, work: Awaitable[Any]) -> tuple[float, float]:
    """Await ``work`` (the gate is open), rewriting the ``progress`` file each second;
    returns (epoch time the phase began, this process's CPU seconds during it)."""
    gate_at, cpu0 = time.time(), _cpu_s()
    ticker = asyncio.create_task(_progress(progress, t)) if progress else None
    try:
        await work
    finally:
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
    return gate_at, _cpu_s() - cpu0


def tally_result(t: Tally, *, url: str, messages: int, senders: int, rate: float = 0.0,
                 gate_at: float, cpu: float) -> SendResult:
    """The :class:`SendResult` of a finished send phase."""
    lat = sorted(t.latency)
    return SendResult(
        url=url, messages=messages, senders=senders, sent=t.sent, send_failed=t.failed, rate=rate,
        gate_opened_at=gate_at, first_send_at=t.first_wall, last_send_at=t.last_wall,
        first_send_mono=t.first_mono, last_send_mono=t.last_mono,
        send_p50_ms=_quantile(lat, 0.50) if lat else None,
        send_p95_ms=_quantile(lat, 0.95) if lat else None,
        send_max_ms=round(lat[-1] * 1000, 3) if lat else None,
        cpu_s=round(cpu, 4), first_error=t.first_error,
    )


async def _wait_for_file(path: Path, gate: asyncio.Event) -> None:
    # A 20 ms stat() poll: nothing to wait on across processes, and it ends before the window.
    while not path.exists():  # noqa: ASYNC110 - one stat() per tick
        await asyncio.sleep(GATE_POLL_S)
    gate.set()


def write_result(result: SendResult, out: Path) -> None:
    """Write ``result`` as JSON to ``out`` atomically (temp file in the same dir + rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=1))
    tmp.replace(out)


async def gated(start_file: Path | None, work: Callable[[asyncio.Event | None], Awaitable[SendResult]],
                failed: Callable[[str], SendResult]) -> SendResult:
    """``work(gate)`` with a gate that opens once ``start_file`` exists (None: no gate); a crash
    becomes ``failed(error)``, because the result file must exist whatever happened."""
    gate = waiter = None
    if start_file is not None:
        gate = asyncio.Event()
        waiter = asyncio.create_task(_wait_for_file(start_file, gate))
    try:
        return await work(gate)
    except Exception as e:
        return failed(f"{type(e).__name__}: {e}")
    finally:
        if waiter is not None:
            waiter.cancel()


def add_gate_options(p: argparse.ArgumentParser) -> None:
    """``--start-file``, ``--out`` and ``--progress``: the protocol with the runner."""
    p.add_argument("--start-file", type=Path, default=None, help="start once this file exists")
    p.add_argument("--out", type=Path, required=True, help="result JSON, written atomically")
    p.add_argument("--progress", type=Path, default=None,
                   help="counter file, rewritten each second")


def run_and_write(main: Callable[[], Coroutine[Any, Any, SendResult]], out: Path) -> int:
    """Run ``main()`` on uvloop, write its result to ``out``; the process's exit status."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
        result = r.run(main())
    write_result(result, out)
    return 0 if result.error is None else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.workload.senders", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="web service base URL, e.g. http://127.0.0.1:28080")
    p.add_argument("--messages", type=int, required=True)
    p.add_argument("--senders", type=int, default=200)
    p.add_argument("--rate", type=float, default=0.0,
                   help="open-loop msg/s (latency mode); default 0 = closed loop")
    p.add_argument("--rate-steps", default="", help="open-loop staircase R1,R2,... msg/s (with --step-s)")
    p.add_argument("--step-s", type=float, default=20.0, help="seconds per staircase step (default 20)")
    p.add_argument("--stop-file", type=Path, default=None,
                   help="staircase: start no further step once this file exists")
    p.add_argument("--warm-s", type=float, default=0.0,
                   help="staircase: seconds at its top rate, then a rest, before the first step (default 0)")
    p.add_argument("--client", choices=CLIENTS, default=DEFAULT_CLIENT,
                   help="HTTP client: raw (default; lab.workload.rawhttp, leaner) or aiohttp")
    add_gate_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.messages < 0 or a.senders < 1 or a.rate < 0 or not 0 <= a.warm_s <= 3600:
        p.error("--messages and --rate must be >= 0, --senders >= 1, --warm-s within 0..3600")
    return run_and_write(lambda: gated(
        a.start_file,
        lambda gate: run_senders(a.url, a.messages, a.senders, gate, rate=a.rate, progress=a.progress,
                                 client=a.client, rate_steps=a.rate_steps, step_s=a.step_s,
                                 stop_file=a.stop_file, warm_s=a.warm_s),
        lambda error: SendResult(url=a.url, messages=a.messages, senders=a.senders, sent=0,
                                 send_failed=0, rate=a.rate, error=error),
    ), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
