"""lab.study.capacity on hand-made staircase runs, and the report handing the staircase to the
latency notebook (no services)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lab.settings import Settings
from lab.study import capacity, report


def _step(rate: float, ok: bool, p99: float = 100.0, cpu: float = 1.0) -> dict:
    return {"rate": rate, "achieved_rate": rate, "delivered_per_s": rate if ok else rate * 0.7,
            "lag_end": 10 if ok else 5000, "oldest_age_s": 0.1, "lag_slope": 0.0 if ok else rate * 0.3,
            "latency_ms": {"p50": p99 / 2, "p99": p99}, "latency_from_due_ms": {"p99": p99 + 1},
            "cpu_ms_per_msg": {"total": cpu, "web": cpu / 4}, "sustainable": ok}


def _run(run_id: str, pipeline: str, n: int, steps: list[dict], success: bool = True) -> dict:
    top = None
    for st in steps:
        if not st["sustainable"]:
            break
        top = st["rate"]
    return {"run_id": run_id, "success": success, "scenario": {"pipeline": pipeline, "consumers": n},
            "steps": steps, "max_sustainable_rate": top}


RESULTS = [
    _run("a", "wal", 1, [_step(250, True, 80, 2.0), _step(500, True, 90, 1.5), _step(1000, False, 5000)]),
    _run("b", "wal", 1, [_step(250, True), _step(500, False)]),
    _run("c", "kafka", 1, [_step(250, True), _step(500, True, 300, 3.0)]),  # never reached its limit
    _run("d", "kafka", 4, [_step(250, False)]),  # even the first step failed
    _run("e", "rabbitmq", 1, [_step(250, True)], success=False),  # a failed run does not count
    {"run_id": "w", "success": True, "scenario": {"pipeline": "wal", "consumers": 1, "warmup": True}},
]


def test_capacity_table_one_row_per_pipeline_and_n() -> None:
    t = capacity.capacity_table(RESULTS).set_index(["pipeline", "consumers"])
    assert list(t.index) == [("wal", 1), ("kafka", 1), ("kafka", 4)]  # the reference order of lab.scenario
    assert t.loc[("wal", 1), "max_sustainable_rate"] == 375.0  # median of 500 and 250
    assert t.loc[("wal", 1), "runs"] == 2 and t.loc[("wal", 1), "limit_found"]
    assert t.loc[("wal", 1), "first_unsustainable"] == 750.0
    assert t.loc[("kafka", 1), "max_sustainable_rate"] == 500.0 and not t.loc[("kafka", 1), "limit_found"]
    assert t.loc[("kafka", 1), "p99_ms_at_max"] == 300.0 and t.loc[("kafka", 1), "cpu_ms_per_msg_at_max"] == 3.0
    assert pd.isna(t.loc[("kafka", 4), "max_sustainable_rate"])
    assert capacity.capacity_table([]).empty


def test_steps_table_and_figure() -> None:
    st = capacity.steps_table(RESULTS)
    assert len(st) == 3 + 2 + 2 + 1 + 1
    assert list(st.columns[:5]) == ["pipeline", "consumers", "run_id", "run_ok", "rate"]
    a = st[st["run_id"] == "a"]
    assert list(a["sustainable"]) == [True, True, False] and list(a["p99_ms"]) == [80, 90, 5000]
    assert list(a["cpu_ms_per_msg"])[:2] == [2.0, 1.5]
    fig = capacity.capacity_figure(RESULTS)
    assert len(fig.axes) == 3 * 3  # wal, kafka, rabbitmq (its failed run's steps are still shown)
    assert capacity.capacity_figure([]).axes


def test_plan_and_series_id() -> None:
    plan = capacity.plan("100,200", 5.0, pipelines=["wal", "kafka"], consumers=[1, 4], profile_name="smoke")
    assert [(s.pipeline, s.consumers) for s in plan] == [("wal", 1), ("wal", 4), ("kafka", 1), ("kafka", 4)]
    assert all(s.rate_steps == "100,200" and s.messages == 1500 and s.cooldown_s == 0.0 for s in plan)
    assert capacity.series_id("quick", "250,500", 8.0, ["wal"], [1, 4]) == "quick-wal-steps250+500x8s-n1+4"
    # a warm phase changes every cell, and so the id: a warmed series never resumes an unwarmed one
    warm_id = capacity.series_id("quick", "250,500", 8.0, ["wal"], [1, 4], 10.0)
    assert warm_id == "quick-wal-steps250+500x8s-n1+4-warm10s"
    warmed = capacity.plan("100,200", 5.0, pipelines=["wal"], consumers=[1], profile_name="smoke", warm_s=2.0)
    assert [(s.warm_s, s.messages) for s in warmed] == [(2.0, 400 + 1500)]  # 2 s at 200 msg/s first
    with pytest.raises(ValueError, match="increase strictly"):
        capacity.plan("200,100", 5.0, pipelines=["wal"], consumers=[1])


def test_report_hands_the_staircase_to_the_latency_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, dict] = {}
    monkeypatch.setattr(report, "execute_notebook",
                        lambda name, out, params, **kw: calls.setdefault(name, params) and out)
    monkeypatch.setattr(report, "combine", lambda nbs, out: out)
    monkeypatch.setattr(report, "export_html", lambda nb, html, **kw: html)
    report.build_report("quick", Settings().replace(data_dir=tmp_path), series_id="s1")
    lat = calls["latency"]
    assert (lat["rate_steps"], lat["step_s"], lat["steps_consumers"]) == ("100,200,400,800", 8.0, "1,16")
    assert lat["pipelines"] == "wal,kafka,rabbitmq"  # the question's three: no wal-sharded staircase in quick
    assert lat["warm_s"] == 10.0  # the report's staircases warm, and their series' id says so
    assert lat["steps_series_id"] == report.report_series("s1", "quick")["capacity"] == "s1-capacity-warm10s"
    assert report.ranking_series("quick-s7")["capacity"] == "quick-s7-capacity-warm10s"  # the id's profile
    assert report.ranking_series("mine")["capacity"] == "mine-capacity"  # an id of no profile: no warm known
    assert lat["series_id"] == "s1-rate500"
    for profile, size in report.CAPACITY.items():  # every profile's staircase is a valid one, and warms
        assert size["warm_s"] > 0
        capacity.plan(size["rate_steps"], size["step_s"], pipelines=["wal"], consumers=[1], profile_name=profile,
                      warm_s=size["warm_s"])
