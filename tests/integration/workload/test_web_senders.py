"""The web service and the senders as real processes against a real PostgreSQL 18.

They run on the session stack's PostgreSQL. One web service on ``settings.web_port`` (inserts)
and ``settings.control_port`` (work and stats calls) serves the module; others, on free ports,
are stopped by SIGTERM, killed, or frozen to show the control listener does not depend on the
insert listener. The senders run as the
process the runner starts, gated on a start file, and once through the in-process API. Each
test that counts rows starts from an empty ``messages`` (TRUNCATE, as the runner's reset does).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
import psycopg
import pytest

from lab.settings import Settings, child_env
from lab.stack import proc
from lab.workload.senders import SendResult, run_senders

pytestmark = pytest.mark.integration

WEB_POOL = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def workdir(stack: object, settings: Settings) -> Iterator[Path]:
    # Under the session stack dir, not pytest's basetemp (see test_postgres.py).
    d = settings.stack_dir / "web-senders"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_settings(stack: object, settings: Settings) -> Settings:
    """The session settings, with the stack (and so its PostgreSQL) up."""
    return settings


@pytest.fixture
def db(pg_settings: Settings) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_settings.pg_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE messages")
        yield conn


@dataclass(frozen=True)
class Web:
    proc: subprocess.Popen[bytes]
    url: str  # the insert listener (the senders')
    control: str  # the control listener (work calls, /load/*)


def _start_web(settings: Settings, log: Path, port: int | None = None,
               control_port: int | None = None) -> Web:
    port = _free_port() if port is None else port
    control_port = _free_port() if control_port is None else control_port
    proc.require_free(port, "the web service", "LAB_WEB_PORT")
    argv = [sys.executable, "-m", "lab.workload.web", "--port", str(port), "--control-port",
            str(control_port), "--dsn", settings.pg_dsn, "--pool", str(WEB_POOL)]
    with open(log, "ab") as out:
        web = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=child_env(settings))
    try:
        watched = psutil.Process(web.pid)
        # the control listener starts after the insert listener: it answering means both do
        proc.wait_until(lambda: proc.port_open(control_port), timeout=60, what="web", proc=watched,
                        log_path=log)
        assert proc.port_open(port)
    except BaseException:
        web.kill()
        web.wait()
        raise
    return Web(web, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control_port}")


def _stop(web: subprocess.Popen[bytes]) -> None:
    web.send_signal(signal.SIGTERM)
    try:
        web.wait(30)
    except subprocess.TimeoutExpired:
        web.kill()
        web.wait()


@pytest.fixture(scope="module")
def service(pg_settings: Settings, workdir: Path) -> Iterator[Web]:
    web = _start_web(pg_settings, workdir / "web.log", pg_settings.web_port, pg_settings.control_port)
    try:
        yield web
    finally:
        _stop(web.proc)


@pytest.fixture(scope="module")
def web_url(service: Web) -> str:
    return service.url


def _senders(settings: Settings, url: str, out: Path, *, messages: int, senders: int,
             start_file: Path | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "lab.workload.senders", "--url", url, "--messages", str(messages),
            "--senders", str(senders), "--out", str(out)]
    if start_file is not None:
        argv += ["--start-file", str(start_file)]
    return subprocess.Popen(argv, env=child_env(settings))


async def _call(method: str, url: str, body: dict | None = None) -> tuple[int, dict | None]:
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else None)


def test_senders_process_inserts_exactly_m_rows(
    web_url: str, db: psycopg.Connection, workdir: Path, pg_settings: Settings
) -> None:
    start, out = workdir / "start", workdir / "senders.json"
    senders = _senders(pg_settings, web_url, out, messages=2000, senders=50, start_file=start)
    try:
        assert db.execute("SELECT count(*) FROM messages").fetchone() == (0,)
        assert senders.poll() is None  # held at the gate, not finished
        start.touch()
        assert senders.wait(120) == 0
    finally:
        if senders.poll() is None:
            senders.kill()
    r = SendResult.load(out)
    assert (r.sent, r.send_failed, r.error, r.first_error) == (2000, 0, None, None)
    assert r.ok
    assert r.gate_opened_at <= r.first_send_at <= r.last_send_at
    assert r.first_send_mono <= r.last_send_mono
    assert 0 < r.send_p50_ms <= r.send_p95_ms <= r.send_max_ms
    rows = db.execute("SELECT count(*), count(DISTINCT id), count(*) FILTER "
                      "(WHERE content = 'helloworld') FROM messages").fetchone()
    assert rows == (2000, 2000, 2000)
    assert not list(workdir.glob(".senders.json.*.tmp"))


def test_insert_returns_the_row(web_url: str, db: psycopg.Connection) -> None:
    status, body = asyncio.run(_call("POST", f"{web_url}/load/messages", {"content": "x"}))
    assert status == 201
    row = db.execute("SELECT id, created_at FROM messages WHERE content = 'x'").fetchone()
    assert body == {"id": row[0], "createdAt": row[1].isoformat()}


def test_gate_holds_the_in_process_api(web_url: str, db: psycopg.Connection) -> None:
    async def scenario() -> tuple[int, bool, SendResult]:
        gate = asyncio.Event()
        task = asyncio.create_task(run_senders(web_url, 100, 10, gate))
        for _ in range(20):
            await asyncio.sleep(0.01)
        held = await asyncio.to_thread(
            lambda: db.execute("SELECT count(*) FROM messages").fetchone()[0])
        done_early = task.done()
        gate.set()
        return held, done_early, await task

    held, done_early, r = asyncio.run(scenario())
    assert (held, done_early) == (0, False)
    assert (r.sent, r.send_failed, r.rate) == (100, 0, 0.0)
    assert db.execute("SELECT count(*) FROM messages").fetchone() == (100,)


def test_open_loop_sends_exactly_m(web_url: str, db: psycopg.Connection) -> None:
    r = asyncio.run(run_senders(web_url, 60, 4, rate=600.0))
    assert (r.sent, r.send_failed, r.rate) == (60, 0, 600.0)
    assert r.first_send_at <= r.last_send_at
    assert db.execute("SELECT count(*) FROM messages").fetchone() == (60,)


def test_send_email_counts_calls_and_distinct_ids(service: Web) -> None:
    ids = [7, 8, 8, 9, 9, 9]
    web_url = service.control

    async def scenario() -> list[tuple[int, dict | None]]:
        steps = [await _call("POST", f"{web_url}/load/reset")]
        for i in ids:
            steps.append(await _call("POST", f"{web_url}/send-email",
                                     {"id": i, "content": "helloworld", "createdAt": "t"}))
        steps.append(await _call("GET", f"{web_url}/load/stats"))
        steps.append(await _call("GET", f"{web_url}/load/arrivals"))
        steps.append(await _call("POST", f"{web_url}/load/reset"))
        steps.append(await _call("GET", f"{web_url}/load/stats"))
        steps.append(await _call("GET", f"{web_url}/load/arrivals"))
        return steps

    steps = asyncio.run(scenario())
    reset, *sends, (s1, stats), (_, arrivals), (r2, _), (_, zero), (_, empty) = steps
    assert reset == (204, None) and r2 == 204
    assert [s for s, _ in sends] == [202] * len(ids)
    assert s1 == 200
    assert (stats["calls"], stats["distinct"]) == (6, 3)
    assert stats["cpuMs"] > 0 and stats["memoryMb"] > 0
    assert arrivals["ids"] == ids
    assert arrivals["t"] == sorted(arrivals["t"]) and len(arrivals["t"]) == len(ids)
    assert (zero["calls"], zero["distinct"]) == (0, 0)
    assert zero["cpuMs"] >= stats["cpuMs"]
    assert empty == {"ids": [], "t": []}


def test_no_listener_fails_every_send_without_retry(workdir: Path, settings: Settings) -> None:
    out = workdir / "refused.json"
    senders = _senders(settings, f"http://127.0.0.1:{_free_port()}", out, messages=300, senders=20)
    assert senders.wait(120) == 0
    r = SendResult.load(out)
    assert (r.sent, r.send_failed, r.error) == (0, 300, None)
    assert not r.ok
    assert r.first_send_at is None and r.send_p50_ms is None
    assert "Connect" in r.first_error


def test_sigterm_stops_web_gracefully(pg_settings: Settings, workdir: Path) -> None:
    w = _start_web(pg_settings, workdir / "web-sigterm.log")
    web = w.proc
    query = "SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY(%s)"
    try:
        status, _ = asyncio.run(_call("GET", f"{w.control}/load/stats"))
        assert status == 200
        (control,) = psutil.Process(web.pid).children()
        ports = [c.laddr.port for c in psutil.Process(web.pid).net_connections("tcp")
                 if c.raddr and c.raddr.port == pg_settings.pg_port]
        assert len(ports) == WEB_POOL  # the pool is open before the port is
        with psycopg.connect(pg_settings.pg_dsn, autocommit=True) as conn:
            assert conn.execute(query, [ports]).fetchone() == (WEB_POOL,)
            web.send_signal(signal.SIGTERM)
            assert web.wait(30) == 0  # our handler ran (the default action would be -SIGTERM)
            assert not control.is_running()  # the control listener was stopped with it
            proc.wait_until(lambda: conn.execute(query, [ports]).fetchone() == (0,),
                            timeout=30, what="web pool close")
    finally:
        if web.poll() is None:
            web.kill()
            web.wait()
    assert "Traceback" not in (workdir / "web-sigterm.log").read_text()


def test_control_listener_dies_with_a_killed_web(pg_settings: Settings, workdir: Path) -> None:
    w = _start_web(pg_settings, workdir / "web-kill.log")
    (control,) = psutil.Process(w.proc.pid).children()
    w.proc.kill()
    w.proc.wait()
    control.wait(10)  # PR_SET_PDEATHSIG: gone without anyone stopping it (else TimeoutExpired)
    assert not control.is_running()


def _timed_get(url: str, timeout: float) -> tuple[int, float]:
    async def get() -> tuple[int, float]:
        t0 = time.monotonic()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s, \
                s.get(url) as r:
            await r.read()
            return r.status, time.monotonic() - t0
    return asyncio.run(get())


def test_control_listener_answers_while_the_insert_listener_cannot(
    pg_settings: Settings, workdir: Path, db: psycopg.Connection
) -> None:
    """The separation itself: with the insert process frozen (SIGSTOP), no insert can be
    answered, and the stats and work calls still are, by the other process."""
    w = _start_web(pg_settings, workdir / "web-stop.log")
    try:
        w.proc.send_signal(signal.SIGSTOP)
        try:
            status, took = _timed_get(f"{w.control}/load/stats", timeout=10)
            assert status == 200 and took < 5.0
            assert asyncio.run(_call("POST", f"{w.control}/send-email", {"id": 1}))[0] == 202
            with pytest.raises(TimeoutError):  # the insert listener really was frozen
                asyncio.run(asyncio.wait_for(_call("POST", f"{w.url}/load/messages", {"content": "x"}), 2))
        finally:
            w.proc.send_signal(signal.SIGCONT)
        assert asyncio.run(_call("POST", f"{w.url}/load/messages", {"content": "y"}))[0] == 201
    finally:
        _stop(w.proc)


def test_stats_answer_while_200_raw_senders_saturate_the_web(
    service: Web, db: psycopg.Connection, workdir: Path, pg_settings: Settings
) -> None:
    """200 raw senders (the senders process, its default client) keep ~200 inserts queued at the
    insert listener; a stats poll every 0.2 s on the control listener is still answered well
    inside the runner's 10 s timeout (a generous 5 s bound: it shows the polls are not queued
    behind the inserts; it is no latency benchmark)."""
    messages, out = 6000, workdir / "saturate.json"
    senders = _senders(pg_settings, service.url, out, messages=messages, senders=200)

    async def poll() -> tuple[list[float], int]:
        took: list[float] = []
        during = 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            while senders.poll() is None:
                t0 = time.monotonic()
                async with s.get(f"{service.control}/load/stats") as r:
                    assert r.status == 200
                    await r.read()
                took.append(time.monotonic() - t0)
                during += senders.poll() is None
                await asyncio.sleep(0.2)
        return took, during

    try:
        took, during = asyncio.run(poll())
    finally:
        if senders.poll() is None:
            senders.kill()
    assert senders.wait(10) == 0
    r = SendResult.load(out)
    assert (r.sent, r.send_failed) == (messages, 0)
    assert during >= 3  # the polls overlapped the saturated phase
    assert max(took) < 5.0, f"worst stats reply {max(took):.2f} s"


@pytest.mark.parametrize("client", ["raw", "aiohttp"])
def test_each_client_sends_exactly_m_rows(web_url: str, db: psycopg.Connection, client: str) -> None:
    r = asyncio.run(run_senders(web_url, 500, 20, client=client))
    assert (r.sent, r.send_failed, r.error, r.first_error) == (500, 0, None, None)
    assert 0 < r.send_p50_ms <= r.send_p95_ms
    assert db.execute("SELECT count(*), count(DISTINCT id) FROM messages").fetchone() == (500, 500)
