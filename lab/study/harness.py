"""``lab bench harness``: the lab's web + senders against a naive baseline, in one go.

Per round, the chosen arms one after the other (the order of ``ARMS``), on the same PostgreSQL
(``messages`` truncated before each), each reported as web + senders CPU in ms per message:

* ``naive``: :mod:`lab.workload.naive` (aiohttp + psycopg-pool web, aiohttp senders; inserts
  only). The senders report their own CPU over the send phase; the web's is read with psutil
  over the same phase.
* ``real_inserts``: the lab's web (:mod:`lab.workload.web`, its defaults: raw insert listener,
  the reset) and senders (:mod:`lab.workload.senders`, its default raw client), inserts only,
  measured the same way: like for like.
* ``real_inserts_aiohttp_client`` / ``real_inserts_aiohttp_server``: the same with the other
  client (``--client aiohttp``) or the other insert listener (``--http aiohttp``); not run
  unless asked for (``arms``).
* ``real_run``: ``lab run --pipeline wal --consumers 1`` with every default (its web also
  serves the work calls, on its control listener); ``web`` + ``senders`` from the run's sampled
  window, as the issue's figure was taken.

The result is each figure's median, and the real ones as ratios of the naive one.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import psycopg

from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings, child_env
from lab.stack import children, proc
from lab.stack.base import StackError
from lab.stack.hosts import namespace

Say = Callable[[str], None]
SENDERS_TIMEOUT_S = 1800.0


def _truncate(settings: Settings) -> None:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE messages")


def _inserts_only(settings: Settings, web_argv: list[str], senders_argv: list[str],
                  senders_cpu: Callable[[str, Path], float], messages: int) -> float:
    """One web + senders pair: (web CPU over the send phase + senders' own CPU) per message. Both run
    where a run's web and senders run (the ``web`` host under ``LAB_HOSTS=netns``), started as a
    run's children: recorded and tied to this process, so a SIGKILLed bench leaves nothing holding
    the port that ``lab stack down`` cannot find."""
    holder = children.port_holder(settings.web_port)
    if holder is not None:  # its wait on the port would take another web service for its own
        raise StackError(f"port {settings.web_port} (LAB_WEB_PORT) is taken by pid {holder}: "
                         "the harness starts its own web service there")
    _truncate(settings)
    env, host = child_env(settings), namespace(settings, "web")
    with tempfile.TemporaryDirectory(prefix="lab-harness-") as tmp:
        out, web_log, senders_log = Path(tmp) / "senders.json", Path(tmp) / "web.log", Path(tmp) / "senders.log"
        web = children.spawn(settings, "harness-web", [sys.executable, *web_argv], log_path=web_log, env=env,
                             netns=host)
        started = [web]
        try:
            proc.wait_until(lambda: proc.port_open(settings.web_port, settings.web_host), timeout=150, what="web",
                            proc=web, log_path=web_log)
            time.sleep(1.0)  # the pool finishes opening
            cpu0 = sum(web.cpu_times()[:2])
            extra = ["--out", str(out)] if "lab.workload.senders" in senders_argv else []
            senders = children.spawn(settings, "harness-senders", [sys.executable, *senders_argv, *extra],
                                     log_path=senders_log, env=env, netns=host)
            started.append(senders)
            try:
                code = senders.wait(timeout=SENDERS_TIMEOUT_S)
            finally:
                children.stop([senders], timeout=10)
            web_cpu = sum(web.cpu_times()[:2]) - cpu0
        finally:
            children.stop([web], timeout=30)  # TERM, bounded wait, KILL
            children.forget(settings, started)
        report = senders_log.read_text()
        if code != 0:
            raise RuntimeError(f"senders failed ({code}): {report.strip()[-300:]}")
        with psycopg.connect(settings.pg_dsn) as conn:
            rows = conn.execute("SELECT count(*) FROM messages").fetchone()
        if rows != (messages,):
            raise RuntimeError(f"expected {messages} rows, found {rows}")
        # both senders report their CPU over the send phase only (not their start-up)
        return (web_cpu + senders_cpu(report, out)) * 1000 / messages


def harness_commands(settings: Settings, messages: int, senders: int, *, naive: bool, client: str | None = None,
                     http: str | None = None) -> tuple[list[str], list[str]]:
    """The web's and the senders' arguments (after the interpreter) of one arm: the web listens
    where a run's web does (``Settings.web_host``), the senders reach it there."""
    dsn, port = settings.pg_dsn, str(settings.web_port)
    if naive:
        return (["-m", "lab.workload.naive", "web", "--host", settings.web_host, "--port", port, "--dsn", dsn],
                ["-m", "lab.workload.naive", "senders", "--url", settings.web_url, "--messages", str(messages),
                 "--senders", str(senders)])
    return (["-m", "lab.workload.web", "--host", settings.web_host, "--port", port, "--dsn", dsn,
             *(["--http", http] if http else [])],
            ["-m", "lab.workload.senders", "--url", settings.web_url, "--messages", str(messages),
             "--senders", str(senders), *(["--client", client] if client else [])])


def _naive(settings: Settings, messages: int, senders: int) -> float:
    web_argv, senders_argv = harness_commands(settings, messages, senders, naive=True)
    return _inserts_only(settings, web_argv, senders_argv,
                         lambda stdout, _: float(json.loads(stdout.strip().splitlines()[-1])["cpu_s"]), messages)


def _real_inserts(settings: Settings, messages: int, senders: int, *, client: str | None = None,
                  http: str | None = None) -> float:
    """The lab's web and senders, inserts only; ``None``: the module's default."""
    web_argv, senders_argv = harness_commands(settings, messages, senders, naive=False, client=client, http=http)
    return _inserts_only(settings, web_argv, senders_argv,
                         lambda _, out: float(json.loads(out.read_text())["cpu_s"]), messages)


def _real_inserts_aiohttp_client(settings: Settings, messages: int, senders: int) -> float:
    return _real_inserts(settings, messages, senders, client="aiohttp")


def _real_inserts_aiohttp_server(settings: Settings, messages: int, senders: int) -> float:
    return _real_inserts(settings, messages, senders, http="aiohttp")


def _real_run(settings: Settings, messages: int, senders: int) -> float:
    scenario = Scenario(pipeline="wal", consumers=1, messages=messages, senders=senders, cooldown_s=5)
    r = proc.run_interruptible(run_scenario(scenario, settings))
    if not r["success"]:
        raise RuntimeError(f"run {r['run_id']} failed: {r['error']}")
    return (r["cpu_s"]["web"] + r["cpu_s"]["senders"]) * 1000 / messages


ARMS: dict[str, Callable[[Settings, int, int], float]] = {
    "naive": _naive, "real_inserts": _real_inserts,
    "real_inserts_aiohttp_client": _real_inserts_aiohttp_client,
    "real_inserts_aiohttp_server": _real_inserts_aiohttp_server,
    "real_run": _real_run,
}
DEFAULT_ARMS = ("naive", "real_inserts", "real_run")


def bench_harness(settings: Settings, *, messages: int = 20_000, senders: int = 200, repeats: int = 3,
                  arms: Sequence[str] = DEFAULT_ARMS, say: Say = lambda _: None) -> dict[str, Any]:
    """``repeats`` rounds of the ``arms`` (naive first, whatever the order given); medians, and
    each real arm's median as a ratio of the naive one."""
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}: choose from {', '.join(ARMS)}")
    chosen = {name: arm for name, arm in ARMS.items() if name in arms or name == "naive"}
    got: dict[str, list[float]] = {name: [] for name in chosen}
    loads = []
    for i in range(repeats):
        for name, arm in chosen.items():
            say(f"round {i + 1}/{repeats}: {name}")
            got[name].append(round(arm(settings, messages, senders), 4))
            loads.append(round(os.getloadavg()[0], 2))
    med = {name: round(statistics.median(v), 4) for name, v in got.items()}
    return {
        "messages": messages, "senders": senders, "repeats": repeats,
        "web_plus_senders_ms_per_msg": got, "median": med,
        **{f"ratio_{name}_to_naive": round(med[name] / med["naive"], 3) for name in med if name != "naive"},
        "loadavg_1m": loads, "host_cpus": psutil.cpu_count(),
    }
