"""The web service of a run: the HTTP hop the senders insert through, and the work endpoint.

Run as its own measured process::

    python -m lab.workload.web --port 28080 --dsn "host=127.0.0.1 port=25432 ..." [--pool 220]

Endpoints (method.md §3 and §5):

* ``POST /load/messages`` ``{"content": ...}`` -> one autocommit
  ``INSERT INTO messages (content) VALUES (%s) RETURNING id, created_at`` -> 201
  ``{"id", "createdAt"}``. With ``--reset discard`` (the default) a reused pooled connection
  first gets ``DISCARD ALL``, pipelined with the INSERT in one round trip (one Sync, no wait in
  between), as Npgsql does when a pooled connection is reused without ``No Reset On Close``
  (method.md §3); ``--reset none`` sends the INSERT alone.
* ``POST /send-email`` ``{"id", "content", "createdAt"}`` -> counts calls and distinct ids, yields
  once to the loop (the reference's ``Task.Yield()``; ``--work-delay-ms`` sleeps instead, for the
  control experiment) -> 202.
* ``GET /load/stats`` -> ``{"calls", "distinct", "cpuMs", "memoryMb"}`` (this process's CPU, RSS).
* ``GET /load/arrivals`` -> ``{"ids": [...], "t": [...]}``: every work call's id and wall-clock
  arrival (``time.time()``), kept in two ``array`` columns (16 bytes and well under 1 µs a call).
  That is already every call per id: per-id call counts (duplicates, issue 14) are counted by the
  runner from it, after the run, so the hot path keeps no per-id counter.
* Fault runs only, with ``--by-consumer``: the work body also carries ``"by"`` (the consumer's
  index), kept in a third column and returned as ``"by"`` by ``/load/arrivals`` (per-consumer
  accounting). Without the option the handler is the plain one.
* ``POST /load/reset`` -> 204; zeroes the counters and the arrivals.
* Test only, with ``--test-hold``: ``POST /test/hold`` ``{"id"}`` makes ``/send-email`` for that id
  wait (after counting the call) until ``POST /test/release``; the watermark test holds one row's
  work this way. Without the option the routes do not exist and the hot path is unchanged.

Hot path (measured with 20k messages from 200 senders on 2 shared cores): uvloop, orjson, no
access log, a fixed pool of 220 connections as in the reference (a pool of 64 cost ~50 % more
web CPU per message), ``getconn``/``putconn`` and one reused binary cursor per connection instead
of the pool's context manager and a cursor per request (~25 % less web CPU). The INSERT is sent
unprepared by default, as the reference's EF Core + Npgsql did, because PostgreSQL is a measured
participant: ``--prepare`` saves the web ~3 % but PostgreSQL ~35 % per insert (no parse/plan),
which would shrink the postgres column against the published one. Binary vs text: a wash.
``--prepare`` needs ``--reset none``: ``DISCARD ALL`` deallocates the prepared statements that
psycopg believes exist.
SIGTERM/SIGINT stop the server gracefully and close the pool.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import time
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from weakref import WeakKeyDictionary

import orjson
import psutil
import uvloop
from aiohttp import web
from psycopg import AsyncConnection, AsyncCursor
from psycopg_pool import AsyncConnectionPool

log = logging.getLogger("lab.workload.web")  # not __name__: that is "__main__" under -m

INSERT = b"INSERT INTO messages (content) VALUES (%s) RETURNING id, created_at"
DISCARD = b"DISCARD ALL"
RESETS = ("discard", "none")  # what a reused pooled connection gets before the INSERT
DEFAULT_POOL = 220
APPLICATION_NAME = "lab-web"  # how its connections show in pg_stat_activity
_JSON = "application/json"
Handler = Callable[[web.Request], Awaitable[web.Response]]
_SELF = psutil.Process()


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


POOL = web.AppKey("pool", AsyncConnectionPool)
STATS = web.AppKey("stats", WorkStats)
PREPARE = web.AppKey("prepare", bool)
RESET = web.AppKey("reset", bool)


_cursors: WeakKeyDictionary[AsyncConnection, AsyncCursor] = WeakKeyDictionary()


async def insert_row(
    conn: AsyncConnection, cur: AsyncCursor, content: str, *, reset: bool, prepare: bool = False
) -> tuple[Any, ...] | None:
    """The INSERT; with ``reset``, ``DISCARD ALL`` first, both sent before either is read."""
    if reset:
        async with conn.pipeline():  # one Sync at the exit: a single round trip
            await cur.execute(DISCARD, prepare=False)
            await cur.execute(INSERT, (content,), prepare=False)
    else:
        await cur.execute(INSERT, (content,), prepare=prepare)  # False: never auto-prepared either
    return await cur.fetchone()


async def insert_message(request: web.Request) -> web.Response:
    content = orjson.loads(await request.read())["content"]
    pool = request.app[POOL]
    conn = await pool.getconn()  # getconn/putconn: cheaper than the connection() context
    try:
        # One binary cursor per pooled connection, reused across requests (saves its setup);
        # a connection seen before is a reuse, and only a reuse gets the reset (as in Npgsql).
        cur = _cursors.get(conn)
        reused = cur is not None
        if cur is None:
            cur = _cursors[conn] = conn.cursor(binary=True)
        row = await insert_row(conn, cur, content, reset=reused and request.app[RESET],
                               prepare=request.app[PREPARE])
    finally:
        await pool.putconn(conn)  # a broken connection is discarded and replaced by the pool
    assert row is not None
    body = orjson.dumps({"id": row[0], "createdAt": row[1]})
    return web.Response(body=body, status=201, content_type=_JSON)


async def send_email(request: web.Request) -> web.Response:
    request.app[STATS].work(orjson.loads(await request.read())["id"])
    await asyncio.sleep(0)  # the reference's Task.Yield(): one trip through the loop
    return web.Response(status=202)


async def by_consumer_send_email(request: web.Request) -> web.Response:
    """``/send-email`` that also keeps which consumer called (``--by-consumer``, fault runs)."""
    body = orjson.loads(await request.read())
    stats = request.app[STATS]
    stats.work(body["id"])
    stats.arrival_by.append(body.get("by", -1))
    await asyncio.sleep(0)
    return web.Response(status=202)


HOLD = web.AppKey("hold", dict)


def holding_send_email(inner: Handler) -> Handler:
    """``/send-email`` that waits on the held id until it is released (``--test-hold`` only)."""

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


def delayed_send_email(delay_s: float) -> Handler:
    """``/send-email`` that sleeps ``delay_s`` instead of yielding (the control experiment)."""

    async def handler(request: web.Request) -> web.Response:
        request.app[STATS].work(orjson.loads(await request.read())["id"])
        await asyncio.sleep(delay_s)
        return web.Response(status=202)

    return handler


async def stats(request: web.Request) -> web.Response:
    s = request.app[STATS]
    ru = resource.getrusage(resource.RUSAGE_SELF)
    body = {
        "calls": s.calls,
        "distinct": len(s.ids),
        "cpuMs": round((ru.ru_utime + ru.ru_stime) * 1000.0, 3),
        "memoryMb": round(_SELF.memory_info().rss / 2**20, 1),
    }
    return web.Response(body=orjson.dumps(body), content_type=_JSON)


async def arrivals(request: web.Request) -> web.Response:
    s = request.app[STATS]
    out = {"ids": s.arrival_ids.tolist(), "t": s.arrival_t.tolist()}
    if s.arrival_by:
        out["by"] = s.arrival_by.tolist()
    body = orjson.dumps(out)
    return web.Response(body=body, content_type=_JSON)


async def reset_stats(request: web.Request) -> web.Response:
    request.app[STATS].reset()
    return web.Response(status=204)


def create_app(
    dsn: str, pool_size: int = DEFAULT_POOL, work_delay_ms: float = 0.0, prepare: bool = False,
    test_hold: bool = False, reset: str = "discard", by_consumer: bool = False,
) -> web.Application:
    """The aiohttp application; the pool opens on startup and closes on cleanup.

    ``prepare=False`` sends the INSERT unprepared every time (parse and plan per request in
    PostgreSQL, like the reference's Npgsql defaults); psycopg's automatic preparation is off too.
    ``reset`` is ``discard`` (``DISCARD ALL`` on every reuse of a pooled connection) or ``none``.
    """
    if reset not in RESETS:
        raise ValueError(f"unknown reset {reset!r}: choose one of {', '.join(RESETS)}")
    if prepare and reset == "discard":
        raise ValueError("--prepare needs --reset none: DISCARD ALL drops the prepared statement")
    app = web.Application()
    app[STATS] = WorkStats()
    app[PREPARE] = prepare
    app[RESET] = reset == "discard"

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        pool = AsyncConnectionPool(
            dsn, min_size=pool_size, max_size=pool_size, open=False,
            kwargs={"autocommit": True, "application_name": APPLICATION_NAME}, name="web",
        )
        await pool.open(wait=True, timeout=60)
        app[POOL] = pool
        yield
        await pool.close()

    app.cleanup_ctx.append(pool_ctx)
    app.router.add_post("/load/messages", insert_message)
    work = delayed_send_email(work_delay_ms / 1000) if work_delay_ms > 0 else send_email
    if by_consumer:
        if work_delay_ms > 0:
            raise ValueError("--by-consumer does not combine with --work-delay-ms")
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


async def serve(
    host: str, port: int, dsn: str, pool_size: int = DEFAULT_POOL, work_delay_ms: float = 0.0,
    prepare: bool = False, test_hold: bool = False, reset: str = "discard", by_consumer: bool = False,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting, finish, and close the pool."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(
        create_app(dsn, pool_size, work_delay_ms, prepare, test_hold, reset, by_consumer),
        access_log=None, handle_signals=False
    )
    await runner.setup()  # opens the pool: the port only listens once every connection is up
    try:
        await web.TCPSite(runner, host, port, backlog=1024, reuse_address=True).start()
        log.info("web listening on %s:%d (pool %d, reset %s)", host, port, pool_size, reset)
        await stop.wait()
    finally:
        await runner.cleanup()
        log.info("web stopped")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.workload.web", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--pool", type=int, default=DEFAULT_POOL, help="connections (default 220)")
    p.add_argument("--work-delay-ms", type=float, default=0.0,
                   help="sleep this long in /send-email instead of yielding (control experiment)")
    p.add_argument("--prepare", action=argparse.BooleanOptionalAction, default=False,
                   help="server-side prepared INSERT (default: unprepared, as the reference)")
    p.add_argument("--test-hold", action="store_true",
                   help="tests only: /test/hold and /test/release hold one id's work")
    p.add_argument("--reset", choices=RESETS, default="discard",
                   help="on reuse of a pooled connection: DISCARD ALL pipelined with the INSERT "
                        "(default, as Npgsql) or none")
    p.add_argument("--by-consumer", action="store_true",
                   help="fault runs: keep which consumer made each work call (the body's \"by\")")
    a = p.parse_args(argv)
    if a.prepare and a.reset == "discard":
        p.error("--prepare needs --reset none: DISCARD ALL drops the prepared statement")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    logging.getLogger("lab").setLevel(logging.INFO)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
        r.run(serve(a.host, a.port, a.dsn, a.pool, a.work_delay_ms, a.prepare, a.test_hold, a.reset,
                    a.by_consumer))


if __name__ == "__main__":
    main()
