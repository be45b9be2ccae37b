"""The web service of a run: the HTTP hop the senders insert through, and the work endpoint.

Run as its own measured process::

    python -m lab.workload.web --port 28080 --control-port 28081 --dsn "host=127.0.0.1 ..." [--pool 220]

Two listeners in two processes (one participant, ``web``: the runner measures the tree):

* ``--port``: ``POST /load/messages`` ``{"content": ...}`` -> one autocommit
  ``INSERT INTO messages (content) VALUES ($1) RETURNING id, created_at`` -> 201
  ``{"id", "createdAt"}``. With ``--reset discard`` (the default) a reused pooled
  connection first gets ``DISCARD ALL``, pipelined with the INSERT in one round trip (one Sync,
  no wait in between), as Npgsql does when a pooled connection is reused without ``No Reset On
  Close``; ``--reset none`` sends the INSERT alone.
* ``--control-port``: the consumers' ``/send-email`` and the runner's ``/load/*`` calls
  (:mod:`lab.workload.work_listener`), in a child process started once the insert listener is up, so
  that the control port answering means the whole service is ready. Without ``--control-port``
  the service inserts only (``lab bench harness``'s like-for-like arms).

Hot path (profiled with py-spy under 200 senders on 2 shared cores; figures in
docs/benchmarks.md, "Harness"): uvloop; the insert listener is a raw asyncio protocol
(:class:`lab.workload.rawhttp.PostServer`; ``--http aiohttp`` serves the same handler with
aiohttp); a fixed pool of 220 connections as in the reference (a pool of 64 cost ~50 % more web
CPU per message), ``getconn``/``putconn`` instead of the pool's context manager; and the
statements go out through libpq directly (``send_query_params`` with the statement text
converted once, the pipeline entered and synced by hand, the two result columns decoded with
psycopg's own binary loaders) instead of a psycopg cursor, whose per-execute machinery was the
largest part of the web's CPU. The wire traffic is what psycopg sent: Parse/Bind/Describe/Execute
of the unnamed statement, the parameter untyped text (``tests/unit/workload/test_web_statement.py``
holds the text equal to psycopg's conversion). The INSERT is unprepared by default, as the
reference's EF Core + Npgsql did, because PostgreSQL is a measured participant: ``--prepare``
saves the web ~3 % but PostgreSQL ~35 % per insert (no parse/plan), which would shrink the
postgres column against the published one. ``--prepare`` needs ``--reset none``: ``DISCARD
ALL`` deallocates prepared statements.
SIGTERM/SIGINT stop both listeners and close the pool.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from weakref import WeakKeyDictionary

import orjson
import uvloop
from aiohttp import web
from psycopg import AsyncConnection, errors, postgres, pq
from psycopg.pq.abc import PGconn, PGresult
from psycopg_pool import AsyncConnectionPool

from lab.stack.proc import die_with_parent
from lab.workload import work_listener
from lab.workload.rawhttp import PostServer

log = logging.getLogger("lab.workload.web")  # not __name__: that is "__main__" under -m

# The INSERT as psycopg converts "... VALUES (%s) ..." for a str: $1, an untyped text parameter.
INSERT = b"INSERT INTO messages (content) VALUES ($1) RETURNING id, created_at"
# The same statement in psycopg's placeholder style, for a psycopg cursor (the big-transaction
# fault); tests/unit/workload/test_web_statement.py holds its conversion equal to INSERT.
INSERT_QUERY = b"INSERT INTO messages (content) VALUES (%s) RETURNING id, created_at"
INSERT_TYPES = (0,)
INSERT_FORMATS = (pq.Format.TEXT,)
PREPARED = b"lab_insert"
DISCARD = b"DISCARD ALL"
RESETS = ("discard", "none")  # what a reused pooled connection gets before the INSERT
HTTP_SERVERS = ("raw", "aiohttp")  # the insert listener; the first is the default
DEFAULT_HTTP = HTTP_SERVERS[0]
DEFAULT_POOL = 220
APPLICATION_NAME = "lab-web"  # how its connections show in pg_stat_activity
CONTROL_STOP_S = 10.0
POOL_OPEN_S = 120.0  # 220 connections; a machine at load 40 took over 60 s
_BINARY = pq.Format.BINARY
_OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_TIMESTAMPTZ = postgres.types["timestamptz"].oid


class _Session:
    """What the web keeps per pooled connection: seen before (a reuse), prepared, its loader."""

    __slots__ = ("created_at", "prepared", "used")

    def __init__(self, conn: AsyncConnection) -> None:
        self.used = self.prepared = False
        loader = conn.adapters.get_loader(_TIMESTAMPTZ, _BINARY)
        assert loader is not None
        self.created_at = loader(_TIMESTAMPTZ, conn)  # the connection's time zone, as a cursor's


_sessions: WeakKeyDictionary[AsyncConnection, _Session] = WeakKeyDictionary()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool = False) -> None:
    fut = loop.create_future()
    (loop.add_writer if write else loop.add_reader)(fd, _wake, fut)
    try:
        await fut
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _results(pgconn: PGconn, *, pipeline: bool) -> list[PGresult]:
    """Flush what was sent, then read every result: up to the Sync in a pipeline, else to the end."""
    loop = asyncio.get_running_loop()
    fd = pgconn.socket
    while pgconn.flush():  # 1: the socket's buffer is full, more to send
        await _ready(loop, fd, write=True)
    out: list[Any] = []
    while True:
        while pgconn.is_busy():
            await _ready(loop, fd)
            pgconn.consume_input()
        r = pgconn.get_result()
        if r is None:
            if pipeline:
                continue  # the end of one statement's results
            return out
        if r.status == _SYNC:
            return out
        out.append(r)


async def insert_row(conn: AsyncConnection, content: str, *, reset: bool,
                     prepare: bool = False) -> tuple[int, datetime]:
    """The INSERT's (id, created_at); with ``reset``, ``DISCARD ALL`` first, both sent before
    either is read (one Sync). ``conn`` must be idle and used by nobody else (a pool's getconn)."""
    session = _sessions.get(conn)
    if session is None:
        session = _sessions[conn] = _Session(conn)
    pgconn = conn.pgconn
    param = (content.encode(),)
    if reset:
        pgconn.enter_pipeline_mode()
        pgconn.send_query_params(DISCARD, None, result_format=_BINARY)
        pgconn.send_query_params(INSERT, param, INSERT_TYPES, INSERT_FORMATS, _BINARY)
        pgconn.pipeline_sync()
        results = await _results(pgconn, pipeline=True)
        pgconn.exit_pipeline_mode()
    elif prepare:
        if not session.prepared:
            pgconn.send_prepare(PREPARED, INSERT, INSERT_TYPES)
            _check(await _results(pgconn, pipeline=False), conn)
            session.prepared = True
        pgconn.send_query_prepared(PREPARED, param, INSERT_FORMATS, _BINARY)
        results = await _results(pgconn, pipeline=False)
    else:
        pgconn.send_query_params(INSERT, param, INSERT_TYPES, INSERT_FORMATS, _BINARY)
        results = await _results(pgconn, pipeline=False)
    _check(results, conn)
    r = results[-1]
    raw_id, raw_at = r.get_value(0, 0), r.get_value(0, 1)
    assert raw_id is not None and raw_at is not None
    return int.from_bytes(raw_id, "big", signed=True), session.created_at.load(raw_at)


def _check(results: Sequence[PGresult], conn: AsyncConnection) -> None:
    for r in results:
        if r.status not in _OK:
            raise errors.error_from_result(r, encoding=conn.info.encoding)


class Inserter:
    """``await inserter(body)`` -> (201, the JSON reply): one message into ``messages``."""

    def __init__(self, pool: AsyncConnectionPool, *, reset: bool, prepare: bool) -> None:
        self.pool, self.reset, self.prepare = pool, reset, prepare

    async def __call__(self, body: bytes) -> tuple[int, bytes]:
        content = orjson.loads(body)["content"]
        conn = await self.pool.getconn()  # getconn/putconn: cheaper than the connection() context
        try:
            session = _sessions.get(conn)
            reused = session is not None and session.used  # only a reuse gets the reset (as Npgsql)
            row_id, created_at = await insert_row(conn, content, reset=reused and self.reset,
                                                  prepare=self.prepare)
            _sessions[conn].used = True
        except BaseException:
            await conn.close()  # its protocol state is unknown: the pool replaces it
            raise
        finally:
            await self.pool.putconn(conn)
        return 201, orjson.dumps({"id": row_id, "createdAt": created_at})


def _aiohttp_app(inserter: Inserter) -> web.Application:
    async def insert_message(request: web.Request) -> web.Response:
        status, body = await inserter(await request.read())
        return web.Response(body=body, status=status, content_type="application/json")

    app = web.Application()
    app.router.add_post("/load/messages", insert_message)
    return app


def _spawn_control(port: int, host: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """The control listener, a child that dies with this process."""
    return subprocess.Popen(
        [sys.executable, "-m", "lab.workload.web", "--control", "--host", host, "--port", str(port),
         "--insert-pid", str(os.getpid()), *argv],
        stdin=subprocess.DEVNULL, preexec_fn=die_with_parent(os.getpid()),
    )


async def _stop_control(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.terminate()
    try:
        await asyncio.to_thread(child.wait, CONTROL_STOP_S)
    except subprocess.TimeoutExpired:
        child.kill()
        await asyncio.to_thread(child.wait)


async def serve(
    host: str, port: int, dsn: str, pool_size: int = DEFAULT_POOL, *, prepare: bool = False,
    reset: str = "discard", http: str = "raw", control_port: int | None = None,
    control_argv: Sequence[str] = (),
) -> None:
    """Open the pool, listen for inserts, start the control listener; serve until SIGTERM or
    SIGINT, then stop both listeners and close the pool."""
    if reset not in RESETS:
        raise ValueError(f"unknown reset {reset!r}: choose one of {', '.join(RESETS)}")
    if prepare and reset == "discard":
        raise ValueError("--prepare needs --reset none: DISCARD ALL drops the prepared statement")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pool = AsyncConnectionPool(
        dsn, min_size=pool_size, max_size=pool_size, open=False,
        kwargs={"autocommit": True, "application_name": APPLICATION_NAME}, name="web",
    )
    await pool.open(wait=True, timeout=POOL_OPEN_S)  # the port listens once every connection is up
    inserter = Inserter(pool, reset=reset == "discard", prepare=prepare)
    raw: PostServer | None = None
    runner: web.AppRunner | None = None
    child: subprocess.Popen[bytes] | None = None
    try:
        if http == "raw":
            raw = PostServer("/load/messages", inserter)
            await raw.start(host, port)
        else:
            runner = web.AppRunner(_aiohttp_app(inserter), access_log=None, handle_signals=False)
            await runner.setup()
            await web.TCPSite(runner, host, port, backlog=1024, reuse_address=True).start()
        if control_port is not None:
            child = _spawn_control(control_port, host, list(control_argv))
        log.info("web listening on %s:%d (%s, pool %d, reset %s), control on %s", host, port, http,
                 pool_size, reset, control_port)
        await stop.wait()
    finally:
        if child is not None:
            await _stop_control(child)
        if raw is not None:
            await raw.close()
        if runner is not None:
            await runner.cleanup()
        await pool.close()
        log.info("web stopped")


async def serve_control(host: str, port: int, insert_pid: int | None, **options: Any) -> None:
    """The control listener (:mod:`lab.workload.work_listener`) until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(work_listener.create_app(insert_pid=insert_pid, **options), access_log=None,
                           handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, backlog=1024, reuse_address=True).start()
        await stop.wait()
    finally:
        await runner.cleanup()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.workload.web", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="the insert listener's port")
    p.add_argument("--control-port", type=int, default=None,
                   help="the work/stats listener's port (default: none, inserts only)")
    p.add_argument("--dsn", help="PostgreSQL (required but with --control)")
    p.add_argument("--pool", type=int, default=DEFAULT_POOL, help="connections (default 220)")
    p.add_argument("--http", choices=HTTP_SERVERS, default=DEFAULT_HTTP,
                   help="the insert listener: raw asyncio protocol (default) or aiohttp")
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
    p.add_argument("--control", action="store_true", help=argparse.SUPPRESS)  # the child itself
    p.add_argument("--insert-pid", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    if a.prepare and a.reset == "discard":
        p.error("--prepare needs --reset none: DISCARD ALL drops the prepared statement")
    if a.by_consumer and a.work_delay_ms > 0:
        p.error("--by-consumer does not combine with --work-delay-ms")
    if not a.control and not a.dsn:
        p.error("--dsn is required")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    logging.getLogger("lab").setLevel(logging.INFO)
    options = {"work_delay_ms": a.work_delay_ms, "by_consumer": a.by_consumer, "test_hold": a.test_hold}
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
        if a.control:
            r.run(serve_control(a.host, a.port, a.insert_pid, **options))
            return
        control_argv = [*(["--work-delay-ms", str(a.work_delay_ms)] if a.work_delay_ms else []),
                        *(["--by-consumer"] if a.by_consumer else []),
                        *(["--test-hold"] if a.test_hold else [])]
        r.run(serve(a.host, a.port, a.dsn, a.pool, prepare=a.prepare, reset=a.reset, http=a.http,
                    control_port=a.control_port, control_argv=control_argv))


if __name__ == "__main__":
    main()
