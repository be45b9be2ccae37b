"""A run's record: what each phase returned, gathered at its end into the one dict run.json is
assembled from (:func:`record`). The sampler's window, the probe, the idle baseline, the cost split
and provenance are read here; the verdict and run.json's shape are not: :mod:`lab.runner.verdict`,
:mod:`lab.runner.assembly`."""

from __future__ import annotations

import logging
from typing import Any

from lab import __version__
from lab.measure import pgbackends, probe, steady
from lab.measure.disk import DiskGuard
from lab.measure.idle import idle_rates_for
from lab.measure.provenance import client_versions, provenance
from lab.measure.sampler import Sampler, Snapshot
from lab.measure.services import stack_record
from lab.pipelines.versions import broker_client_versions
from lab.runner.assembly import SCHEMA_VERSION, window_cpu_s, window_edges
from lab.runner.drain import Observer
from lab.runner.environment import RunEnv
from lab.runner.values import Checked, Drained, Finished, Latency, Settled, Stopped
from lab.runner.verdict import planned_messages
from lab.runner.windows import Windows
from lab.workload import HARNESS

log = logging.getLogger(__name__)


def record(env: RunEnv, *, started_at: str, error: str | None, drained: Drained | None, stopped: Stopped,
           settled: Settled | None, checked: Checked | None, windows: Windows, guard: DiskGuard,
           observer: Observer, idle: dict[str, Any] | None, interrupted: str | None) -> Finished:
    """The run's record from what its phases returned (None: the run failed before that phase),
    and the sampler's timeline for samples.csv."""
    s = env.scenario
    sent = drained.sent if drained is not None else {}
    latency = checked.latency if checked is not None else Latency()
    m = planned_messages(s.as_parameters(), sent)
    t0, t1 = window_edges(sent, stopped.consumers)
    sampler = windows.sampler
    window: dict[str, Any] = {}
    samples: list[dict[str, Any]] = []
    # per-participant figures derived from the timelines, each a block of run.json
    derived: dict[str, Any] = {"cost_split": None, "postgres_backends": None}
    if sampler is not None and t0 and t1 and t1 > t0:
        timeline = sampler.timeline()
        a, b = interpolate(timeline, t0), interpolate(timeline, t1)
        window = sampler.window(a, b)
        samples = sampler.timeline_rows(origin=a)
        cpu_s = window_cpu_s(window)
        derived["cost_split"] = _cost_split(sampler, a, b, cpu_s, m, latency)
        if {"gate", "drained"} <= windows.backends.keys():  # PostgreSQL by what its processes do
            derived["postgres_backends"] = pgbackends.breakdown(
                windows.backends["gate"], windows.backends["drained"], cpu_s.get("postgres"), m)
    out: dict[str, Any] = {
        "record_schema": SCHEMA_VERSION,
        "run_id": env.run_id, "started_at": started_at, "scenario": s.as_parameters(),
        "consumer_layout": s.layout, "pipeline_settings": env.pipeline.describe(),
        "error": error, "sent": sent, "consumers": stopped.consumers,
        "checks": checked.checks if checked is not None else {},
        "helpers": stopped.helpers, "ended": stopped.ended,
        "accounting": checked.accounted.accounting if checked is not None and checked.accounted else None,
        "fault_facts": None, "fault_block": None,
        "window": window or None,
        "speed": probe.summarise(env.scratch / "probe.json", t0, t1) if t0 and t1 else None,
        "idle_baseline": _idle_baseline(env, idle),
        "latency_ms": latency.latency_ms, "latency_from_due_ms": latency.latency_from_due_ms,
        "staircase": {},
        "slots": settled.slots if settled is not None else {},
        "vacuum": settled.vacuum if settled is not None else None,
        "disk_guard": guard.record(),
        **windows.record(),
        "derived": derived,
        "provenance": {
            **provenance(root=env.settings.root, cpu_method=env.cpu_method, services=_versions(env),
                         clients=client_versions() | broker_client_versions(), window=windows.host),
            **stack_record(env.stack), "harness": HARNESS, "lab_version": __version__},
    }
    out.update(observer.blocks(out, sampler, latency, checked.accounted if checked is not None else None))
    return Finished(out, samples, interrupted)


def _cost_split(sampler: Sampler, a: Snapshot, b: Snapshot, cpu_s: dict[str, float], m: int,
                latency: Latency) -> dict[str, Any] | None:
    """run.json's ``cost_split``: the window's CPU as F + c·M (:mod:`lab.measure.steady`), from the
    sampler's readings inside the window and the wall times of every insert and work call."""
    if latency.flow is None:
        return None
    groups = sampler.groups
    samples = []
    for snap in sampler.timeline():
        if not a.t_mono <= snap.t_mono <= b.t_mono:
            continue
        rel = {n: snap.cpu_s[n] - a.cpu_s.get(n, 0.0) for n in snap.cpu_s}
        rel.update({g: sum(rel.get(n, 0.0) for n in names) for g, names in groups.items()})
        samples.append(steady.Sample(snap.t_wall, rel, t_s=snap.t_mono - a.t_mono))
    inserted, delivered = latency.flow
    return steady.split(samples, cpu_s, m, inserted, delivered)


def _idle_baseline(env: RunEnv, idle: dict[str, Any] | None) -> dict[str, Any] | None:
    """The series' idle baseline's rates for this run's participants (:mod:`lab.measure.idle`), or None."""
    if not idle:
        return None
    sink = env.pipeline.capabilities.cdc_sink if env.scenario.producer == "web" else None
    return {"measured_at": idle.get("measured_at"), "cpu_method": idle.get("cpu_method", "cgroup"),
            "cpu_s_per_s": idle_rates_for(idle, cdc_sink=sink)}


def _versions(env: RunEnv) -> dict[str, str]:
    return {status.name: status.version for status in env.stack.status() if status.version}


def interpolate(timeline: list[Snapshot], t: float) -> Snapshot:
    """The counters at monotonic time ``t``, linear between the two readings around it.

    The runner reads every counter right before opening the senders' gate and right after
    the drain is seen; the window's exact edges (first send completion, last work completion)
    fall between those and the background samples, so the interpolated span is short.
    """
    snaps = sorted(timeline, key=lambda s: s.t_mono)
    before = [s for s in snaps if s.t_mono <= t]
    after = [s for s in snaps if s.t_mono >= t]
    if not before or not after:
        raise ValueError(f"t={t} is outside the sampled timeline")
    a, b = before[-1], after[0]
    if b.t_mono == a.t_mono:
        return a
    f = (t - a.t_mono) / (b.t_mono - a.t_mono)

    def mix(x: float, y: float) -> float:
        return x + (y - x) * f

    names = a.cpu_s.keys() & b.cpu_s.keys()
    return Snapshot(
        t_mono=t,
        t_wall=mix(a.t_wall, b.t_wall),
        cpu_s={n: mix(a.cpu_s[n], b.cpu_s[n]) for n in names},
        rss_mb={n: mix(a.rss_mb.get(n, 0.0), b.rss_mb.get(n, 0.0)) for n in names},
        host_busy_s=mix(a.host_busy_s, b.host_busy_s),
        sampler_cpu_s=mix(a.sampler_cpu_s, b.sampler_cpu_s),
    )
