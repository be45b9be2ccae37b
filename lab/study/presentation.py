"""How results read on a terminal: ``lab run``'s summary and text, a staircase step, a fault
run's accounting, the stack's status and its replication slots. Pure functions of run.json dicts
(and of the stack's status rows) returning text or shortened dicts; :mod:`lab.cli` writes them out."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

SUMMARY_COUNTERS = (
    "sent", "send_failed", "processed", "skipped", "failures", "work_calls", "work_distinct",
    "inbox_rows", "distinct_ids", "claims_min", "claims_max", "db_ops", "decoded_bytes",
)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The one JSON object ``lab run --json`` prints."""
    scenario = result["scenario"]
    counters = result["counters"]
    assert isinstance(scenario, dict) and isinstance(counters, dict)
    out: dict[str, Any] = {
        "run_id": result["run_id"],
        "pipeline": scenario["pipeline"],
        "consumers": scenario["consumers"],
        "messages": scenario["messages"],
        "success": result["success"],
        "error": result["error"],
        "window_s": result["window_s"],
        "cpu_ms_per_msg": result["cpu_ms_per_msg"],
        "cpu_s": result["cpu_s"],
        "mem_mb": result["mem_mb"],
    }
    out.update({k: counters.get(k) for k in SUMMARY_COUNTERS})
    for key in ("latency_ms", "latency_from_due_ms", "achieved_rate", "max_sustainable_rate", "staircase", "warm"):
        if key in result:
            out[key] = result[key]
    if result.get("steps") is not None:
        out["steps"] = [step_line(st) for st in result["steps"]]
    fault = result.get("fault")
    if isinstance(fault, dict):
        out["fault"] = fault_line(fault)
    return out


STEP_FIELDS = ("rate", "achieved_rate", "delivered_per_s", "lag_end", "oldest_age_s", "lag_slope", "sustainable")


def step_line(step: dict[str, Any]) -> dict[str, Any]:
    """One staircase step as ``lab run`` shows it (run.json's ``steps[i]``, shortened)."""
    lat, due, cpu = (step.get(k) or {} for k in ("latency_ms", "latency_from_due_ms", "cpu_ms_per_msg"))
    return {**{k: step.get(k) for k in STEP_FIELDS},
            "p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"),
            "due_p99_ms": due.get("p99"), "cpu_ms_per_msg": cpu.get("total"),
            "failed": step.get("failed")}


FAULT_FIELDS = ("lost", "extra_calls", "max_burst", "once", "repeated", "distinct", "work_calls",
                "messages", "adds_up", "time_to_resume_s", "lost_claimed_by", "per_consumer",
                "big_transaction", "not_sent", "rows_without_reply")


def fault_line(fault: dict[str, Any]) -> dict[str, Any]:
    """A fault run's accounting as ``lab run`` shows it (run.json's ``fault`` block, shortened)."""
    acc = fault.get("accounting") or {}
    assert isinstance(acc, dict)
    wal = fault.get("wal_summary") or {}
    assert isinstance(wal, dict)
    return {"spec": fault.get("spec"), **{k: acc.get(k) for k in FAULT_FIELDS},
            "events": [(e["t_s"], e["what"]) for e in fault.get("events") or []],
            "wal_retained_max_bytes": {k: v["retained_bytes_max"] for k, v in wal.items()},
            "wal_recovered_after_s": {k: v["recovered_after_s"] for k, v in wal.items()},
            "max_retained_wal": fault.get("max_retained_wal"), "guard": fault.get("guard"),
            "invalidation": fault.get("invalidation"),
            "recovery_s": fault.get("recovery_s"), "backlog_peak": fault.get("backlog_peak"),
            "excess_cpu_s": (fault.get("excess_cpu") or {}).get("total_s"),
            "backlog_where": next((b["where"] for b in fault.get("backlog") or []), None),
            "backlog_gaps": len(fault.get("backlog_gaps") or []),
            "phases": {k: {"delivered_per_s": v.get("delivered_per_s"),
                           "cpu_ms_per_msg": v.get("cpu_ms_per_msg_total"),
                           "p99_ms": (v.get("latency_ms") or {}).get("p99")}
                       for k, v in (fault.get("phases") or {}).items()}}


def phases_line(fault: dict[str, Any]) -> str:
    """Recovery, peak backlog and the three phases of :func:`fault_line`, as one printed line."""
    phases = fault.get("phases") or {}
    assert isinstance(phases, dict)
    parts = [f"{k} {v['delivered_per_s']} msg/s {v['cpu_ms_per_msg']} ms CPU/msg p99 {v['p99_ms']} ms"
             for k, v in phases.items()]
    where = fault.get("backlog_where")
    peak = f"{fault.get('backlog_peak')} ({where}, {fault.get('backlog_gaps')} gaps)" if where else "-"
    return (f"recovered after {fault.get('recovery_s')} s, excess CPU {fault.get('excess_cpu_s')} s, "
            f"peak backlog {peak}; " + "; ".join(parts))


def run_text(result: dict[str, Any]) -> str:
    """A run as ``lab run`` prints it without ``--json``: verdict, window, CPU per participant,
    counters, latency, and the staircase's steps or the fault's accounting when there are any."""
    out: list[str] = []
    s = summary(result)
    status = "OK" if s["success"] else f"FAILED: {s['error']}"
    if result.get("cpu_method") not in (None, "cgroup"):  # the fallbacks: docs/operations.md
        status += f" (CPU method {result['cpu_method']}: not exact)"
    out.append(
        f"{s['run_id']}  {s['pipeline']} c{s['consumers']} m{s['messages']}  {status}\n"
        f"window {s['window_s']} s, {s['cpu_ms_per_msg']} ms CPU/msg\n"
    )
    cpu = s["cpu_s"]
    if isinstance(cpu, dict):
        for name, seconds in cpu.items():
            out.append(f"  {name:<16} {seconds:>9.2f} CPU-s\n")
    out.append(
        "  sent {sent} failed {send_failed} processed {processed} skipped {skipped} "
        "work {work_calls}/{work_distinct} claims {claims_min}/{claims_max}\n".format(**s)
    )
    target = result["scenario"].get("rate")
    due = f" (from the due time: {p50_p99(s.get('latency_from_due_ms'))})" if target else ""
    goal = f" (target {target:g})" if target else ""
    out.append(f"  latency {p50_p99(s.get('latency_ms'))}{due}\n"
                     f"  achieved {s.get('achieved_rate') or '-'} msg/s{goal}\n")
    delay = delay_line(result.get("network"))
    if delay:
        out.append(f"  {delay}\n")
    steps = s.get("steps")
    if isinstance(steps, list):
        stair = s.get("staircase") or {}
        top = s.get("max_sustainable_rate")
        found = "" if stair.get("limit_found") else " (every step held: at least that)"
        stop = stair.get("stop")
        out.append(f"  max sustainable rate {top if top is not None else '-'} msg/s{found}"
                         + (f"; stopped early after step {stop['after_step']} (lag {stop['lag']})" if stop else "")
                         + "\n")
        warm = s.get("warm")
        if isinstance(warm, dict):
            out.append(f"  warm {warm['seconds']:g} s at {warm['rate']:g} msg/s ({warm['sent']} messages, not a step), "
                       f"rest {warm['rest_s']:g} s: lag {warm['lag_end']} at its end, "
                       f"{warm['lag_at_first_step']} when the first step began"
                       + ("" if warm["cleared"] else ": NOT cleared, the first step ran on a backlog") + "\n")
        for st in steps:
            out.append(
                "    step {rate:>7g} msg/s: achieved {achieved_rate}, delivered {delivered_per_s}, lag {lag_end} "
                "(oldest {oldest_age_s} s, slope {lag_slope}/s), p50 {p50_ms} p99 {p99_ms} ms (due p99 "
                "{due_p99_ms}), {cpu_ms_per_msg} ms CPU/msg: {verdict}\n".format(
                    **st, verdict="sustainable" if st["sustainable"] else "NOT: " + "; ".join(st["failed"])))
    fault = s.get("fault")
    if isinstance(fault, dict):
        out.append(
            "  fault {spec}: lost {lost}, duplicates {extra_calls} (max burst {max_burst}), once {once}, "
            "repeated {repeated}, resumed after {time_to_resume_s} s, adds up: {adds_up}\n".format(**fault)
        )
        out.append(f"  {phases_line(fault)}\n")
        inv = fault.get("invalidation")
        if isinstance(inv, dict):
            out.append(f"  {invalidation_line(inv)}\n")
    return "".join(out)


def delay_line(network: Any) -> str:
    """The link delay of a run on hosts (run.json's ``network``), and the userspace delayer's cost
    when it made the delay; "" without a delay."""
    if not isinstance(network, dict) or not network.get("link_delay_ms"):
        return ""
    line = f"link delay {network['link_delay_ms']:g} ms ({network.get('link_delay_mechanism') or '?'})"
    d = network.get("delayer")
    if isinstance(d, dict):
        line += (f": delayer {network.get('delayer_cpu_s')} CPU-s (in no participant), {d.get('packets')} packets, "
                 f"{d.get('cpu_us_per_packet')} us CPU/packet, {d.get('dropped')} dropped")
    return line


def invalidation_line(inv: dict[str, Any]) -> str:
    """The loud line of a slot-invalidation run (run.json's ``fault.invalidation``)."""
    return (f"SLOT INVALIDATED: {inv['slot']} ({inv.get('invalidation_reason')}, wal_status "
            f"{inv.get('wal_status')}) under max_slot_wal_keep_size={inv.get('keep_size')}; reader "
            f"{inv.get('consumer')} ended ({str(inv.get('reader_error')).splitlines()[0]}); "
            f"lost {inv.get('lost')} message(s)"
            f" the run's readers never worked")


def p50_p99(lat: object) -> str:
    """A latency summary's p50 and p99 (``-`` when it has no samples)."""
    if not isinstance(lat, dict) or not lat.get("n"):
        return "p50 - ms, p99 - ms"
    return f"p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms"


def status_text(statuses: Sequence[object], *, as_json: bool) -> str:
    """The stack's services as ``lab stack status`` prints them (JSON rows with ``as_json``)."""
    rows = [s.__dict__ for s in statuses]
    if as_json:
        return json.dumps(rows, indent=2, default=str) + "\n"
    out: list[str] = []
    for r in rows:
        pids = ",".join(map(str, r["pids"])) or "-"
        rss = f"{r['rss_mb']:.0f} MB" if r["rss_mb"] is not None else "-"
        out.append(
            f"{r['name']:<18} {r['state']:<8} pid {pids:<14} {r['endpoint']:<28} {r['version']:<14} {rss}\n"
        )
        for slot in r["detail"].get("slots", []) if isinstance(r["detail"], dict) else []:
            out.append("  " + slot_line(slot) + "\n")
        for slot in r["detail"].get("inactive_slots", []) if isinstance(r["detail"], dict) else []:
            out.append(
                f"  warning: replication slot {slot['slot']} is inactive and retains "
                f"{slot['retained_wal_bytes']} bytes of WAL\n"
            )
    return "".join(out)


def slot_line(slot: dict[str, Any]) -> str:
    """One replication slot as ``lab stack status`` shows it: name, active, WAL retained, status."""
    retained = slot.get("retained_wal_bytes")
    safe = slot.get("safe_wal_size")
    held = "active" if slot.get("active") else "inactive"
    kept = f"retains {retained} bytes ({retained / 2**20:.1f} MB)" if isinstance(retained, int) else "retains no WAL"
    line = (f"slot {slot['slot']:<22} {held:<8} {kept}, wal_status {slot.get('wal_status')}, "
            f"safe_wal_size {safe if safe is not None else '-'}")
    if slot.get("invalidation_reason"):
        line += f", INVALIDATED: {slot['invalidation_reason']}"
    return line


MATRIX_COLUMNS = ("pipeline", "spec", "success", "lost", "duplicates", "max_burst", "resume_s", "recovery_s",
                  "wal_peak_mb", "wal_slope_kb_s", "backlog_where", "healthy_lag_peak", "cpu_ms_per_msg")


def matrix_text(table: pd.DataFrame) -> str:
    """A fault matrix as ``lab faults`` prints it: one row per cell, then one per pipeline
    (:func:`lab.study.fault_matrix.matrix_table`)."""
    from lab.study import fault_matrix

    return (fault_matrix.shown(table[list(MATRIX_COLUMNS)]).to_string(index=False) + "\n\n"
            + fault_matrix.shown(fault_matrix.by_pipeline(table)).to_string(index=False) + "\n")


def series_text(results: Sequence[dict[str, Any]]) -> str:
    """A series' outcome as ``lab series`` prints it: one row per run, without the error text
    (:func:`lab.study.series.outcome_table`)."""
    from lab.study import series

    return series.outcome_table(results).drop(columns=["error"]).to_string(index=False) + "\n"
