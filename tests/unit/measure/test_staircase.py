"""lab.measure.staircase on hand-made staircases with known answers (no services): the per-step
figures, the sustainability verdict and the maximum sustainable rate."""

from __future__ import annotations

import pytest

from lab.measure import staircase as steps
from lab.measure.sampler import Snapshot
from lab.scenario import step_plan, warm_plan

GATE = 1000.0
PLAN = step_plan((100.0, 200.0), 10.0)  # 1000 then 2000 messages


def _run(plan, *, insert_s=0.001, work_s=0.05, capacity=None, late_rate=None):
    """created_at and first work call of every message: rows appear ``insert_s`` after their due
    time (or, with ``late_rate``, the second step's rows come only that fast), and are worked
    ``work_s`` later by a FIFO worker of ``capacity`` msg/s (None: no limit)."""
    due = steps.due_times(plan, GATE)
    n0 = plan[0][2]
    created = [d + insert_s for d in due]
    if late_rate:
        created[n0:] = [GATE + plan[1][1] + k / late_rate + insert_s for k in range(len(due) - n0)]
    worked, free = [], 0.0
    for c in created:
        start = c if capacity is None else max(c, free)
        free = start + (1 / capacity if capacity else 0)
        worked.append(start + work_s)
    ids = list(range(1, len(due) + 1))
    return dict(zip(ids, created, strict=True)), ids, worked


def _timeline(t0=GATE - 1, t1=GATE + 25, every=0.5):
    """web burns 0.1 CPU-s/s, consumer-0 0.2, host 0.4 (so 0.1 s/s is unattributed)."""
    out, t = [], t0
    while t <= t1 + 1e-9:
        x = t - t0
        out.append(Snapshot(t_mono=x, t_wall=t, cpu_s={"web": 0.1 * x, "consumer-0": 0.2 * x, "probe": 0.01 * x},
                            rss_mb={}, host_busy_s=0.41 * x, sampler_cpu_s=0.0))
        t += every
    return out


def _rows(created, ids, worked, plan=PLAN, **kw):
    return steps.step_rows(plan, gate_at=GATE, step_s=10.0, created_at=created, arrival_ids=ids,
                           arrival_t=worked, consumers=1, batch_size=100, **kw)


def test_a_pipeline_that_keeps_up_sustains_every_step() -> None:
    rows = _rows(*_run(PLAN), timeline=_timeline(), groups={"consumers": ["consumer-0"]})
    assert [r["rate"] for r in rows] == [100.0, 200.0]
    assert [r["sent"] for r in rows] == [1000, 2000]
    assert [r["achieved_rate"] for r in rows] == [100.0, 200.0]
    assert rows[0]["delivered_per_s"] == pytest.approx(100, abs=1)
    assert rows[1]["lag_end"] == 10  # 0.05 s of work at 200 msg/s
    assert rows[1]["oldest_age_s"] == pytest.approx(0.05, abs=0.006)
    assert abs(rows[1]["lag_slope"]) < 1
    assert rows[0]["latency_ms"]["p50"] == pytest.approx(50.0, abs=0.01)
    assert rows[0]["latency_from_due_ms"]["p99"] == pytest.approx(51.0, abs=0.01)
    assert (rows[0]["t0_s"], rows[0]["t1_s"], rows[1]["t0_s"], rows[1]["t1_s"]) == (0, 10, 10, 20)
    assert all(r["sustainable"] and not r["failed"] for r in rows)
    assert steps.max_sustainable_rate(rows) == 200.0
    cpu = rows[0]["cpu_ms_per_msg"]  # 10 s: web 1 CPU-s, consumers 2, over 1000 messages
    assert cpu["web"] == pytest.approx(1.0) and cpu["consumers"] == pytest.approx(2.0)
    assert cpu["total"] == pytest.approx(3.0) and cpu["unattributed"] == pytest.approx(1.0)
    assert "consumer-0" not in cpu and "probe" not in cpu
    assert rows[1]["cpu_ms_per_msg"]["total"] == pytest.approx(1.5)  # same CPU, twice the messages


def test_a_pipeline_saturated_at_150_per_s_fails_the_second_step_on_its_growing_lag() -> None:
    rows = _rows(*_run(PLAN, capacity=150.0))
    first, second = rows
    assert first["sustainable"] and first["lag_end"] <= 10
    assert not second["sustainable"]
    assert second["lag_slope"] == pytest.approx(50, rel=0.05)  # 200 in, 150 out
    assert second["lag_end"] == pytest.approx(500, abs=10)
    assert second["delivered_per_s"] == pytest.approx(150, abs=2)
    assert second["oldest_age_s"] == pytest.approx(2.5, abs=0.1)  # 500 queued at 150/s, after 10 s: 2.5 s behind
    assert any("lag grows" in f for f in second["failed"])
    assert second["achieved_rate"] == 200.0  # the senders kept the schedule: only the pipeline fell behind
    assert steps.max_sustainable_rate(rows) == 100.0
    due_p99 = second["latency_from_due_ms"]["p99"]
    assert due_p99 > 2000  # the queue's wait shows from the due time


def test_senders_that_fall_behind_make_a_step_unsustainable() -> None:
    rows = _rows(*_run(PLAN, late_rate=150.0))
    assert rows[0]["sustainable"]
    assert rows[1]["achieved_rate"] == pytest.approx(150.0, abs=0.2)
    assert rows[1]["sent"] == 2000  # every message was sent, too late
    assert any("achieved" in f for f in rows[1]["failed"])
    assert not rows[1]["sustainable"]


def test_judge_each_criterion_alone() -> None:
    ok = {"achieved_rate": 500.0, "lag_end": 0, "lag_slope": 0.0, "consumers": 2, "batch_size": 100,
          "step_s": 100.0}  # long steps: 5 % of the rate binds criterion 2
    assert steps.judge(500.0, **ok) == (True, [])
    assert steps.lag_bound(500.0, 2, 100) == 1200.0
    assert steps.judge(500.0, **{**ok, "lag_end": 1200})[0]  # at the bound: held
    assert not steps.judge(500.0, **{**ok, "lag_end": 1201})[0]
    assert steps.judge(500.0, **{**ok, "lag_slope": 25.0})[0]  # 5 % of the rate
    assert not steps.judge(500.0, **{**ok, "lag_slope": 25.1})[0]
    assert steps.judge(500.0, **{**ok, "achieved_rate": 475.0})[0]
    bad, why = steps.judge(500.0, **{**ok, "achieved_rate": 474.9})
    assert not bad and why == ["achieved 474.9 msg/s < 475"]
    assert not steps.judge(500.0, **{**ok, "achieved_rate": None})[0]


def test_the_slope_allows_what_one_batch_per_consumer_can_fake_in_half_a_step() -> None:
    # 8 s steps at 250 msg/s, N = 1: one batch of 100 over 4 s is 25 msg/s, above 5 % (12.5)
    assert steps.slope_limit(250.0, 1, 100, 8.0) == 25.0
    assert steps.slope_limit(2000.0, 1, 100, 8.0) == 100.0  # 5 % binds at a high rate
    assert steps.slope_limit(250.0, 4, 100, 8.0) == 100.0  # a batch per consumer
    kw = {"achieved_rate": 250.0, "lag_end": 50, "consumers": 1, "batch_size": 100, "step_s": 8.0}
    assert steps.judge(250.0, lag_slope=24.0, **kw)[0]
    assert steps.judge(250.0, lag_slope=26.0, **kw) == (False, ["lag grows 26.0 msg/s > 25"])


def test_a_batching_saw_tooth_alone_is_sustainable() -> None:
    """Work in claim batches of 100 at 250 msg/s (a batch every 0.4 s): the lag climbs to 100 and
    drops to 0 again and again; with 8 s steps that is no trend."""
    plan = step_plan((250.0, 500.0), 8.0)
    due = steps.due_times(plan, GATE)
    created = {i + 1: d + 0.001 for i, d in enumerate(due)}
    worked = [due[(k // 100) * 100 + 99] + 0.02 if (k // 100) * 100 + 99 < len(due) else due[-1] + 0.02
              for k in range(len(due))]  # a batch is worked once its 100th row exists
    rows = steps.step_rows(plan, gate_at=GATE, step_s=8.0, created_at=created, arrival_ids=list(created),
                           arrival_t=worked, consumers=1, batch_size=100)
    assert all(r["sustainable"] for r in rows), [r["failed"] for r in rows]
    assert max(r["lag_end"] for r in rows) <= 100 and rows[0]["latency_ms"]["p99"] > 350  # batching's wait


def test_max_sustainable_rate_is_the_top_of_the_leading_sustainable_run() -> None:
    run = [{"rate": 100, "sustainable": True}, {"rate": 200, "sustainable": False},
           {"rate": 400, "sustainable": True}]
    assert steps.max_sustainable_rate(run) == 100
    assert steps.max_sustainable_rate([{"rate": 100, "sustainable": False}]) is None
    assert steps.max_sustainable_rate([]) is None
    s = steps.summary(run, [100, 200, 400, 800], stop={"after_step": 2})
    assert s["stopped_early"] and s["steps_run"] == 3 and s["limit_found"]
    assert s["max_sustainable_rate"] == 100
    assert not steps.summary(run[:1], [100], stop=None)["limit_found"]


def test_due_times_follow_the_staircase() -> None:
    due = steps.due_times(step_plan((2.0, 4.0), 1.0), 10.0)
    assert list(due) == [10.0, 10.5, 11.0, 11.25, 11.5, 11.75]
    lat = steps.staircase_due_latencies([3, 1, 2], [11.1, 10.2, 10.6], step_plan((2.0, 4.0), 1.0), 10.0)
    assert list(lat) == pytest.approx([200.0, 100.0, 100.0])


WARM = warm_plan((100.0, 200.0), 2.0)  # 400 messages at the top rate, 200 msg/s
PLAN_W = step_plan((100.0, 200.0), 10.0, 2.0)  # the same steps, after the warm phase and its 4 s rest


def _warm_rows(created, ids, worked, **kw):
    return steps.step_rows(PLAN_W, gate_at=GATE, step_s=10.0, created_at=created, arrival_ids=ids,
                           arrival_t=worked, consumers=1, batch_size=100, warm=WARM, **kw)


def test_a_warm_phase_is_in_no_step_figure() -> None:
    assert WARM == [(200.0, 0.0, 400)] and [offset for _, offset, _ in PLAN_W] == [6.0, 16.0]
    tl, groups = _timeline(t1=GATE + 30), {"consumers": ["consumer-0"]}
    cold = _rows(*_run(PLAN), timeline=tl, groups=groups)
    warm = _warm_rows(*_run(WARM + PLAN_W), timeline=tl, groups=groups)
    assert [(r["t0_s"], r["t1_s"]) for r in warm] == [(6.0, 16.0), (16.0, 26.0)]
    for c, w in zip(cold, warm, strict=True):  # the warm messages count in no step: the figures are the cold ones
        assert [w[k] for k in ("sent", "achieved_rate", "delivered_per_s", "lag_end", "sustainable")] == [
            c[k] for k in ("sent", "achieved_rate", "delivered_per_s", "lag_end", "sustainable")]
        assert w["latency_ms"]["n"] == c["latency_ms"]["n"] == c["sent"]
        assert w["latency_ms"]["p50"] == pytest.approx(c["latency_ms"]["p50"], abs=0.01)
        assert w["latency_from_due_ms"]["p99"] == pytest.approx(c["latency_from_due_ms"]["p99"], abs=0.01)
        assert w["lag_slope"] == pytest.approx(c["lag_slope"], abs=0.1)
        assert w["cpu_ms_per_msg"]["total"] == pytest.approx(c["cpu_ms_per_msg"]["total"])  # ÷ the step's rows only
    assert steps.max_sustainable_rate(warm) == 200.0


def test_the_warm_block_says_whether_its_backlog_cleared_before_the_first_step() -> None:
    def block(capacity: float) -> dict:
        created, ids, worked = _run(WARM + PLAN_W, capacity=capacity)
        return steps.warm_summary(WARM, gate_at=GATE, warm_s=2.0, first_step_s=PLAN_W[0][1], created_at=created,
                                  arrival_ids=ids, arrival_t=worked)

    # a FIFO worker of 150 msg/s: ~100 of the 400 warm messages wait at the warm phase's end, gone 0.7 s later
    w = block(150.0)
    assert (w["rate"], w["seconds"], w["messages"], w["sent"], w["rest_s"]) == (200.0, 2.0, 400, 400, 4.0)
    assert w["achieved_rate"] == 200.0 and w["latency_ms"]["n"] == 400
    assert w["lag_end"] == pytest.approx(400 - 2.0 * 150, abs=10)
    assert w["lag_at_first_step"] == 0 and w["oldest_age_s_at_first_step"] == 0.0 and w["cleared"]
    # 50 msg/s: the warm messages take 8 s, 2 s beyond the rest: the first step begins on a backlog
    w = block(50.0)
    assert not w["cleared"] and w["lag_at_first_step"] == pytest.approx(400 - 6.0 * 50, abs=5)
    assert w["oldest_age_s_at_first_step"] == pytest.approx(4.5, abs=0.1)
    assert steps.warm_summary([], gate_at=GATE, warm_s=0.0, first_step_s=0.0, created_at={}, arrival_ids=[],
                              arrival_t=[]) is None


def test_due_times_include_the_warm_phase() -> None:
    plan = warm_plan((2.0, 4.0), 1.0) + step_plan((2.0, 4.0), 1.0, 1.0)  # warm 1 s, rest 2 s (the minimum)
    assert list(steps.due_times(plan, 10.0)) == [10.0, 10.25, 10.5, 10.75, 13.0, 13.5, 14.0, 14.25, 14.5, 14.75]


def test_cpu_between_is_none_outside_the_timeline() -> None:
    tl = _timeline()
    assert steps.cpu_between(tl, GATE - 5, GATE) is None
    assert steps.cpu_between(tl, GATE, GATE + 30) is None
    got = steps.cpu_between(tl, GATE + 0.25, GATE + 1.25)  # interpolated inside the readings
    assert got["web"] == pytest.approx(0.1) and got["unattributed"] == pytest.approx(0.1)
