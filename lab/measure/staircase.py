"""The load staircase (``Scenario.rate_steps``): what each step measured, whether its
lag stayed bounded, and the pipeline's **maximum sustainable rate**.

A staircase holds rate R_i for ``step_s`` seconds, step after step (:func:`lab.scenario.step_plan`):
step i spans the wall-clock interval [T0, T1) = [gate + W + i·step_s, gate + W + (i+1)·step_s) (W = 0,
or the warm phase and its rest, below), and its messages are the ranks
``w + sum(n_<i) .. w + sum(n_≤i) - 1`` of the run's ids in INSERT order (w: the warm messages; ids are
handed out in INSERT order and sends start in due order, as :func:`lab.measure.latency.due_latencies`
assumes), message j of the step due at ``T0 + j / R_i``. Per step:

* ``sent``: messages of the step that have an outbox row; ``achieved_rate``: rows whose
  ``created_at`` lies in [T0, T1), ÷ step_s (what the pipeline was fed during the step; a sender or
  web service that falls behind the schedule lowers it); ``delivered_per_s``: first work calls in
  [T0, T1) ÷ step_s.
* **lag** at time t: messages created at or before t (``created_at`` ≤ t) whose first work call
  came after t (or never): ``lag_end`` at T1, ``oldest_age_s`` = how long the oldest of those had
  waited at T1, and ``lag_slope`` = the least-squares slope (messages/s) of lag(t) sampled every
  0.1 s over the step's second half [T0 + step_s/2, T1] (the first half absorbs the backlog's
  change from the previous rate).
* latency p50/p95/p99 (nearest rank, :func:`lab.measure.latency.summarize`) of the step's messages,
  from ``created_at`` (``latency_ms``) and from the due time (``latency_from_due_ms``).
* ``cpu_ms_per_msg``: CPU of each participant between T0 and T1 (the sampler's timeline,
  interpolated linearly at both edges), ÷ the rows created in [T0, T1); ``total`` sums the
  participants (``unattributed`` and the speed probe are shown, not summed), as the run's metric.

**Sustainable** (``sustainable: true``) means all three of:

1. the lag at the step's end is bounded: ``lag_end ≤ LAG_S · R + batch_size · N`` (two seconds'
   worth of the step's messages, plus one claim batch per consumer, which batching alone may hold:
   a batch waits up to ``batch_size`` rows before it is worked);
2. the lag is not growing: ``lag_slope ≤ max(SLOPE_FRACTION · R, batch_size · N / (step_s / 2))``
   over the step's second half: the pipeline works at least 95 % of what arrives, up to what
   batching alone can fake — a claim batch fills and empties (a saw-tooth of up to ``batch_size``
   rows per consumer), so a trend smaller than one batch per consumer over the half step cannot be
   told from it. Steps long against ``40 · batch_size · N / R`` seconds make the 5 % the binding term;
3. the senders kept the schedule: ``achieved_rate ≥ (1 − RATE_TOLERANCE) · R`` — a sender (or web
   service) that cannot insert at R makes the step unsustainable too, whatever the pipeline did.

``max_sustainable_rate`` is the highest R of the leading run of sustainable steps: the staircase is
climbed from the bottom and the first unsustainable step ends the search (a later step that looks
sustainable again is not counted). None when the first step already fails; ``limit_found`` is
False when every step held (the maximum is then at least the top step's rate).

**Early stop** (the runner, :mod:`lab.runner.phases`): ``min(STOP_LEAD_S, step_s / 4)`` before each
step's end (time for a loaded runner to answer before the senders reach the next step) the
runner reads the lag (rows of ``messages`` − distinct ids worked) and, when it is above criterion 1's
bound, tells the senders to start no further step. That runtime test is criterion 1 only and taken a
little early; the per-step verdict above is computed after the run from the exact times.

**Warm phase** (``Scenario.warm_s`` > 0, :func:`lab.scenario.warm_plan`): before step 0 the senders
send at the top rate for ``warm_s`` seconds, then rest ``max(2 s, 2 · warm_s)``
(:func:`lab.scenario.warm_rest_s`), so that a JIT-compiled participant (Debezium) is warm when the
first step is measured; the steps' offsets (and T0, T1) count from the gate and include both. The
warm phase is not a step: not judged, not in ``max_sustainable_rate``, and its messages (the first
ranks) are left out of every step's figures, lag included (:func:`step_rows`'s ``warm``). They are
messages of the run all the same (the success predicate and the whole-window ``cpu_ms_per_msg``
count them). :func:`warm_summary` gives run.json's ``warm`` block, with ``cleared`` false when warm
messages were still waiting as the first step began — the first step was then run on a backlog,
which the block says rather than hides. The fixed rest clears the backlog of any pipeline that
carries at least a third of the top rate; no runtime signal is needed, and the senders' hot path is
unchanged (the warm phase is one more entry of the same schedule).

Pure functions (no I/O): the runner fetches ``created_at``, the arrivals and the timeline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lab.measure.latency import first_arrivals, summarize
from lab.measure.sampler import Snapshot

LAG_S = 2.0  # criterion 1: the lag at a step's end stays within this many seconds of its rate ...
SLOPE_FRACTION = 0.05  # criterion 2: ... and grows by at most this fraction of the rate per second
#                       (or one claim batch per consumer over the half step, batching's own noise)
RATE_TOLERANCE = 0.05  # criterion 3: the achieved send rate is within this fraction of the target
SLOPE_EVERY_S = 0.1  # lag(t) is sampled this often for the slope
STOP_LEAD_S = 1.0  # the runner's early-stop test, this long before a step's end (at most a quarter step)

Plan = Sequence[tuple[float, float, int]]  # (rate, offset_s from the gate, messages) per step


def lag_bound(rate: float, consumers: int, batch_size: int) -> float:
    """Criterion 1's bound on a step's end lag (messages): ``LAG_S · rate + batch_size · consumers``."""
    return LAG_S * rate + batch_size * consumers


def slope_limit(rate: float, consumers: int, batch_size: int, step_s: float) -> float:
    """Criterion 2's bound on the lag's slope (msg/s): ``max(SLOPE_FRACTION · rate, batch_size ·
    consumers / (step_s / 2))``."""
    return max(SLOPE_FRACTION * rate, batch_size * consumers / (step_s / 2))


def judge(rate: float, *, achieved_rate: float | None, lag_end: int, lag_slope: float | None,
          consumers: int, batch_size: int, step_s: float) -> tuple[bool, list[str]]:
    """(sustainable, the criteria it failed) of one step (module docstring)."""
    failed = []
    bound = lag_bound(rate, consumers, batch_size)
    if lag_end > bound:
        failed.append(f"lag {lag_end} > {bound:g} at the step's end")
    limit = slope_limit(rate, consumers, batch_size, step_s)
    if lag_slope is None or lag_slope > limit:
        failed.append(f"lag grows {lag_slope if lag_slope is None else round(lag_slope, 1)} msg/s > {limit:g}")
    if achieved_rate is None or achieved_rate < (1 - RATE_TOLERANCE) * rate:
        failed.append(f"achieved {achieved_rate} msg/s < {(1 - RATE_TOLERANCE) * rate:g}")
    return not failed, failed


def max_sustainable_rate(steps: Sequence[Mapping[str, Any]]) -> float | None:
    """The highest rate of the leading run of sustainable steps (None if the first is not)."""
    best = None
    for s in steps:
        if not s.get("sustainable"):
            break
        best = s["rate"]
    return best


def due_times(plan: Plan, gate_at: float, count: int | None = None) -> np.ndarray:
    """Epoch due time of every message of ``plan`` in send order (the first ``count`` of them)."""
    parts = [gate_at + offset + np.arange(n) / rate for rate, offset, n in plan]
    due = np.concatenate(parts) if parts else np.empty(0)
    return due if count is None else due[:count]


def staircase_due_latencies(ids: Sequence[int], t: Sequence[float], plan: Plan, gate_at: float) -> np.ndarray:
    """Per-message latency in ms from its due time on the staircase to its first work call; the
    k-th smallest arrived id is matched with the k-th due time, as
    :func:`lab.measure.latency.due_latencies` does for one rate."""
    first = first_arrivals(ids, t)
    arrived = np.fromiter((first[i] for i in sorted(first)), dtype=float, count=len(first))
    due = due_times(plan, gate_at, arrived.size)
    return (arrived[:due.size] - due) * 1000.0


class _Lag:
    """lag(t) and the oldest waiting message's age, from each message's created and first-worked time."""

    def __init__(self, created: np.ndarray, worked: np.ndarray) -> None:
        self.created, self.worked = created, worked
        self.created_sorted = np.sort(created)
        self.worked_sorted = np.sort(worked[np.isfinite(worked)])

    def at(self, t: np.ndarray | float) -> np.ndarray:
        return (np.searchsorted(self.created_sorted, t, side="right")
                - np.searchsorted(self.worked_sorted, t, side="right"))

    def oldest_age(self, t: float) -> float:
        waiting = self.created[(self.created <= t) & (self.worked > t)]
        return round(float(t - waiting.min()), 3) if waiting.size else 0.0

    def slope(self, a: float, b: float) -> float | None:
        if b <= a:
            return None
        grid = np.linspace(a, b, max(3, int((b - a) / SLOPE_EVERY_S) + 1))
        return round(float(np.polyfit(grid - a, self.at(grid).astype(float), 1)[0]), 2)


def cpu_between(timeline: Sequence[Snapshot], a: float, b: float,
                groups: Mapping[str, Sequence[str]] | None = None) -> dict[str, float] | None:
    """CPU-seconds per participant (and group, and ``unattributed``) between epoch times ``a`` and
    ``b``, interpolated linearly in the timeline; None when [a, b] is not inside it."""
    snaps = sorted(timeline, key=lambda s: s.t_wall)
    if len(snaps) < 2 or a < snaps[0].t_wall or b > snaps[-1].t_wall or b < a:
        return None
    walls = [s.t_wall for s in snaps]

    def at(t: float) -> tuple[dict[str, float], float]:
        k = min(max(int(np.searchsorted(walls, t, side="right")), 1), len(snaps) - 1)
        lo, hi = snaps[k - 1], snaps[k]
        f = 0.0 if hi.t_wall == lo.t_wall else (t - lo.t_wall) / (hi.t_wall - lo.t_wall)
        names = lo.cpu_s.keys() & hi.cpu_s.keys()
        cpu = {n: lo.cpu_s[n] + (hi.cpu_s[n] - lo.cpu_s[n]) * f for n in names}
        return cpu, lo.host_busy_s + (hi.host_busy_s - lo.host_busy_s) * f

    (ca, ha), (cb, hb) = at(a), at(b)
    delta = {n: cb[n] - ca[n] for n in ca.keys() & cb.keys()}
    out = dict(delta)
    for g, names in (groups or {}).items():
        out[g] = sum(delta.get(n, 0.0) for n in names)
    out["unattributed"] = (hb - ha) - sum(delta.values())
    return out


def _created_worked(created_at: Mapping[int, float], arrival_ids: Sequence[int], arrival_t: Sequence[float]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``created_at`` and first work call (inf: never), in id (= INSERT) order."""
    ids = sorted(created_at)
    first = first_arrivals(arrival_ids, arrival_t)
    created = np.fromiter((created_at[i] for i in ids), dtype=float, count=len(ids))
    worked = np.fromiter((first.get(i, math.inf) for i in ids), dtype=float, count=len(ids))
    return created, worked


def step_rows(plan: Plan, *, gate_at: float, step_s: float, created_at: Mapping[int, float],
              arrival_ids: Sequence[int], arrival_t: Sequence[float], consumers: int, batch_size: int,
              timeline: Sequence[Snapshot] | None = None,
              groups: Mapping[str, Sequence[str]] | None = None, warm: Plan = ()) -> list[dict[str, Any]]:
    """One dict per step of ``plan`` (the steps that were sent), as the module docstring says.

    ``created_at``: epoch ``created_at`` of every row of ``messages``; ``arrival_ids``/``arrival_t``:
    the web service's work calls in order; ``timeline``: the sampler's readings (no CPU without it);
    ``groups``: group name -> its participants (``consumers``), summed like the run's window;
    ``warm``: the warm phase sent before the steps (:func:`lab.scenario.warm_plan`): its messages, the
    first ranks, are left out of every step's figures (its lag too).
    """
    created_all, worked_all = _created_worked(created_at, arrival_ids, arrival_t)
    due_all = due_times([*warm, *plan], gate_at, created_all.size)
    skip = min(sum(n for _, _, n in warm), created_all.size)
    created, worked, due = created_all[skip:], worked_all[skip:], due_all[skip:]
    count = created.size
    lag = _Lag(created, worked)
    worked_sorted = lag.worked_sorted
    rows, begin = [], 0
    for i, (rate, offset, n) in enumerate(plan):
        t0 = gate_at + offset
        t1 = t0 + step_s
        mine = slice(min(begin, count), min(begin + n, count))
        begin += n
        arrived = np.isfinite(worked[mine])
        into = int(np.searchsorted(lag.created_sorted, t1, side="left")
                   - np.searchsorted(lag.created_sorted, t0, side="left"))
        out = int(np.searchsorted(worked_sorted, t1, side="left") - np.searchsorted(worked_sorted, t0, side="left"))
        achieved = round(into / step_s, 2)
        lag_end = int(lag.at(t1))
        slope = lag.slope(t0 + step_s / 2, t1)
        ok, failed = judge(rate, achieved_rate=achieved, lag_end=lag_end, lag_slope=slope,
                           consumers=consumers, batch_size=batch_size, step_s=step_s)
        cpu = cpu_between(timeline, t0, t1, groups) if timeline else None
        rows.append({
            "step": i, "rate": rate, "t0_s": round(offset, 3), "t1_s": round(offset + step_s, 3),
            "sent": mine.stop - mine.start, "achieved_rate": achieved,
            "delivered_per_s": round(out / step_s, 2),
            "lag_end": lag_end, "oldest_age_s": lag.oldest_age(t1), "lag_slope": slope,
            "lag_bound": lag_bound(rate, consumers, batch_size),
            "slope_limit": round(slope_limit(rate, consumers, batch_size, step_s), 2),
            "latency_ms": summarize((worked[mine][arrived] - created[mine][arrived]) * 1000.0),
            "latency_from_due_ms": summarize((worked[mine][arrived] - due[mine][arrived]) * 1000.0),
            "cpu_ms_per_msg": per_message(cpu, into),
            "sustainable": ok, "failed": failed,
        })
    return rows


def warm_summary(warm: Plan, *, gate_at: float, warm_s: float, first_step_s: float,
                 created_at: Mapping[int, float], arrival_ids: Sequence[int], arrival_t: Sequence[float]
                 ) -> dict[str, Any] | None:
    """run.json's ``warm`` block (None without a warm phase): its ``rate``, ``seconds`` and planned
    ``messages``, the rows it created (``sent``) and their ``achieved_rate``, the ``rest_s`` before
    the first step, the lag of its messages at its end (``lag_end``) and when the first step began
    (``lag_at_first_step``, with the oldest one's age), and ``cleared``: whether every warm message
    had been worked by then (if not, the first step was run on a backlog and its figures carry it).
    ``first_step_s``: the first step's offset from the gate (:func:`lab.scenario.step_plan`)."""
    if not warm:
        return None
    rate, _, n = warm[0]
    created, worked = _created_worked(created_at, arrival_ids, arrival_t)
    created, worked = created[:n], worked[:n]
    lag = _Lag(created, worked)
    end, first = gate_at + warm_s, gate_at + first_step_s
    into = int(np.searchsorted(lag.created_sorted, end, side="left"))
    arrived = np.isfinite(worked)
    lag_first = int(lag.at(first))
    return {
        "rate": rate, "seconds": warm_s, "messages": n, "sent": int(created.size),
        "achieved_rate": round(into / warm_s, 2) if warm_s > 0 else None,
        "rest_s": round(first_step_s - warm_s, 3),
        "lag_end": int(lag.at(end)), "lag_at_first_step": lag_first,
        "oldest_age_s_at_first_step": lag.oldest_age(first),
        "latency_ms": summarize((worked[arrived] - created[arrived]) * 1000.0),
        "cleared": lag_first == 0,
    }


def per_message(cpu: Mapping[str, float] | None, messages: int) -> dict[str, float] | None:
    """ms CPU per message per participant (consumer-i left to the ``consumers`` group, the speed
    probe left out), their ``total`` (without ``unattributed``), and ``unattributed``."""
    if cpu is None or messages <= 0:
        return None
    keep = {n: v for n, v in cpu.items() if not n.startswith("consumer-") and n != "probe"}
    total = sum(v for n, v in keep.items() if n != "unattributed")
    return {**{n: round(v * 1000 / messages, 4) for n, v in sorted(keep.items())},
            "total": round(total * 1000 / messages, 4)}


def summary(steps: Sequence[Mapping[str, Any]], rates: Sequence[float], *, stop: Mapping[str, Any] | None
            ) -> dict[str, Any]:
    """run.json's ``staircase`` block: the verdict and what was run of the planned staircase."""
    return {
        "rates": list(rates), "steps_run": len(steps), "stopped_early": len(steps) < len(rates),
        "stop": dict(stop) if stop else None,
        "max_sustainable_rate": max_sustainable_rate(steps),
        "limit_found": any(not s.get("sustainable") for s in steps),
        "criteria": {"lag_s": LAG_S, "slope_fraction": SLOPE_FRACTION, "rate_tolerance": RATE_TOLERANCE,
                     "stop_lead_s": STOP_LEAD_S},
    }
