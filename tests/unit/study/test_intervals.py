"""The stated coverage of a median interval is its real coverage (checked by simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lab.study import costmodel
from lab.study.intervals import coverage_label, median_interval, order_coverage, runs_for


def test_exact_coverage_of_order_statistic_intervals() -> None:
    assert order_coverage(3, 1) == pytest.approx(0.75)  # [min, max] of 3 runs: 1 - 2 * 0.5^3
    assert order_coverage(5, 1) == pytest.approx(1 - 2 * 0.5**5)
    assert order_coverage(10, 2) == pytest.approx(1 - 2 * (1 + 10) / 2**10)
    assert runs_for(0.95) == 6 and runs_for(0.75) == 3
    assert math.isnan(median_interval([3.0])[0]) and median_interval([3.0])[2] == 0.0
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0, pytest.approx(0.75))
    lo, hi, cov = median_interval(np.arange(10.0))  # k = 2 reaches 97.9 %, k = 3 only 89 %
    assert (lo, hi) == (1.0, 8.0) and cov == pytest.approx(order_coverage(10, 2)) and cov >= 0.95
    assert coverage_label(0.75) == "75 %" and coverage_label(0.96875) == "96.8 %"
    assert coverage_label(0.0) == "no interval"


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 8, 10])
def test_stated_coverage_matches_simulation(n: int) -> None:
    """20,000 samples of n runs from a skewed distribution (lognormal, like run times): the share
    of intervals holding the true median is the coverage the interval states, within 1.5 points."""
    rng = np.random.default_rng(n)
    samples = rng.lognormal(0.0, 0.5, (20_000, n))
    hits, stated = 0, set()
    for row in samples:
        lo, hi, cov = median_interval(row)
        stated.add(round(cov, 12))
        hits += lo <= 1.0 <= hi  # the lognormal(0, σ) median is exp(0) = 1
    assert len(stated) == 1
    assert hits / len(samples) == pytest.approx(stated.pop(), abs=0.015)


def test_headline_cells_carry_their_coverage() -> None:
    import pandas as pd

    df = pd.DataFrame(dict(pipeline="wal", consumers=[1, 1, 1, 2], messages=1000,
                           cpu_ms_per_msg=[1.0, 1.2, 1.1, 2.0], success=True, warmup=False))
    h = costmodel.headline(df).set_index("consumers")
    assert (h.loc[1, "lo"], h.loc[1, "hi"], h.loc[1, "coverage"]) == (1.0, 1.2, pytest.approx(0.75))
    assert math.isnan(h.loc[2, "lo"]) and h.loc[2, "coverage"] == 0.0
