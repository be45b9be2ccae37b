"""What a fault run measures after the fact: per-consumer lag, the before / during /
after phases, and the recovery time. Pure functions (no I/O): :mod:`lab.runner.fault_driver` gives them
the web service's arrivals, the ``created_at`` of every outbox row and the sampler's timeline.

Clock: every time here is **seconds after the senders' gate** (``t_s``), the clock of the WAL and
backlog samples. Arrivals and ``created_at`` are wall times of the same host; ``gate_wall`` is the
wall time of the gate.

Definitions (for every pipeline):

* A message's **delivery** is the first work call of its id (later calls are duplicates); its
  **owner** is the consumer that made that call (``by``), i.e. the consumer whose share of the run
  it turned out to be. Messages never worked (lost) and ids without a ``created_at`` (foreign)
  belong to nobody and are left out of the lag.
* **Consumer lag** of consumer ``c`` at time ``t``: ``lag_messages`` = the messages owned by ``c``
  with ``created_at ≤ t < delivery`` (created, not yet worked); ``lag_s`` = ``t`` minus the
  ``created_at`` of the oldest of them (0.0 when there is none). **Total lag** is the sum over
  the consumers. With ``wal`` (fan-out) a stopped reader owns nothing it did not work: the others
  claimed its rows, so its lag stays 0 while the total shows what the survivors had to do.
* **Phases**: ``before`` = [gate, fault start), ``during`` = [fault start, fault end), ``after`` =
  [fault end, last delivery] (the end of the drain). Per phase: ``delivered`` (deliveries in it),
  ``delivered_per_s``, ``cpu_ms_per_msg`` per participant (its CPU over the phase, from the sampler's
  timeline interpolated at the edges, in ms per message delivered in the phase; the consumers
  summed as ``consumers``, plus ``unattributed`` = host busy − Σ participants: the keys of run.json's
  ``cpu_s``; None when nothing was delivered), ``cpu_ms_per_msg_total`` (Σ participants, without
  ``unattributed``, as run.json's ``cpu_ms_per_msg``) and ``latency_ms`` of the messages delivered
  in the phase (delivery − ``created_at``, :func:`lab.measure.latency.summarize`). For the broker
  pipelines ``created_at`` is the outbox row's, so lag and latency include Debezium's capture.
* **Recovery time** (:func:`recovery_s`): seconds from the end of the fault to the first time
  ``t`` (0.1 s grid) from which, for the next :data:`WINDOW_S` s, the total lag stays within its
  pre-fault band and the delivery rate over ``[t, t + WINDOW_S)`` is within its pre-fault band.
  The rate test applies only while the load lasts (``t + WINDOW_S`` ≤ the last ``created_at``):
  once the senders stopped the rate has no band to come back to, and the lag alone says whether
  the backlog was worked off. Bands, from ``[SKIP_S, fault start)`` (the first second is the
  ramp-up: the first deliveries trail the first sends by a latency):

  - rate: the mean rate ``R0`` there ± ``max(RATE_TOL · R0, 3·sqrt(R0 / WINDOW_S))``. The second
    term is three standard deviations of a Poisson count over the window, as a rate (±17 msg/s at
    100 msg/s, ±24 at 200); the first (15 %) covers a closed-loop run's own drift, where a few
    pre-fault seconds are all the reference there is.
  - lag: at most ``L + max(LAG_TOL · L, R0 · LAG_TOL_S, 1)``, ``L`` the largest total lag on the
    0.1 s grid before the fault. Lag at an instant is bursty (consumers fetch and confirm in
    batches), and a 2 s reference sees few bursts: half its peak again, or 100 ms of deliveries,
    or one message, whichever is largest.

  None when the run had no pre-fault reference (fault start < ``SKIP_S`` + 1 s, or nothing
  delivered before it), or the lag never came back into its band (messages lost beyond it).
* **Excess CPU** (:func:`excess_cpu`): per participant, its CPU-seconds from the fault's start
  until the run recovered (fault end + recovery time; the last delivery when it never did) minus
  the same span at its pre-fault CPU per second, over the later half of the time before the fault
  (``[max(SKIP_S, fault start / 2), fault start)``: the first half holds each run's start,
  connections and warm-up, dearer per second than a steady state). The senders keep
  their rate through a fault, so the pre-fault cost per second is what the span would have cost
  without it; the rest is the fault's own price: restarts (a JVM, a crash recovery), replayed
  messages, the backlog worked off. Negative where work was not done (refused inserts, a dead
  participant). ``total_s`` sums the participants, ``unattributed`` left out as in the totals.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lab.measure.latency import summarize
from lab.measure.sampler import Snapshot

WINDOW_S = 3.0  # the delivery rate's window
GRID_S = 0.1  # the recovery time's resolution
SKIP_S = 1.0  # the ramp-up after the gate, left out of the pre-fault bands
MIN_PRE_S = 1.0  # the least pre-fault reference (after SKIP_S) to define bands on
RATE_TOL = 0.15
LAG_TOL, LAG_TOL_S = 0.5, 0.1
LAG_STEP_S = 1.0  # consumer_lag's sampling step
PHASES = ("before", "during", "after")


class Deliveries:
    """Each worked message's ``created`` and ``delivered`` time (``t_s``) and ``owner`` (arrays
    in delivery order), from the web service's arrivals and the outbox's ``created_at``."""

    def __init__(self, ids: Sequence[int], t: Sequence[float], by: Sequence[int] | None,
                 created_at: Mapping[int, float], gate_wall: float) -> None:
        if len(ids) != len(t) or (by is not None and len(by) != len(ids)):
            raise ValueError("arrivals: ids, t and by differ in length")
        first: dict[int, tuple[float, int]] = {}
        for n, (i, ti) in enumerate(zip(ids, t, strict=True)):
            if i not in first or ti < first[i][0]:
                first[i] = (ti, -1 if by is None else int(by[n]))
        kept = sorted((v[0], created_at[i], v[1]) for i, v in first.items() if i in created_at)
        self.delivered = np.array([k[0] - gate_wall for k in kept], dtype=float)
        self.created = np.array([k[1] - gate_wall for k in kept], dtype=float)
        self.owner = np.array([k[2] for k in kept], dtype=int)
        self.lost_created = np.array(sorted(c - gate_wall for i, c in created_at.items() if i not in first),
                                     dtype=float)

    def total_lag(self, times: np.ndarray) -> np.ndarray:
        """Total lag at each of ``times``, a message never worked (lost) counted as pending forever."""
        created = np.concatenate((self.created, self.lost_created))
        delivered = np.concatenate((self.delivered, np.full(self.lost_created.size, np.inf)))
        return lag_at(created, delivered, times)

    @property
    def end_s(self) -> float:
        """The last delivery (the end of the drain), 0.0 when nothing was delivered."""
        return float(self.delivered[-1]) if self.delivered.size else 0.0

    def consumers(self) -> list[int]:
        return sorted({int(o) for o in self.owner})


def lag_at(created: np.ndarray, delivered: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Messages with ``created ≤ t < delivered`` at each of ``times`` (a delivery never precedes
    its creation on one host clock; one that would is counted as delivered at its creation)."""
    delivered = np.maximum(delivered, created)
    return (np.searchsorted(np.sort(created), times, side="right")
            - np.searchsorted(np.sort(delivered), times, side="right"))


def _oldest_age(created: np.ndarray, delivered: np.ndarray, times: np.ndarray) -> np.ndarray:
    """At each of ``times`` (ascending): ``t`` minus the oldest ``created`` not yet delivered, 0.0
    when nothing is pending. The first message in creation order that is still pending only
    moves forward as ``t`` grows, so one pass does it."""
    order = np.argsort(created, kind="stable")
    c, d = created[order], np.maximum(delivered[order], created[order])
    out = np.zeros(times.size)
    j = 0
    for k, t in enumerate(times):
        while j < c.size and d[j] <= t:
            j += 1
        if j < c.size and c[j] <= t:  # every message created before it was delivered by t
            out[k] = t - c[j]
    return out


def consumer_lag(d: Deliveries, step_s: float = LAG_STEP_S) -> list[dict[str, Any]]:
    """``[{"t_s", "consumer", "lag_messages", "lag_s"}]`` every ``step_s`` from the gate to the last
    delivery, per consumer (module docstring)."""
    if not d.delivered.size:
        return []
    times = np.arange(0.0, d.end_s + step_s, step_s)
    rows: list[dict[str, Any]] = []
    for c in d.consumers():
        mine = d.owner == c
        n = lag_at(d.created[mine], d.delivered[mine], times)
        age = _oldest_age(d.created[mine], d.delivered[mine], times)
        rows += [{"t_s": round(float(t), 3), "consumer": c, "lag_messages": int(k), "lag_s": round(float(a), 3)}
                 for t, k, a in zip(times, n, age, strict=True)]
    rows.sort(key=lambda r: (r["t_s"], r["consumer"]))
    return rows


def _cpu_at(timeline: Sequence[Snapshot], t_mono: float) -> tuple[dict[str, float], float]:
    """CPU-seconds per participant and host busy at ``t_mono``, linear between the readings
    around it (clamped to the first and last reading)."""
    snaps = sorted(timeline, key=lambda s: s.t_mono)
    if t_mono <= snaps[0].t_mono:
        return dict(snaps[0].cpu_s), snaps[0].host_busy_s
    for a, b in itertools.pairwise(snaps):
        if a.t_mono <= t_mono <= b.t_mono:
            f = 0.0 if b.t_mono == a.t_mono else (t_mono - a.t_mono) / (b.t_mono - a.t_mono)
            names = a.cpu_s.keys() & b.cpu_s.keys()
            return ({n: a.cpu_s[n] + (b.cpu_s[n] - a.cpu_s[n]) * f for n in names},
                    a.host_busy_s + (b.host_busy_s - a.host_busy_s) * f)
    return dict(snaps[-1].cpu_s), snaps[-1].host_busy_s


def phase_cpu_s(timeline: Sequence[Snapshot], t0_mono: float, t1_mono: float) -> dict[str, float]:
    """CPU-seconds per participant between two instants: ``consumer-<i>`` summed as ``consumers``,
    the speed probe left out (it is outside the totals), plus ``unattributed`` (host busy − Σ)."""
    (a, ha), (b, hb) = _cpu_at(timeline, t0_mono), _cpu_at(timeline, t1_mono)
    out: dict[str, float] = {}
    for name in sorted(a.keys() & b.keys()):
        if name == "probe":
            continue
        key = "consumers" if name.startswith("consumer-") else name
        out[key] = out.get(key, 0.0) + b[name] - a[name]
    out["unattributed"] = (hb - ha) - sum(out.values())
    return out


def phases(d: Deliveries, fault_start: float, fault_end: float, *,
           timeline: Sequence[Snapshot] | None = None, gate_mono: float | None = None) -> dict[str, Any]:
    """``{"before"|"during"|"after": {"t0_s", "t1_s", "delivered", "delivered_per_s",
    "cpu_ms_per_msg", "cpu_ms_per_msg_total", "latency_ms"}}`` (module docstring); the CPU is None
    without a timeline. ``gate_mono``: the gate on the timeline's monotonic clock."""
    end = max(d.end_s, fault_end)
    edges = {"before": (0.0, fault_start), "during": (fault_start, fault_end), "after": (fault_end, end)}
    out: dict[str, Any] = {}
    for name, (t0, t1) in edges.items():
        last = name == "after"
        inside = (d.delivered >= t0) & ((d.delivered <= t1) if last else (d.delivered < t1))
        n = int(inside.sum())
        span = t1 - t0
        cpu = total = None
        if timeline and gate_mono is not None and n:
            cpu_s = phase_cpu_s(timeline, gate_mono + t0, gate_mono + t1)
            cpu = {k: round(v * 1000 / n, 4) for k, v in cpu_s.items()}
            total = round(sum(v for k, v in cpu_s.items() if k != "unattributed") * 1000 / n, 4)
        out[name] = {
            "t0_s": round(t0, 3), "t1_s": round(t1, 3), "delivered": n,
            "delivered_per_s": round(n / span, 2) if span > 0 else None,
            "cpu_ms_per_msg": cpu, "cpu_ms_per_msg_total": total,
            "latency_ms": summarize((d.delivered[inside] - d.created[inside]) * 1000.0),
        }
    return out


def bands(d: Deliveries, fault_start: float) -> dict[str, float] | None:
    """The pre-fault bands of :func:`recovery_s` (``rate``, ``rate_lo``, ``rate_hi``, ``lag_hi``),
    None when there is no pre-fault reference."""
    if fault_start - SKIP_S < MIN_PRE_S:
        return None
    n = int(((d.delivered >= SKIP_S) & (d.delivered < fault_start)).sum())
    if n == 0:
        return None
    r0 = n / (fault_start - SKIP_S)
    tol = max(RATE_TOL * r0, 3 * math.sqrt(r0 / WINDOW_S))
    grid = np.arange(SKIP_S, fault_start, GRID_S)
    peak = int(d.total_lag(grid).max())
    return {"rate": round(r0, 2), "rate_lo": round(r0 - tol, 2), "rate_hi": round(r0 + tol, 2),
            "lag_peak": peak, "lag_hi": round(peak + max(LAG_TOL * peak, r0 * LAG_TOL_S, 1.0), 1)}


def recovery_s(d: Deliveries, fault_start: float, fault_end: float) -> float | None:
    """Seconds from the end of the fault until delivery rate and total lag are back in their
    pre-fault bands (module docstring); None when never, or without a pre-fault reference."""
    band = bands(d, fault_start)
    if band is None or not d.delivered.size:
        return None
    load_end = float(d.created.max())
    end = max(d.end_s, fault_end)
    grid = np.arange(fault_end, end + GRID_S, GRID_S)
    lag = d.total_lag(grid)
    # from each grid point: is the lag out of its band anywhere in the next WINDOW_S?
    over = np.concatenate(([0], np.cumsum(lag > band["lag_hi"])))
    span = round(WINDOW_S / GRID_S)
    ahead = np.minimum(np.arange(grid.size) + span, grid.size)
    bad_ahead = over[ahead] - over[:-1] > 0
    delivered = np.sort(d.delivered)
    for k, t in enumerate(grid):
        if bad_ahead[k]:
            continue
        if t + WINDOW_S <= load_end:
            n = np.searchsorted(delivered, t + WINDOW_S, side="left") - np.searchsorted(delivered, t, side="left")
            if not band["rate_lo"] <= n / WINDOW_S <= band["rate_hi"]:
                continue
        return round(max(0.0, float(t) - fault_end), 3)
    return None


def backlog_peak(samples: Iterable[Mapping[str, Any]]) -> int | None:
    """The largest broker backlog sampled (messages), None without a sample."""
    return max((int(s["messages"]) for s in samples if s.get("messages") is not None), default=None)


def excess_cpu(timeline: Sequence[Snapshot], gate_mono: float, fault_start: float,
               until: float) -> dict[str, Any] | None:
    """The fault's CPU on top of the steady state, from ``fault_start`` to ``until`` (seconds after
    the gate; module docstring): ``{"t0_s", "t1_s", "baseline_s", "excess_s": {participant: s},
    "total_s"}``. None without a timeline, a pre-fault reference of :data:`MIN_PRE_S`, or a span."""
    ref = max(SKIP_S, fault_start / 2)
    if not timeline or fault_start - ref < MIN_PRE_S or until <= fault_start:
        return None
    pre = phase_cpu_s(timeline, gate_mono + ref, gate_mono + fault_start)
    span = phase_cpu_s(timeline, gate_mono + fault_start, gate_mono + until)
    per_s, length = fault_start - ref, until - fault_start
    excess = {k: round(span[k] - pre[k] / per_s * length, 3) for k in sorted(span.keys() & pre.keys())}
    return {"t0_s": round(fault_start, 3), "t1_s": round(until, 3), "baseline_s": round(per_s, 3),
            "excess_s": excess, "total_s": round(sum(v for k, v in excess.items() if k != "unattributed"), 3)}


def longest_stall_after(t: Sequence[float], after: float) -> float | None:
    """The longest time without any work call from wall time ``after`` to the last call (``t``
    in arrival order), counting the wait for the first one: how long delivery stopped while a
    broker node was down and its partitions or queue leader moved. None without a call after."""
    start = bisect.bisect_left(t, after)
    if start >= len(t):
        return None
    gaps = [t[start] - after, *(b - a for a, b in itertools.pairwise(t[start:]))]
    return round(max(gaps), 3)


def first_call_after(t: Sequence[float], after: float, by: Sequence[int] | None = None,
                     who: int | None = None) -> float | None:
    """Seconds from wall time ``after`` to the first work call at or after it (by consumer
    ``who`` when given; ``t`` in arrival order, non-decreasing), or None if there is none."""
    start = bisect.bisect_left(t, after)
    for n in range(start, len(t)):
        if who is None or (by is not None and by[n] == who):
            return round(t[n] - after, 3)
    return None
