from __future__ import annotations

import numpy as np
import pandas as pd

from lab.measure.probe import normalise, summarise, unit
from lab.study import speed, summary


def series(seed: int = 0) -> pd.DataFrame:
    """Two pipelines x N, 3 runs each; the machine's slowness s multiplies every run's cost."""
    rng, rows = np.random.default_rng(seed), []
    for p, a, b in (("wal", 1.0, 0.3), ("kafka", 2.2, 0.0)):
        for n in (1, 2, 4, 8):
            for r in range(3):
                slow = rng.uniform(1.0, 1.6)  # the host's slowness during this run
                raw = (a + b * (n - 1)) * slow * rng.normal(1, 0.01)
                rows.append({"run_id": f"{p}-{n}-{r}", "pipeline": p, "consumers": n, "messages": 5000,
                             "cpu_ms_per_msg": raw, "cpu_ms_per_msg_norm": raw / slow,
                             "speed.unit_ms_median": slow, "success": True, "warmup": False})
    return pd.DataFrame(rows)


def test_normalisation_removes_the_machines_slowness_from_the_spread() -> None:
    s = speed.spread(series())
    assert len(s) == 8
    assert (s["normalised_spread_pct"] < s["raw_spread_pct"]).all()
    v = speed.verdicts(series())
    assert set(v.columns) >= {"raw", "normalised", "changed"} and len(v) == 4


def test_slow_runs_are_flagged_against_the_median() -> None:
    df = series()
    df.loc[3, "speed.unit_ms_median"] = 10.0
    slow = speed.slow_runs(df)
    assert list(slow["run_id"]) == [df.loc[3, "run_id"]] and slow["times_median"].iloc[0] > 5


def test_probe_unit_summary_and_normalisation(tmp_path) -> None:
    assert unit() > 0
    path = tmp_path / "probe.json"
    path.write_text('{"unit_loops": 1, "period_s": 0.1, "t": [1, 2, 3, 4], "ms": [9.0, 2.0, 2.0, 4.0]}')
    got = summarise(path, 1.5, 4.5)
    assert got["samples"] == 3 and got["unit_ms_median"] == 2.0 and got["speed"] == 0.5
    assert normalise(3.0, got) == 1.5 and normalise(None, got) is None and summarise(tmp_path / "x", 0, 1) is None


def test_the_summary_opens_with_the_answer_in_words() -> None:
    text = summary.markdown(series(), "series test: 5000 messages", n_boot=200)
    assert text.startswith("## The answer")
    assert "| consumers N | cheapest |" in text and "| 1 | wal |" in text
    assert "**wal vs kafka**" in text and "N ≈ 11" in text and "75 %" in text
    assert "n_star" not in text and "upto8" not in text


def test_the_crossover_names_the_interval_it_really_has() -> None:
    """3 runs per N: a bootstrap of the runs; 1 run per N (the reference profile): the fit's own
    t distribution, which must not be called a bootstrap of the runs."""
    three = summary.crossover_sentences(series(), n_boot=200)
    one_run = series().groupby(["pipeline", "consumers"]).head(1)
    one = summary.crossover_sentences(one_run, n_boot=200)
    assert "95 % bootstrap interval" in three[0]
    assert "95 % parametric interval (one run per N)" in one[0] and "bootstrap" not in one[0]
