"""A run's readings at its end: the sampler's window, the probe, the idle baseline, the staircase,
the cost split, the fault's block and provenance, gathered into the record run.json is assembled from."""

from __future__ import annotations

import logging
from typing import Any

from lab import __version__
from lab.measure import pgbackends, probe, steady
from lab.measure.idle import idle_rates_for
from lab.measure.provenance import client_versions, provenance
from lab.measure.sampler import Sampler, Snapshot
from lab.measure.services import stack_record
from lab.measure.staircase import step_rows
from lab.measure.staircase import summary as step_summary
from lab.pipelines.versions import broker_client_versions
from lab.runner.assembly import SCHEMA_VERSION, verdict_of, window_cpu_s, window_edges
from lab.runner.context import RunContext
from lab.runner.verdict import planned_messages
from lab.workload import HARNESS

log = logging.getLogger(__name__)


class RunReadings:
    """What one run read at its end, as the record :func:`lab.runner.assembly.assemble` turns into
    run.json (a part of :class:`lab.runner.Run`, over its state): the sampler's window, the probe, the idle
    baseline's rates, the staircase, the fault's block, provenance. The verdict and run.json's
    shape are not here: :mod:`lab.runner.verdict`, :mod:`lab.runner.assembly`."""

    def __init__(self, run: RunContext) -> None:
        self.run = run  # the run's state, shared with its other parts and the fault injector

    def record(self, started_at: str, sampler: Sampler | None, sent: dict[str, Any],
                consumers: list[dict[str, Any]], checks: dict[str, Any], error: str | None) -> dict[str, Any]:
        s = self.run.scenario
        m = planned_messages(s.as_parameters(), sent)
        t0, t1 = window_edges(sent, consumers)
        window: dict[str, Any] = {}
        # per-participant figures derived from the timelines, each a block of run.json
        derived: dict[str, Any] = {"cost_split": None, "postgres_backends": None}
        if sampler is not None and t0 and t1 and t1 > t0:
            timeline = sampler.timeline()
            a, b = interpolate(timeline, t0), interpolate(timeline, t1)
            window = sampler.window(a, b)
            self.run.samples = sampler.timeline_rows(origin=a)
            cpu_s = window_cpu_s(window)
            derived["cost_split"] = self._cost_split(sampler, a, b, cpu_s, m)
            if {"gate", "drained"} <= self.run.pg_edges.keys():  # PostgreSQL by what its processes do
                derived["postgres_backends"] = pgbackends.breakdown(
                    self.run.pg_edges["gate"], self.run.pg_edges["drained"], cpu_s.get("postgres"), m)
        inj = self.run.injector
        facts = None
        if inj is not None:
            facts = inj.facts(s.claim)
        record: dict[str, Any] = {
            "record_schema": SCHEMA_VERSION,
            "run_id": self.run.run_id, "started_at": started_at, "scenario": s.as_parameters(),
            "consumer_layout": s.layout, "pipeline_settings": self.run.pipeline.describe(),
            "error": error, "sent": sent, "consumers": consumers, "checks": checks,
            "helpers": self.run.helper_results,
            "ended": sorted(self.run.ended), "accounting": self.run.accounting,
            "fault_facts": facts, "fault_block": None,
            "window": window or None,
            "speed": probe.summarise(self.run.scratch / "probe.json", t0, t1) if t0 and t1 else None,
            "idle_baseline": self._idle_baseline(),
            "latency_ms": self.run.latency_ms, "latency_from_due_ms": self.run.latency_from_due_ms,
            "staircase": self._staircase(sampler, sent) if s.rate_steps else {},
            "slots": self.run.slot_stats,
            "vacuum": self.run.vacuum,
            "disk_guard": self.run.disk_guard.record(),
            "network": self.run.net_window.record() if self.run.net_window is not None else None,
            "disk": self.run.disk_window.record() if self.run.disk_window is not None else None,
            "wal": self.run.wal_window.record(),
            "derived": derived,
            "provenance": {
                **provenance(root=self.run.settings.root, cpu_method=self.run.cpu_method, services=self._versions(),
                             clients=client_versions() | broker_client_versions(), window=self.run.host_window),
                **stack_record(self.run.stack), "harness": HARNESS, "lab_version": __version__},
        }
        if inj is not None:  # its block reads the accounting the verdict completed
            acc = verdict_of(record).accounting
            record["fault_block"] = inj.record(acc, sampler.timeline() if sampler is not None else None)
        return record

    def _cost_split(self, sampler: Sampler | None, a: Snapshot, b: Snapshot, cpu_s: dict[str, float],
                    m: int) -> dict[str, Any] | None:
        """run.json's ``cost_split``: the window's CPU as F + c·M (:mod:`lab.measure.steady`), from the
        sampler's readings inside the window and the wall times of every insert and work call."""
        if sampler is None or self.run.flow is None:
            return None
        groups = sampler.groups
        samples = []
        for snap in sampler.timeline():
            if not a.t_mono <= snap.t_mono <= b.t_mono:
                continue
            rel = {n: snap.cpu_s[n] - a.cpu_s.get(n, 0.0) for n in snap.cpu_s}
            rel.update({g: sum(rel.get(n, 0.0) for n in names) for g, names in groups.items()})
            samples.append(steady.Sample(snap.t_wall, rel, t_s=snap.t_mono - a.t_mono))
        inserted, delivered = self.run.flow
        return steady.split(samples, cpu_s, m, inserted, delivered)

    def _staircase(self, sampler: Sampler | None, sent: dict[str, Any]) -> dict[str, Any]:
        """run.json's ``steps``, ``max_sustainable_rate`` and ``staircase`` (:mod:`lab.measure.staircase`),
        from the rows' ``created_at``, the work calls and the sampler's timeline; a failure to
        compute them is logged and leaves ``steps`` None (the run's own verdict stands)."""
        s, data = self.run.scenario, self.run.stair_data
        rates = [r for r, _, _ in s.staircase]
        out: dict[str, Any] = {"steps": None, "max_sustainable_rate": None,
                               "staircase": {"rates": rates, "step_s": s.step_s, "stop": self.run.stair_stop}}
        if data is None or not sent.get("gate_opened_at"):
            return out
        try:
            steps = step_rows(
                s.staircase[:sent.get("steps_sent") or 0], gate_at=sent["gate_opened_at"], step_s=s.step_s,
                created_at=data["created_at"], arrival_ids=data["arrivals"]["ids"],
                arrival_t=data["arrivals"]["t"], consumers=s.consumers, batch_size=s.batch_size,
                timeline=sampler.timeline() if sampler is not None else None,
                groups=sampler.groups if sampler is not None else None)
        except Exception as exc:  # a measurement: never fails the run, never silent
            log.warning("run %s: steps not measured: %s: %s", self.run.run_id, type(exc).__name__, exc)
            return out
        block = step_summary(steps, rates, stop=self.run.stair_stop)
        return {"steps": steps, "max_sustainable_rate": block["max_sustainable_rate"],
                "staircase": {**block, "step_s": s.step_s}}

    def _idle_baseline(self) -> dict[str, Any] | None:
        """The series' idle baseline's rates for this run's participants (:mod:`lab.measure.idle`), or None."""
        if not self.run.idle:
            return None
        sink = self.run.pipeline.cdc_sink if self.run.scenario.producer == "web" else None
        idle = self.run.idle
        return {"measured_at": idle.get("measured_at"), "cpu_method": idle.get("cpu_method", "cgroup"),
                "cpu_s_per_s": idle_rates_for(idle, cdc_sink=sink)}

    def _versions(self) -> dict[str, str]:
        out = {}
        for status in self.run.stack.status():
            if status.version:
                out[status.name] = status.version
        return out


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
