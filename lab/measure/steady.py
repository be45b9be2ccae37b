"""A run's CPU split into a fixed part and a steady cost per message: CPU = F + c·M.

Every run pays for things that do not grow with its messages — a JVM's warm-up (its JIT compiles
during the first seconds of traffic), a slot's first decode, the tail of the drain — beside a cost
that does. The whole-window figure (CPU ÷ M, the reference study's metric) mixes the two, so it falls
as M grows and a crossover computed from it moves with M. This module separates them from the run's
own timeline (the sampler's cumulative CPU per participant, every 0.5 s):

* **The regressor**: at each sample, the messages that had passed the participant's stage — rows
  inserted into the outbox (``created_at``) for the participants upstream of it (``senders``,
  ``web``), work calls made for every other participant. Closed loop, the senders run ahead of the
  consumers on two cores, so counting deliveries for them would charge their cost to the wrong
  messages.
* **The steady part**: the samples taken while between :data:`STEADY_FROM` and :data:`STEADY_TO` of
  the messages had passed the participant's stage: the start-up and the drain's tail are left out.
* **The estimator**: the Theil–Sen slope (the median of the slopes between every pair of steady
  samples) of cumulative CPU against that count. A GC pause or a scheduling stall moves a median
  little, where least squares follows it; with the 10–100 points of a run it costs nothing.
* ``c`` is that slope and ``F`` = window CPU − c·M, so F + c·M is exactly the window's CPU: F is
  everything the run paid beyond M messages at its steady cost. F can be negative within noise.
* **Is it steady?** ``drift`` compares the slope of the steady part's second half with its first
  half's (relative change). A warm-up that lasts into the steady part (a JVM still compiling after
  20 % of a short run) shows as a clearly negative drift, and its ``c`` is then too high and ``F``
  too low: a longer run, or the split of one, says more.

The total is the sum over participants (``unattributed`` is left out, as in the headline). A
participant with fewer than :data:`MIN_POINTS` steady samples (closed loop, the senders insert a few
thousand messages in a second or two) is not split: its whole window counts as steady cost
(``"split": false``), so the total still adds up to the window's CPU and says how much of it is
unsplit. A run whose deliveries give fewer than :data:`MIN_POINTS` steady samples gets no split at all
and says why.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STEADY_FROM = 0.2  # share of the messages delivered when the steady part begins
STEADY_TO = 0.9  # ... and when it ends (the drain's tail after it)
MIN_POINTS = 4
UPSTREAM = frozenset({"senders", "web"})  # their work follows the inserts, not the deliveries


@dataclass(frozen=True)
class Sample:
    """One reading of the timeline: wall-clock time and cumulative CPU-seconds per participant,
    relative to the window's start."""

    t_wall: float
    cpu_s: Mapping[str, float]


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The median of the slopes between every pair of points with distinct x."""
    slopes = [(y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.combinations(zip(xs, ys, strict=True), 2)
              if x2 != x1]
    if not slopes:
        raise ValueError("no two points with distinct x")
    return statistics.median(slopes)


def _count(times: Sequence[float], t: float) -> int:
    return bisect.bisect_right(times, t)


def _drift(xs: Sequence[float], ys: Sequence[float], c: float) -> float | None:
    """(slope of the second half − slope of the first half) / c; None when a half cannot tell."""
    h = len(xs) // 2
    try:
        first, second = theil_sen(xs[:h + 1], ys[:h + 1]), theil_sen(xs[h:], ys[h:])
    except ValueError:
        return None
    return round((second - first) / c, 3) if c > 0 else None


def split(samples: Sequence[Sample], window_cpu_s: Mapping[str, float], messages: int,
          inserted: Sequence[float], delivered: Sequence[float]) -> dict[str, object]:
    """``F`` and ``c`` per participant and in total; ``inserted`` and ``delivered`` are the sorted
    wall-clock times of every outbox insert and every work call, ``window_cpu_s`` the window's CPU
    per participant (run.json's ``cpu_s``). Returns ``{"method", "points", "participants": {name:
    {"fixed_cpu_s", "steady_ms_per_msg", "drift", "split"}}, "total": {"fixed_cpu_s",
    "steady_ms_per_msg", "unsplit_cpu_s"}}``,
    or ``{"method", "points", "error"}``."""
    method = (f"Theil-Sen slope of cumulative CPU against messages passed, over the samples "
              f"between {STEADY_FROM:.0%} and {STEADY_TO:.0%} delivered")
    if messages <= 0 or not delivered:
        return {"method": method, "points": 0, "error": "no message delivered"}
    lo, hi = STEADY_FROM * messages, STEADY_TO * messages

    def steady_part(times: Sequence[float]) -> list[Sample]:
        return [s for s in samples if lo <= _count(times, s.t_wall) <= hi]

    points = len(steady_part(delivered))
    if points < MIN_POINTS:
        return {"method": method, "points": points,
                "error": f"{points} steady samples, fewer than {MIN_POINTS}: the run is too short to split"}
    parts: dict[str, dict[str, Any]] = {}
    unsplit = 0.0
    for name, cpu in window_cpu_s.items():
        if name == "unattributed":
            continue
        times = inserted if name in UPSTREAM and inserted else delivered
        steady = [s for s in steady_part(times) if name in s.cpu_s]
        xs = [float(_count(times, s.t_wall)) for s in steady]
        if len(steady) < MIN_POINTS or len(set(xs)) < 2:
            parts[name] = {"fixed_cpu_s": 0.0, "steady_ms_per_msg": round(cpu * 1000 / messages, 5),
                           "drift": None, "split": False}
            unsplit += cpu
            continue
        ys = [s.cpu_s[name] for s in steady]
        c = theil_sen(xs, ys)
        parts[name] = {"fixed_cpu_s": round(cpu - c * messages, 4), "steady_ms_per_msg": round(c * 1000, 5),
                       "drift": _drift(xs, ys, c), "split": True}
    total = {"fixed_cpu_s": round(sum(p["fixed_cpu_s"] for p in parts.values()), 4),
             "steady_ms_per_msg": round(sum(p["steady_ms_per_msg"] for p in parts.values()), 5),
             "unsplit_cpu_s": round(unsplit, 4)}
    return {"method": method, "points": points, "participants": parts, "total": total}


def per_message(split_record: Mapping[str, object], messages: float) -> float | None:
    """ms CPU per message at ``messages`` per start from a run's split: c + F/M (total)."""
    total = split_record.get("total")
    if not isinstance(total, Mapping) or messages <= 0:
        return None
    return float(total["steady_ms_per_msg"]) + 1000 * float(total["fixed_cpu_s"]) / messages
