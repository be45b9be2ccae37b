"""``lab bench crossing``: measure the crossover instead of extrapolating it.

Up a ladder of reader counts beyond the series' N (:data:`LADDER`), the direct pipeline and the
broker pipeline run side by side at each N, alternating, ``repeats`` times. Each N is judged on the
difference of the medians, direct − broker, of the whole-window figure at the run's M (so the answer
holds for that many messages per Debezium start), or with ``steady=True`` of each run's steady cost
when every run has a split. The run's own split is biased high for Kafka runs shorter than
Debezium's warm-up (docs/history/2026-12-03-cost-split-and-volume-check.md), hence the default.
The climb stops at the first N where the direct readers cost more: the crossing lies between that
N and the one below, both measured with repeats. It also stops, and says which measurement stopped
it, when a direct run fails (too many readers for this machine: a drain past its deadline, a gate
that never opens) — then the crossing is beyond what this machine can measure.

:func:`verdict` is the pure decision over the measured rungs; :func:`climb` runs them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lab.runner import run_scenario
from lab.scenario import MAX_CONSUMERS, Scenario
from lab.settings import Settings
from lab.stack.proc import run_interruptible

LADDER = (16, 24, 32, 48, MAX_CONSUMERS)
Say = Callable[[str], None]


@dataclass
class Rung:
    """One N of the ladder: each pipeline's runs (run.json contents), and a failure if one stopped it."""

    n: int
    direct: list[dict[str, Any]] = field(default_factory=list)
    broker: list[dict[str, Any]] = field(default_factory=list)
    failed: str = ""
    steady: bool = False  # judge on each run's steady cost (its cost split) instead of its whole window

    @property
    def metric(self) -> str:
        runs = self.direct + self.broker
        split = self.steady and runs and all("total" in (r.get("cost_split") or {}) for r in runs)
        return "steady_ms_per_msg" if split else "cpu_ms_per_msg"

    def _value(self, r: dict[str, Any]) -> float:
        if self.metric == "steady_ms_per_msg":
            return float(r["cost_split"]["total"]["steady_ms_per_msg"])
        return float(r["cpu_ms_per_msg"])

    @property
    def difference(self) -> float | None:
        """median(direct) − median(broker) in ms/msg; None until both have a successful run."""
        if not self.direct or not self.broker:
            return None
        return (statistics.median(self._value(r) for r in self.direct)
                - statistics.median(self._value(r) for r in self.broker))


def verdict(rungs: Sequence[Rung]) -> dict[str, Any]:
    """What the measured rungs say: ``crossed`` (between ``below`` and ``above``), ``not yet``
    (the direct readers are still cheaper at the top), or ``stopped`` (a run failed at ``at``)."""
    below = None
    for rung in rungs:
        if rung.failed:
            return {"verdict": "stopped", "at": rung.n, "below": below, "why": rung.failed}
        d = rung.difference
        if d is not None and d > 0:
            return {"verdict": "crossed", "below": below, "above": rung.n, "metric": rung.metric,
                    "difference_ms": round(d, 4)}
        below = rung.n
    return {"verdict": "not yet", "below": below, "above": None}


def climb(base: Scenario, direct: str, broker: str, settings: Settings, *, ladder: Sequence[int] = LADDER,
          repeats: int = 2, steady: bool = False, say: Say = lambda _: None) -> dict[str, Any]:
    """Run the ladder until :func:`verdict` stops changing its mind (module docstring)."""
    rungs: list[Rung] = []
    for n in ladder:
        rung = Rung(n, steady=steady)
        rungs.append(rung)
        for i in range(repeats):
            for pipeline, runs in ((direct, rung.direct), (broker, rung.broker)):
                scenario = base.replace(pipeline=pipeline, consumers=n)
                say(f"N = {n}, round {i + 1}/{repeats}: {scenario.slug}")
                result = run_interruptible(run_scenario(scenario, settings))
                if not result["success"]:
                    rung.failed = f"{pipeline} at N = {n} failed (run {result['run_id']}): {result['error']}"
                    break
                runs.append(result)
            if rung.failed:
                break
        v = verdict(rungs)
        d = rung.difference
        say(f"N = {n}: direct − broker = {'-' if d is None else f'{d:+.3f}'} ms/msg ({rung.metric}); {v['verdict']}")
        if v["verdict"] != "not yet":
            break
    return {
        **verdict(rungs), "direct": direct, "broker": broker, "scenario": base.slug, "repeats": repeats,
        "rungs": [{"n": r.n, "metric": r.metric, "failed": r.failed,
                   "difference_ms": None if r.difference is None else round(r.difference, 4),
                   "direct_runs": [x["run_id"] for x in r.direct], "broker_runs": [x["run_id"] for x in r.broker]}
                  for r in rungs],
    }
