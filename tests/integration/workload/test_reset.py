"""The Npgsql-style reset on the insert path: ``DISCARD ALL`` pipelined with the INSERT.

Checked three ways against the session stack's real PostgreSQL: libpq's protocol trace shows
both statements sent before any reply is read (one round trip); the server log of a web process
whose sessions log every statement shows one ``DISCARD ALL`` per reused connection (and none with
``--reset none``); the broker-native ``pg`` producer writes exactly M rows with either reset.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import psycopg
import pytest

from lab.pipelines.producers import run_producers
from lab.settings import Settings, child_env
from lab.stack import proc
from lab.workload.web import insert_row

pytestmark = pytest.mark.integration

REQUESTS = 12
POOL = 2


@pytest.fixture
def db(stack: object, settings: Settings) -> Iterator[psycopg.Connection]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE messages")
        yield conn


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_discard_and_insert_go_out_before_any_reply(db: psycopg.Connection, settings: Settings,
                                                    tmp_path: Path) -> None:
    trace = tmp_path / "libpq.trace"

    async def one() -> tuple[object, ...] | None:
        conn = await psycopg.AsyncConnection.connect(settings.pg_dsn, autocommit=True)
        try:
            with open(trace, "w") as f:
                conn.pgconn.trace(f.fileno())
                row = await insert_row(conn, "traced", reset=True)
                conn.pgconn.untrace()
            return row
        finally:
            await conn.close()

    row = asyncio.run(one())
    assert row is not None and isinstance(row[0], int)
    # libpq trace lines: timestamp, F (sent) or B (received), length, message type, contents
    msgs = [[*line.split("\t"), ""][:5] for line in trace.read_text().splitlines()]
    sent = [m[3] for m in msgs if m[1] == "F"]
    first_reply = next(i for i, m in enumerate(msgs) if m[1] == "B")
    assert all(m[1] == "F" for m in msgs[:first_reply])  # nothing read before everything is out
    assert sent.count("Sync") == 1 and sent.count("Execute") == 2
    assert "DISCARD ALL" in msgs[0][4] and "INSERT INTO messages" in "".join(m[4] for m in msgs[:first_reply])
    done = [m[4] for m in msgs if m[1] == "B" and m[3] == "CommandComplete"]
    assert [d.strip().strip('"') for d in done] == ["DISCARD ALL", "INSERT 0 1"]
    assert db.execute("SELECT content FROM messages").fetchall() == [("traced",)]


def _discards_logged(settings: Settings, tmp_path: Path, reset: str) -> int:
    """Start a web with a statement-logging DSN, send REQUESTS one at a time, count DISCARDs."""
    log = settings.stack_dir / "postgres" / "postgres.log"
    offset = log.stat().st_size
    port = _free_port()
    dsn = settings.pg_dsn + " options='-c log_statement=all'"
    argv = [sys.executable, "-m", "lab.workload.web", "--port", str(port), "--dsn", dsn,
            "--pool", str(POOL), "--reset", reset]
    with open(tmp_path / f"web-{reset}.log", "ab") as out:
        web = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=child_env(settings))
    try:
        proc.wait_until(lambda: proc.port_open(port), timeout=60, what="web",
                        proc=psutil.Process(web.pid), log_path=tmp_path / f"web-{reset}.log")

        async def send() -> None:
            async with aiohttp.ClientSession() as s:
                for _ in range(REQUESTS):
                    async with s.post(f"http://127.0.0.1:{port}/load/messages",
                                      json={"content": "helloworld"}) as r:
                        assert r.status == 201

        asyncio.run(send())
    finally:
        web.send_signal(signal.SIGTERM)
        web.wait(30)
    time.sleep(0.5)  # the server's stderr reaches the file asynchronously
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return sum(1 for line in text.splitlines() if "DISCARD ALL" in line)


def test_web_resets_every_reused_connection(db: psycopg.Connection, settings: Settings,
                                            tmp_path: Path) -> None:
    discards = _discards_logged(settings, tmp_path, "discard")
    # each of the POOL connections' first request is no reuse; every later one is
    assert REQUESTS - POOL <= discards <= REQUESTS - 1
    assert db.execute("SELECT count(*) FROM messages").fetchone() == (REQUESTS,)
    assert _discards_logged(settings, tmp_path, "none") == 0
    assert db.execute("SELECT count(*) FROM messages").fetchone() == (2 * REQUESTS,)


@pytest.mark.parametrize("reset", ["discard", "none"])
def test_pg_producer_writes_exactly_m_rows(db: psycopg.Connection, settings: Settings,
                                           reset: str) -> None:
    r = asyncio.run(run_producers("pg", settings, 300, 8, reset=reset))
    assert (r.sent, r.send_failed, r.error) == (300, 0, None)
    assert db.execute("SELECT count(*), count(DISTINCT id) FROM messages").fetchone() == (300, 300)


def test_harness_baseline_and_lab_inserts_only(db: psycopg.Connection, settings: Settings) -> None:
    """lab bench harness's inserts-only arms: each writes exactly M rows (checked inside)."""
    from lab.study.harness import _naive, _real_inserts, _real_inserts_aiohttp_client, _real_inserts_aiohttp_server

    assert _naive(settings, 300, 10) > 0
    assert _real_inserts(settings, 300, 10) > 0
    assert _real_inserts_aiohttp_client(settings, 300, 10) > 0
    assert _real_inserts_aiohttp_server(settings, 300, 10) > 0
