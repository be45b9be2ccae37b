"""run.json: the counters, the Success predicate, the window's CPU per participant, provenance."""

from __future__ import annotations

import logging
from typing import Any

from lab import __version__
from lab.measure import probe, steady
from lab.measure.idle import idle_rates_for, net_of_idle
from lab.measure.latency import achieved_rate
from lab.measure.provenance import client_versions, provenance
from lab.measure.sampler import Sampler, Snapshot
from lab.measure.services import stack_record
from lab.measure.staircase import step_rows
from lab.measure.staircase import summary as step_summary
from lab.pipelines.versions import broker_client_versions
from lab.runner.context import RunContext
from lab.workload import HARNESS

log = logging.getLogger(__name__)


class RunResult(RunContext):
    """What one run stores (a part of :class:`lab.runner.Run`)."""

    def _assemble(self, started_at: str, sampler: Sampler | None, sent: dict[str, Any],
                  consumers: list[dict[str, Any]], checks: dict[str, Any], error: str | None) -> dict[str, Any]:
        s = self.scenario
        processed = sum(c.get("processed", 0) for c in consumers)
        counters = {
            "sent": sent.get("sent", 0), "send_failed": sent.get("send_failed", 0),
            "processed": processed,
            "skipped": sum(c.get("skipped", 0) for c in consumers),
            "failures": sum(c.get("failures", 0) for c in consumers),
            "db_ops": sum(c.get("db_ops", 0) for c in consumers),
            "decoded_bytes": sum(c.get("decoded_bytes", 0) for c in consumers),
            **checks,
        }
        consumer_errors = [f"consumer {c['index']}: {c['error']}" for c in consumers
                           if c.get("error") and c.get("index") not in self.ended]  # ended: the fault's outcome
        if error is None and consumer_errors:
            error = "; ".join(consumer_errors)
        # a staircase the runner stopped early meant to send only the messages of its steps run
        m = (sent.get("planned") or s.messages) if s.rate_steps else s.messages
        acc = self.accounting
        if self.injector is None:
            success = (
                error is None and counters["send_failed"] == 0 and counters["sent"] == m
                and processed == m and checks.get("distinct_ids") == m
                and checks.get("work_calls") == m and checks.get("work_distinct") == m
                and checks.get("ids_match") is not False  # the id sets, not only their sizes
            )
        else:  # at-least-once: duplicates allowed and counted, nothing lost (lab.runner.accounting)
            extra = len(self.injector.extra_ids)  # big-transaction's rows
            if self.injector.fault.kind in ("postgres-restart", "postgres-failover"):
                # an INSERT refused while PostgreSQL was down is a message never sent (counted, the
                # sender does not retry), not a lost one; one whose commit raced the shutdown may
                # have a row without a 2xx: a message too (rows_without_reply), and must be worked
                sends_ok = counters["sent"] + counters["send_failed"] == m
                rows_ok = acc is not None and counters["sent"] + extra <= acc["messages"] <= m + extra
                if acc is not None:
                    acc["not_sent"] = counters["send_failed"]
                    acc["rows_without_reply"] = max(0, acc["messages"] - extra - counters["sent"])
                    # a failover's crash: acknowledged inserts the promoted standby never received
                    acc["acknowledged_absent"] = max(0, counters["sent"] + extra - acc["messages"])
            else:
                sends_ok = counters["send_failed"] == 0 and counters["sent"] == m
                rows_ok = acc is not None and acc["messages"] == m + extra
            success = (
                error is None and sends_ok and rows_ok
                and acc is not None and acc["lost"] == 0 and acc["foreign"] == 0 and acc["adds_up"]
            )
            if error is None and not success:
                error = "fault accounting: " + (", ".join(
                    f"{k}={acc.get(k)}" for k in ("messages", "lost", "foreign", "extra_calls", "adds_up",
                                                  "lost_claimed_by", "acknowledged_absent")
                    if k in acc
                ) if acc else "not measured") + f", sent={counters['sent']}, send_failed={counters['send_failed']}"
                if acc and set(acc.get("lost_claimed_by") or ()) - {"(unclaimed)"} and s.claim == "owner":
                    error += ("; the reference's claim binds a row to a consumer name: with --claim takeover "
                              "a live consumer takes over the rows of one that is gone")
        if self.injector is not None and self.injector.invalidation is not None and error is not None:
            inv = self.injector.invalidation  # said first: the loss is this slot's
            error = (f"slot {inv['slot']} invalidated ({inv['invalidation_reason']}, wal_status "
                     f"{inv['wal_status']}), reader {inv['consumer']} ended; " + error)
        if error is None and not success:
            error = "counters do not match: " + ", ".join(
                f"{k}={counters.get(k)}" for k in ("sent", "send_failed", "processed", "distinct_ids", "work_calls",
                                                   "work_distinct", "ids_match")
            )
        t0 = sent.get("first_send_mono")
        lasts = [c["last_work_mono"] for c in consumers if c.get("last_work_mono")]
        t1 = max(lasts) if lasts else None
        cpu_s: dict[str, float] = {}
        mem_mb: dict[str, float] = {}
        mem_mb_max: dict[str, float] = {}
        window: dict[str, Any] = {}
        if sampler is not None and t0 and t1 and t1 > t0:
            timeline = sampler.timeline()
            a, b = interpolate(timeline, t0), interpolate(timeline, t1)
            window = sampler.window(a, b)
            self.samples = sampler.timeline_rows(origin=a)
            parts = {n: v for n, v in window["participants"].items() if not n.startswith("consumer-")}
            parts.update(window["groups"])
            cpu_s = {n: v["cpu_s"] for n, v in parts.items()}
            mem_mb = {n: v["rss_mb_mean"] for n, v in parts.items()}
            mem_mb_max = {n: v["rss_mb_max"] for n, v in parts.items()}
            for c in consumers:
                w = window["participants"].get(f"consumer-{c['index']}")
                if w:
                    c["cpu_s"], c["rss_mb_mean"] = w["cpu_s"], w["rss_mb_mean"]
            cpu_s["unattributed"] = window["unattributed_cpu_s"]
        probe_cpu_s = cpu_s.pop("probe", None)  # its own participant, never in the totals
        mem_mb.pop("probe", None), mem_mb_max.pop("probe", None)
        speed = probe.summarise(self.scratch / "probe.json", t0, t1) if t0 and t1 else None
        if speed is not None:
            speed["cpu_s"] = probe_cpu_s
        total = sum(v for k, v in cpu_s.items() if k != "unattributed")
        span = t1 - t0 if t0 and t1 else None
        stair = self._staircase(sampler, sent) if s.rate_steps else {}
        raw = round(total * 1000 / m, 4) if window else None
        cost_split = self._cost_split(sampler, a, b, cpu_s, m) if window else None
        return {
            "run_id": self.run_id,
            "started_at": started_at,
            "scenario": s.as_parameters(),
            "consumer_layout": s.layout,  # what ran: the scenario's ``auto`` resolved (lab.scenario)
            "pipeline_settings": self.pipeline.describe(),
            "success": success,
            "error": error,
            "window_s": round(span, 3) if span else None,
            "cpu_ms_per_msg": raw,
            "cpu_ms_per_msg_norm": probe.normalise(raw, speed),  # at the probe's reference speed
            "speed": speed,
            "cpu_s": cpu_s,
            "cost_split": cost_split,
            "mem_mb": mem_mb,
            "mem_mb_max": mem_mb_max,
            "slots": self.slot_stats,
            "idle": self._idle_block(cpu_s, span or 0.0, m),
            "latency_ms": self.latency_ms,
            "latency_from_due_ms": self.latency_from_due_ms,
            "achieved_rate": achieved_rate(sent, span),
            **stair,
            "counters": counters,
            **({"fault": self.injector.record(acc, sampler.timeline() if sampler is not None else None)}
               if self.injector is not None else {}),
            "senders": sent,
            "consumers": consumers,
            "sampler": {k: window.get(k) for k in ("samples", "host_busy_cpu_s", "sampler_cpu_s",
                                                    "sampler_core_pct")},
            **provenance(root=self.settings.root, cpu_method=self.cpu_method, services=self._versions(),
                         clients=client_versions() | broker_client_versions(), window=self.host_window),
            **stack_record(self.stack),
            "harness": HARNESS,
            "lab_version": __version__,
        }

    def _cost_split(self, sampler: Sampler | None, a: Snapshot, b: Snapshot, cpu_s: dict[str, float],
                    m: int) -> dict[str, Any] | None:
        """run.json's ``cost_split``: the window's CPU as F + c·M (:mod:`lab.measure.steady`), from the
        sampler's readings inside the window and the wall times of every insert and work call."""
        if sampler is None or self.flow is None:
            return None
        groups = sampler.groups
        samples = []
        for snap in sampler.timeline():
            if not a.t_mono <= snap.t_mono <= b.t_mono:
                continue
            rel = {n: snap.cpu_s[n] - a.cpu_s.get(n, 0.0) for n in snap.cpu_s}
            rel.update({g: sum(rel.get(n, 0.0) for n in names) for g, names in groups.items()})
            samples.append(steady.Sample(snap.t_wall, rel, t_s=snap.t_mono - a.t_mono))
        inserted, delivered = self.flow
        return steady.split(samples, cpu_s, m, inserted, delivered)

    def _staircase(self, sampler: Sampler | None, sent: dict[str, Any]) -> dict[str, Any]:
        """run.json's ``steps``, ``max_sustainable_rate`` and ``staircase`` (:mod:`lab.measure.staircase`),
        from the rows' ``created_at``, the work calls and the sampler's timeline; a failure to
        compute them is logged and leaves ``steps`` None (the run's own verdict stands)."""
        s, data = self.scenario, getattr(self, "stair_data", None)
        rates = [r for r, _, _ in s.staircase]
        out: dict[str, Any] = {"steps": None, "max_sustainable_rate": None,
                               "staircase": {"rates": rates, "step_s": s.step_s, "stop": self.stair_stop}}
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
            log.warning("run %s: steps not measured: %s: %s", self.run_id, type(exc).__name__, exc)
            return out
        block = step_summary(steps, rates, stop=self.stair_stop)
        return {"steps": steps, "max_sustainable_rate": block["max_sustainable_rate"],
                "staircase": {**block, "step_s": s.step_s}}

    def _idle_block(self, cpu_s: dict[str, float], window_s: float, messages: int) -> dict[str, Any] | None:
        """This run's cost with the series' idle baseline taken out (lab.measure.idle), or None."""
        if not self.idle or not cpu_s or window_s <= 0:
            return None
        sink = self.pipeline.cdc_sink if self.scenario.producer == "web" else None
        rates = idle_rates_for(self.idle, cdc_sink=sink)
        return {"measured_at": self.idle.get("measured_at"), "cpu_s_per_s": rates,
                # a baseline read by another method than the run's is kept but says so
                "cpu_method": self.idle.get("cpu_method", "cgroup"),
                **net_of_idle(cpu_s, window_s, messages, rates)}

    def _versions(self) -> dict[str, str]:
        out = {}
        for status in self.stack.status():
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
