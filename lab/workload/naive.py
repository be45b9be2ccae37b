"""A naive insert harness: the baseline ``lab bench harness`` holds the real one against.

What a new user would write first, with the same libraries and nothing tuned: an aiohttp web
service with a ``psycopg_pool`` pool (its ``connection()`` context, a cursor per request, JSON
through the standard library, the default asyncio loop) that only serves ``POST /load/messages``,
and aiohttp senders (one ``ClientSession``, S tasks in a closed loop) that only insert.

    python -m lab.workload.naive web --port P --dsn DSN [--host ADDRESS]
    python -m lab.workload.naive senders --url http://127.0.0.1:P --messages M --senders S

The senders print one JSON line: ``sent``, ``failed``, ``wall_s`` and ``cpu_s`` (their own CPU
over the send phase only, not the start-up). The web's CPU is read from outside (psutil) by the
bench, over the same phase. The pool has the real web's 220 connections and no reset.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from psycopg_pool import AsyncConnectionPool

POOL = 220


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def create_app(dsn: str, pool_size: int = POOL) -> web.Application:
    app = web.Application()

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        async with AsyncConnectionPool(dsn, min_size=pool_size, max_size=pool_size,
                                       kwargs={"autocommit": True}) as pool:
            await pool.wait(timeout=120)  # a loaded machine took over 60 s for 220 connections
            app["pool"] = pool
            yield

    async def insert(request: web.Request) -> web.Response:
        data = await request.json()
        async with request.app["pool"].connection() as conn, conn.cursor() as cur:
            await cur.execute("INSERT INTO messages (content) VALUES (%s) RETURNING id, created_at",
                              (data["content"],))
            row = await cur.fetchone()
        assert row is not None
        return web.json_response({"id": row[0], "createdAt": row[1].isoformat()}, status=201)

    app.cleanup_ctx.append(pool_ctx)
    app.router.add_post("/load/messages", insert)
    return app


async def send_all(url: str, messages: int, senders: int) -> dict[str, float]:
    left = messages
    sent = failed = 0

    async def loop(session: aiohttp.ClientSession) -> None:
        nonlocal left, sent, failed
        while left > 0:
            left -= 1
            try:
                async with session.post(url + "/load/messages", json={"content": "helloworld"}) as r:
                    await r.read()
                    if 200 <= r.status < 300:
                        sent += 1
                    else:
                        failed += 1
            except aiohttp.ClientError:
                failed += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=senders + 16)) as session:
        cpu0, t0 = _cpu_s(), time.monotonic()
        await asyncio.gather(*(loop(session) for _ in range(senders)))
        return {"sent": sent, "failed": failed, "wall_s": time.monotonic() - t0, "cpu_s": _cpu_s() - cpu0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.workload.naive", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    w = sub.add_parser("web")
    w.add_argument("--host", default="127.0.0.1")
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--dsn", required=True)
    s = sub.add_parser("senders")
    s.add_argument("--url", required=True)
    s.add_argument("--messages", type=int, required=True)
    s.add_argument("--senders", type=int, default=200)
    a = p.parse_args(argv)
    if a.role == "web":
        web.run_app(create_app(a.dsn), host=a.host, port=a.port, access_log=None, print=None)
        return 0
    out = asyncio.run(send_all(a.url, a.messages, a.senders))
    sys.stdout.write(json.dumps(out) + "\n")
    return 0 if out["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
