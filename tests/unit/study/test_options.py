"""``lab bench options``: the --vary spec and the summary of one value's runs."""

from __future__ import annotations

import pytest

from lab.study.options import parse_vary, summarize


def test_vary_spec_is_typed_from_the_scenario_field() -> None:
    assert parse_vary("reset=discard,none") == ("reset", ["discard", "none"])
    assert parse_vary("consumer-layout=processes,tasks") == ("consumer_layout", ["processes", "tasks"])
    assert parse_vary("consumers=1,4") == ("consumers", [1, 4])
    for bad, says in (("nope=1,2", "Scenario field"), ("reset", "Scenario field"),
                      ("reset=discard", "at least two values")):
        with pytest.raises(ValueError, match=says):
            parse_vary(bad)


def test_summary_is_per_message_medians() -> None:
    runs = [
        {"run_id": "a", "cpu_ms_per_msg": 2.0, "window_s": 1,
         "cpu_s": {"postgres": 1.0, "web": 2.0, "senders": 1.0, "consumer-0": 0.5, "consumers": 0.5}},
        {"run_id": "b", "cpu_ms_per_msg": 4.0, "window_s": 1,
         "cpu_s": {"postgres": 3.0, "web": 2.0, "senders": 3.0, "consumers": 1.5}},
        {"run_id": "c", "cpu_ms_per_msg": 3.0, "window_s": 1,
         "cpu_s": {"postgres": 2.0, "web": 4.0, "senders": 2.0, "consumers": 1.0}},
    ]
    for r in runs:
        r["scenario"] = {"messages": 1000}
    s = summarize(runs)
    assert s["median_ms_per_msg"] == 3.0
    assert s["by_participant"]["postgres"] == 2.0 and s["by_participant"]["web"] == 2.0
    assert s["web_plus_senders_ms_per_msg"] == 4.0
    assert s["runs"] == ["a", "b", "c"]
    assert s["consumers_ms_per_msg"] == 1.0  # the "consumers" group, not its members again


def test_each_value_is_divided_by_its_own_volume_and_carries_its_split() -> None:
    def run(rid: str, m: int, cpu: float, c: float, f: float) -> dict:
        return {"run_id": rid, "cpu_ms_per_msg": cpu * 1000 / m, "window_s": 1, "scenario": {"messages": m},
                "cpu_s": {"debezium": cpu},
                "cost_split": {"participants": {"debezium": {"steady_ms_per_msg": c, "fixed_cpu_s": f}},
                               "total": {"steady_ms_per_msg": c, "fixed_cpu_s": f}}}
    small = summarize([run("a", 5000, 6.0, 0.31, 4.45), run("b", 5000, 6.2, 0.33, 4.55)])
    big = summarize([run("c", 100_000, 34.5, 0.30, 4.5), {"run_id": "d", "cpu_ms_per_msg": 0.35, "window_s": 1,
                                                        "scenario": {"messages": 100_000}, "cpu_s": {},
                                                        "cost_split": {"error": "too short"}}])
    assert small["by_participant"]["debezium"] == pytest.approx(1.22)  # 6.1 CPU-s / 5,000
    assert small["steady_ms_per_msg"] == {"median": 0.32, "min": 0.31, "max": 0.33}
    assert small["fixed_by_participant"]["debezium"]["median"] == pytest.approx(4.5)
    assert big["runs_split"] == 1 and big["steady_ms_per_msg"]["median"] == 0.30
    assert small["whole_window_ms_per_msg"]["median"] > 3 * big["whole_window_ms_per_msg"]["median"]
