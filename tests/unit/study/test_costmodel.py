from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lab.results import load_reference
from lab.study import costmodel as cm
from lab.study import linefit


def synth(
    a: float,
    b: float,
    *,
    sd: float = 0.05,
    repeats: int = 3,
    ns=(1, 2, 4, 8),
    seed: int = 0,
    pipeline: str = "wal",
) -> pd.DataFrame:
    """Runs with ms/msg = a + b·(N - 1) + N(0, sd²) noise, in the shape load_runs() returns."""
    n = np.repeat(ns, repeats)
    y = a + b * (n - 1) + np.random.default_rng(seed).normal(0, sd, n.size)
    return pd.DataFrame(
        dict(
            pipeline=pipeline,
            consumers=n,
            messages=100_000,
            cpu_ms_per_msg=y,
            success=True,
            warmup=False,
            label="",
        )
    )


@pytest.fixture(scope="module")
def published() -> pd.DataFrame:
    return cm.published_runs()


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return cm.runs_from_table(load_reference("headline"))


def test_reference_tables_are_complete_and_consistent() -> None:
    h = load_reference("headline")
    assert len(h) == 16 and set(h["pipeline"]) == {"wal", "wal-sharded", "kafka", "rabbitmq"}
    assert h.set_index(["reference_name", "consumers"]).loc[("dbz-quorum", 4), "ms_per_msg"] == 2.25
    p = load_reference("participants")
    parts = p[["postgres", "kafka", "rabbitmq", "debezium", "web", "test"]].fillna(0).sum(axis=1)
    assert np.allclose(parts, p["sum"]) and np.allclose(
        p["sum"] * 1000 / p["messages"], p["ms_per_msg"]
    )
    assert (~p["warmup"]).sum() == 16 and p["label"].fillna("").tolist().count("drift") == 1
    t = load_reference("throughput").merge(h, on=["pipeline", "consumers"], suffixes=("", "_h"))
    assert np.allclose(t.loc[~t["warmup"], "ms_per_msg"], t.loc[~t["warmup"], "ms_per_msg_h"])
    assert load_reference("control").groupby("consumers")["msg_per_s"].count().tolist() == [3, 3, 3]
    native = load_reference("broker_native").set_index("pipeline")["ms_per_msg"]
    assert native.to_dict() == {"kafka": 0.45, "rabbitmq": 0.58, "wal": 2.22}
    with pytest.raises(ValueError, match="choose one of"):
        load_reference("no-such-table")


def test_student_t_quantiles_match_the_tables() -> None:
    for dof, t in {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 10: 2.228, 30: 2.042}.items():
        assert linefit.t975(dof) == pytest.approx(t, abs=1e-3)


def test_the_articles_model_anchored_at_n1_with_the_postgres_slope(published: pd.DataFrame) -> None:
    # Article: 1.19 + 0.094·(N - 1), "PG pays ≈ 9.4 CPU-s per extra reader",
    # N* ≈ 11 against the flat CDC line 2.16 (the Kafka N = 8 cell). The runs carry the JSON's 3-dp
    # values, so a = 1.187 rounds to 1.19, and b = (129.7 - 64.0) CPU-s / 7 / 100,000 msg = 0.09386
    # rounds to 0.094: tolerances are half a unit of the article's last printed digit.
    fit = cm.fit_fanout(published, "wal", anchor="first", slope_from="postgres")
    assert fit.a == pytest.approx(1.19, abs=0.005) and fit.b == pytest.approx(0.094, abs=0.0005)
    assert fit.predict(8) == pytest.approx(1.85, abs=0.01)  # "N = 8: model 1.85, measured 1.88"
    assert fit.ci_method == "none" and math.isnan(
        fit.a_ci[0]
    )  # one run per N: no interval, said so
    level = cm.broker_level(published, "kafka", at=8)
    assert level.level == pytest.approx(2.16, abs=0.005) and math.isnan(level.ci[0])
    cross = cm.crossover(fit, level)
    assert round(cross.n_star) == 11 and not cross.inside and cross.n_range == (1, 8)
    # the article's own arithmetic, from its printed numbers
    assert 1 + (2.16 - 1.19) / fit.b == pytest.approx(11.3, abs=0.05)


def test_ols_over_the_published_headline(table: pd.DataFrame) -> None:
    fit = cm.fit_fanout(table, "wal")
    # closed form for x = 0, 1, 3, 7 and y = 1.19, 1.21, 1.48, 1.88: Sxy = 2.97, Sxx = 28.75
    assert fit.b == pytest.approx(2.97 / 28.75, abs=1e-9)
    assert fit.a == pytest.approx(1.44 - 2.75 * 2.97 / 28.75, abs=1e-9)
    # One run per cell: the bootstrap degenerates, the OLS t-interval (2 dof) is the one shown.
    assert fit.ci_method == "ols-t" and fit.dof == 2 and math.isnan(fit.a_ci_boot[0])
    # OLS does not anchor at N = 1, so a is 0.034 below the article's 1.19 and b 0.009 above its
    # 0.094; both article values lie well inside the 95 % intervals (residual sd 0.043 on 2 dof).
    assert fit.a_ci[0] < 1.19 < fit.a_ci[1] and fit.b_ci[0] < 0.094 < fit.b_ci[1]
    assert fit.a == pytest.approx(1.19, abs=0.05) and fit.b == pytest.approx(0.094, abs=0.01)
    cross = cm.crossover(fit, cm.broker_level(table, "kafka", at=8))
    assert (
        round(cross.n_star) == 11
        and cross.ci_method == "parametric-t"
        and not cross.level_resampled
    )
    assert cross.ci[0] < cross.n_star < cross.ci[1] and not cross.inside


def test_broker_levels_of_the_published_sweep_are_flat(published: pd.DataFrame) -> None:
    for pipeline in ("kafka", "rabbitmq"):
        level = cm.broker_level(published, pipeline)
        assert level.slope_nonzero is False and level.ci[0] <= level.level <= level.ci[1]
    assert cm.broker_level(published, "kafka").level == pytest.approx((2.030 + 2.159) / 2)
    assert cm.broker_level(published, "wal").slope_nonzero is True  # the fan-out line is not flat


def test_fit_recovers_known_parameters() -> None:
    fit = cm.fit_fanout(synth(1.2, 0.1, sd=0.01, repeats=6), "wal", seed=1)
    assert fit.ci_method == "bootstrap" and fit.runs_per_n == {1: 6, 2: 6, 4: 6, 8: 6}
    assert fit.a == pytest.approx(1.2, abs=0.015) and fit.b == pytest.approx(0.1, abs=0.003)
    assert fit.a_ci[0] < fit.a < fit.a_ci[1] and fit.b_ci[0] < fit.b < fit.b_ci[1]
    lo, hi = fit.band([1, 8])
    assert np.all(lo < fit.predict([1, 8])) and np.all(fit.predict([1, 8]) < hi)


@pytest.mark.parametrize("repeats", [3, 4])
def test_intervals_cover_the_truth_in_about_95_percent_of_seeds(repeats: int) -> None:
    a, b, seeds = 1.2, 0.1, range(100)
    hits = np.zeros(4)
    for s in seeds:
        fit = cm.fit_fanout(synth(a, b, repeats=repeats, seed=s), "wal", n_boot=1000, seed=s)
        hits += [
            fit.a_ci_boot[0] <= a <= fit.a_ci_boot[1],
            fit.b_ci_boot[0] <= b <= fit.b_ci_boot[1],
            fit.a_ci_ols[0] <= a <= fit.a_ci_ols[1],
            fit.b_ci_ols[0] <= b <= fit.b_ci_ols[1],
        ]
    coverage = hits / len(seeds)
    # nominal 0.95; 100 seeds give a binomial sd of ~0.02, so 0.85-1.0 is a loose but failing bound
    # (the plain percentile bootstrap covers b ~0.80 with 3 runs per N)
    assert np.all(coverage >= 0.85) and np.all(coverage <= 1.0), coverage


def test_repeats_within_a_cell_all_count_and_warmups_do_not() -> None:
    df = synth(1.0, 0.2, sd=0.0, repeats=2)
    noisy = pd.DataFrame(
        [
            dict(
                pipeline="wal",
                consumers=8,
                messages=1,
                cpu_ms_per_msg=50.0,
                success=s,
                warmup=w,
                label="",
            )
            for s, w in ((False, False), (True, True))
        ]
    )
    fit = cm.fit_fanout(pd.concat([df, noisy], ignore_index=True), "wal")
    assert fit.n.size == 8 and fit.b == pytest.approx(0.2) and fit.a == pytest.approx(1.0)
    with pytest.raises(ValueError, match="2 or more consumer counts"):
        cm.fit_fanout(df[df["consumers"] == 1], "wal")
    with pytest.raises(ValueError, match="unknown anchor"):
        cm.fit_fanout(df, "wal", anchor="last")  # type: ignore[arg-type]


def test_no_crossover_when_the_direct_line_does_not_rise() -> None:
    fit = cm.fit_fanout(synth(1.5, -0.02, sd=0.01), "wal")
    level = cm.broker_level(synth(2.0, 0.0, sd=0.05, pipeline="kafka"), "kafka")
    cross = cm.crossover(fit, level, seed=3)
    assert fit.b < 0 and cross.n_star is None and not cross.inside
    assert cross.p_never > 0.9 and cross.ci[1] == math.inf and cross.level_resampled


def test_crossover_inside_or_outside_the_measured_range() -> None:
    fit = cm.fit_fanout(synth(1.0, 0.1, sd=0.01), "wal")
    near = cm.crossover(fit, cm.broker_level(synth(1.35, 0.0, sd=0.01, pipeline="kafka"), "kafka"))
    far = cm.crossover(fit, cm.broker_level(synth(3.0, 0.0, sd=0.01, pipeline="kafka"), "kafka"))
    assert (
        near.n_star == pytest.approx(4.5, abs=0.3) and near.inside and near.ci_method == "bootstrap"
    )
    assert near.ci[0] < near.n_star < near.ci[1] < far.ci[0]
    assert far.n_star == pytest.approx(21, abs=1.5) and not far.inside


def test_headline_medians_counts_and_intervals() -> None:
    df = pd.concat([synth(1.0, 0.1, repeats=3), synth(2.0, 0.0, repeats=1, pipeline="kafka")])
    df = pd.concat(
        [
            df,
            pd.DataFrame(
                [dict(pipeline="kafka", consumers=1, cpu_ms_per_msg=9.0, success=True, warmup=True)]
            ),
        ],
        ignore_index=True,
    )
    h = cm.headline(df)
    assert (
        h["pipeline"].tolist() == ["wal"] * 4 + ["kafka"] * 4
        and h["n"].tolist() == [3] * 4 + [1] * 4
    )
    wal = h[h["pipeline"] == "wal"]
    assert np.all((wal["lo"] <= wal["median"]) & (wal["median"] <= wal["hi"]))
    assert h[h["pipeline"] == "kafka"]["lo"].isna().all() and h["median"].max() < 9


def test_within_noise_by_overlap_or_the_articles_10_percent_rule() -> None:
    assert cm.within_noise(2.16, 2.21) and not cm.within_noise(1.19, 2.35)
    # The article also calls 1.60 vs 1.88 noise, but that is 15 % apart: its own 10 % rule says no.
    assert not cm.within_noise(1.60, 1.88)
    cell = dict(median=1.0, lo=0.9, hi=1.1)
    assert cm.within_noise(cell, dict(median=1.25, lo=1.05, hi=1.4))
    assert not cm.within_noise(cell, dict(median=1.05, lo=1.11, hi=1.2))  # 5 % apart, yet resolved


def test_drift_probe_against_its_origin(published: pd.DataFrame) -> None:
    d = cm.drift(published)
    assert len(d) == 1 and d.loc[0, "origin_run"] == "ref-02-dbz-kafka-c1"
    assert d.loc[0, "cpu_change_pct"] == pytest.approx(0.04, abs=0.01)  # the reference study: +0.04 %
    assert d.loc[0, "rate_change_pct"] == pytest.approx(100 * (53.8**-1 / 46.4**-1 - 1))


def test_anchored_fit_with_repeats_gets_a_bootstrap_interval() -> None:
    df = synth(1.2, 0.1, sd=0.02, repeats=4).assign(
        **{"cpu_s.postgres": lambda d: d.consumers * 5.0}
    )
    fit = cm.fit_fanout(df, "wal", anchor="first", slope_from="postgres")
    assert fit.ci_method == "bootstrap" and fit.b == pytest.approx(5.0 * 1000 / 100_000)
    assert fit.b_ci == pytest.approx((0.05, 0.05)) and fit.a_ci[0] < 1.2 < fit.a_ci[1]
    assert (
        cm.crossover(fit, cm.broker_level(synth(2.0, 0, pipeline="kafka"), "kafka")).inside is False
    )


def test_crossover_uses_the_brokers_fitted_line_when_its_slope_is_not_zero() -> None:
    direct = synth(1.0, 0.5, sd=0.02, ns=(1, 2, 4, 8, 16))
    rising = synth(3.0, 0.25, sd=0.02, ns=(1, 2, 4, 8, 16), pipeline="kafka", seed=1)
    df = pd.concat([direct, rising], ignore_index=True)
    fit, level = cm.fit_fanout(df, "wal"), cm.broker_level(df, "kafka")
    assert level.slope_nonzero and level.model == "fitted line"
    c = cm.crossover(fit, level)
    assert c.broker_model == "fitted line"
    assert c.n_star == pytest.approx(1 + 2.0 / 0.25, rel=0.05)  # 9, where the two lines meet
    assert c.ci[0] < c.n_star < c.ci[1]
    flat = synth(3.0, 0.0, sd=0.02, ns=(1, 2, 4, 8, 16), pipeline="kafka", seed=1)
    level = cm.broker_level(pd.concat([direct, flat], ignore_index=True), "kafka")
    assert not level.slope_nonzero and level.model == "flat level"
    assert cm.crossover(fit, level).n_star == pytest.approx(1 + 2.0 / 0.5, rel=0.05)
    parallel = synth(3.0, 0.5, sd=0.02, ns=(1, 2, 4, 8, 16), pipeline="kafka", seed=1)
    level = cm.broker_level(pd.concat([direct, parallel], ignore_index=True), "kafka")
    assert cm.crossover(fit, level).p_never > 0.2  # equal slopes: the lines may never meet
