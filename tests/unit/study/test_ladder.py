"""The measured crossing's decision over the rungs climbed so far."""

from __future__ import annotations

from lab.study.ladder import Rung, verdict


def _run(ms: float, steady: float | None = None) -> dict:
    split = {"total": {"steady_ms_per_msg": steady, "fixed_cpu_s": 1.0}} if steady is not None else {"error": "x"}
    return {"run_id": "r", "cpu_ms_per_msg": ms, "cost_split": split}


def test_crossed_between_the_last_cheaper_rung_and_the_first_dearer_one() -> None:
    rungs = [Rung(16, [_run(2.0, 1.5), _run(2.1, 1.6)], [_run(2.5, 2.0), _run(2.4, 2.0)], steady=True),
             Rung(24, [_run(2.6, 2.3), _run(2.7, 2.2)], [_run(2.5, 2.0), _run(2.5, 2.1)], steady=True)]
    v = verdict(rungs)
    assert v["verdict"] == "crossed" and (v["below"], v["above"]) == (16, 24)
    assert v["metric"] == "steady_ms_per_msg" and v["difference_ms"] == 0.2


def test_whole_window_by_default_or_when_a_run_has_no_split_and_not_yet_at_the_top() -> None:
    assert Rung(16, [_run(2.0, 1.0)], [_run(2.5, 2.0)]).metric == "cpu_ms_per_msg"
    rung = Rung(16, [_run(2.0)], [_run(2.5, 2.0)], steady=True)
    assert rung.metric == "cpu_ms_per_msg" and rung.difference == -0.5
    assert verdict([rung]) == {"verdict": "not yet", "below": 16, "above": None}


def test_a_failed_direct_run_stops_the_climb_and_says_why() -> None:
    rungs = [Rung(16, [_run(2.0)], [_run(2.5)]), Rung(24, failed="wal at N = 24 failed: not drained")]
    v = verdict(rungs)
    assert v == {"verdict": "stopped", "at": 24, "below": 16, "why": "wal at N = 24 failed: not drained"}
