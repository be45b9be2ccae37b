"""Distribution-free intervals for a median, labelled with their exact coverage.

With n runs, the interval [x₍ₖ₎, x₍ₙ₋ₖ₊₁₎] between two order statistics contains the true median
with probability P(k ≤ B ≤ n − k), B ~ Binomial(n, ½), whatever the distribution of the runs
(continuous). :func:`median_interval` takes the narrowest such interval whose coverage is at least
the level asked for; when even [min, max] falls short (n ≤ 5 for 95 %: 3 runs give 75 %,
5 give 93.75 %) it returns [min, max] with the coverage it really has. Every table and figure
prints that coverage (``coverage``) next to the interval, never a nominal "95 %".

Across sittings, :func:`hierarchical_interval` bootstraps at two levels, sittings and then the runs
within each (the random-effects view of Kalibera and Jones, "Rigorous Benchmarking in Reasonable
Time", ISMM 2013).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

LEVEL = 0.95


def order_coverage(n: int, k: int) -> float:
    """P(x₍ₖ₎ ≤ median ≤ x₍ₙ₋ₖ₊₁₎) for n continuous i.i.d. values (k is 1-based)."""
    if n < 2 or not 1 <= k <= n // 2:
        return 0.0
    below = sum(math.comb(n, i) for i in range(k))  # fewer than k values below the median
    return 1.0 - 2.0 * below / 2.0**n


def runs_for(level: float = LEVEL) -> int:
    """The fewest runs whose [min, max] reaches ``level`` (6 for 95 %)."""
    n = 2
    while order_coverage(n, 1) < level:
        n += 1
    return n


def median_interval(values: np.ndarray | list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(lo, hi, coverage) of the median of ``values``; NaNs and coverage 0 with fewer than 2."""
    x = np.sort(np.asarray(values, float))
    n = x.size
    if n < 2:
        return math.nan, math.nan, 0.0
    k = 1
    while k + 1 <= n // 2 and order_coverage(n, k + 1) >= level:
        k += 1
    return float(x[k - 1]), float(x[n - k]), order_coverage(n, k)


def coverage_label(coverage: float) -> str:
    """``0.75`` -> "75 %" (rounded down to a tenth, so it never overstates)."""
    if not coverage or not math.isfinite(coverage):
        return "no interval"
    return f"{math.floor(coverage * 1000) / 10:g} %"


def hierarchical_interval(groups: Sequence[Sequence[float]], *, level: float = 0.95, n_boot: int = 2000,
                          seed: int = 0) -> tuple[float, float, float]:
    """The median over sittings of each sitting's median, and its bootstrap interval resampling
    sittings with replacement and then the runs within each drawn sitting (two levels). With one
    sitting only the runs are resampled: the interval then says nothing of other sittings."""
    data = [np.asarray(g, float) for g in groups if len(g)]
    if not data:
        return (math.nan, math.nan, math.nan)
    point = float(np.median([np.median(g) for g in data]))
    rng = np.random.default_rng(seed)
    draws = np.empty(n_boot)
    for i in range(n_boot):
        picked = [data[j] for j in rng.integers(0, len(data), len(data))]
        draws[i] = np.median([np.median(rng.choice(g, g.size)) for g in picked])
    a = (1 - level) / 2
    return (point, float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a)))
