"""The insulation matrix: every pipeline x every fault it applies to, at a fixed rate.

A profile (:data:`PROFILES`) fixes the load (N = 2 consumers, M messages open-loop at a fixed rate,
so that lag and recovery mean something) and the faults' timing; :func:`plan` turns it into one
:class:`~lab.scenario.Scenario` per cell, fault kinds outer and pipelines inner (an interrupted
matrix still compares the architectures on the faults it reached), then a clean cell per pipeline
at the same rate (``baseline``) to price the recovery. Which (pipeline, fault) pairs exist is the
faults' decision (:func:`lab.faults.check`, by each pipeline's capabilities), not this module's: a
cell is planned when its fault applies, and :func:`inapplicable` says why the others were left out.

:func:`run_matrix` runs the plan as a series (``series_id`` in every run.json). A failed run is a
*finding* (RabbitMQ losing a killed consumer's claims, a slot invalidated under ``wal-sharded``),
so resuming skips every cell that has a stored run, failed or not; ``retry_failed`` re-runs the
failed ones, ``force`` every cell. A cell whose run raised before it was stored is recorded with its
error and the matrix goes on.

:func:`matrix_table` reads the runs into one row per cell (:data:`COLUMNS`), from the ``fault``
block of run.json; keys a newer runner adds (``backlog``, ``consumer_lag``, ``phases``,
``recovery_s``) are used when present and NaN when not, so old runs still tabulate. What a fault is
beyond its kind (``family``, ``hit_consumers``) is read from what it recorded; a run recorded before
those fields has them from its kind's class in :data:`lab.faults.FAULTS` (:func:`recorded`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lab import faults as fault_kinds
from lab.results import iter_runs
from lab.scenario import FaultSpec, Scenario, parse_fault
from lab.settings import Settings
from lab.stack.proc import exclusive
from lab.study.plots import finding, outside_legend
from lab.study.series import Step, available_pipelines

log = logging.getLogger(__name__)
LABEL = "faults"  # every cell's Scenario.label
# the fault kinds a matrix runs, in its order: the telling ones first, the slow ones last
KIND_ORDER = ("consumer-dead", "consumer-kill", "sink-outage", "walsender-kill", "consumer-slow",
              "debezium-kill", "broker-restart", "postgres-restart", "slot-invalidation", "big-transaction")
# kinds of the ha topology only (the failover), run on their own, not in the single matrix
HA_KINDS = ("broker-node-kill", "postgres-failover")
TARGET = 1  # the consumer a targeted fault hits (consumer 0 stays healthy)
GROWTH = 2.0  # a backlog "lives" where its peak after the fault's start exceeds GROWTH x its pre-fault peak
SOURCE_FLOOR = 64 * 1024  # ... and this many bytes of unconfirmed WAL
BROKER_FLOOR = 100  # ... and this many messages in the broker (one claim batch)
SLOPE_MIN_S = 2.0  # WAL's slope is fitted over at least this long after the fault's start


@dataclass(frozen=True)
class FaultProfile:
    """How big a fault matrix is: the load of every cell and the faults' timing."""

    name: str
    messages: int
    rate: float  # open-loop msg/s
    start_s: float  # the fault's start after the senders' gate
    duration_s: float  # consumer-dead, sink-outage, consumer-slow
    outage_s: float  # broker-restart, postgres-restart: stopped this long
    big_rows: int  # big-transaction's rows
    cooldown_s: float
    drain_timeout_s: float
    kinds: tuple[str, ...]
    pipelines: tuple[str, ...]  # empty: every registered pipeline
    baseline: bool  # a clean cell per pipeline at the same rate
    description: str
    consumers: int = 2
    slow: str = "20ms"  # consumer-slow's extra work per message

    @property
    def sends_s(self) -> float:
        return self.messages / self.rate


PROFILES: dict[str, FaultProfile] = {p.name: p for p in (
    FaultProfile("smoke", 1400, 200.0, 2.0, 2.0, 1.0, 2000, 0.0, 180.0, ("consumer-dead",),
                 ("wal", "kafka"), False,
                 "tests: wal and kafka x a 2 s dead consumer, 1,400 messages at 200 msg/s "
                 "(2 runs, about a minute)"),
    FaultProfile("quick", 2400, 200.0, 3.0, 4.0, 2.0, 5000, 2.0, 300.0, KIND_ORDER, (), True,
                 "every applicable fault x every pipeline, 2,400 messages at 200 msg/s, faults of 4 s at "
                 "3 s, plus a clean cell per pipeline (72 runs with eight pipelines, about 40-45 min on 2 cores)"),
    FaultProfile("full", 24_000, 200.0, 20.0, 60.0, 30.0, 100_000, 10.0, 900.0, KIND_ORDER, (), True,
                 "as quick with 24,000 messages (2 min of sends) and 60 s faults at 20 s, so WAL "
                 "pinning and its slope show; 100,000-row big transaction (about 1.5-2 h)"),
)}


def profile(name: str) -> FaultProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown fault profile {name!r}: choose one of {', '.join(PROFILES)}") from None


def _t(seconds: float) -> str:
    return f"{seconds:g}s"


def candidates(kind: str, p: FaultProfile) -> list[str]:
    """The specs of ``kind`` under profile ``p``, aimed at consumer :data:`TARGET` first, then
    untargeted: the scenario validation keeps the first it accepts (a kind that takes no target,
    or Debezium's walsender, only parses without)."""
    amount = {"consumer-slow": f"={p.slow}", "big-transaction": f"={p.big_rows}"}.get(kind, "")  # the profile's
    # a fault that must last lasts the profile's duration, one that may (a service's outage) its outage
    lasting = {"required": p.duration_s, "optional": p.outage_s}.get(fault_kinds.FAULTS[kind].lasting)
    tail = f"@{_t(p.start_s)}" + (f"+{_t(lasting)}" if lasting else "")
    return [f"{kind}{amount}:{TARGET}{tail}", f"{kind}{amount}{tail}"]


def _cells(p: FaultProfile, pipelines: Sequence[str]) -> list[tuple[str, str, Scenario | None, str]]:
    """(pipeline, kind, scenario or None, why not) for every kind x pipeline, in the run order."""
    # one process per consumer and the takeover claim in every cell, the clean ones too: a fault
    # needs them, and the clean cell is what a fault cell's CPU is compared with (the defaults,
    # auto layout and the reference's owner claim, would differ there)
    base = Scenario(consumers=p.consumers, messages=p.messages, rate=p.rate, cooldown_s=p.cooldown_s,
                    drain_timeout_s=p.drain_timeout_s, label=LABEL, consumer_layout="processes",
                    claim="takeover")  # at-least-once under every fault (lab.workload.inbox)
    out: list[tuple[str, str, Scenario | None, str]] = []
    for kind in p.kinds:
        for pipe in pipelines:
            why = ""
            for spec in candidates(kind, p):
                try:
                    cell = base.replace(pipeline=pipe, fault=spec)
                    fault_kinds.check(cell)
                    out.append((pipe, kind, cell, ""))
                    break
                except ValueError as exc:
                    why = str(exc)
            else:
                out.append((pipe, kind, None, why))
    if p.baseline:  # last: on a slow day the faults come first
        out += [(pipe, "none", base.replace(pipeline=pipe), "") for pipe in pipelines]
    return out


def _pipelines(p: FaultProfile, pipelines: Sequence[str] | None) -> list[str]:
    pipes = list(pipelines or p.pipelines or available_pipelines())
    if not pipes:
        raise ValueError("no pipeline to run")
    return pipes


def plan(name: str = "quick", *, pipelines: Sequence[str] | None = None) -> list[Scenario]:
    """The cells of profile ``name``: each fault on every pipeline it applies to, then the clean cells."""
    p = profile(name)
    return [s for _, _, s, _ in _cells(p, _pipelines(p, pipelines)) if s is not None]


def inapplicable(name: str = "quick", *, pipelines: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
    """(pipeline, kind, the scenario validation's reason) for every pair :func:`plan` leaves out."""
    p = profile(name)
    return [(pipe, kind, why) for pipe, kind, s, why in _cells(p, _pipelines(p, pipelines)) if s is None]


def default_series_id(name: str, *, pipelines: Sequence[str] | None = None) -> str:
    """``faults-<profile>`` (``-wal+kafka`` for a subset), stable so that running it again resumes it."""
    p = profile(name)
    pipes = _pipelines(p, pipelines)
    return f"faults-{name}" + ("" if pipes == _pipelines(p, None) else "-" + "+".join(pipes))


def cell_label(s: Scenario) -> str:
    return f"{s.pipeline} {s.fault or 'no fault'}"


def _stored(series_id: str, settings: Settings | None) -> dict[Scenario, list[dict[str, Any]]]:
    """Every stored run of the series (failed ones too), per scenario, oldest first."""
    out: dict[Scenario, list[dict[str, Any]]] = {}
    names = set(Scenario.field_names())
    for run in sorted(iter_runs(settings=settings), key=lambda r: str(r.get("started_at"))):
        params = run.get("scenario") or {}
        if run.get("series_id") != series_id or not set(params) <= names:
            continue
        try:
            out.setdefault(Scenario(**params), []).append(run)
        except (TypeError, ValueError):
            continue
    return out


def _pick(runs: list[dict[str, Any]], retry_failed: bool = False) -> dict[str, Any] | None:
    """The run that stands for a cell: its last successful one, else its last failed one (unless
    ``retry_failed``), else None."""
    done = [r for r in runs if r.get("success")] or ([] if retry_failed else runs)
    return done[-1] if done else None


def stored(plan: Sequence[Scenario], settings: Settings, *, series_id: str) -> list[dict[str, Any]]:
    """The stored run of every cell of ``plan`` that has one in ``series_id`` (nothing is run)."""
    runs = _stored(series_id, settings)
    return [r for r in (_pick(runs.get(s, [])) for s in plan) if r is not None]


def stored_series(series_id: str, settings: Settings | None = None) -> list[dict[str, Any]]:
    """The run that stands for every cell stored in ``series_id`` (:func:`_pick`), in the order they
    were run, whatever profile planned them: what a reader of the matrix needs without its plan."""
    picked = [r for r in map(_pick, _stored(series_id, settings).values()) if r is not None]
    return sorted(picked, key=lambda r: (r.get("series_index") is None, r.get("series_index") or 0))


async def run_matrix(plan: Sequence[Scenario], settings: Settings, *, series_id: str, force: bool = False,
                     retry_failed: bool = False, progress: Callable[[Step], None] | None = None,
                     ) -> list[dict[str, Any]]:
    """Run every cell of ``plan`` not run before in ``series_id``; return each cell's run.json
    content (module docstring: what is skipped, what a cell that raised records)."""
    from lab.runner import run_scenario

    report = progress or (lambda step: None)
    results: list[dict[str, Any]] = []
    with exclusive(settings.run_lock, "the stack", settings.lock_owner):
        stored = {} if force else _stored(series_id, settings)
        for i, scenario in enumerate(plan):
            done = _pick(stored.get(scenario, []), retry_failed)
            if done is not None:
                report(Step(i, len(plan), scenario, "skipped", result=done))
                results.append(done)
                continue
            report(Step(i, len(plan), scenario, "start"))

            def on_phase(phase: str, info: dict[str, Any], i: int = i, s: Scenario = scenario) -> None:
                report(Step(i, len(plan), s, "phase", phase=phase))

            meta = {"series_id": series_id, "series_index": i}
            try:
                result = await run_scenario(scenario, settings, progress=on_phase, meta=meta)
            except Exception as exc:  # not stored: the next resume tries it again
                log.exception("%s: the run raised", cell_label(scenario))
                result = {"run_id": None, "scenario": scenario.as_parameters(), "success": False,
                          "error": f"{type(exc).__name__}: {exc}", **meta}
            log.info("[%d/%d] %s: %s", i + 1, len(plan), cell_label(scenario), outcome(result))
            report(Step(i, len(plan), scenario, "done", result=result))
            results.append(result)
    return results


def outcome(result: dict[str, Any]) -> str:
    """One line per cell: lost, duplicates, resume, and the error of a failed run."""
    acc = (result.get("fault") or {}).get("accounting") or {}
    parts = [f"lost {acc['lost']}, duplicates {acc.get('extra_calls')}" if "lost" in acc else ""]
    if acc.get("time_to_resume_s") is not None:
        parts.append(f"resumed after {acc['time_to_resume_s']:.2f} s")
    if result.get("window_s"):
        parts.append(f"{result.get('cpu_ms_per_msg')} ms CPU/msg")
    head = "ok" if result.get("success") else f"FAILED ({result.get('error')})"
    return "; ".join([head, *(p for p in parts if p)])


# The matrix as tables ---------------------------------------------------------------------------

COLUMNS = (
    "pipeline", "fault", "spec", "family", "hit", "success", "lost", "duplicates", "max_burst", "resume_s",
    "recovery_s",
    "slots_back_s", "wal_peak_mb", "wal_slope_kb_s", "backlog_where", "source_backlog_peak_kb",
    "broker_backlog_peak", "healthy_lag_peak", "healthy_lag_peak_s", "hit_lag_peak", "waits", "delivered_during_pct",
    "p99_during_ms", "cpu_ms_per_msg", "cpu_vs_clean_ms", "recovery_cpu_ms", "excess_cpu_s", "loadavg_1m",
    "unattributed_ms", "run_id", "error",
)
NAN = float("nan")
# whole numbers (or <NA>)
COUNTS = ("lost", "duplicates", "max_burst", "broker_backlog_peak", "healthy_lag_peak", "hit_lag_peak")


def _num(value: Any) -> float:
    """A number as float; anything else (None, missing, text) as NaN."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else NAN


def _fault(run: dict[str, Any]) -> dict[str, Any]:
    f = run.get("fault")
    return f if isinstance(f, dict) else {}


def _rows(run: dict[str, Any], key: str) -> list[dict[str, Any]]:
    rows = _fault(run).get(key)
    if not isinstance(rows, list):
        return []
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("t_s"), int | float)]


def timeline(run: dict[str, Any], key: str = "wal") -> pd.DataFrame:
    """One of the fault block's per-second lists as a table: ``wal`` (per slot), ``backlog`` (the
    broker's) or ``consumer_lag`` (per consumer); empty when the run has none."""
    return pd.DataFrame(_rows(run, key))


def fault_window(run: dict[str, Any]) -> tuple[float, float] | None:
    """(start, end) of the fault, seconds after the gate: the ``during`` phase when the run has one,
    else its first to last event (a cleanup's or the guard's excluded), else the spec's timing."""
    f = _fault(run)
    during = (f.get("phases") or {}).get("during") if isinstance(f.get("phases"), dict) else None
    if isinstance(during, dict) and not math.isnan(_num(during.get("t0_s")) + _num(during.get("t1_s"))):
        return float(during["t0_s"]), float(during["t1_s"])
    times = [e["t_s"] for e in f.get("events") or [] if isinstance(e, dict) and isinstance(e.get("t_s"), int | float)
             and "cleanup" not in str(e.get("what")) and "guard" not in str(e.get("what"))]
    if times:
        return min(times), max(times)
    start = _num(f.get("start_s"))
    return None if math.isnan(start) else (start, start + (_num(f.get("duration_s")) if f.get("duration_s") else 0.0))


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, value) points, value per second; NaN under two distinct times."""
    if len(points) < 2:
        return NAN
    mt = sum(t for t, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    var = sum((t - mt) ** 2 for t, _ in points)
    return NAN if var == 0 else sum((t - mt) * (v - mv) for t, v in points) / var


def _per_slot(run: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in _rows(run, "wal"):
        out.setdefault(str(s.get("slot")), []).append(s)
    return out


def _slot_slope(samples: list[dict[str, Any]], window: tuple[float, float] | None) -> float:
    """Retained WAL's slope over the fault: at least :data:`SLOPE_MIN_S` from its start (a kill is over
    in a second), plus one sample interval."""
    if window is None:
        return NAN
    hi = max(window[1], window[0] + SLOPE_MIN_S) + 1.0
    return slope([(s["t_s"], s["retained_bytes"]) for s in samples
                  if window[0] <= s["t_s"] <= hi and isinstance(s.get("retained_bytes"), int | float)])


def _peak(values: Sequence[Any]) -> float:
    nums = [v for v in map(_num, values) if not math.isnan(v)]
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
    for samples in _per_slot(run).values():
        before = _peak([s.get("unconfirmed_bytes") for s in samples if s["t_s"] < start])
        after = _peak([s.get("unconfirmed_bytes") for s in samples if s["t_s"] >= start])
        source_peak = _peak([source_peak, after])
        grew |= after > max(GROWTH * (0.0 if math.isnan(before) else before), SOURCE_FLOOR)
    if grew:
        places.append("source")
    backlog = _rows(run, "backlog")
    broker_before = _peak([b.get("messages") for b in backlog if b["t_s"] < start])
    broker_peak = _peak([b.get("messages") for b in backlog if b["t_s"] >= start])
    if broker_peak > max(GROWTH * (0.0 if math.isnan(broker_before) else broker_before), BROKER_FLOOR):
        places.append("broker")
    broker = (run.get("pipeline_settings") or {}).get("debezium_sink") or _fault(run).get("debezium_properties")
    unknown = " (broker not sampled)" if broker and not backlog else ""  # an older runner
    if places:
        return "+".join(places) + unknown, source_peak, broker_peak
    return ("none" + unknown if _per_slot(run) or backlog else "—"), source_peak, broker_peak


def recorded(run: dict[str, Any]) -> dict[str, Any]:
    """What the run's fault recorded of itself (``family``, ``stops_service``, ``stops_source``,
    ``hit_consumers``); for a run recorded before those fields, what its kind's class says of the
    recorded kind and parameters. Empty without a fault block."""
    f = _fault(run)
    keys = ("family", "stops_service", "stops_source", "hit_consumers")
    if not f or all(k in f for k in keys):
        return {k: f.get(k) for k in keys}
    cls = fault_kinds.FAULTS.get(str(f.get("kind")))
    if cls is None:
        return {k: f.get(k) for k in keys}
    spec = FaultSpec(str(f.get("spec")), str(f.get("kind")), None, f.get("target"), _num(f.get("start_s")),
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
    rows = [r for r in _rows(run, "consumer_lag")
            if window[0] <= r["t_s"] <= window[1] and r.get("consumer") not in hit]
    return _peak([r.get("lag_messages") for r in rows]), _peak([r.get("lag_s") for r in rows])


WAITED = 0.5  # a consumer's messages waited when its oldest one's lag reached this share of the fault


def _lag_peaks(run: dict[str, Any], window: tuple[float, float], hit: bool) -> tuple[float, float, float]:
    """(peak lag in messages over the fault, peak lag in seconds over the fault, peak lag in seconds
    before it) of the consumers the fault hit (``hit``) or of the others; NaNs without samples."""
    struck = set(recorded(run).get("hit_consumers") or ())
    rows = [r for r in _rows(run, "consumer_lag") if (r.get("consumer") in struck) == hit]
    during = [r for r in rows if window[0] <= r["t_s"] <= window[1]]
    return (_peak([r.get("lag_messages") for r in during]), _peak([r.get("lag_s") for r in during]),
            _peak([r.get("lag_s") for r in rows if r["t_s"] < window[0]]))


def who_waits(run: dict[str, Any], window: tuple[float, float] | None = None) -> str:
    """Whose messages waited while the fault lasted, from the per-consumer lag: ``its messages``
    (those the hit consumer works after it is back: its partitions, shards, share or prefetched
    batch), ``every consumer`` (the others' too), ``nobody`` (the others took its messages), ``—``
    without lag samples. A side waited when its oldest message's lag over the fault reached
    :data:`WAITED` x the fault's length and :data:`GROWTH` x its own peak before the fault."""
    window = window or fault_window(run)
    if window is None or not _rows(run, "consumer_lag"):
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
    during = _num(_phase(run, "during").get("delivered_per_s"))
    rate = _num((run.get("scenario") or {}).get("rate"))
    if not rate > 0:
        rate = _num(_phase(run, "before").get("delivered_per_s"))
    return 100 * during / rate if rate > 0 else NAN


def _phase(run: dict[str, Any], name: str) -> dict[str, Any]:
    phases = _fault(run).get("phases")
    p = phases.get(name) if isinstance(phases, dict) else None
    return p if isinstance(p, dict) else {}


def _phase_cpu(run: dict[str, Any], name: str) -> float:
    """ms CPU/msg of one phase, summed over participants (``unattributed`` left out, as in the
    run's total): the runner's ``cpu_ms_per_msg_total``, else the sum of its ``cpu_ms_per_msg``."""
    phase = _phase(run, name)
    if not math.isnan(_num(phase.get("cpu_ms_per_msg_total"))):
        return float(phase["cpu_ms_per_msg_total"])
    cpu = phase.get("cpu_ms_per_msg")
    if not isinstance(cpu, dict) or not cpu:
        return NAN
    return sum(_num(v) for k, v in cpu.items() if k != "unattributed")


def cell_row(run: dict[str, Any], clean: dict[str, float] | None = None) -> dict[str, Any]:
    """One run as one row of the matrix (:data:`COLUMNS`); ``clean``: each pipeline's ms CPU/msg
    without a fault, for ``cpu_vs_clean_ms``."""
    s, f = run.get("scenario") or {}, _fault(run)
    mine = recorded(run)
    acc: dict[str, Any] = f["accounting"] if isinstance(f.get("accounting"), dict) else {}
    window = fault_window(run) if f else None
    slots = _per_slot(run)
    where, source_peak, broker_peak = backlog_where(run, window) if f else ("—", NAN, NAN)
    lag, lag_s = _healthy_lag(run, window)
    summary: dict[str, Any] = f["wal_summary"] if isinstance(f.get("wal_summary"), dict) else {}
    cpu = _num(run.get("cpu_ms_per_msg"))
    unattributed = _num((run.get("cpu_s") or {}).get("unattributed"))
    messages = _num(s.get("messages"))
    return {
        "pipeline": s.get("pipeline"), "fault": _kind(s.get("fault")),
        "spec": s.get("fault") or "", "family": mine.get("family") or "—", "hit": _hit(run, mine),
        "success": bool(run.get("success")),
        "lost": _num(acc.get("lost")), "duplicates": _num(acc.get("extra_calls")),
        "max_burst": _num(acc.get("max_burst")), "resume_s": _num(acc.get("time_to_resume_s")),
        "recovery_s": _num(f.get("recovery_s")),
        "slots_back_s": _peak([v.get("recovered_after_s") for v in summary.values() if isinstance(v, dict)]),
        "wal_peak_mb": _peak([x.get("retained_bytes") for v in slots.values() for x in v]) / 2**20,
        "wal_slope_kb_s": _peak([_slot_slope(v, window) for v in slots.values()]) / 1024,
        "backlog_where": where, "source_backlog_peak_kb": source_peak / 1024, "broker_backlog_peak": broker_peak,
        "healthy_lag_peak": lag, "healthy_lag_peak_s": lag_s,
        "hit_lag_peak": _lag_peaks(run, window, True)[0] if window else NAN,
        "waits": who_waits(run, window) if f else "—", "delivered_during_pct": delivered_during_pct(run) if f else NAN,
        "p99_during_ms": _num((_phase(run, "during").get("latency_ms") or {}).get("p99")),
        "cpu_ms_per_msg": cpu,
        "cpu_vs_clean_ms": cpu - (clean or {}).get(str(s.get("pipeline")), NAN) if f else NAN,
        "recovery_cpu_ms": _phase_cpu(run, "after") - _phase_cpu(run, "before"),
        "excess_cpu_s": _num((f.get("excess_cpu") or {}).get("total_s")),
        "loadavg_1m": _num(run.get("loadavg_1m")),
        "unattributed_ms": unattributed * 1000 / messages if messages else NAN,
        "run_id": run.get("run_id"), "error": run.get("error"),
    }


DEAD_CONSUMER = ("consumer_stop", "one")  # (family, hit) of the cells that stop one consumer of several


def _hit(run: dict[str, Any], mine: dict[str, Any]) -> str:
    """Which consumers the fault hit directly: ``one`` (or some), ``all``, ``none`` (a service, a
    slot of Debezium's, the load); ``—`` without a fault."""
    if not _fault(run):
        return "—"
    hit = set(mine.get("hit_consumers") or ())
    consumers = int((run.get("scenario") or {}).get("consumers") or 0)
    return "none" if not hit else "all" if hit >= set(range(consumers)) else "one"


def _dead_consumer(t: pd.DataFrame) -> pd.Series:
    """The cells whose fault stopped one consumer of several (the backlog a dead consumer leaves)."""
    return (t["family"] == DEAD_CONSUMER[0]) & (t["hit"] == DEAD_CONSUMER[1])


def _kind(spec: Any) -> str:
    if not spec:
        return "none"
    try:
        return parse_fault(str(spec)).kind
    except ValueError:
        return str(spec)


def _clean(results: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each pipeline's ms CPU/msg in its successful clean cell (the last one, if several)."""
    return {r["scenario"]["pipeline"]: _num(r.get("cpu_ms_per_msg")) for r in results
            if r.get("success") and not (r.get("scenario") or {}).get("fault") and r.get("scenario")}


def matrix_table(results: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per cell (:data:`COLUMNS`), in the order run: what each fault cost each pipeline."""
    clean = _clean(results)
    table = pd.DataFrame([cell_row(r, clean) for r in results], columns=list(COLUMNS))
    return table.astype({c: "Int64" for c in COUNTS})


def wal_table(results: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Per fault cell and slot: peak WAL retained and unconfirmed (MB), the retained slope over the
    fault (KB/s), ``wal_status`` values seen, seconds after the fault until back in band."""
    rows = []
    for run in results:
        f = _fault(run)
        summary: dict[str, Any] = f["wal_summary"] if isinstance(f.get("wal_summary"), dict) else {}
        window = fault_window(run) if f else None
        for slot, samples in _per_slot(run).items():
            info: dict[str, Any] = summary[slot] if isinstance(summary.get(slot), dict) else {}
            rows.append({
                "pipeline": (run.get("scenario") or {}).get("pipeline"),
                "spec": (run.get("scenario") or {}).get("fault"),
                "slot": slot, "retained_peak_mb": _peak([s.get("retained_bytes") for s in samples]) / 2**20,
                "unconfirmed_peak_mb": _peak([s.get("unconfirmed_bytes") for s in samples]) / 2**20,
                "slope_kb_s": _slot_slope(samples, window) / 1024,
                "wal_status": ",".join(info.get("wal_status") or sorted({str(s.get("wal_status")) for s in samples})),
                "back_in_band_s": _num(info.get("recovered_after_s")),
            })
    return pd.DataFrame(rows, columns=["pipeline", "spec", "slot", "retained_peak_mb", "unconfirmed_peak_mb",
                                       "slope_kb_s", "wal_status", "back_in_band_s"])


def by_pipeline(table: pd.DataFrame) -> pd.DataFrame:
    """The matrix per pipeline, for choosing between architectures: fault cells run, cells that
    lost messages and how many, duplicates, the slowest resume, the median and longest recovery,
    the most WAL any slot retained, and where a dead consumer's backlog lived."""
    t = table[table["fault"] != "none"]
    rows = []
    for pipeline, g in t.groupby("pipeline", sort=False):
        dead = g.loc[_dead_consumer(g), "backlog_where"]
        rows.append({
            "pipeline": pipeline, "fault_cells": len(g), "cells_with_loss": int(_positive(g["lost"]).sum()),
            "lost": g["lost"].sum(min_count=1), "duplicates": g["duplicates"].sum(min_count=1),
            "worst_resume_s": g["resume_s"].max(), "median_recovery_s": g["recovery_s"].median(),
            "worst_recovery_s": g["recovery_s"].max(), "wal_peak_mb": g["wal_peak_mb"].max(),
            "dead_consumer_backlog": dead.iloc[0] if not dead.empty else "—",
        })
    return pd.DataFrame(rows, columns=["pipeline", "fault_cells", "cells_with_loss", "lost", "duplicates",
                                       "worst_resume_s", "median_recovery_s", "worst_recovery_s", "wal_peak_mb",
                                       "dead_consumer_backlog"])


def shown(table: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """The table for reading: numbers rounded, what was not measured as ``—``."""
    return table.round(digits).astype(object).where(table.notna(), "—")


# Figures and the plain-language reading ---------------------------------------------------------

def wal_figure(results: Sequence[dict[str, Any]], kind: str = "consumer-dead") -> Any:
    """WAL retained on the source over time, one panel per pipeline, one line per slot, for the
    ``kind`` cell of each pipeline; the fault's window shaded. None when no such cell has samples."""
    from matplotlib.figure import Figure

    cells = [r for r in results if _kind((r.get("scenario") or {}).get("fault")) == kind and _per_slot(r)]
    if not cells:
        return None
    fig = Figure(figsize=(3.4 * len(cells), 3.2), layout="constrained")
    axes = fig.subplots(1, len(cells), sharey=True, squeeze=False)[0]
    for ax, run in zip(axes, cells, strict=True):
        for slot, samples in sorted(_per_slot(run).items()):
            ax.plot([s["t_s"] for s in samples], [_num(s.get("retained_bytes")) / 2**20 for s in samples],
                    label=slot, lw=1.2)
        window = fault_window(run)
        if window:
            ax.axvspan(*window, color="tab:red", alpha=0.12, label="fault")
        ax.set(title=f"{run['scenario']['pipeline']}", xlabel="s after the gate")
        ax.grid(alpha=0.3)
        outside_legend(ax, fontsize="x-small")
    axes[0].set_ylabel("WAL retained (MB)")
    peaks = {run["scenario"]["pipeline"]: max((_num(s.get("retained_bytes")) / 2**20 for ss in _per_slot(run).values()
                                               for s in ss), default=0.0) for run in cells}
    most = max(peaks, key=lambda p: peaks[p])
    return finding(fig, f"{kind}: {most} pins the most WAL on the source, {peaks[most]:,.0f} MB at its peak",
                   "WAL each replication slot retains over the run, one panel per pipeline; shaded: the fault.")


def lag_figure(results: Sequence[dict[str, Any]], kind: str = "consumer-dead") -> Any:
    """Per pipeline's ``kind`` cell: each consumer's lag (messages) and the broker's backlog over time,
    the fault's window shaded. None when no cell sampled either."""
    from matplotlib.figure import Figure

    cells = [r for r in results if _kind((r.get("scenario") or {}).get("fault")) == kind
             and (_rows(r, "consumer_lag") or _rows(r, "backlog"))]
    if not cells:
        return None
    fig = Figure(figsize=(3.4 * len(cells), 3.2), layout="constrained")
    axes = fig.subplots(1, len(cells), sharey=True, squeeze=False)[0]
    for ax, run in zip(axes, cells, strict=True):
        lag = timeline(run, "consumer_lag")
        hit_consumers = set(recorded(run).get("hit_consumers") or ())
        for c, g in (lag.groupby("consumer") if not lag.empty else []):
            hit = " (hit)" if c in hit_consumers else ""
            ax.plot(g["t_s"], g["lag_messages"], lw=1.2, label=f"consumer {c}{hit}")
        backlog = timeline(run, "backlog")
        if not backlog.empty:
            ax.plot(backlog["t_s"], backlog["messages"], "k--", lw=1, label=f"in {backlog['where'].iloc[0]}")
        window = fault_window(run)
        if window:
            ax.axvspan(*window, color="tab:red", alpha=0.12)
        ax.set(title=run["scenario"]["pipeline"], xlabel="s after the gate")
        ax.grid(alpha=0.3)
        outside_legend(ax, fontsize="x-small")
    axes[0].set_ylabel("messages behind")
    return finding(fig, f"{kind}: where the messages wait while a consumer is dead, pipeline by pipeline",
                   "Each consumer's lag (messages claimed by nobody yet) and the broker's backlog, sampled every "
                   "second; shaded: the fault.")


def _list(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "none"


def _fmt(x: Any, unit: str = "", digits: int = 1) -> str:
    return "—" if pd.isna(x) else f"{float(x):,.{digits}f}{unit}"


def _positive(column: pd.Series) -> pd.Series:
    """``column > 0`` with what was not measured as False."""
    return (pd.to_numeric(column, errors="coerce") > 0).fillna(False).astype(bool)


def reading(table: pd.DataFrame) -> list[str]:
    """The matrix in plain sentences, every figure read from ``table`` (:func:`matrix_table`)."""
    t = table[table["fault"] != "none"]
    if t.empty:
        return ["No fault cell has run yet."]
    out = []
    lossy = t[_positive(t["lost"])]
    measured = t["lost"].notna()
    lossy_cells = _list([f"{r.pipeline} {r.fault} ({int(r.lost):,})" for r in lossy.itertuples()])
    out.append(f"**Losses**: {int((t['lost'] == 0).fillna(False).sum())} of {int(measured.sum())} accounted cells "
               "lost nothing" + (f"; lost messages in {lossy_cells}." if not lossy.empty else "."))
    dup = t[_positive(t["duplicates"])].sort_values("duplicates", ascending=False)
    out.append("**Duplicates** (re-worked, at-least-once): "
               + (_list([f"{r.pipeline} {r.fault} {int(r.duplicates):,} (burst {_fmt(r.max_burst, digits=0)})"
                         for r in dup.itertuples()]) + "." if not dup.empty else "none in any cell."))
    dead = t[_dead_consumer(t)]
    if not dead.empty:
        out.append("**A dead consumer** (WAL retained on the source, peak and slope over the fault; where the "
                   "backlog lived; the healthy consumer's peak lag): " + _list([
                       f"{r.pipeline}: {_fmt(r.wal_peak_mb, ' MB', 2)} at {_fmt(r.wal_slope_kb_s, ' KB/s')}, "
                       f"backlog in {r.backlog_where}, healthy lag {_fmt(r.healthy_lag_peak, ' msgs', 0)}"
                       for r in dead.itertuples()]) + ".")
    resume = t.dropna(subset=["resume_s"])
    if not resume.empty:
        fast, slow = resume.loc[resume["resume_s"].idxmin()], resume.loc[resume["resume_s"].idxmax()]
        out.append(f"**Resume** after the fault ranged from {fast['resume_s']:.2f} s ({fast['pipeline']} "
                   f"{fast['fault']}) to {slow['resume_s']:.2f} s ({slow['pipeline']} {slow['fault']}).")
    rec = t.dropna(subset=["recovery_s"])
    if not rec.empty:
        worst = rec.loc[rec["recovery_s"].idxmax()]
        out.append(f"**Recovery** (rate and lag back in the pre-fault band): median {rec['recovery_s'].median():.1f} s "
                   f"over {len(rec)} cells, longest {worst['recovery_s']:.1f} s "
                   f"({worst['pipeline']} {worst['fault']}).")
    cost = t.dropna(subset=["cpu_vs_clean_ms"])
    if not cost.empty:
        by = cost.groupby("pipeline")["cpu_vs_clean_ms"].median()
        out.append("**CPU of a fault** (median over faults, ms CPU/msg above the clean cell at the same rate): "
                   + _list([f"{p} {v:+.3f}" for p, v in by.items()]) + ".")
    failed = t[~t["success"].astype(bool) & ~_positive(t["lost"])]
    if not failed.empty:
        out.append("**Failed without a loss** (the run's error says why): "
                   + _list([f"{r.pipeline} {r.fault}: {str(r.error).splitlines()[0][:160]}"
                            for r in failed.itertuples()]) + ".")
    load = table["loadavg_1m"].dropna()
    if not load.empty:
        out.append(f"Measured with a 1-min load average of {load.min():.1f}-{load.max():.1f} "
                   f"(median {load.median():.1f}); "
                   "times are slower on a loaded machine, the counts are not.")
    return out
