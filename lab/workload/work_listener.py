"""The web service's second listener: the consumers' work calls and the runner's ``/load/*`` calls.

It runs as a process of its own, started by :mod:`lab.workload.web` once the insert listener is
up, and dies with it (``prctl(PR_SET_PDEATHSIG)``). The reason is the event loop: a Python web
service is one loop, and 200 closed-loop senders keep about 200 inserts queued in it at every
moment, so on a loaded machine a work call or a ``/load/stats`` call queued behind them waited
seconds (runs failed on the consumers' 30 s and the runner's 10 s timeouts). The reference's
ASP.NET service answered both on a thread pool; here the kernel's scheduler does that job between
the two processes, and the work calls never wait behind an insert (docs/benchmarks.md, "Harness").

Endpoints:

* ``POST /send-email`` ``{"id", "content", "createdAt"}`` -> counts calls and distinct ids, yields
  once to the loop (the reference's ``Task.Yield()``; ``--work-delay-ms`` sleeps instead, for the
  control experiment) -> 202.
* ``GET /load/stats`` -> ``{"calls", "distinct", "cpuMs", "memoryMb"}``: the CPU and RSS of the
  whole web service (both processes).
* ``GET /load/arrivals`` -> ``{"ids": [...], "t": [...]}``: every work call's id and wall-clock
  arrival (``time.time()``), kept in two ``array`` columns (16 bytes and well under 1 µs a call).
  Per-id call counts (duplicates) are counted by the runner from it, after the run.
* Fault runs only, with ``by_consumer``: the work body also carries ``"by"`` (the consumer's
  index), kept in a third column and returned as ``"by"`` (per-consumer accounting).
* ``POST /load/reset`` -> 204; zeroes the counters and the arrivals.
* Test only, with ``test_hold``: ``POST /test/hold`` ``{"id"}`` makes ``/send-email`` for that id
  wait (after counting the call) until ``POST /test/release``. Without it the routes do not exist.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Awaitable, Callable

import orjson
import psutil
from aiohttp import web

_JSON = "application/json"
Handler = Callable[[web.Request], Awaitable[web.Response]]


class WorkStats:
    """Counters of ``/send-email``: calls, distinct ids, and (id, arrival) per call."""

    __slots__ = ("arrival_by", "arrival_ids", "arrival_t", "calls", "ids")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.ids: set[int] = set()
        self.arrival_ids = array("q")
        self.arrival_t = array("d")
        self.arrival_by = array("h")  # filled by by_consumer_send_email only

    def work(self, message_id: int) -> None:
        self.calls += 1
        self.ids.add(message_id)
        self.arrival_ids.append(message_id)
        self.arrival_t.append(time.time())


STATS = web.AppKey("stats", WorkStats)
SERVICE = web.AppKey("service", list)  # the web service's processes: [insert listener?, this one]
HOLD = web.AppKey("hold", dict)


async def send_email(request: web.Request) -> web.Response:
    request.app[STATS].work(orjson.loads(await request.read())["id"])
    await asyncio.sleep(0)  # the reference's Task.Yield(): one trip through the loop
    return web.Response(status=202)


async def by_consumer_send_email(request: web.Request) -> web.Response:
    """``/send-email`` that also keeps which consumer called (fault runs)."""
    body = orjson.loads(await request.read())
    stats = request.app[STATS]
    stats.work(body["id"])
    stats.arrival_by.append(body.get("by", -1))
    await asyncio.sleep(0)
    return web.Response(status=202)


def delayed_send_email(delay_s: float) -> Handler:
    """``/send-email`` that sleeps ``delay_s`` instead of yielding (the control experiment)."""

    async def handler(request: web.Request) -> web.Response:
        request.app[STATS].work(orjson.loads(await request.read())["id"])
        await asyncio.sleep(delay_s)
        return web.Response(status=202)

    return handler


def holding_send_email(inner: Handler) -> Handler:
    """``/send-email`` that waits on the held id until it is released (``test_hold`` only)."""

    async def handler(request: web.Request) -> web.Response:
        body = await request.read()
        hold = request.app[HOLD]
        if orjson.loads(body)["id"] == hold.get("id"):
            request.app[STATS].work(hold["id"])
            await hold["released"].wait()
            return web.Response(status=202)
        return await inner(request)

    return handler


async def hold_id(request: web.Request) -> web.Response:
    request.app[HOLD].update(id=orjson.loads(await request.read())["id"], released=asyncio.Event())
    return web.Response(status=204)


async def release_id(request: web.Request) -> web.Response:
    hold = request.app[HOLD]
    if "released" in hold:
        hold["released"].set()
    return web.Response(status=204)


async def stats(request: web.Request) -> web.Response:
    s = request.app[STATS]
    cpu_s = rss = 0.0
    for p in request.app[SERVICE]:
        try:
            with p.oneshot():
                t = p.cpu_times()
                cpu_s += t.user + t.system
                rss += p.memory_info().rss
        except psutil.NoSuchProcess:  # the insert listener is gone: this one still answers
            continue
    body = {"calls": s.calls, "distinct": len(s.ids), "cpuMs": round(cpu_s * 1000.0, 3),
            "memoryMb": round(rss / 2**20, 1)}
    return web.Response(body=orjson.dumps(body), content_type=_JSON)


async def arrivals(request: web.Request) -> web.Response:
    s = request.app[STATS]
    out = {"ids": s.arrival_ids.tolist(), "t": s.arrival_t.tolist()}
    if s.arrival_by:
        out["by"] = s.arrival_by.tolist()
    return web.Response(body=orjson.dumps(out), content_type=_JSON)


async def reset_stats(request: web.Request) -> web.Response:
    request.app[STATS].reset()
    return web.Response(status=204)


def create_app(*, work_delay_ms: float = 0.0, by_consumer: bool = False, test_hold: bool = False,
               insert_pid: int | None = None) -> web.Application:
    """The control listener's application; ``insert_pid``: the web's insert process, whose CPU
    and RSS ``/load/stats`` adds to this process's own."""
    if by_consumer and work_delay_ms > 0:
        raise ValueError("--by-consumer does not combine with --work-delay-ms")
    app = web.Application()
    app[STATS] = WorkStats()
    app[SERVICE] = [psutil.Process(insert_pid)] if insert_pid else []
    app[SERVICE].append(psutil.Process())
    work = delayed_send_email(work_delay_ms / 1000) if work_delay_ms > 0 else send_email
    if by_consumer:
        work = by_consumer_send_email
    if test_hold:  # test only: the normal handler stays as it is otherwise
        app[HOLD] = {}
        work = holding_send_email(work)
        app.router.add_post("/test/hold", hold_id)
        app.router.add_post("/test/release", release_id)
    app.router.add_post("/send-email", work)
    app.router.add_get("/load/stats", stats)
    app.router.add_get("/load/arrivals", arrivals)
    app.router.add_post("/load/reset", reset_stats)
    return app
