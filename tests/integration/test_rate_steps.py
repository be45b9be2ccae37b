"""The load staircase end to end on the real stack: the senders follow it, every step
is measured, the run's verdict is still the reference's, a runaway lag stops it early, and a warm phase
goes first without counting in any step."""

from __future__ import annotations

import asyncio

import pytest

from lab.measure.staircase import max_sustainable_rate
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings

pytestmark = pytest.mark.integration


def run(settings: Settings, **kw: object) -> dict:
    return asyncio.run(run_scenario(Scenario(**{"cooldown_s": 0, "pipeline": "wal", **kw}), settings))


def test_a_staircase_is_sent_and_measured_step_by_step(stack: object, settings: Settings) -> None:
    r = run(settings, rate_steps="100,200", step_s=3.0)
    assert r["success"], r["error"]
    c = r["counters"]
    assert r["scenario"]["messages"] == 900 and c["sent"] == c["work_calls"] == c["distinct_ids"] == 900
    steps = r["steps"]
    assert [s["rate"] for s in steps] == [100.0, 200.0]
    assert [s["sent"] for s in steps] == [300, 600]
    assert [(s["t0_s"], s["t1_s"]) for s in steps] == [(0.0, 3.0), (3.0, 6.0)]
    for s in steps:
        assert s["achieved_rate"] == pytest.approx(s["rate"], rel=0.15)  # the senders kept the schedule
        assert s["delivered_per_s"] > 0  # how fast the pipeline kept up is the machine's (a loaded one: slower)
        assert s["latency_ms"]["n"] == s["sent"] and 0 < s["latency_ms"]["p50"] <= s["latency_ms"]["p99"]
        assert s["latency_from_due_ms"]["p50"] >= s["latency_ms"]["p50"] - 5  # due time precedes created_at
        cpu = s["cpu_ms_per_msg"]
        assert {"postgres", "web", "senders", "consumers", "runner", "total", "unattributed"} <= set(cpu)
        assert cpu["total"] > 0 and cpu["consumers"] > 0 and "consumer-0" not in cpu
        assert s["lag_end"] >= 0 and s["oldest_age_s"] >= 0 and s["lag_slope"] is not None
    # the lag at each step's end is what was created by then minus what was worked by then
    created = sum(s["achieved_rate"] * 3.0 for s in steps)
    worked = sum(s["delivered_per_s"] * 3.0 for s in steps)
    assert steps[-1]["lag_end"] == pytest.approx(created - worked, abs=15)
    assert r["max_sustainable_rate"] == max_sustainable_rate(steps)
    assert r["staircase"]["rates"] == [100.0, 200.0] and not r["staircase"]["stopped_early"]
    assert r["senders"]["planned"] == 900 and r["senders"]["steps_sent"] == 2
    assert r["latency_from_due_ms"]["n"] == 900


def test_a_runaway_lag_stops_the_staircase_and_the_run_still_works_every_message(
        stack: object, settings: Settings) -> None:
    # 20 ms of work per message: one consumer works about 50 msg/s, far below the second step (its
    # rates are as low as keep that plain: the backlog left to work after the stop is the test's time)
    r = run(settings, rate_steps="10,300,600", step_s=4.0, work_delay_ms=20.0)
    assert r["success"], r["error"]
    stair = r["staircase"]
    assert stair["stopped_early"] and stair["stop"]["after_step"] == 1 and stair["steps_run"] == 2
    assert r["senders"]["steps_sent"] == 2 and r["senders"]["planned"] == 40 + 1200
    assert r["counters"]["sent"] == r["counters"]["work_distinct"] == r["counters"]["distinct_ids"] == 1240
    first, second = r["steps"]
    assert first["sustainable"], first["failed"]
    assert not second["sustainable"] and second["lag_slope"] > 150
    assert second["delivered_per_s"] < 100
    assert r["max_sustainable_rate"] == 10.0 and stair["limit_found"]
    total = sum(v for k, v in r["cpu_s"].items() if k != "unattributed")
    assert r["cpu_ms_per_msg"] == pytest.approx(total * 1000 / 1240, rel=1e-3)  # the messages really sent


def test_a_warm_phase_goes_first_and_counts_in_no_step(stack: object, settings: Settings) -> None:
    # 1 s at the top rate (200 messages at 200 msg/s), a rest of 2 s, then the two steps
    r = run(settings, rate_steps="100,200", step_s=3.0, warm_s=1.0)
    assert r["success"], r["error"]
    c = r["counters"]
    assert r["scenario"]["messages"] == 200 + 900 and c["sent"] == c["work_calls"] == c["distinct_ids"] == 1100
    sent = r["senders"]
    assert (sent["planned"], sent["steps_sent"], sent["warm_s"]) == (1100, 2, 1.0)  # the warm phase is no step
    steps = r["steps"]
    assert [s["sent"] for s in steps] == [300, 600] and [s["latency_ms"]["n"] for s in steps] == [300, 600]
    assert [(s["t0_s"], s["t1_s"]) for s in steps] == [(3.0, 6.0), (6.0, 9.0)]
    for s in steps:
        assert s["achieved_rate"] == pytest.approx(s["rate"], rel=0.15)  # the warm rows fall in no step
    warm = r["warm"]
    assert (warm["rate"], warm["seconds"], warm["messages"], warm["sent"]) == (200.0, 1.0, 200, 200)
    assert warm["rest_s"] == 2.0
    assert warm["cleared"] and warm["lag_at_first_step"] == 0, warm  # wal works 200 messages well within 2 s
    assert r["staircase"]["warm_s"] == 1.0 and r["max_sustainable_rate"] == max_sustainable_rate(steps)
    assert r["latency_from_due_ms"]["n"] == 1100  # every message of the run, the warm ones too
