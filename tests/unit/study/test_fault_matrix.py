"""The fault matrix: its plan, its resume rules, its tables on hand-made fault blocks
(the shape h2's runner writes, and the older one without backlog, lag, phases or recovery), the CLI.
No services: stored runs are written by hand, as in test_series."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lab.cli
import lab.runner
from lab.cli import build_parser, main
from lab.faults import KINDS, check, fault_for
from lab.results import write_run
from lab.scenario import Scenario, parse_fault
from lab.settings import Settings
from lab.study import fault_matrix
from lab.study.series import Step

DIRECT = ("wal", "wal-sharded", "wal-filtered")
PAIRS_LEFT_OUT = {(p, k) for p in DIRECT for k in ("debezium-kill", "broker-restart")} | {
    ("kafka", "slot-invalidation"), ("rabbitmq", "slot-invalidation")} | {
    (p, k) for p in ("poll", "wal-relay") for k in ("debezium-kill", "broker-restart", "slot-invalidation")}
PAIRS_LEFT_OUT |= {("poll", "walsender-kill"), ("kafka-share", "slot-invalidation")}
PIPES = ["kafka", "rabbitmq", "wal", "wal-sharded", "poll", "wal-filtered", "wal-relay", "kafka-share"]


# --- the plan -------------------------------------------------------------------------------------

def test_quick_is_every_applicable_fault_on_every_pipeline_and_a_clean_cell_each() -> None:
    plan = fault_matrix.plan("quick")
    assert sorted(fault_matrix.KIND_ORDER + fault_matrix.HA_KINDS) == sorted(KINDS)  # every kind the runner knows, once
    clean = [s for s in plan if not s.fault]
    assert [s.pipeline for s in clean] == PIPES and plan[-len(PIPES):] == clean
    cells = {(s.pipeline, parse_fault(s.fault).kind) for s in plan if s.fault}
    every = {(p, k) for p in PIPES for k in fault_matrix.KIND_ORDER}
    assert cells == every - PAIRS_LEFT_OUT and len(plan) == len(PIPES) + len(every) - len(PAIRS_LEFT_OUT) == 72
    left = fault_matrix.inapplicable("quick")
    assert {(p, k) for p, k, _ in left} == PAIRS_LEFT_OUT
    assert all("needs Debezium and a broker" in why or "needs a direct reader's slot" in why
               or "walsender-kill needs a slot" in why or "relay" in why for _, _, why in left)
    # fault kinds outer, pipelines inner: an interrupted matrix has compared the pipelines on what it reached
    kinds = [parse_fault(s.fault).kind for s in plan if s.fault]
    assert kinds == sorted(kinds, key=fault_matrix.KIND_ORDER.index)
    assert {(s.consumers, s.messages, s.rate, s.label, s.producer, s.consumer_layout) for s in plan} == {
        (2, 2400, 200.0, "faults", "web", "processes")}
    assert {s.claim for s in plan} == {"takeover"}


def test_targeted_faults_hit_consumer_1_and_debeziums_walsender_has_no_target() -> None:
    for s in fault_matrix.plan("quick"):
        f = fault_for(s)
        if f is None:
            continue
        if f.kind in ("consumer-kill", "consumer-dead", "consumer-slow", "slot-invalidation") or (
                f.kind == "walsender-kill" and s.pipeline in ("wal", "wal-sharded", "wal-filtered")):
            assert f.target == 1, s.fault
        else:
            assert f.target is None, s.fault
    specs = {(s.pipeline, s.fault) for s in fault_matrix.plan("quick")}
    assert ("kafka", "walsender-kill@3s") in specs and ("wal", "walsender-kill:1@3s") in specs
    assert ("wal-relay", "walsender-kill@3s") in specs  # the relay's walsender, as Debezium's
    assert ("wal-relay", "postgres-restart@3s+2s") in specs
    assert ("wal", "consumer-slow=20ms:1@3s+4s") in specs and ("kafka", "big-transaction=5000@3s") in specs
    assert ("rabbitmq", "broker-restart@3s+2s") in specs and ("wal", "sink-outage@3s+4s") in specs


def test_profile_sizes() -> None:
    smoke, quick, full = (fault_matrix.profile(n) for n in ("smoke", "quick", "full"))
    plan = fault_matrix.plan("smoke")
    assert [(s.pipeline, parse_fault(s.fault).kind) for s in plan] == [
        ("wal", "consumer-dead"), ("kafka", "consumer-dead")]
    # make test: a handful of short runs (a broker run pays ~20 s of Debezium start on top of its sends)
    assert len(plan) * (smoke.sends_s + 25) < 4 * 60
    for p in (smoke, quick, full):  # every fault ends while the load still runs: there is an "after"
        assert p.start_s >= 2 and p.start_s + max(p.duration_s, p.outage_s) < p.sends_s - 2, p.name
        assert p.consumers == 2 and p.rate == 200.0
    assert smoke.messages < quick.messages < full.messages and quick.big_rows < full.big_rows == 100_000
    assert full.duration_s >= 60  # long enough for WAL pinning and its slope
    assert len(fault_matrix.plan("full")) == len(fault_matrix.plan("quick"))
    with pytest.raises(ValueError, match="unknown fault profile 'huge'"):
        fault_matrix.plan("huge")


def test_pipelines_and_series_ids() -> None:
    assert fault_matrix.default_series_id("quick") == "faults-quick"
    assert fault_matrix.default_series_id("smoke") == "faults-smoke"  # its own two pipelines are the default
    assert fault_matrix.default_series_id("quick", pipelines=["wal", "kafka"]) == "faults-quick-wal+kafka"
    only = fault_matrix.plan("quick", pipelines=["wal"])
    assert {s.pipeline for s in only} == {"wal"} and len(only) == 8 + 1
    assert fault_matrix.inapplicable("smoke") == []


def test_candidates_leave_the_choice_to_the_faults_check() -> None:
    q = fault_matrix.profile("quick")
    assert fault_matrix.candidates("debezium-kill", q) == ["debezium-kill:1@3s", "debezium-kill@3s"]
    assert fault_matrix.candidates("postgres-restart", q)[1] == "postgres-restart@3s+2s"
    with pytest.raises(ValueError, match="takes no :TARGET"):
        check(Scenario(pipeline="kafka", consumers=2, rate=200.0, fault=fault_matrix.candidates("debezium-kill", q)[0]))


# --- running it: resume, findings, a cell that raises ---------------------------------------------

def _settings(tmp_path: Path) -> Settings:
    return Settings().replace(data_dir=tmp_path, stack_dir=tmp_path / "stack")


def _store(settings: Settings, s: Scenario, sid: str, *, ok: bool, stamp: str) -> dict[str, Any]:
    run = {"run_id": f"{stamp}-{s.pipeline}", "started_at": stamp, "scenario": s.as_parameters(), "success": ok,
           "error": None if ok else "fault accounting: lost=24", "series_id": sid, "cpu_ms_per_msg": 1.0}
    write_run(run, settings=settings)
    return run


def test_run_matrix_keeps_failed_runs_as_findings_and_goes_on_after_a_cell_that_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(tmp_path)
    plan = fault_matrix.plan("smoke", pipelines=("wal", "kafka", "rabbitmq", "wal-sharded"))
    assert len(plan) == 4
    done = _store(settings, plan[0], "m", ok=True, stamp="2026-01-01T00")
    finding = _store(settings, plan[3], "m", ok=False, stamp="2026-01-01T01")  # the last cell lost some
    _store(settings, plan[1], "other", ok=True, stamp="2026-01-01T02")  # another series: not ours
    ran: list[Scenario] = []

    async def recorder(scenario: Scenario, settings: Settings, *, progress: Any = None,
                       meta: dict[str, Any] | None = None, idle: Any = None) -> dict[str, Any]:
        ran.append(scenario)
        if scenario == plan[2]:
            raise RuntimeError("stack not up")
        assert meta == {"series_id": "m", "series_index": plan.index(scenario)}
        return {"run_id": f"new-{len(ran)}", "scenario": scenario.as_parameters(), "success": True, **meta}

    monkeypatch.setattr(lab.runner, "run_scenario", recorder)
    steps: list[Step] = []
    results = asyncio.run(fault_matrix.run_matrix(plan, settings, series_id="m", progress=steps.append))
    assert ran == [plan[1], plan[2]]  # the stored success and the stored finding are not run again
    assert results[0]["run_id"] == done["run_id"] and results[3]["run_id"] == finding["run_id"]
    assert results[2]["run_id"] is None and results[2]["error"] == "RuntimeError: stack not up"
    assert not results[2]["success"] and results[2]["series_id"] == "m"  # recorded, and the matrix went on
    assert [s.status for s in steps if s.status != "start"] == ["skipped", "done", "done", "skipped"]
    stored = fault_matrix.stored(plan, settings, series_id="m")
    assert [r["run_id"] for r in stored] == [done["run_id"], finding["run_id"]]
    ran.clear()
    asyncio.run(fault_matrix.run_matrix(plan, settings, series_id="m", retry_failed=True))
    assert ran == [plan[1], plan[2], plan[3]]  # the finding is retried, the success is not
    ran.clear()
    asyncio.run(fault_matrix.run_matrix(plan, settings, series_id="m", force=True))
    assert ran == plan


def test_outcome_lines() -> None:
    run = {"success": True, "window_s": 12.0, "cpu_ms_per_msg": 1.5,
           "fault": {"accounting": {"lost": 0, "extra_calls": 14, "time_to_resume_s": 3.3}}}
    assert fault_matrix.outcome(run) == "ok; lost 0, duplicates 14; resumed after 3.30 s; 1.5 ms CPU/msg"
    assert fault_matrix.outcome({"success": False, "error": "RuntimeError: x"}) == "FAILED (RuntimeError: x)"


# --- the tables ------------------------------------------------------------------------------------

def _scenario(pipeline: str, fault: str) -> dict[str, Any]:
    return Scenario(pipeline=pipeline, consumers=2, messages=2400, rate=200.0, fault=fault).as_parameters()


def _wal(slots: dict[str, Any], ts: range) -> list[dict[str, Any]]:
    """Samples of every slot at each t: ``slots[name](t)`` = (retained, unconfirmed)."""
    return [{"t_s": float(t), "slot": name, "retained_bytes": f(t)[0], "unconfirmed_bytes": f(t)[1],
             "wal_status": "reserved", "safe_wal_size": None, "active": True}
            for t in ts for name, f in slots.items()]


def _old_wal_dead() -> dict[str, Any]:
    """wal, consumer 1 stopped from 3 s to 7 s, as the first runner stored it (no backlog, lag, phases)."""
    dead = lambda t: (10_000 + 100_000 * max(0, t - 3), 100_000 * max(0, min(t, 7) - 3) if t < 9 else 500)  # noqa: E731
    healthy = lambda t: (10_000 + 1000 * t, 2000)  # noqa: E731
    return {
        "run_id": "r-wal-dead", "scenario": _scenario("wal", "consumer-dead:1@3s+4s"), "success": True, "error": None,
        "cpu_ms_per_msg": 2.5, "cpu_s": {"postgres": 4.0, "unattributed": 0.48}, "window_s": 12.0, "loadavg_1m": 3.0,
        "fault": {"spec": "consumer-dead:1@3s+4s", "kind": "consumer-dead", "target": 1, "start_s": 3.0,
                  "duration_s": 4.0, "events": [{"what": "stop", "t_s": 3.0}, {"what": "resume", "t_s": 7.0}],
                  "accounting": {"lost": 0, "extra_calls": 0, "max_burst": 0, "time_to_resume_s": 0.16},
                  "wal": _wal({"load_test_slot_0": healthy, "load_test_slot_1": dead}, range(0, 12)),
                  "wal_summary": {"load_test_slot_0": {"recovered_after_s": 0.0, "wal_status": ["reserved"]},
                                  "load_test_slot_1": {"recovered_after_s": 2.0, "wal_status": ["reserved"]}}},
    }


def _new_kafka_dead() -> dict[str, Any]:
    """kafka, consumer 1 stopped: the broker holds the backlog, the source slot keeps up; h2's keys."""
    lag = [{"t_s": float(t), "consumer": c, "lag_messages": (300 if c == 1 and 3 <= t <= 7 else 40 + c),
            "lag_s": 0.2} for t in range(12) for c in (0, 1)]
    phases = {name: {"t0_s": t0, "t1_s": t1, "delivered_per_s": 200.0,
                     "cpu_ms_per_msg": {"kafka": k, "debezium": 0.5, "unattributed": 9.0},
                     "latency_ms": {"p50": 50.0, "p95": 90.0, "p99": p99}}
              for name, t0, t1, k, p99 in (("before", 0.0, 3.0, 1.0, 120.0), ("during", 3.0, 7.0, 1.2, 4100.0),
                                           ("after", 7.0, 12.0, 1.6, 300.0))}
    return {
        "run_id": "r-kafka-dead", "scenario": _scenario("kafka", "consumer-dead:1@3s+4s"), "success": True,
        "error": None, "cpu_ms_per_msg": 1.9, "cpu_s": {}, "window_s": 12.5, "loadavg_1m": 5.0,
        "fault": {"spec": "consumer-dead:1@3s+4s", "kind": "consumer-dead", "target": 1, "start_s": 3.0,
                  "duration_s": 4.0, "events": [{"what": "stop", "t_s": 3.1}, {"what": "resume", "t_s": 7.1}],
                  "accounting": {"lost": 0, "extra_calls": 0, "max_burst": 0, "time_to_resume_s": 0.02},
                  "wal": _wal({"dbz_quorum_slot": lambda t: (5000 + 500 * t, 3000)}, range(12)),
                  "wal_summary": {"dbz_quorum_slot": {"recovered_after_s": 0.0}},
                  "backlog": [{"t_s": float(t), "where": "kafka", "messages": 800 if 3 <= t <= 7 else 20}
                              for t in range(12)],
                  "consumer_lag": lag, "phases": phases, "recovery_s": 2.4},
    }


def _clean(pipeline: str, cpu: float) -> dict[str, Any]:
    return {"run_id": f"r-{pipeline}-clean", "scenario": _scenario(pipeline, ""), "success": True, "error": None,
            "cpu_ms_per_msg": cpu, "cpu_s": {}, "window_s": 12.0}


def _rabbit_kill() -> dict[str, Any]:
    return {"run_id": "r-rabbit-kill", "scenario": _scenario("rabbitmq", "consumer-kill:1@3s"), "success": False,
            "error": "fault accounting: messages=2400, lost=24", "cpu_ms_per_msg": 2.0, "cpu_s": {},
            "fault": {"kind": "consumer-kill", "target": 1, "start_s": 3.0, "duration_s": 0.0,
                      "events": [{"what": "kill", "t_s": 3.0}, {"what": "replacement ready", "t_s": 4.7}],
                      "accounting": {"lost": 24, "extra_calls": 0, "max_burst": 0, "time_to_resume_s": 1.7}}}


def test_an_old_fault_block_tabulates_with_nan_where_the_runner_did_not_measure() -> None:
    row = fault_matrix.cell_row(_old_wal_dead(), {"wal": 2.0})
    assert list(row) == list(fault_matrix.COLUMNS)
    got = (row["pipeline"], row["fault"], row["spec"], row["success"])
    assert got == ("wal", "consumer-dead", "consumer-dead:1@3s+4s", True)
    assert (row["lost"], row["duplicates"], row["max_burst"], row["resume_s"]) == (0, 0, 0, 0.16)
    assert row["slots_back_s"] == 2.0  # the later of the two slots
    assert row["wal_slope_kb_s"] == pytest.approx(100_000 / 1024)  # slot 1's retained WAL over 3..8 s
    assert row["wal_peak_mb"] == pytest.approx((10_000 + 100_000 * 8) / 2**20)
    assert row["backlog_where"] == "source" and row["source_backlog_peak_kb"] == pytest.approx(400_000 / 1024)
    assert row["cpu_vs_clean_ms"] == pytest.approx(0.5) and row["unattributed_ms"] == pytest.approx(0.2)
    for key in ("recovery_s", "broker_backlog_peak", "healthy_lag_peak", "healthy_lag_peak_s", "p99_during_ms",
                "recovery_cpu_ms"):
        assert math.isnan(row[key]), key


def test_the_new_keys_fill_backlog_lag_recovery_and_the_cpu_of_recovery() -> None:
    row = fault_matrix.cell_row(_new_kafka_dead(), {"kafka": 1.5})
    assert fault_matrix.fault_window(_new_kafka_dead()) == (3.0, 7.0)  # the "during" phase, not the events
    assert row["backlog_where"] == "broker" and row["broker_backlog_peak"] == 800
    assert row["healthy_lag_peak"] == 40 and row["healthy_lag_peak_s"] == 0.2  # consumer 0 only: 1 was hit
    assert row["recovery_s"] == 2.4 and row["p99_during_ms"] == 4100.0
    assert row["recovery_cpu_ms"] == pytest.approx((1.6 + 0.5) - (1.0 + 0.5))  # unattributed left out
    assert row["cpu_vs_clean_ms"] == pytest.approx(0.4)
    assert row["wal_slope_kb_s"] == pytest.approx(500 / 1024)
    run = _new_kafka_dead()  # the runner's own total, when it stores one, is the one used
    run["fault"]["phases"]["after"]["cpu_ms_per_msg_total"] = 3.0
    run["fault"]["phases"]["before"]["cpu_ms_per_msg_total"] = None  # nothing delivered: the sum
    assert fault_matrix.cell_row(run)["recovery_cpu_ms"] == pytest.approx(3.0 - 1.5)
    run["fault"]["phases"]["during"] = {"t0_s": 3.0, "t1_s": 7.0, "cpu_ms_per_msg": None, "latency_ms": None}
    assert math.isnan(fault_matrix.cell_row(run)["p99_during_ms"])


def test_where_the_backlog_lives() -> None:
    run = _new_kafka_dead()
    run["fault"]["wal"] = _wal({"dbz_quorum_slot": lambda t: (0, 900_000 if t >= 3 else 2000)}, range(12))
    assert fault_matrix.backlog_where(run)[0] == "source+broker"
    run["fault"]["backlog"] = [{"t_s": float(t), "where": "kafka", "messages": 30} for t in range(12)]
    assert fault_matrix.backlog_where(run)[0] == "source"
    run["fault"]["wal"] = _wal({"dbz_quorum_slot": lambda t: (0, 2000)}, range(12))
    assert fault_matrix.backlog_where(run)[0] == "none"
    assert fault_matrix.backlog_where({"fault": {"start_s": 3.0}})[0] == "—"  # nothing sampled
    del run["fault"]["backlog"]  # an older runner on a broker pipeline: the broker side is unknown
    run["pipeline_settings"] = {"debezium_sink": "kafka"}
    assert fault_matrix.backlog_where(run)[0] == "none (broker not sampled)"
    run["fault"]["wal"] = _wal({"dbz_quorum_slot": lambda t: (0, 900_000 if t >= 3 else 2000)}, range(12))
    assert fault_matrix.backlog_where(run)[0] == "source (broker not sampled)"
    assert fault_matrix.backlog_where({})[0] == "—"


def test_sink_outage_has_no_healthy_consumer() -> None:
    run = _new_kafka_dead()
    run["fault"]["kind"], run["fault"]["target"] = "sink-outage", None  # recorded before hit_consumers
    assert math.isnan(fault_matrix.cell_row(run)["healthy_lag_peak"]) and fault_matrix.cell_row(run)["hit"] == "all"
    run = _new_kafka_dead()  # what the fault recorded decides, not its kind
    run["fault"].update(family="consumer_stop", stops_service=False, stops_source=False, hit_consumers=[0, 1])
    assert math.isnan(fault_matrix.cell_row(run)["healthy_lag_peak"])
    run["fault"]["hit_consumers"] = [1]
    row = fault_matrix.cell_row(run)
    assert not math.isnan(row["healthy_lag_peak"]) and (row["family"], row["hit"]) == ("consumer_stop", "one")


def test_matrix_table_a_failed_cell_and_a_cell_that_never_stored_a_run() -> None:
    raised = {"run_id": None, "scenario": _scenario("wal", "consumer-kill:1@3s"), "success": False,
              "error": "RuntimeError: stack not up"}
    results = [_clean("wal", 2.0), _clean("kafka", 1.5), _old_wal_dead(), _new_kafka_dead(), _rabbit_kill(), raised]
    t = fault_matrix.matrix_table(results)
    assert list(t.columns) == list(fault_matrix.COLUMNS) and len(t) == 6
    assert list(t["fault"]) == ["none", "none", "consumer-dead", "consumer-dead", "consumer-kill", "consumer-kill"]
    assert t.loc[2, "cpu_vs_clean_ms"] == pytest.approx(0.5) and t.loc[3, "cpu_vs_clean_ms"] == pytest.approx(0.4)
    assert math.isnan(t.loc[4, "cpu_vs_clean_ms"])  # no clean rabbitmq cell
    assert t.loc[4, "lost"] == 24 and not t.loc[4, "success"] and t.loc[4, "backlog_where"] == "—"  # no samples
    assert t.loc[5, "error"] == "RuntimeError: stack not up" and pd.isna(t.loc[5, "lost"])
    assert str(t["lost"].dtype) == "Int64" and str(t["duplicates"].dtype) == "Int64"  # counts stay whole
    shown = fault_matrix.shown(t)
    assert shown.loc[5, "lost"] == "—" and shown.loc[4, "lost"] == 24
    wal = fault_matrix.wal_table(results)
    assert list(wal["slot"]) == ["load_test_slot_0", "load_test_slot_1", "dbz_quorum_slot"]
    assert wal.loc[1, "slope_kb_s"] == pytest.approx(100_000 / 1024) and wal.loc[1, "back_in_band_s"] == 2.0
    assert wal.loc[2, "wal_status"] == "reserved"  # read from the samples when the summary has none


def test_by_pipeline_sums_what_each_architecture_cost() -> None:
    t = fault_matrix.matrix_table([_clean("wal", 2.0), _old_wal_dead(), _new_kafka_dead(), _rabbit_kill(),
                             {**_rabbit_kill(), "run_id": "again",
                              "scenario": _scenario("rabbitmq", "sink-outage@3s+4s")}])
    by = fault_matrix.by_pipeline(t).set_index("pipeline")
    assert list(by.index) == ["wal", "kafka", "rabbitmq"]  # the clean cell is not a fault cell
    assert by.loc["rabbitmq", "fault_cells"] == 2 and by.loc["rabbitmq", "cells_with_loss"] == 2
    assert by.loc["rabbitmq", "lost"] == 48 and by.loc["rabbitmq", "dead_consumer_backlog"] == "—"
    assert by.loc["wal", "cells_with_loss"] == 0 and by.loc["wal", "dead_consumer_backlog"] == "source"
    assert by.loc["kafka", "dead_consumer_backlog"] == "broker" and by.loc["kafka", "median_recovery_s"] == 2.4
    assert pd.isna(by.loc["wal", "median_recovery_s"])  # an old run: not measured, not 0


def test_the_reading_is_computed_from_the_table() -> None:
    t = fault_matrix.matrix_table([_clean("wal", 2.0), _clean("kafka", 1.5), _old_wal_dead(), _new_kafka_dead(),
                             _rabbit_kill()])
    text = "\n".join(fault_matrix.reading(t))
    assert "2 of 3 accounted cells lost nothing" in text and "rabbitmq consumer-kill (24)" in text
    assert "Duplicates** (re-worked, at-least-once): none in any cell." in text
    assert "wal: 0.77 MB at 97.7 KB/s, backlog in source" in text
    assert "kafka: 0.01 MB at 0.5 KB/s, backlog in broker, healthy lag 40 msgs" in text
    assert "from 0.02 s (kafka consumer-dead) to 1.70 s (rabbitmq consumer-kill)" in text
    assert "median 2.4 s over 1 cells" in text and "wal +0.500" in text and "kafka +0.400" in text
    assert "load average of 3.0-5.0" in text
    t.loc[t["pipeline"] == "rabbitmq", "lost"] = 0
    assert "3 of 3 accounted cells lost nothing." in "\n".join(fault_matrix.reading(t))
    assert fault_matrix.reading(fault_matrix.matrix_table([_clean("wal", 2.0)])) == ["No fault cell has run yet."]


def test_slope() -> None:
    assert fault_matrix.slope([(0.0, 10.0), (1.0, 12.0), (2.0, 14.0)]) == pytest.approx(2.0)
    assert math.isnan(fault_matrix.slope([(1.0, 3.0)])) and math.isnan(fault_matrix.slope([(1.0, 3.0), (1.0, 5.0)]))
    kill = _old_wal_dead()  # a kill is over in 0.4 s: the slope still gets the samples of 3..6 s
    kill["fault"]["events"] = [{"what": "kill", "t_s": 3.0}, {"what": "replacement ready", "t_s": 3.4},
                               {"what": "continued by cleanup", "t_s": 11.0}]  # a cleanup is not the fault
    assert fault_matrix.fault_window(kill) == (3.0, 3.4)
    assert fault_matrix.cell_row(kill)["wal_slope_kb_s"] == pytest.approx(100_000 / 1024)


def test_figures_draw_what_was_sampled() -> None:
    results = [_old_wal_dead(), _new_kafka_dead(), _rabbit_kill()]
    fig = fault_matrix.wal_figure(results)
    assert len(fig.axes) == 2 and [ax.get_title() for ax in fig.axes] == ["wal", "kafka"]
    assert len(fig.axes[0].get_lines()) == 2  # one line per slot
    lag = fault_matrix.lag_figure(results)
    assert len(lag.axes) == 1 and len(lag.axes[0].get_lines()) == 3  # two consumers and the broker
    assert fault_matrix.lag_figure([_old_wal_dead()]) is None and fault_matrix.wal_figure([_rabbit_kill()]) is None


# --- the CLI -----------------------------------------------------------------------------------------

def test_cli_parses_lab_faults() -> None:
    args = build_parser().parse_args(["faults", "--profile", "smoke", "--pipelines", "wal", "--series-id", "x",
                                      "--retry-failed"])
    got = (args.profile, args.pipelines, args.series_id, args.retry_failed, args.force)
    assert got == ("smoke", "wal", "x", True, False)
    assert build_parser().parse_args(["faults"]).profile == "quick"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["faults", "--profile", "huge"])


def test_lab_faults_runs_the_matrix_prints_it_and_fails_only_when_a_cell_could_not_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    settings = _settings(tmp_path)
    monkeypatch.setattr(lab.cli, "get_settings", lambda: settings)  # not the process-wide (cached) ones
    boom = {"raise": True}

    async def fake(scenario: Scenario, settings: Settings, *, progress: Any = None,
                   meta: dict[str, Any] | None = None, idle: Any = None) -> dict[str, Any]:
        if scenario.pipeline == "kafka" and boom["raise"]:
            raise RuntimeError("no debezium")
        result = {"run_id": f"r{meta['series_index']}", "started_at": str(meta["series_index"]),  # type: ignore[index]
                  "scenario": scenario.as_parameters(), "success": scenario.pipeline == "wal", "error": None,
                  "fault": {"kind": parse_fault(scenario.fault).kind, "accounting": {"lost": 0, "extra_calls": 3}},
                  **(meta or {})}
        write_run(result, settings=settings)
        return result

    monkeypatch.setattr(lab.runner, "run_scenario", fake)
    assert main(["faults", "--profile", "smoke", "--series-id", "cli"]) == 1  # the kafka cells raised
    out, err = capsys.readouterr()
    assert "fault matrix cli: 2 runs" in err and "[2/2] kafka consumer-dead:1@2s+2s (run): FAILED (RuntimeError" in err
    assert "1 could not run: kafka consumer-dead:1@2s+2s" in err
    assert "consumer-dead:1@2s+2s" in out and "—" in out
    boom["raise"] = False
    assert main(["faults", "--profile", "smoke", "--series-id", "cli"]) == 0  # resumed: only kafka ran
    err = capsys.readouterr().err
    assert "[1/2] wal consumer-dead:1@2s+2s (done before): ok" in err and "1 failed" in err
    table = fault_matrix.matrix_table(fault_matrix.stored(fault_matrix.plan("smoke"), settings, series_id="cli"))
    assert list(table["pipeline"]) == ["wal", "kafka"] and table["duplicates"].eq(3).all()
    assert isinstance(table, pd.DataFrame)


def _lagging(hit_s: float, healthy_s: float) -> dict[str, Any]:
    """kafka with consumer 1 stopped 3-7 s: the oldest lag of the hit consumer and of the other over the fault."""
    run = _new_kafka_dead()
    run["fault"]["consumer_lag"] = [
        {"t_s": float(t), "consumer": c, "lag_messages": 400 if c == 1 and 3 <= t <= 7 else 20,
         "lag_s": ({1: hit_s, 0: healthy_s}[c] if 3 <= t <= 7 else 0.3)} for t in range(12) for c in (0, 1)]
    return run


def test_who_waits_for_a_dead_consumer() -> None:
    assert fault_matrix.who_waits(_lagging(3.9, 0.3)) == "its messages"  # its partitions waited
    assert fault_matrix.who_waits(_lagging(0.3, 0.3)) == "nobody"  # the other took its messages
    assert fault_matrix.who_waits(_lagging(3.9, 3.0)) == "every consumer"
    assert fault_matrix.who_waits(_lagging(1.9, 0.3)) == "nobody"  # under half the fault's 4 s
    run = _lagging(3.9, 0.3)
    run["fault"]["consumer_lag"] = [dict(r, lag_s=r["lag_s"] + 5.0) for r in run["fault"]["consumer_lag"]]
    assert fault_matrix.who_waits(run) == "nobody"  # 8.9 s is not twice its 5.3 s before the fault
    assert fault_matrix.who_waits(_old_wal_dead()) == "—"  # no lag sampled
    row = fault_matrix.cell_row(_lagging(3.9, 0.3))
    assert (row["waits"], row["hit_lag_peak"]) == ("its messages", 400)


def test_delivered_while_the_fault_lasted() -> None:
    run = _new_kafka_dead()
    run["fault"]["phases"]["during"]["delivered_per_s"] = 100.0
    assert fault_matrix.delivered_during_pct(run) == pytest.approx(50.0)  # of the 200 msg/s sent
    run["scenario"]["rate"] = 0.0  # closed loop: against the rate before the fault
    assert fault_matrix.delivered_during_pct(run) == pytest.approx(50.0)
    run["fault"]["phases"]["before"]["delivered_per_s"] = 400.0
    assert fault_matrix.delivered_during_pct(run) == pytest.approx(25.0)
    assert math.isnan(fault_matrix.delivered_during_pct(_old_wal_dead()))
    assert math.isnan(fault_matrix.cell_row(_clean("wal", 2.0))["delivered_during_pct"])


def test_stored_series_reads_every_cell_of_a_matrix_without_its_plan(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", stack_dir=tmp_path / "stack")
    first = {**_rabbit_kill(), "run_id": "a", "started_at": "2026-12-04T00:00:01", "series_id": "faults-x",
             "series_index": 1}
    again = {**_old_wal_dead(), "run_id": "b", "started_at": "2026-12-04T00:00:02", "series_id": "faults-x",
             "series_index": 0}
    retried = {**first, "run_id": "c", "started_at": "2026-12-04T00:00:03", "success": True}
    other = {**_new_kafka_dead(), "run_id": "d", "started_at": "2026-12-04T00:00:04", "series_id": "faults-y"}
    for run in (first, again, retried, other):
        write_run(run, settings=settings)
    got = fault_matrix.stored_series("faults-x", settings)
    assert [r["run_id"] for r in got] == ["b", "c"]  # in the order run; a cell's successful retry stands for it
    assert fault_matrix.stored_series("none-such", settings) == []
