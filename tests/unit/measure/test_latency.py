"""lab.measure.latency on synthetic data with known answers (no services)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lab.measure import latency


def test_first_arrival_per_id_wins() -> None:
    ids = [3, 1, 3, 2, 1]
    t = [10.5, 10.0, 10.2, 11.0, 9.0]
    assert latency.first_arrivals(ids, t) == {3: 10.2, 1: 9.0, 2: 11.0}


def test_latency_per_message_in_ms_from_created_at_to_first_arrival() -> None:
    created = {1: 100.000, 2: 100.010, 3: 100.020}
    ids = [2, 1, 3, 1]  # id 1 redelivered later: counted once, at its first arrival
    t = [100.015, 100.002, 100.120, 100.900]
    got = latency.message_latencies(ids, t, created)
    assert got == pytest.approx([2.0, 5.0, 100.0])  # ascending id order


def test_an_arrival_without_created_at_is_an_error() -> None:
    with pytest.raises(ValueError, match="1 arrived ids have no created_at"):
        latency.message_latencies([1, 7], [1.0, 2.0], {1: 0.5})
    with pytest.raises(ValueError, match="2 ids but 1 times"):
        latency.first_arrivals([1, 2], [1.0])


def test_summary_uses_nearest_rank_quantiles() -> None:
    s = latency.summarize(np.arange(1, 101, dtype=float))  # 1..100 ms
    assert s == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0, "mean": 50.5, "n": 100}
    # nearest rank: every percentile is an observed value (linear interpolation would give 2.5)
    s = latency.summarize([1.0, 2.0, 3.0, 4.0])
    assert (s["p50"], s["p95"], s["p99"], s["max"]) == (2.0, 4.0, 4.0, 4.0)
    one = latency.summarize([7.25])
    assert one["p50"] == one["p99"] == one["max"] == one["mean"] == 7.25 and one["n"] == 1


def test_summary_of_nothing() -> None:
    assert latency.summarize([]) == {"p50": None, "p95": None, "p99": None, "max": None,
                                     "mean": None, "n": 0}


def test_a_tail_shows_in_p99_and_max_not_in_p50() -> None:
    x = [5.0] * 990 + [500.0] * 10
    s = latency.summarize(x)
    assert s["p50"] == s["p95"] == 5.0 and s["p99"] == 5.0 and s["max"] == 500.0
    s = latency.summarize([5.0] * 989 + [500.0] * 11)
    assert s["p99"] == 500.0


def _open(sent: int, gate: float, last: float, rate: float = 500.0) -> dict[str, float]:
    return {"rate": rate, "sent": sent, "gate_opened_at": gate, "last_send_at": last}


def test_achieved_rate_open_loop_on_schedule() -> None:
    # 5000 messages at 500/s: the last is due 9.998 s after the gate, answered 2 ms later
    assert latency.achieved_rate(_open(5000, 1000.0, 1010.0), window_s=99.0) == 500.0


def test_achieved_rate_reveals_a_sender_that_falls_behind() -> None:
    # the same 5000 messages, but the sender needed 12.5 s: 400 msg/s, not the target's 500
    assert latency.achieved_rate(_open(5000, 1000.0, 1012.5), window_s=12.6) == 400.0
    # failed sends do not count
    assert latency.achieved_rate(_open(4000, 1000.0, 1010.0), window_s=10.0) == 400.0


def test_achieved_rate_closed_loop_is_sent_over_the_window() -> None:
    closed = {"rate": 0.0, "sent": 3000, "gate_opened_at": 0.0, "last_send_at": 1.0}
    assert latency.achieved_rate(closed, window_s=2.0) == 1500.0
    assert latency.achieved_rate(closed, window_s=None) is None
    assert latency.achieved_rate({"rate": 500.0, "sent": 10}, window_s=1.0) is None
    assert latency.achieved_rate({}, window_s=1.0) is None


def _runs() -> pd.DataFrame:
    rows = []
    for pipeline, base in (("kafka", 20.0), ("wal", 100.0)):
        for n in (1, 4):
            for k, factor in enumerate((1.0, 3.0)):  # two repeats: the median is 2x base
                v = base * n * factor
                rows.append({"pipeline": pipeline, "consumers": n, "success": True, "warmup": False,
                             "rate": 500.0, "achieved_rate": 499.0 + k, "cpu_ms_per_msg": 1.0 + k,
                             "latency_ms.p50": v, "latency_ms.p95": 2 * v, "latency_ms.p99": 3 * v,
                             "latency_ms.max": 4 * v, "latency_from_due_ms.p50": v + 1,
                             "latency_from_due_ms.p99": 3 * v + 1})
    rows.append({**rows[0], "success": False, "latency_ms.p50": 1e6})  # a failed run: left out
    rows.append({**rows[0], "warmup": True, "latency_ms.p50": 1e6})  # a warm-up: left out
    rows.append({**rows[0], "latency_ms.p50": np.nan})  # no latency measured: left out
    return pd.DataFrame(rows)


def test_latency_table_medians_per_cell_in_pipeline_order() -> None:
    t = latency.latency_table(_runs())
    assert list(zip(t["pipeline"], t["consumers"], strict=True)) == [
        ("wal", 1), ("wal", 4), ("kafka", 1), ("kafka", 4)]  # the registry's order
    wal4 = t.iloc[1]
    assert (wal4["p50"], wal4["p95"], wal4["p99"], wal4["max"]) == (800.0, 1600.0, 2400.0, 3200.0)
    assert wal4["achieved_rate"] == 499.5 and wal4["cpu_ms_per_msg"] == 1.5 and wal4["runs"] == 2
    assert (wal4["due_p50"], wal4["due_p99"]) == (801.0, 2401.0)
    assert latency.latency_table(pd.DataFrame()).empty


def test_latency_figure_has_a_log_panel_per_pipeline_with_four_lines() -> None:
    from lab.study import plots

    fig = plots.latency_figure(_runs())
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["wal", "kafka"]  # the rate is the caption's, said once
    assert "open loop at 500 msg/s" in " ".join(fig.get_supxlabel().split())
    assert axes[0].get_yscale() == "log"
    lines = axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == ["p50", "p95", "p99", "max"]
    assert list(lines[0].get_ydata()) == [200.0, 800.0]  # wal p50 at N = 1, 4


def test_schedule_table_one_row_per_measured_run() -> None:
    results = [
        {"run_id": "w",
         "scenario": {"pipeline": "kafka", "consumers": 1, "rate": 0.0, "warmup": True}},
        {"run_id": "a", "success": True, "achieved_rate": 498.0,
         "scenario": {"pipeline": "wal", "consumers": 4, "rate": 500.0, "warmup": False},
         "senders": {"send_p50_ms": 1.5, "send_p95_ms": 3.0, "send_max_ms": 40.0}},
    ]
    t = latency.schedule_table(results)
    assert list(t["run_id"]) == ["a"]
    row = t.iloc[0][["rate", "achieved_rate", "send_p95_ms", "send_max_ms"]]
    assert row.tolist() == [500.0, 498.0, 3.0, 40.0]


def test_due_latency_counts_from_the_schedule_so_a_stall_cannot_hide() -> None:
    # 4 messages due at 0, 10, 20, 30 ms (100 msg/s); the web stalled: ids 2..4 arrive late
    ids, t = [11, 12, 13, 14, 12], [0.005, 0.110, 0.111, 0.112, 0.2]
    got = latency.due_latencies(ids, t, gate_opened_at=0.0, rate=100.0)
    assert got == pytest.approx([5.0, 100.0, 91.0, 82.0])
    # created_at would have been stamped after the stall: 5 ms each, the stall invisible
    created = {11: 0.0, 12: 0.105, 13: 0.106, 14: 0.107}
    assert latency.message_latencies(ids, t, created) == pytest.approx([5.0] * 4)
    # the mean does not depend on which id is matched with which due time
    shuffled = latency.due_latencies([14, 13, 12, 11], [0.005, 0.110, 0.111, 0.112], 0.0, 100.0)
    assert shuffled.mean() == pytest.approx(got.mean())
    with pytest.raises(ValueError, match="positive rate"):
        latency.due_latencies(ids, t, 0.0, 0.0)
