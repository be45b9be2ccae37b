"""One cell of the matrix: one run read as one row (:func:`cell_row`, :data:`COLUMNS`).

The row comes from the ``fault`` block of run.json; keys a newer runner adds (``backlog``,
``consumer_lag``, ``phases``, ``recovery_s``) are used when present and NaN when not, so old runs
still tabulate. What a fault is beyond its kind (``family``, ``hit_consumers``) is read from what it
recorded; a run recorded before those fields has them from its kind's class in
:data:`lab.faults.FAULTS` (:func:`recorded`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from lab import faults as fault_kinds
from lab.scenario import FaultSpec, Scenario, parse_fault

GROWTH = 2.0  # a backlog "lives" where its peak after the fault's start exceeds GROWTH x its pre-fault peak
SOURCE_FLOOR = 64 * 1024  # ... and this many bytes of unconfirmed WAL
BROKER_FLOOR = 100  # ... and this many messages in the broker (one claim batch)
SLOPE_MIN_S = 2.0  # WAL's slope is fitted over at least this long after the fault's start


COLUMNS = (
    "pipeline", "fault", "spec", "family", "hit", "success", "lost", "duplicates", "max_burst", "resume_s",
    "recovery_s",
    "slots_back_s", "wal_peak_mb", "wal_slope_kb_s", "backlog_where", "source_backlog_peak_kb",
    "broker_backlog_peak", "healthy_lag_peak", "healthy_lag_peak_s", "hit_lag_peak", "waits", "delivered_during_pct",
    "p99_during_ms", "cpu_ms_per_msg", "cpu_vs_clean_ms", "recovery_cpu_ms", "excess_cpu_s", "loadavg_1m",
    "unattributed_ms", "run_id", "error",
)
NAN = float("nan")


def num(value: Any) -> float:
    """A number as float; anything else (None, missing, text) as NaN."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else NAN


def fault_of(run: dict[str, Any]) -> dict[str, Any]:
    f = run.get("fault")
    return f if isinstance(f, dict) else {}


def rows_of(run: dict[str, Any], key: str) -> list[dict[str, Any]]:
    rows = fault_of(run).get(key)
    if not isinstance(rows, list):
        return []
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("t_s"), int | float)]


def timeline(run: dict[str, Any], key: str = "wal") -> pd.DataFrame:
    """One of the fault block's per-second lists as a table: ``wal`` (per slot), ``backlog`` (the
    broker's) or ``consumer_lag`` (per consumer); empty when the run has none."""
    return pd.DataFrame(rows_of(run, key))


def fault_window(run: dict[str, Any]) -> tuple[float, float] | None:
    """(start, end) of the fault, seconds after the gate: the ``during`` phase when the run has one,
    else its first to last event (a cleanup's or the guard's excluded), else the spec's timing."""
    f = fault_of(run)
    during = (f.get("phases") or {}).get("during") if isinstance(f.get("phases"), dict) else None
    if isinstance(during, dict) and not math.isnan(num(during.get("t0_s")) + num(during.get("t1_s"))):
        return float(during["t0_s"]), float(during["t1_s"])
    times = [e["t_s"] for e in f.get("events") or [] if isinstance(e, dict) and isinstance(e.get("t_s"), int | float)
             and "cleanup" not in str(e.get("what")) and "guard" not in str(e.get("what"))]
    if times:
        return min(times), max(times)
    start = num(f.get("start_s"))
    return None if math.isnan(start) else (start, start + (num(f.get("duration_s")) if f.get("duration_s") else 0.0))


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, value) points, value per second; NaN under two distinct times."""
    if len(points) < 2:
        return NAN
    mt = sum(t for t, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    var = sum((t - mt) ** 2 for t, _ in points)
    return NAN if var == 0 else sum((t - mt) * (v - mv) for t, v in points) / var


def per_slot(run: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in rows_of(run, "wal"):
        out.setdefault(str(s.get("slot")), []).append(s)
    return out


def slot_slope(samples: list[dict[str, Any]], window: tuple[float, float] | None) -> float:
    """Retained WAL's slope over the fault: at least :data:`SLOPE_MIN_S` from its start (a kill is over
    in a second), plus one sample interval."""
    if window is None:
        return NAN
    hi = max(window[1], window[0] + SLOPE_MIN_S) + 1.0
    return slope([(s["t_s"], s["retained_bytes"]) for s in samples
                  if window[0] <= s["t_s"] <= hi and isinstance(s.get("retained_bytes"), int | float)])


def peak(values: Sequence[Any]) -> float:
    nums = [v for v in map(num, values) if not math.isnan(v)]
    return max(nums) if nums else NAN


def backlog_where(run: dict[str, Any], window: tuple[float, float] | None = None) -> tuple[str, float, float]:
    """Where the backlog lived: ``source`` (a slot's unconfirmed WAL), ``broker`` (messages waiting in
    Kafka or RabbitMQ), both, ``none``, or ``—`` without samples. A side counts when its peak from the
    fault's start on exceeds :data:`GROWTH` x its peak before the fault and its floor; a broker
    pipeline's run without broker samples adds `` (broker not sampled)`` (an older runner). Also returns
    the peaks: unconfirmed WAL in bytes (the highest slot) and broker messages (NaN: not sampled)."""
    window = window or fault_window(run)
    if window is None:
        return "—", NAN, NAN
    start, places = window[0], []
    source_peak, grew = NAN, False
    for samples in per_slot(run).values():
        before = peak([s.get("unconfirmed_bytes") for s in samples if s["t_s"] < start])
        after = peak([s.get("unconfirmed_bytes") for s in samples if s["t_s"] >= start])
        source_peak = peak([source_peak, after])
        grew |= after > max(GROWTH * (0.0 if math.isnan(before) else before), SOURCE_FLOOR)
    if grew:
        places.append("source")
    backlog = rows_of(run, "backlog")
    broker_before = peak([b.get("messages") for b in backlog if b["t_s"] < start])
    broker_peak = peak([b.get("messages") for b in backlog if b["t_s"] >= start])
    if broker_peak > max(GROWTH * (0.0 if math.isnan(broker_before) else broker_before), BROKER_FLOOR):
        places.append("broker")
    broker = (run.get("pipeline_settings") or {}).get("debezium_sink") or fault_of(run).get("debezium_properties")
    unknown = " (broker not sampled)" if broker and not backlog else ""  # an older runner
    if places:
        return "+".join(places) + unknown, source_peak, broker_peak
    return ("none" + unknown if per_slot(run) or backlog else "—"), source_peak, broker_peak


def recorded(run: dict[str, Any]) -> dict[str, Any]:
    """What the run's fault recorded of itself (``family``, ``stops_service``, ``stops_source``,
    ``hit_consumers``); for a run recorded before those fields, what its kind's class says of the
    recorded kind and parameters. Empty without a fault block."""
    f = fault_of(run)
    keys = ("family", "stops_service", "stops_source", "hit_consumers")
    if not f or all(k in f for k in keys):
        return {k: f.get(k) for k in keys}
    cls = fault_kinds.FAULTS.get(str(f.get("kind")))
    if cls is None:
        return {k: f.get(k) for k in keys}
    spec = FaultSpec(str(f.get("spec")), str(f.get("kind")), None, f.get("target"), num(f.get("start_s")),
                     f.get("duration_s"))
    scenario = Scenario(consumers=int((run.get("scenario") or {}).get("consumers") or 1))
    return {"family": cls.family, "stops_service": cls.stops_service, "stops_source": cls.stops_source,
            "hit_consumers": cls.parse(spec).hit_consumers(scenario)}


def _healthy_lag(run: dict[str, Any], window: tuple[float, float] | None) -> tuple[float, float]:
    """Peak lag (messages, seconds) of the consumers the fault did not hit, over the fault; NaN when
    it hit every consumer (a sink outage) or lag was not sampled."""
    hit = set(recorded(run).get("hit_consumers") or ())
    consumers = int((run.get("scenario") or {}).get("consumers") or 0)
    if window is None or (consumers and hit >= set(range(consumers))):
        return NAN, NAN
    rows = [r for r in rows_of(run, "consumer_lag")
            if window[0] <= r["t_s"] <= window[1] and r.get("consumer") not in hit]
    return peak([r.get("lag_messages") for r in rows]), peak([r.get("lag_s") for r in rows])


WAITED = 0.5  # a consumer's messages waited when its oldest one's lag reached this share of the fault


def _lag_peaks(run: dict[str, Any], window: tuple[float, float], hit: bool) -> tuple[float, float, float]:
    """(peak lag in messages over the fault, peak lag in seconds over the fault, peak lag in seconds
    before it) of the consumers the fault hit (``hit``) or of the others; NaNs without samples."""
    struck = set(recorded(run).get("hit_consumers") or ())
    rows = [r for r in rows_of(run, "consumer_lag") if (r.get("consumer") in struck) == hit]
    during = [r for r in rows if window[0] <= r["t_s"] <= window[1]]
    return (peak([r.get("lag_messages") for r in during]), peak([r.get("lag_s") for r in during]),
            peak([r.get("lag_s") for r in rows if r["t_s"] < window[0]]))


def who_waits(run: dict[str, Any], window: tuple[float, float] | None = None) -> str:
    """Whose messages waited while the fault lasted, from the per-consumer lag: ``its messages``
    (those the hit consumer works after it is back: its partitions, shards, share or prefetched
    batch), ``every consumer`` (the others' too), ``nobody`` (the others took its messages), ``—``
    without lag samples. A side waited when its oldest message's lag over the fault reached
    :data:`WAITED` x the fault's length and :data:`GROWTH` x its own peak before the fault."""
    window = window or fault_window(run)
    if window is None or not rows_of(run, "consumer_lag"):
        return "—"

    def waited(hit: bool) -> bool:
        _, during, before = _lag_peaks(run, window, hit)
        bar = max(WAITED * (window[1] - window[0]), GROWTH * (0.0 if math.isnan(before) else before))
        return not math.isnan(during) and during >= bar

    if _hit(run, recorded(run)) == "all":
        return "every consumer" if waited(True) else "nobody"
    if waited(False):
        return "every consumer"
    return "its messages" if waited(True) else "nobody"


def delivered_during_pct(run: dict[str, Any]) -> float:
    """Messages delivered while the fault lasted, in % of what arrived meanwhile: the ``during``
    phase's delivery rate over the run's open-loop rate (closed loop: over the ``before`` phase's);
    NaN without phases."""
    during = num(_phase(run, "during").get("delivered_per_s"))
    rate = num((run.get("scenario") or {}).get("rate"))
    if not rate > 0:
        rate = num(_phase(run, "before").get("delivered_per_s"))
    return 100 * during / rate if rate > 0 else NAN


def _phase(run: dict[str, Any], name: str) -> dict[str, Any]:
    phases = fault_of(run).get("phases")
    p = phases.get(name) if isinstance(phases, dict) else None
    return p if isinstance(p, dict) else {}


def _phase_cpu(run: dict[str, Any], name: str) -> float:
    """ms CPU/msg of one phase, summed over participants (``unattributed`` left out, as in the
    run's total): the runner's ``cpu_ms_per_msg_total``, else the sum of its ``cpu_ms_per_msg``."""
    phase = _phase(run, name)
    if not math.isnan(num(phase.get("cpu_ms_per_msg_total"))):
        return float(phase["cpu_ms_per_msg_total"])
    cpu = phase.get("cpu_ms_per_msg")
    if not isinstance(cpu, dict) or not cpu:
        return NAN
    return sum(num(v) for k, v in cpu.items() if k != "unattributed")


def cell_row(run: dict[str, Any], clean: dict[str, float] | None = None) -> dict[str, Any]:
    """One run as one row of the matrix (:data:`COLUMNS`); ``clean``: each pipeline's ms CPU/msg
    without a fault, for ``cpu_vs_clean_ms``."""
    s, f = run.get("scenario") or {}, fault_of(run)
    mine = recorded(run)
    acc: dict[str, Any] = f["accounting"] if isinstance(f.get("accounting"), dict) else {}
    window = fault_window(run) if f else None
    slots = per_slot(run)
    where, source_peak, broker_peak = backlog_where(run, window) if f else ("—", NAN, NAN)
    lag, lag_s = _healthy_lag(run, window)
    summary: dict[str, Any] = f["wal_summary"] if isinstance(f.get("wal_summary"), dict) else {}
    cpu = num(run.get("cpu_ms_per_msg"))
    unattributed = num((run.get("cpu_s") or {}).get("unattributed"))
    messages = num(s.get("messages"))
    return {
        "pipeline": s.get("pipeline"), "fault": kind_of(s.get("fault")),
        "spec": s.get("fault") or "", "family": mine.get("family") or "—", "hit": _hit(run, mine),
        "success": bool(run.get("success")),
        "lost": num(acc.get("lost")), "duplicates": num(acc.get("extra_calls")),
        "max_burst": num(acc.get("max_burst")), "resume_s": num(acc.get("time_to_resume_s")),
        "recovery_s": num(f.get("recovery_s")),
        "slots_back_s": peak([v.get("recovered_after_s") for v in summary.values() if isinstance(v, dict)]),
        "wal_peak_mb": peak([x.get("retained_bytes") for v in slots.values() for x in v]) / 2**20,
        "wal_slope_kb_s": peak([slot_slope(v, window) for v in slots.values()]) / 1024,
        "backlog_where": where, "source_backlog_peak_kb": source_peak / 1024, "broker_backlog_peak": broker_peak,
        "healthy_lag_peak": lag, "healthy_lag_peak_s": lag_s,
        "hit_lag_peak": _lag_peaks(run, window, True)[0] if window else NAN,
        "waits": who_waits(run, window) if f else "—", "delivered_during_pct": delivered_during_pct(run) if f else NAN,
        "p99_during_ms": num((_phase(run, "during").get("latency_ms") or {}).get("p99")),
        "cpu_ms_per_msg": cpu,
        "cpu_vs_clean_ms": cpu - (clean or {}).get(str(s.get("pipeline")), NAN) if f else NAN,
        "recovery_cpu_ms": _phase_cpu(run, "after") - _phase_cpu(run, "before"),
        "excess_cpu_s": num((f.get("excess_cpu") or {}).get("total_s")),
        "loadavg_1m": num(run.get("loadavg_1m")),
        "unattributed_ms": unattributed * 1000 / messages if messages else NAN,
        "run_id": run.get("run_id"), "error": run.get("error"),
    }


DEAD_CONSUMER = ("consumer_stop", "one")  # (family, hit) of the cells that stop one consumer of several


def _hit(run: dict[str, Any], mine: dict[str, Any]) -> str:
    """Which consumers the fault hit directly: ``one`` (or some), ``all``, ``none`` (a service, a
    slot of Debezium's, the load); ``—`` without a fault."""
    if not fault_of(run):
        return "—"
    hit = set(mine.get("hit_consumers") or ())
    consumers = int((run.get("scenario") or {}).get("consumers") or 0)
    return "none" if not hit else "all" if hit >= set(range(consumers)) else "one"


def kind_of(spec: Any) -> str:
    if not spec:
        return "none"
    try:
        return parse_fault(str(spec)).kind
    except ValueError:
        return str(spec)
