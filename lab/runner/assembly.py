"""run.json from what a run recorded: a pure function (:func:`assemble`) of one JSON-able dict.

The record (built by :mod:`lab.runner.readings` at the run's end, or read back from a stored
fixture) holds:

* identity: ``run_id``, ``started_at``, ``scenario`` (:meth:`lab.scenario.Scenario.as_parameters`),
  ``consumer_layout``, ``pipeline_settings``;
* what the run counted: ``error`` (the run's own exception), ``sent`` (the senders' result),
  ``consumers`` (each consumer's result), ``checks`` (the verification), ``ended`` (consumers a fault
  ended on purpose), ``accounting`` (fault runs, :mod:`lab.runner.accounting`), ``fault_facts``
  (:class:`lab.runner.verdict.FaultFacts` as a dict, None without a fault) and ``fault_block``
  (the injector's ``fault`` block, its ``accounting`` replaced by the verdict's);
* what the run measured: ``window`` (:meth:`lab.measure.sampler.Sampler.window` between the first
  send and the last work call, None when not measured), ``speed`` (the probe's summary),
  ``idle_baseline`` (the series' idle baseline's rates, None without one), ``latency_ms``,
  ``latency_from_due_ms``, ``staircase`` (``steps``, ``max_sustainable_rate``, ``staircase``, ``warm``; empty
  without a staircase), ``slots``, ``vacuum`` (:mod:`lab.measure.vacuum`; None when not read);
  ``network`` (bytes per host link and per pair of hosts over the
  window under ``LAB_HOSTS=netns``, absent or None otherwise: :mod:`lab.measure.network`);
  ``disk`` (bytes each participant wrote and read over the window and how: :mod:`lab.measure.diskio`)
  and ``wal`` (WAL generated over the window: :mod:`lab.measure.walstats`), absent or None when not read;
* ``derived``: per-participant figures derived from the run's timelines (each a block of run.json
  under its own key, e.g. ``cost_split``); a new figure of that kind is one more key here;
* ``provenance``: run.json's provenance and stack fields, ``harness``, ``lab_version``.

:data:`SCHEMA_VERSION` is the shape of the record (the fixtures under ``tests/unit/runner/fixtures``
carry it); run.json's own schema version lives with :mod:`lab.results`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from lab.measure import probe
from lab.measure.diskio import consumer_bytes, disk_block, host_block
from lab.measure.idle import net_of_idle
from lab.measure.latency import achieved_rate
from lab.measure.network import network_block
from lab.measure.walstats import wal_block
from lab.runner.verdict import FaultFacts, Verdict, consumer_errors, counters_of, judge, planned_messages

SCHEMA_VERSION = 2  # of the record; 1: the first; 2: fault_facts.stops_source (absent: False)


def window_edges(sent: Mapping[str, Any], consumers: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """The measured window: the first send's completion to the last work call's (monotonic)."""
    t0 = sent.get("first_send_mono")
    lasts = [c["last_work_mono"] for c in consumers if c.get("last_work_mono")]
    return t0, (max(lasts) if lasts else None)


def participants_of(window: Mapping[str, Any]) -> dict[str, Any]:
    """The window's participants as run.json names them: the consumers as their group (each one is
    in ``consumers``), every other participant and group by its name."""
    parts = {n: v for n, v in window["participants"].items() if not n.startswith("consumer-")}
    parts.update(window["groups"])
    return parts


def window_cpu_s(window: Mapping[str, Any]) -> dict[str, float]:
    """run.json's ``cpu_s`` from a window: CPU-seconds per participant and ``unattributed``, without
    the speed probe (its own participant, never in the totals)."""
    cpu_s = {n: v["cpu_s"] for n, v in participants_of(window).items()}
    cpu_s["unattributed"] = window["unattributed_cpu_s"]
    cpu_s.pop("probe", None)
    return cpu_s


def verdict_of(record: Mapping[str, Any]) -> Verdict:
    """The run's :class:`~lab.runner.verdict.Verdict` from its record."""
    facts = record.get("fault_facts")
    counters = counters_of(record["sent"], record["consumers"], record["checks"])
    return judge(counters, planned_messages(record["scenario"], record["sent"]), error=record.get("error"),
                 consumer_errors=consumer_errors(record["consumers"], record.get("ended") or ()),
                 fault=FaultFacts(**facts) if facts is not None else None, accounting=record.get("accounting"))


def assemble(record: Mapping[str, Any]) -> dict[str, Any]:
    """run.json's content from a run's record (module docstring); the record is not changed."""
    s = record["scenario"]
    sent, checks = record["sent"], record["checks"]
    consumers = copy.deepcopy(list(record["consumers"]))
    m = planned_messages(s, sent)
    verdict = verdict_of(record)
    t0, t1 = window_edges(sent, consumers)
    window = record.get("window") or {}
    cpu_s: dict[str, float] = {}
    mem_mb: dict[str, float] = {}
    mem_mb_max: dict[str, float] = {}
    if window:
        parts = participants_of(window)
        cpu_s = {n: v["cpu_s"] for n, v in parts.items()}
        mem_mb = {n: v["rss_mb_mean"] for n, v in parts.items()}
        mem_mb_max = {n: v["rss_mb_max"] for n, v in parts.items()}
        for c in consumers:
            w = window["participants"].get(f"consumer-{c['index']}")
            if w:
                c["cpu_s"], c["rss_mb_mean"] = w["cpu_s"], w["rss_mb_mean"]
        cpu_s["unattributed"] = window["unattributed_cpu_s"]
    for c in consumers:  # each consumer's own disk bytes beside its CPU
        if (wb := consumer_bytes(record.get("disk"), c["index"])) is not None:
            c["disk_write_bytes"] = wb
    probe_cpu_s = cpu_s.pop("probe", None)  # its own participant, never in the totals
    mem_mb.pop("probe", None), mem_mb_max.pop("probe", None)
    speed = dict(record["speed"]) if record.get("speed") is not None else None
    if speed is not None:
        speed["cpu_s"] = probe_cpu_s
    total = sum(v for k, v in cpu_s.items() if k != "unattributed")
    span = t1 - t0 if t0 and t1 else None
    raw = round(total * 1000 / m, 4) if window else None
    derived = record.get("derived") or {}
    fault_block = record.get("fault_block")
    return {
        "run_id": record["run_id"],
        "started_at": record["started_at"],
        "scenario": s,
        "consumer_layout": record["consumer_layout"],  # what ran: the scenario's ``auto`` resolved
        "pipeline_settings": record["pipeline_settings"],
        "success": verdict.success,
        "error": verdict.error,
        "window_s": round(span, 3) if span else None,
        "cpu_ms_per_msg": raw,
        "cpu_ms_per_msg_norm": probe.normalise(raw, speed),  # at the probe's reference speed
        "speed": speed,
        "cpu_s": cpu_s,
        # per-participant figures derived from the timelines (window present), each under its key
        **{k: (v if window else None) for k, v in derived.items()},
        "mem_mb": mem_mb,
        "mem_mb_max": mem_mb_max,
        "slots": record.get("slots") or {},
        # the tables' counters and autovacuum's CPU (lab.measure.vacuum); records older than it have none
        **({"vacuum": record["vacuum"]} if "vacuum" in record else {}),
        **({"disk_guard": record["disk_guard"]} if "disk_guard" in record else {}),
        # LAB_HOSTS=netns only: bytes per hop (lab.measure.network)
        **({"network": network_block(record["network"], m)} if record.get("network") else {}),
        # disk bytes per participant and WAL generated over the window (lab.measure.diskio, walstats);
        # records older than them have neither
        **({"disk": disk_block(record["disk"], m), "disk_host": host_block(record["disk"], m),
            "disk_io_controller": record["disk"].get("io_controller")} if record.get("disk") else {}),
        **({"wal": wal_block(record["wal"], m)} if record.get("wal") else {}),
        "idle": idle_block(record.get("idle_baseline"), cpu_s, span or 0.0, m),
        "latency_ms": record.get("latency_ms"),
        "latency_from_due_ms": record.get("latency_from_due_ms"),
        "achieved_rate": achieved_rate(sent, span),
        **(record.get("staircase") or {}),
        "counters": counters_of(sent, consumers, checks),
        **({"fault": {**fault_block, "accounting": verdict.accounting}} if fault_block is not None else {}),
        "senders": sent,
        "consumers": consumers,
        # the results of the pipeline's own processes (wal-relay's relay), where it has any
        **({"helpers": record["helpers"]} if record.get("helpers") else {}),
        "sampler": {k: window.get(k) for k in ("samples", "host_busy_cpu_s", "sampler_cpu_s", "sampler_core_pct")},
        **record["provenance"],
    }


def idle_block(baseline: Mapping[str, Any] | None, cpu_s: Mapping[str, float], window_s: float,
               messages: int) -> dict[str, Any] | None:
    """This run's cost with the series' idle baseline taken out (:mod:`lab.measure.idle`), or None.
    ``baseline``: ``measured_at``, ``cpu_method`` and the rates for this run's pipeline."""
    if not baseline or not cpu_s or window_s <= 0:
        return None
    rates = baseline["cpu_s_per_s"]
    return {"measured_at": baseline.get("measured_at"), "cpu_s_per_s": rates,
            # a baseline read by another method than the run's is kept but says so
            "cpu_method": baseline.get("cpu_method", "cgroup"),
            **net_of_idle(cpu_s, window_s, messages, rates)}
