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
    s = summarize(runs, 1000)
    assert s["median_ms_per_msg"] == 3.0
    assert s["by_participant"]["postgres"] == 2.0 and s["by_participant"]["web"] == 2.0
    assert s["web_plus_senders_ms_per_msg"] == 4.0
    assert s["runs"] == ["a", "b", "c"]
    assert s["consumers_ms_per_msg"] == 1.0  # the "consumers" group, not its members again
