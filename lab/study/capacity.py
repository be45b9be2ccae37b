"""The maximum sustainable rate per pipeline x N: a series of load staircases and its views.

Each cell is one run with ``Scenario.rate_steps`` (the same staircase for every cell): open-loop
rates held ``step_s`` each, the run stopping once a step's lag ran away (:mod:`lab.measure.staircase`
defines what a step measures and when it is sustainable). No warm-up run; instead each staircase
may start with a warm phase (``warm_s``: the top rate for that long, then a rest, before the first
step, :func:`lab.scenario.warm_plan`), so that its first steps are not measured on a JVM still
compiling. A warm phase changes every cell, so it is part of :func:`series_id`: a warmed series
never resumes an unwarmed one.

:func:`plan` builds the series, :func:`capacity_table` gives one row per pipeline x N (the maximum
sustainable rate, median over repeats; ``≥`` when every step held), :func:`steps_table` one row per
step, and :func:`capacity_figure` delivered rate, latency and CPU per message against the target rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lab.pipelines import NAMES
from lab.scenario import Scenario, parse_rate_steps
from lab.study.plots import finding, outside_legend, pipeline_color
from lab.study.series import matrix, profile

_MARKERS = ("o", "s", "^", "v", "D", "P")


def plan(rate_steps: str, step_s: float, *, pipelines: Iterable[str], consumers: Iterable[int],
         profile_name: str = "quick", repeats: int = 1, warm_s: float = 0.0) -> list[Scenario]:
    """pipeline x N (x repeats) staircases, with the profile's senders and cooldown (and a warm
    phase of ``warm_s`` before each)."""
    prof = profile(profile_name)
    base = Scenario(senders=prof.senders, cooldown_s=prof.cooldown_s, rate_steps=rate_steps, step_s=step_s,
                    warm_s=warm_s)
    return matrix(base, pipelines=list(pipelines), consumers=list(consumers), repeats=repeats)


def series_id(profile_name: str, rate_steps: str, step_s: float, pipelines: Sequence[str],
              consumers: Sequence[int], warm_s: float = 0.0) -> str:
    """A stable id for the staircase series, so that running it again resumes it (``-warm10s``: each
    staircase warmed that long first)."""
    rates = parse_rate_steps(rate_steps)
    return (f"{profile_name}-{'+'.join(pipelines)}-steps{'+'.join(f'{r:g}' for r in rates)}"
            f"x{step_s:g}s-n{'+'.join(map(str, consumers))}" + (f"-warm{warm_s:g}s" if warm_s else ""))


def _measured(results: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in results if r.get("steps") and not (r.get("scenario") or {}).get("warmup")]


def _num(x: Any) -> float:
    return np.nan if x is None else float(x)


def _order(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    rank = {p: i for i, p in enumerate(NAMES)}
    return df.sort_values(by, key=lambda s: s.map(rank) if s.name == "pipeline" else s).reset_index(drop=True)


def steps_table(results: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per step of every staircase run: target and achieved rate, delivered rate, the lag
    at the step's end and its slope, p50/p99 latency (from ``created_at``) and p99 from the due
    time (ms), ms CPU per message (all participants), and the verdict."""
    rows = []
    for r in _measured(results):
        s = r["scenario"]
        for st in r["steps"]:
            lat, due, cpu = (st.get(k) or {} for k in ("latency_ms", "latency_from_due_ms", "cpu_ms_per_msg"))
            rows.append({
                "pipeline": s["pipeline"], "consumers": s["consumers"], "run_id": r["run_id"],
                "run_ok": r.get("success"), "rate": st["rate"], "achieved_rate": st["achieved_rate"],
                "delivered_per_s": st["delivered_per_s"], "lag_end": st["lag_end"],
                "oldest_age_s": st["oldest_age_s"], "lag_slope": st["lag_slope"],
                "p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"), "due_p99_ms": due.get("p99"),
                "cpu_ms_per_msg": cpu.get("total"), "sustainable": st["sustainable"],
            })
    cols = ["pipeline", "consumers", "run_id", "run_ok", "rate", "achieved_rate", "delivered_per_s", "lag_end",
            "oldest_age_s", "lag_slope", "p50_ms", "p99_ms", "due_p99_ms", "cpu_ms_per_msg", "sustainable"]
    df = pd.DataFrame(rows, columns=cols)
    return _order(df, ["pipeline", "consumers", "run_id", "rate"]) if not df.empty else df


def capacity_table(results: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per pipeline x N: ``max_sustainable_rate`` (median over its runs; NaN when even the
    first step failed), ``limit_found`` (False: every step held, the maximum is at least that),
    at that rate the p99 latency and ms CPU per message, the rate of the first unsustainable step,
    and the number of runs. Only successful runs (every message worked) count."""
    rows = []
    for r in _measured(results):
        if not r.get("success"):
            continue
        s, top = r["scenario"], r.get("max_sustainable_rate")
        at = next((st for st in r["steps"] if st["rate"] == top), None)
        failed = next((st["rate"] for st in r["steps"] if not st["sustainable"]), None)
        rows.append({"pipeline": s["pipeline"], "consumers": s["consumers"],
                     "max_sustainable_rate": _num(top), "limit_found": failed is not None,
                     "first_unsustainable": _num(failed),
                     "p99_ms_at_max": _num(((at or {}).get("latency_ms") or {}).get("p99")),
                     "cpu_ms_per_msg_at_max": _num(((at or {}).get("cpu_ms_per_msg") or {}).get("total"))})
    cols = ["pipeline", "consumers", "max_sustainable_rate", "limit_found", "first_unsustainable",
            "p99_ms_at_max", "cpu_ms_per_msg_at_max", "runs"]
    if not rows:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows)
    g = df.groupby(["pipeline", "consumers"])
    table = g[["max_sustainable_rate", "first_unsustainable", "p99_ms_at_max", "cpu_ms_per_msg_at_max"]].median()
    table["limit_found"] = g["limit_found"].all()
    table["runs"] = g.size()
    return _order(table.reset_index()[cols], ["pipeline", "consumers"])


def capacity_figure(results: Iterable[Mapping[str, Any]]) -> Figure:
    """Per pipeline, against the target rate: delivered msg/s (top), p99 latency from the due time
    (middle, log) and ms CPU per message of all participants (bottom), one line per N; a hollow
    marker is an unsustainable step."""
    steps = steps_table(results)
    pipes = [p for p in NAMES if p in set(steps["pipeline"])] or ["(no runs)"]
    fig = Figure(figsize=(3.2 * len(pipes) + 0.6, 8.4), layout="constrained")
    axes = fig.subplots(3, len(pipes), sharex=True, squeeze=False)
    for k, pipeline in enumerate(pipes):
        top, bottom, cost = axes[0][k], axes[1][k], axes[2][k]
        g = steps[steps["pipeline"] == pipeline]
        for m, (n, cell) in enumerate(g.groupby("consumers")):
            for run_id, run in cell.groupby("run_id"):
                style = {"color": pipeline_color(pipeline), "marker": _MARKERS[m % len(_MARKERS)],
                         "alpha": 0.5 + 0.5 * (m + 1) / (g["consumers"].nunique() or 1)}
                label = f"N = {n}" if run_id == cell["run_id"].iloc[0] else None
                for ax, y in ((top, "delivered_per_s"), (bottom, "due_p99_ms"), (cost, "cpu_ms_per_msg")):
                    ax.plot(run["rate"], run[y], "-", label=label if ax is top else None, **style)
                    bad = run[~run["sustainable"].astype(bool)]
                    ax.plot(bad["rate"], bad[y], linestyle="none", markerfacecolor="white", **style)
        if not g.empty:
            lim = [0, float(g["rate"].max()) * 1.05]
            top.plot(lim, lim, ":", color="0.5", label="delivered = target")
        top.set_title(pipeline)
        top.grid(True, alpha=0.3)
        bottom.set_yscale("log")
        bottom.grid(True, which="both", alpha=0.3)
        cost.grid(True, alpha=0.3)
        cost.set_ylim(bottom=0)
        cost.set_xlabel("target rate (msg/s)")
    axes[0][0].set_ylabel("delivered (msg/s)")
    axes[1][0].set_ylabel("p99 due → work call (ms)")
    axes[2][0].set_ylabel("ms CPU / msg (all participants)")
    if not steps.empty:
        outside_legend(axes[0][-1])
    held = steps[steps["sustainable"].astype(bool)] if not steps.empty else steps
    if held.empty:
        title = "No step of any staircase was sustained"
    else:
        best = held.loc[held["rate"].idxmax()]
        title = (f"{best['pipeline']} sustains the highest rate: {best['rate']:,.0f} msg/s at N = "
                 f"{int(best['consumers'])}")
    return finding(fig, title, "Each line one staircase (a pipeline at one N), each point one step held at its "
                               "target rate; hollow: a step not sustained (lag left behind or growing).")
