"""Latency mode end to end: `lab run --rate R --json` on the real stack (item 3)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import pytest

from lab.results import read_run
from lab.runner import run_scenario
from lab.runner.environment import RunEnv
from lab.runner.phases import measure_latency
from lab.runner.processes import RunProcesses
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.native import NativeStack
from tests.conftest import lab_env

pytestmark = pytest.mark.integration
RATE, M = 200.0, 1500
SANE_MAX_MS = 5000.0  # a 1500-message run at 200 msg/s on an idle pipeline: far below this


def _ordered(lat: dict[str, float]) -> bool:
    return 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"] < SANE_MAX_MS


def test_fixed_rate_run_keeps_its_rate_and_reports_latency(
    stack: object, settings: Settings,
) -> None:
    argv = [sys.executable, "-m", "lab", "run", "--pipeline", "wal", "--consumers", "1",
            "--messages", str(M), "--rate", str(RATE), "--cooldown-s", "0", "--json"]
    res = subprocess.run(argv, env=lab_env(settings), capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["success"], out["error"]
    assert out["achieved_rate"] == pytest.approx(RATE, rel=0.10)
    lat = out["latency_ms"]
    assert _ordered(lat), lat
    assert lat["n"] == M and lat["p50"] <= lat["mean"] * 3
    # from the due time: the same messages, plus any wait before the row existed; the means
    # compare exactly (each row is created after its message was due)
    due = out["latency_from_due_ms"]
    assert due["n"] == M and _ordered(due) and due["mean"] >= lat["mean"] - 1.0
    # open loop: the send phase lasts about M / RATE seconds, not as long as 200 senders need
    stored = read_run(out["run_id"], settings=settings)
    assert stored["latency_ms"] == lat and stored["achieved_rate"] == out["achieved_rate"]
    snd = stored["senders"]
    span = snd["last_send_at"] - snd["gate_opened_at"]
    assert snd["rate"] == RATE and span == pytest.approx(M / RATE, rel=0.10)
    assert 0 < snd["send_p50_ms"] <= snd["send_p95_ms"] <= snd["send_max_ms"] < SANE_MAX_MS


def test_a_closed_loop_run_reports_latency_and_its_throughput(
    stack: object, settings: Settings,
) -> None:
    r = asyncio.run(run_scenario(Scenario(pipeline="wal", consumers=1, messages=300, senders=20,
                                          cooldown_s=0), settings))
    assert r["success"], r["error"]
    assert r["latency_ms"]["n"] == 300 and _ordered(r["latency_ms"])
    assert r["achieved_rate"] == pytest.approx(300 / r["window_s"], rel=0.01)
    assert r["latency_from_due_ms"] is None  # closed loop: no schedule


def test_latency_that_cannot_be_measured_is_null_with_a_warning(
    stack: NativeStack, settings: Settings, caplog: pytest.LogCaptureFixture,
) -> None:
    env = RunEnv.create(Scenario(pipeline="wal", messages=10), settings, stack, lambda phase, info: None)
    with caplog.at_level(logging.WARNING, logger="lab.runner"):  # no web service is listening
        latency = asyncio.run(measure_latency(env, RunProcesses(env), {"rate": 100.0, "sent": 10,
                                                                         "gate_opened_at": 1.0}))
    assert latency.latency_ms is None and latency.latency_from_due_ms is None
    assert "latency not measured" in caplog.text
