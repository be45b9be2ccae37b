"""A run's CPU split into a fixed part and a steady cost per message: CPU = F + c·M.

Every run pays for things that do not grow with its messages — a JVM's warm-up (its JIT compiles
during the first seconds of traffic), a slot's first decode, the tail of the drain — beside a cost
that does. The whole-window figure (CPU ÷ M, the reference study's metric) mixes the two, so it falls
as M grows and a crossover computed from it moves with M. This module separates them from the run's
own timeline (the sampler's cumulative CPU per participant, every 0.5 s) and the wall-clock times of
every outbox insert and every work call:

* **Two stages.** A message costs CPU when it is inserted (senders, web, PostgreSQL's INSERT, the
  WAL's decoding by Debezium) and when it is delivered (the broker's fetch, the consumer, its claim
  statement, the web service's work call). Closed loop on two cores these happen seconds apart — the
  senders run ahead and the consumers drain afterwards — so a participant's cumulative CPU is
  modelled as ``k + a·inserted(t) + b·delivered(t)`` and its steady cost per message is
  ``c = a + b``. With one regressor (deliveries only) the CPU of the insert stage would be charged to
  whatever was delivered meanwhile, and the slope would depend on where the window is cut.
* **The loaded part**: from the sample where :data:`STEADY_FROM` of the messages had been inserted
  to the last one before :data:`STEADY_TO` had been delivered: the start-up and the drain's tail are
  left out.
* **The fit**: least squares; a stage whose coefficient comes out negative is dropped and the other
  refitted alone (a participant that works in one stage only). When inserts and deliveries move
  together (open loop below capacity: correlation above :data:`COLLINEAR`) they cannot be told apart
  and the one regressor is their mean, fitted with the Theil–Sen slope (the median of pairwise
  slopes, robust to one stall).
* ``F`` = window CPU − c·M, so F + c·M is exactly the window's CPU: F is everything the run paid beyond
  M messages at its steady cost. It can be negative within noise.
* **Its limit**: a warm-up still under way when the loaded part begins (a JVM compiling for 3 s
  while a short run inserts its first 20 % in one) is charged to the messages of that stage: ``c``
  comes out high and ``F`` low. Runs of the same cell at several volumes, fitted across runs
  (:func:`lab.study.costmodel.volume_fit`), do not have that limit; the report shows both.

The total is the sum over participants (``unattributed`` is left out, as in the headline). A
participant with fewer than :data:`MIN_POINTS` loaded samples is not split: its whole window counts as
steady cost (``"split": false``), so the total still adds up and says how much of it is unsplit. The
record keeps the progress at every sample (``progress``: seconds from the window's start, inserted,
delivered), so a split can be recomputed from ``samples.csv``.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

STEADY_FROM = 0.2  # share of the messages inserted when the loaded part begins
STEADY_TO = 0.9  # share delivered when it ends (the drain's tail after it)
MIN_POINTS = 4
COLLINEAR = 0.995  # correlation of inserts and deliveries above which they cannot be told apart


@dataclass(frozen=True)
class Sample:
    """One reading of the timeline: wall-clock time and cumulative CPU-seconds per participant,
    relative to the window's start."""

    t_wall: float
    cpu_s: Mapping[str, float]
    t_s: float = 0.0  # seconds from the window's start (samples.csv's ``t``)


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The median of the slopes between every pair of points with distinct x."""
    slopes = [(y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.combinations(zip(xs, ys, strict=True), 2)
              if x2 != x1]
    if not slopes:
        raise ValueError("no two points with distinct x")
    return statistics.median(slopes)


def _count(times: Sequence[float], t: float) -> int:
    return bisect.bisect_right(times, t)


def _fit(ins: np.ndarray, dlv: np.ndarray, y: np.ndarray) -> tuple[float, float, str]:
    """(a, b, model) of y ≈ k + a·ins + b·dlv on the loaded samples (module docstring)."""
    if np.ptp(ins) == 0 or np.ptp(dlv) == 0 or np.corrcoef(ins, dlv)[0, 1] > COLLINEAR:
        c = theil_sen(list((ins + dlv) / 2), list(y))
        return c / 2, c / 2, "one stage (inserts and deliveries together)"
    ones = np.ones_like(y)
    _, a, b = np.linalg.lstsq(np.column_stack([ones, ins, dlv]), y, rcond=None)[0]
    if a < 0 <= b or (a < 0 and b < 0 and abs(a) > abs(b)):
        return 0.0, float(np.linalg.lstsq(np.column_stack([ones, dlv]), y, rcond=None)[0][1]), "deliveries"
    if b < 0:
        return float(np.linalg.lstsq(np.column_stack([ones, ins]), y, rcond=None)[0][1]), 0.0, "inserts"
    return float(a), float(b), "inserts and deliveries"


def split(samples: Sequence[Sample], window_cpu_s: Mapping[str, float], messages: int,
          inserted: Sequence[float], delivered: Sequence[float]) -> dict[str, Any]:
    """``F`` and ``c`` per participant and in total; ``inserted`` and ``delivered`` are the sorted
    wall-clock times of every outbox insert and every work call, ``window_cpu_s`` the window's CPU
    per participant (run.json's ``cpu_s``). Returns ``{"method", "points", "participants": {name:
    {"fixed_cpu_s", "steady_ms_per_msg", "insert_ms", "delivery_ms", "model", "split"}}, "total":
    {"fixed_cpu_s", "steady_ms_per_msg", "unsplit_cpu_s"}, "progress"}``, or ``{"method", "points",
    "error"}``."""
    method = (f"least squares of cumulative CPU on inserts and deliveries, from {STEADY_FROM:.0%} inserted "
              f"to {STEADY_TO:.0%} delivered")
    if messages <= 0 or not delivered:
        return {"method": method, "points": 0, "error": "no message delivered"}
    ins_at = [_count(inserted, s.t_wall) for s in samples]
    dlv_at = [_count(delivered, s.t_wall) for s in samples]
    loaded = [i for i, s in enumerate(samples)
              if ins_at[i] >= STEADY_FROM * messages and dlv_at[i] <= STEADY_TO * messages]
    progress = [[round(s.t_s, 3), ins_at[i], dlv_at[i]] for i, s in enumerate(samples)]
    if len(loaded) < MIN_POINTS:
        return {"method": method, "points": len(loaded), "progress": progress,
                "error": f"{len(loaded)} loaded samples, fewer than {MIN_POINTS}: the run is too short to split"}
    ins = np.array([ins_at[i] for i in loaded], float)
    dlv = np.array([dlv_at[i] for i in loaded], float)
    parts: dict[str, dict[str, Any]] = {}
    unsplit = 0.0
    for name, cpu in window_cpu_s.items():
        if name == "unattributed":
            continue
        if not all(name in samples[i].cpu_s for i in loaded):
            parts[name] = {"fixed_cpu_s": 0.0, "steady_ms_per_msg": round(cpu * 1000 / messages, 5),
                           "split": False}
            unsplit += cpu
            continue
        a, b, model = _fit(ins, dlv, np.array([samples[i].cpu_s[name] for i in loaded], float))
        c = a + b
        parts[name] = {"fixed_cpu_s": round(cpu - c * messages, 4), "steady_ms_per_msg": round(c * 1000, 5),
                       "insert_ms": round(a * 1000, 5), "delivery_ms": round(b * 1000, 5), "model": model,
                       "split": True}
    total = {"fixed_cpu_s": round(sum(p["fixed_cpu_s"] for p in parts.values()), 4),
             "steady_ms_per_msg": round(sum(p["steady_ms_per_msg"] for p in parts.values()), 5),
             "unsplit_cpu_s": round(unsplit, 4)}
    return {"method": method, "points": len(loaded), "participants": parts, "total": total, "progress": progress}


def per_message(split_record: Mapping[str, object], messages: float) -> float | None:
    """ms CPU per message at ``messages`` per start from a run's split: c + F/M (total)."""
    total = split_record.get("total")
    if not isinstance(total, Mapping) or messages <= 0:
        return None
    return float(total["steady_ms_per_msg"]) + 1000 * float(total["fixed_cpu_s"]) / messages
