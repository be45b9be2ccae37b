"""The issue-6 analysis on synthetic runs with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lab.measure.idle import idle_rates_for, net_of_idle
from lab.study import compare, costmodel

NS = (1, 2, 4, 8, 12, 16)


def _runs(lines: dict[str, tuple[float, float]], *, repeats: int = 3, noise: float = 0.005,
          ns: tuple[int, ...] = NS, seed: int = 1) -> pd.DataFrame:
    """Runs of each pipeline at ``a + b·(N-1)`` times a symmetric jitter of ``noise``."""
    rng = np.random.default_rng(seed)
    rows = []
    for p, (a, b) in lines.items():
        for n in ns:
            jit = np.linspace(-noise, noise, repeats) if repeats > 1 else np.zeros(1)
            for k, j in enumerate(rng.permutation(jit)):
                rows.append(dict(run_id=f"{p}-{n}-{k}", pipeline=p, consumers=n, messages=1000,
                                 success=True, warmup=False, window_s=10.0,
                                 cpu_ms_per_msg=(a + b * (n - 1)) * (1 + j)))
    return pd.DataFrame(rows)


def test_cell_comparisons_marks_noise_by_intervals_and_by_the_ten_percent_rule() -> None:
    head = pd.DataFrame([
        dict(pipeline="wal", consumers=1, median=1.0, n=3, lo=0.95, hi=1.05),
        dict(pipeline="kafka", consumers=1, median=2.0, n=3, lo=1.9, hi=2.1),
        dict(pipeline="rabbitmq", consumers=1, median=2.05, n=3, lo=1.95, hi=2.2),
        dict(pipeline="wal", consumers=4, median=1.3, n=1, lo=math.nan, hi=math.nan),
        dict(pipeline="kafka", consumers=4, median=1.35, n=1, lo=math.nan, hi=math.nan),
    ])
    out = compare.cell_comparisons(head).set_index(["consumers", "a", "b"])
    assert not out.loc[(1, "wal", "kafka"), "within_noise"]
    assert out.loc[(1, "wal", "kafka"), "diff"] == pytest.approx(-1.0)
    assert out.loc[(1, "wal", "kafka"), "ratio"] == pytest.approx(0.5)
    assert out.loc[(1, "kafka", "rabbitmq"), "within_noise"]  # intervals overlap
    assert out.loc[(4, "wal", "kafka"), "within_noise"]  # one run each: 3.7 % < 10 %
    assert len(out) == 4


def test_crossing_inside_the_measured_range_is_found_by_the_cells_and_the_fit() -> None:
    # wal = 1 + 0.1·(N-1) meets kafka's flat 2.0 at N* = 11: between the cells 8 and 12.
    df = _runs({"wal": (1.0, 0.1), "kafka": (2.0, 0.0)})
    row = compare.crossover_table(df, n_boot=400).iloc[0]
    assert (row.direct, row.broker) == ("wal", "kafka")
    assert row.n_star_all == pytest.approx(11.0, rel=0.02)
    assert row.lo_all <= 11.0 <= row.hi_all
    assert row.inside_all
    assert row.n_star_upto8 == pytest.approx(11.0, rel=0.05)  # the same line, extrapolated
    assert row.first_measured_n == 12 and row.clear
    assert row.last_clearly_below == 8
    assert "N=12" in row.verdict and "11.0" in row.verdict


def test_no_crossing_below_sixteen_is_said_plainly() -> None:
    df = _runs({"wal": (1.0, 0.02), "rabbitmq": (2.5, 0.0)})
    row = compare.crossover_table(df, n_boot=400).iloc[0]
    first = row.first_measured_n
    assert first is None or (isinstance(first, float) and math.isnan(first))
    assert not row.inside_all and row.n_star_all == pytest.approx(76.0, rel=0.05)
    assert "no crossing up to N=16" in row.verdict


def test_a_line_that_bends_after_eight_is_caught_by_the_measurement_not_the_extrapolation() -> None:
    # Flat 1.0 up to N=8, then +0.5 per step: the fit over N <= 8 never reaches 2.0 (b = 0).
    rows = []
    for n, v in zip(NS, (1.0, 1.0, 1.0, 1.0, 2.5, 3.0), strict=True):
        for k in range(3):
            rows.append(dict(run_id=f"w{n}{k}", pipeline="wal", consumers=n, messages=1000, success=True,
                             warmup=False, window_s=1.0, cpu_ms_per_msg=v * (1 + 0.002 * (k - 1))))
            rows.append(dict(run_id=f"k{n}{k}", pipeline="kafka", consumers=n, messages=1000, success=True,
                             warmup=False, window_s=1.0, cpu_ms_per_msg=2.0 * (1 + 0.002 * (k - 1))))
    row = compare.crossover_table(pd.DataFrame(rows), n_boot=400).iloc[0]
    assert row.first_measured_n == 12 and row.clear
    assert not (row.n_star_upto8 < 16)  # NaN (slope <= 0) or far away: the extrapolation misses it


def test_cells_measured_for_one_pipeline_only_do_not_count() -> None:
    head = costmodel.headline(_runs({"wal": (1.0, 0.1), "kafka": (2.0, 0.0)}, ns=(1, 2, 4, 8), repeats=1))
    extra = pd.DataFrame([dict(pipeline="wal", consumers=16, median=5.0, n=1, lo=math.nan, hi=math.nan)])
    cell = compare.measured_crossing(pd.concat([head, extra]), "wal", "kafka")
    assert cell["ns"] == [1, 2, 4, 8] and cell["first_n"] is None


def test_idle_table_separates_gross_net_idle_and_residual() -> None:
    df = pd.DataFrame([dict(run_id="r", pipeline="kafka", consumers=1, messages=1000, success=True, warmup=False,
                            window_s=10.0, cpu_ms_per_msg=2.0, cpu_ms_per_msg_net=1.5,
                            **{"cpu_s.unattributed": 0.25})])
    row = compare.idle_table(df).iloc[0]
    assert row.idle_ms_per_msg == pytest.approx(0.5)
    assert row.unattributed_ms_per_msg == pytest.approx(0.25)
    assert row.idle_share_pct == pytest.approx(25.0)


def test_net_of_idle_subtracts_rate_times_window_and_never_goes_below_zero() -> None:
    cpu = {"postgres": 1.0, "kafka": 0.1, "debezium": 2.0, "web": 1.0, "unattributed": 5.0}
    rates = {"postgres": 0.01, "kafka": 0.04, "debezium": 0.03, "web": 0.0}
    out = net_of_idle(cpu, 10.0, 1000, rates)
    assert out["idle_cpu_s"] == {"postgres": 0.1, "kafka": 0.4, "debezium": 0.3, "web": 0.0}
    assert out["net_cpu_s"]["kafka"] == 0.0  # 0.1 measured < 0.4 idle: clamped
    assert out["net_cpu_s"]["postgres"] == pytest.approx(0.9)
    assert "unattributed" not in out["net_cpu_s"]
    assert out["cpu_ms_per_msg_net"] == pytest.approx((0.9 + 0 + 1.7 + 1.0) * 1000 / 1000)
    with pytest.raises(ValueError):
        net_of_idle(cpu, 0.0, 1000, rates)


def test_idle_rates_take_the_debezium_of_the_runs_sink_only() -> None:
    record = {"cpu_s_per_s": {"postgres": 0.001, "kafka": 0.04, "rabbitmq": 0.003, "web": 0.0,
                              "debezium-kafka": 0.027, "debezium-rabbitmq": 0.026}}
    assert idle_rates_for(record, cdc_sink="rabbitmq")["debezium"] == 0.026
    assert "debezium" not in idle_rates_for(record, cdc_sink=None)
    assert idle_rates_for(record, cdc_sink=None)["kafka"] == 0.04


def test_decode_and_memory_tables_take_medians_per_cell() -> None:
    df = pd.DataFrame([
        dict(run_id=f"r{k}", pipeline="wal", consumers=4, messages=1000, success=True, warmup=False,
             window_s=1.0, cpu_ms_per_msg=1.0, decoded_mb=v, slots=4,
             **{"mem_mb_max.postgres": 300 + k, "mem_mb_max.consumers": 100.0})
        for k, v in enumerate((0.8, 1.0, 1.2))
    ])
    dec = compare.decode_table(df).iloc[0]
    assert dec.decoded_mb == pytest.approx(1.0) and dec.mb_per_slot == pytest.approx(0.25)
    assert dec.bytes_per_msg == pytest.approx(2**20 / 1000)
    mem = compare.memory_table(df).iloc[0]
    assert (mem.pipeline, mem.consumers) == ("wal", 4)
    assert mem.postgres_mb == 301 and mem.consumers_mb == 100 and mem.total_mb == 401
