"""``lab bench options``: one option's values side by side, in one go, runs alternating.

Every value of one Scenario field (``--vary reset=discard,none``) is run ``repeats`` times in
rounds (A B A B ...), so a slow drift of a shared machine lands on every value alike. The
figures are medians of ms CPU per message in total and per participant, plus each value's
median as a ratio of the first value's (the default goes first), and the machine's load: the
median ``unattributed`` CPU (other work on the host during the window, in ms per message) and
the 1-minute load average when each run ended.

Beside the whole-window figure each value gets its runs' cost split (:mod:`lab.measure.steady`):
the steady cost per message ``c`` and the fixed part ``F``, total and per participant, with their
range over the repeats. ``--vary messages=5000,20000,100000`` is the volume check: the whole-window
figure falls with M when a fixed part is spread over it; the output then also has ``volume_fit``,
F and c per participant fitted across the volumes (:func:`lab.study.crossover.volume_fit`).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import psutil

from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.proc import run_interruptible
from lab.study import crossover

Say = Callable[[str], None]


def parse_vary(spec: str) -> tuple[str, list[Any]]:
    """``field=v1,v2,...`` -> (field, typed values); one clear line when it is wrong."""
    name, sep, values = spec.partition("=")
    name = name.strip().replace("-", "_")
    default = getattr(Scenario(), name, None)
    if not sep or name not in Scenario.field_names():
        raise ValueError(f"--vary wants FIELD=V1,V2 with a Scenario field, got {spec!r}")
    kind: Any = type(default)
    items = [v.strip() for v in values.split(",") if v.strip()]
    if len(items) < 2:
        raise ValueError(f"--vary {name} needs at least two values, got {values!r}")
    if kind is bool:
        return name, [v.lower() in ("1", "true", "yes") for v in items]
    return name, [kind(v) for v in items]


def _median_range(values: Sequence[float]) -> dict[str, float] | None:
    return ({"median": round(statistics.median(values), 4), "min": round(min(values), 4),
             "max": round(max(values), 4)} if values else None)


def split_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The cost split of the runs of one value: median and range of the steady cost (ms/msg) and
    the fixed part (CPU-s), in total and per participant; runs without a split are counted."""
    splits = [r["cost_split"] for r in runs if isinstance(r.get("cost_split"), dict) and "total" in r["cost_split"]]
    names = sorted({n for s in splits for n in s["participants"]})
    return {
        "runs_split": len(splits),
        "steady_ms_per_msg": _median_range([s["total"]["steady_ms_per_msg"] for s in splits]),
        "fixed_cpu_s": _median_range([s["total"]["fixed_cpu_s"] for s in splits]),
        "steady_by_participant": {
            n: _median_range([s["participants"][n]["steady_ms_per_msg"] for s in splits if n in s["participants"]])
            for n in names},
        "fixed_by_participant": {
            n: _median_range([s["participants"][n]["fixed_cpu_s"] for s in splits if n in s["participants"]])
            for n in names},
    }


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of one value (ms CPU per message, each run divided by its own M)."""
    names = sorted({k for r in runs for k in r["cpu_s"]})

    def ms(r: dict[str, Any], n: str) -> float:
        return float(r["cpu_s"].get(n, 0.0)) * 1000 / r["scenario"]["messages"]

    per = {n: round(statistics.median(ms(r, n) for r in runs), 3) for n in names}
    consumers = [ms(r, "consumers") for r in runs]
    totals = [r["cpu_ms_per_msg"] for r in runs]
    return {
        "runs": [r["run_id"] for r in runs],
        "cpu_ms_per_msg": totals,
        "median_ms_per_msg": round(statistics.median(totals), 3),
        "by_participant": per,
        "consumers_ms_per_msg": round(statistics.median(consumers), 3),
        "web_plus_senders_ms_per_msg": round(per.get("web", 0.0) + per.get("senders", 0.0), 3),
        "window_s": [r["window_s"] for r in runs],
        "whole_window_ms_per_msg": _median_range(totals),
        **split_summary(runs),
    }


def bench_options(
    base: Scenario, field: str, values: Sequence[Any], settings: Settings, *, repeats: int = 3,
    say: Say = lambda _: None,
) -> dict[str, Any]:
    """Run ``base`` with each value of ``field``, alternating, ``repeats`` rounds. Every value is
    checked (each scenario built) before the first run: a bad one is refused in one line, not
    after the runs of the values before it."""
    scenarios = [base.replace(**{field: v}) for v in values]
    runs: dict[str, list[dict[str, Any]]] = {str(v): [] for v in values}
    loads: list[float] = []
    failed: list[dict[str, str]] = []
    for i in range(repeats):
        for v, scenario in zip(values, scenarios, strict=True):
            say(f"round {i + 1}/{repeats}: {field}={v} ({scenario.slug})")
            result = run_interruptible(run_scenario(scenario, settings))
            loads.append(os.getloadavg()[0])
            if not result["success"]:  # kept out of the medians, listed in the output
                say(f"run {result['run_id']} ({field}={v}) failed: {result['error']}")
                failed.append({"run_id": result["run_id"], field: str(v), "error": result["error"]})
                continue
            runs[str(v)].append(result)
    if any(not r for r in runs.values()):
        raise RuntimeError(f"no successful run for some value of {field}: {failed}")
    out = {str(v): summarize(runs[str(v)]) for v in values}
    first = out[str(values[0])]
    for s in out.values():
        s["ratio_to_first"] = round(s["median_ms_per_msg"] / first["median_ms_per_msg"], 3)
        s["participant_ratio_to_first"] = {
            n: round(ms / first["by_participant"][n], 3)
            for n, ms in s["by_participant"].items()
            if first["by_participant"].get(n) and n != "unattributed"
        }
    extra: dict[str, Any] = {}
    if field == "messages":  # the volume check: F and c across the volumes, beside each run's own split
        flat = pd.DataFrame([{"pipeline": r["scenario"]["pipeline"], "consumers": r["scenario"]["consumers"],
                              "messages": r["scenario"]["messages"], "cpu_ms_per_msg": r["cpu_ms_per_msg"],
                              "success": True, **{f"cpu_s.{k}": v for k, v in r["cpu_s"].items()}}
                             for rs in runs.values() for r in rs])
        names = sorted({k for rs in runs.values() for r in rs for k in r["cpu_s"]} - {"unattributed"})
        fit = crossover.volume_fit(flat, names)
        extra["volume_fit"] = {row.participant: {"fixed_cpu_s": round(row.fixed_cpu_s, 3),
                                                 "steady_ms_per_msg": round(row.steady_ms_per_msg, 4),
                                                 "steady_se": None if math.isnan(row.steady_se)
                                                 else round(row.steady_se, 4)}
                               for row in fit.itertuples()}
    return {
        **extra,
        "scenario": base.slug, "field": field, "values": [str(v) for v in values], "repeats": repeats,
        "results": out, "failed": failed, "loadavg_1m": [round(x, 2) for x in loads], "host_cpus": psutil.cpu_count(),
    }
