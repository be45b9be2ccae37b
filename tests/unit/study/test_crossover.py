"""N*∞, N*(M) and N* by rate over models, on synthetic runs with known costs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lab.study import crossover


def _runs(seed: int = 0, noise: float = 0.01) -> pd.DataFrame:
    """wal: steady 0.6 + 0.1·(N−1) ms/msg, F = 1 CPU-s; kafka: steady 1.5 flat, F = 4.5 CPU-s (a JVM);
    3 repeats at N = 1, 2, 4, 8, 16, M = 5,000, so their whole-window figures are c + F/M."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (1, 2, 4, 8, 16):
        for _ in range(3):
            for pipeline, c, f in (("wal", 0.6 + 0.1 * (n - 1), 1.0), ("kafka", 1.5, 4.5)):
                c += rng.normal(0, noise)
                rows.append({"pipeline": pipeline, "consumers": n, "messages": 5000, "rate": 0.0,
                             "success": True, "warmup": False, "steady_ms_per_msg": c, "fixed_cpu_s": f,
                             "cpu_ms_per_msg": c + 1000 * f / 5000})
    return pd.DataFrame(rows)


def test_n_star_by_volume_moves_with_the_fixed_part_and_settles_at_the_steady_crossing() -> None:
    answers = crossover.by_volume(_runs(), "wal", "kafka", n_boot=200)
    by = {a.condition: a for a in answers}
    steady = by["M = ∞ (steady), from each run's split"]
    straight = next(m for m in steady.models if m.model == crossover.MODELS[0])
    assert straight.n_star == pytest.approx(10.0, rel=0.05)  # 1 + (1.5 − 0.6) / 0.1
    assert straight.inside and straight.ci[0] < 10 < straight.ci[1]
    five = next(m for m in by["M = 5,000, from each run's split"].models if m.model == crossover.MODELS[0])
    assert five.n_star == pytest.approx(17.0, rel=0.05)  # 1 + ((1.5 + 0.9) − (0.6 + 0.2)) / 0.1
    assert not five.inside  # beyond the measured N = 16: extrapolated, and said so
    assert "extrapolated beyond N = 16" in by["M = 5,000, from each run's split"].words()
    hundred = next(m for m in by["M = 100,000, from each run's split"].models if m.model == crossover.MODELS[0])
    assert 10 < hundred.n_star < 11.0
    assert {m.model for m in steady.models} == set(crossover.MODELS)  # every model could be fitted
    lo, hi = steady.range
    assert lo <= 10.0 * 1.05 and hi >= 10.0 * 0.95


def test_a_curved_direct_line_is_one_of_the_models() -> None:
    df = _runs(noise=0.0)
    curve = df["pipeline"] == "wal"
    x = df.loc[curve, "consumers"] - 1
    df.loc[curve, "steady_ms_per_msg"] = 0.6 + 0.02 * x + 0.004 * x**2  # accelerating
    (steady,) = crossover.by_volume(df, "wal", "kafka", volumes=[math.inf], n_boot=100)
    curved = next(m for m in steady.models if m.model == crossover.MODELS[2])
    assert curved.n_star == pytest.approx(1 + (-0.02 + math.sqrt(0.02**2 + 4 * 0.004 * 0.9)) / (2 * 0.004), rel=0.01)
    straight = next(m for m in steady.models if m.model == crossover.MODELS[0])
    assert steady.range == (min(curved.n_star, straight.n_star), max(curved.n_star, straight.n_star))


def test_runs_without_a_split_are_left_out() -> None:
    df = _runs()
    df.loc[df.index[:4], "steady_ms_per_msg"] = np.nan
    assert len(crossover.at_volume(df, 5000)) == len(df) - 4
    assert crossover.at_volume(df.drop(columns=["steady_ms_per_msg"]), 5000).empty


def _staircase(pipeline: str, n: int, floor: float, per_msg_ms: float) -> dict:
    steps = []
    for rate in (250.0, 500.0, 1000.0, 2000.0):
        cpu_per_s = floor + per_msg_ms / 1000 * rate
        steps.append({"rate": rate, "achieved_rate": rate, "sustainable": rate < 2000,
                      "cpu_ms_per_msg": {"total": cpu_per_s * 1000 / rate}})
    return {"scenario": {"pipeline": pipeline, "consumers": n}, "steps": steps}


def test_rate_lines_and_n_star_by_rate() -> None:
    runs = [_staircase("wal", n, 0.05 * n, 0.6 + 0.1 * (n - 1)) for n in (1, 4, 8)]
    runs += [_staircase("kafka", n, 0.8, 1.5) for n in (1, 4, 8)]
    lines = crossover.rate_lines(runs)
    wal1 = lines[(lines.pipeline == "wal") & (lines.consumers == 1)].iloc[0]
    assert wal1.a_cpu_per_s == pytest.approx(0.05) and wal1.b_ms_per_msg == pytest.approx(0.6)
    assert wal1.steps == 3  # the unsustainable 2,000 msg/s step is left out
    slow, fast = crossover.by_rate(lines, "wal", "kafka", rates=[200.0, 1000.0])
    n_slow = next(m for m in slow.models if m.model == crossover.MODELS[0]).n_star
    n_fast = next(m for m in fast.models if m.model == crossover.MODELS[0]).n_star
    # at a low rate the broker's idle JVM and pollers are paid over few messages: the broker pays off later
    assert n_slow > n_fast
    table = crossover.answer_table([slow, fast])
    assert table["model"].str.contains("range over models").sum() == 2
    # every row names its pair: a saved table is read without the answers beside it
    assert table[["direct", "broker"]].notna().all().all()
    assert list(table.columns[:3]) == ["direct", "broker", "condition"]


def test_volume_fit_recovers_a_fixed_part_only_where_there_is_one() -> None:
    rng = np.random.default_rng(3)
    rows = []
    for m in (5_000, 20_000, 100_000):
        for _ in range(2):
            dbz = 4.0 + 0.15e-3 * m + rng.normal(0, 0.05)
            cons = 0.23e-3 * m + rng.normal(0, 0.05)
            rows.append({"pipeline": "kafka", "consumers": 1, "messages": m, "success": True,
                         "cpu_s.debezium": dbz, "cpu_s.consumers": cons, "cpu_ms_per_msg": (dbz + cons) * 1000 / m})
    rows.append({**rows[0], "success": False, "cpu_ms_per_msg": 99.0})  # a failed run is left out
    fit = crossover.volume_fit(pd.DataFrame(rows), ["debezium", "consumers"]).set_index("participant")
    assert fit.loc["debezium", "fixed_cpu_s"] == pytest.approx(4.0, abs=0.15)
    assert fit.loc["debezium", "steady_ms_per_msg"] == pytest.approx(0.15, abs=0.01)
    assert abs(fit.loc["consumers", "fixed_cpu_s"]) < 0.15
    assert fit.loc["total", "steady_ms_per_msg"] == pytest.approx(0.38, abs=0.01)
    assert fit.loc["total", "runs"] == 6 and fit.loc["total", "volumes"] == [5_000, 20_000, 100_000]
    one_volume = pd.DataFrame([r for r in rows if r["messages"] == 5_000])
    assert crossover.volume_fit(one_volume).empty


def test_the_slope_is_the_sum_of_its_parts() -> None:
    rows = []
    for n in (1, 2, 4, 8):
        for rep in range(2):
            m = 5000
            wals, claims, cons = 0.05 * n, 0.02 * n, 0.2 + 0.01 * n  # ms/msg per part
            rows.append({"pipeline": "wal", "consumers": n, "messages": m, "success": True, "warmup": False,
                         "rate": 0.0, "pg.walsenders": wals * m / 1000, "pg.claims": claims * m / 1000,
                         "pg.other": 0.1 * m / 1000, "cpu_s.consumers": cons * m / 1000,
                         "cpu_ms_per_msg": wals + claims + 0.1 + cons + 0.001 * rep})
    parts = crossover.slope_parts(pd.DataFrame(rows), "wal").set_index("part")
    assert parts.loc["pg.walsenders", "b_ms_per_msg"] == pytest.approx(0.05)
    assert parts.loc["pg.claims", "b_ms_per_msg"] == pytest.approx(0.02)
    assert parts.loc["total", "b_ms_per_msg"] == pytest.approx(0.08)
    named = parts.drop(index="total")["b_ms_per_msg"].sum()
    assert named == pytest.approx(parts.loc["total", "b_ms_per_msg"])
    assert parts.loc["pg.walsenders", "share_of_slope"] == pytest.approx(0.625)


def test_cells_run_at_several_volumes_answer_from_the_fit_across_them() -> None:
    rows = []
    for n in (1, 2, 4, 8):
        for m in (5_000, 20_000):
            for pipeline, c, f in (("wal", 0.6 + 0.1 * (n - 1), 0.0), ("kafka", 1.5, 4.5)):
                rows.append({"pipeline": pipeline, "consumers": n, "messages": m, "success": True, "warmup": False,
                             "cpu_ms_per_msg": c + 1000 * f / m})  # no split at all: not needed
    five, steady = crossover.by_volume(pd.DataFrame(rows), "wal", "kafka", volumes=[5_000, math.inf], n_boot=50)
    assert steady.condition == "M = ∞ (steady), fitted across volumes"
    straight = next(m for m in steady.models if m.model == crossover.MODELS[0])
    assert straight.n_star == pytest.approx(10.0, rel=0.01)
    assert next(m for m in five.models if m.model == crossover.MODELS[0]).n_star == pytest.approx(19.0, rel=0.01)


def test_a_volume_arm_at_two_n_gives_f_as_a_line_in_n_and_each_runs_steady_cost() -> None:
    """The series' design: every cell at 5,000 messages, a volume arm at 20,000 at N = 1 and 16 only.
    wal: F = 0.5 + 0.1·(N − 1) CPU-s (a slot and a consumer each), kafka: F = 4.5 (a JVM); no split."""
    rng = np.random.default_rng(3)
    main, arm = [], []
    for n in (1, 2, 4, 8, 16):
        for m, into in ((5_000, main), (20_000, arm)):
            if into is arm and n not in (1, 16):
                continue
            for _ in range(2):
                for pipeline, c, f in (("wal", 0.6 + 0.1 * (n - 1), 0.5 + 0.1 * (n - 1)), ("kafka", 1.5, 4.5)):
                    into.append({"pipeline": pipeline, "consumers": n, "messages": m, "success": True,
                                 "warmup": into is arm, "label": "volume" if into is arm else "",
                                 "cpu_ms_per_msg": c + 1000 * f / m + rng.normal(0, 0.005)})
    lines = crossover.fixed_lines(pd.DataFrame(main), pd.DataFrame(arm)).set_index("pipeline")
    assert lines.loc["kafka", "f0"] == pytest.approx(4.5, abs=0.15) and abs(lines.loc["kafka", "f1"]) < 0.02
    assert lines.loc["wal", "f1"] == pytest.approx(0.1, abs=0.02) and lines.loc["wal", "fitted_at"] == [1, 16]
    five, steady = crossover.by_volume(pd.DataFrame(main), "wal", "kafka", volumes=[5_000, math.inf],
                                       arm=pd.DataFrame(arm), n_boot=100)
    assert steady.condition == "M = ∞ (steady), F fitted across volumes at N = 1, 16"
    straight = next(m for m in steady.models if m.model == crossover.MODELS[0])
    assert straight.n_star == pytest.approx(10.0, rel=0.03)  # 1 + (1.5 − 0.6) / 0.1
    # at 5,000 per start: wal 0.6 + 0.1x + (0.1 + 0.02x), kafka 1.5 + 0.9 -> x = 1.7 / 0.12
    assert next(m for m in five.models if m.model == crossover.MODELS[0]).n_star == pytest.approx(
        1 + 1.7 / 0.12, rel=0.03)
    # without the arm the same runs fall back to each run's split, which these runs do not carry
    with pytest.raises(ValueError, match="2 or more consumer counts"):
        crossover.by_volume(pd.DataFrame(main), "wal", "kafka", volumes=[math.inf], n_boot=50)


def test_sides_follow_the_pipelines_own_attributes_and_answers_cover_every_pair() -> None:
    assert crossover.sides(["rabbitmq", "wal", "kafka", "wal-sharded"]) == (["wal", "wal-sharded"],
                                                                            ["kafka", "rabbitmq"])
    df = _runs()
    answers, notes = crossover.answers_by_volume(df, None, n_boot=50)
    assert {(a.direct, a.broker) for a in answers} == {("wal", "kafka")} and not notes
    lonely = df[(df["pipeline"] == "kafka") | (df["consumers"] == 1)]  # wal at one N only: no slope
    answers, notes = crossover.answers_by_volume(lonely, None, n_boot=50)
    assert not answers and len(notes) == 1 and notes[0].startswith("wal vs kafka: no crossover")
    vol = pd.DataFrame([{"label": "volume", "success": True}, {"label": "", "success": True},
                        {"label": "volume", "success": False}])
    assert len(crossover.volume_arm(vol)) == 1


def test_a_curve_that_never_crosses_in_most_draws_gives_inf_without_a_warning() -> None:
    """Bootstrap draws of the curved model that never cross are inf; the interval's bound between two of
    them is inf, not inf − inf (a NaN that numpy warned about on the report page, once per pair and volume)."""
    import warnings

    df = _runs()
    wal = df["pipeline"] == "wal"
    x = df.loc[wal, "consumers"] - 1
    noise = np.random.default_rng(3).normal(0, 0.02, int(wal.sum()))
    df.loc[wal, "steady_ms_per_msg"] = 0.6 + 0.05 * x - 0.003 * x**2 + noise  # bends down below kafka's 1.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (steady,) = crossover.by_volume(df, "wal", "kafka", volumes=[math.inf], n_boot=200)
    curved = next(m for m in steady.models if m.model == crossover.MODELS[2])
    assert curved.n_star is None and curved.ci == (math.inf, math.inf)
