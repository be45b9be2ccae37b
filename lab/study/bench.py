"""Benchmarks of the workbench itself: ``lab bench stack`` and ``lab bench run``.

Figures go to ``docs/benchmarks.md`` with the command and the machine. Shared machines are noisy:
report medians and ratios from one invocation, never a single absolute time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from lab.measure.idle import sample_idle
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack import get_stack
from lab.stack.base import DEBEZIUM_SINKS, ParticipantSource, debezium_participant, services
from lab.stack.proc import run_interruptible

Say = Callable[[str], None]


def bench_stack(settings: Settings, *, idle_s: float = 30.0, say: Say = lambda _: None) -> dict[str, Any]:
    """Warm ``up`` time, idle CPU % and RSS per service, Debezium start-to-streaming per sink."""
    stack = get_stack(settings)
    stack.provision()
    say("stopping the stack for a warm start")
    stack.down()
    t0 = time.monotonic()
    stack.up()
    out: dict[str, Any] = {"warm_up_s": round(time.monotonic() - t0, 1)}
    say(f"warm up: {out['warm_up_s']} s; measuring idle services for {idle_s:.0f} s")
    sources = stack.participants()  # a participant per node (the ha topology)
    out["topology"] = stack.topology
    out["idle"] = _idle(settings, sources, services(sources), idle_s)
    out["debezium_start_s"] = {}
    for sink in DEBEZIUM_SINKS:
        say(f"starting debezium-{sink}, then measuring it idle for {idle_s:.0f} s")
        t0 = time.monotonic()
        stack.start_debezium(sink)
        out["debezium_start_s"][sink] = round(time.monotonic() - t0, 1)
        name = debezium_participant(sink)
        out["idle"].update(_idle(settings, stack.participants(), (name,), idle_s))
        stack.stop_debezium(sink)
    return out


def _idle(
    settings: Settings, roots: Mapping[str, ParticipantSource], names: tuple[str, ...], idle_s: float
) -> dict[str, dict[str, float]]:
    """CPU % of one core and mean RSS of each named participant over ``idle_s`` of idling."""
    window = sample_idle(settings, {n: roots[n] for n in names}, idle_s)
    return {
        name: {"cpu_pct": round(100 * v["cpu_s"] / window["window_s"], 2), "rss_mb": v["rss_mb_mean"]}
        for name, v in window["participants"].items()
    }


def bench_run(
    scenario: Scenario, settings: Settings, *, repeats: int = 3, say: Say = lambda _: None
) -> dict[str, Any]:
    """``repeats`` runs of one scenario: median ms CPU/msg in total and per participant."""
    runs = []
    for i in range(repeats):
        say(f"run {i + 1}/{repeats}: {scenario.slug}")
        result = run_interruptible(run_scenario(scenario, settings))
        if not result["success"]:
            raise RuntimeError(f"run {result['run_id']} failed: {result['error']}")
        runs.append(result)
    m = scenario.messages
    totals = [r["cpu_ms_per_msg"] for r in runs]
    names = sorted({k for r in runs for k in r["cpu_s"]})
    per = {n: statistics.median(r["cpu_s"].get(n, 0.0) * 1000 / m for r in runs) for n in names}
    norm = [r.get("cpu_ms_per_msg_norm") for r in runs]
    norm_ok = [v for v in norm if v is not None]
    return {
        "scenario": scenario.slug,
        "runs": [r["run_id"] for r in runs],
        "cpu_ms_per_msg": totals,
        "median_ms_per_msg": round(statistics.median(totals), 3),
        "spread_pct": round(100 * (max(totals) - min(totals)) / statistics.median(totals), 1),
        # the speed probe (lab.measure.probe): ms per unit of fixed work, and ms/msg normalised by it
        "probe_unit_ms": [(r.get("speed") or {}).get("unit_ms_median") for r in runs],
        "cpu_ms_per_msg_norm": norm,
        "spread_norm_pct": (round(100 * (max(norm_ok) - min(norm_ok)) / statistics.median(norm_ok), 1)
                            if len(norm_ok) == len(runs) else None),
        "steal_pct": [r.get("steal_pct") for r in runs],
        "loadavg_1m": [r.get("loadavg_1m") for r in runs],
        "median_ms_per_msg_by_participant": {n: round(v, 3) for n, v in per.items()},
        "web_plus_senders_ms_per_msg": round(per.get("web", 0) + per.get("senders", 0), 3),
        "sampler_core_pct": [r["sampler"].get("sampler_core_pct") for r in runs],
        "window_s": [r["window_s"] for r in runs],
        "host_cpus": psutil.cpu_count(),
    }
