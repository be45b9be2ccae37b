"""A line fitted over N, y = a + b·(N - 1) (:func:`fit_line`; :mod:`lab.study.costmodel` fits each
fan-out pipeline with it), and its intervals: the bootstrap that resamples runs within each N,
small-sample corrected (:func:`boot_draws`), and OLS with Student's t (:func:`t975`).

95 % intervals, and which one a report shows (``FanoutFit.ci_method``):

* ``"bootstrap"`` when every N has at least 3 runs (2 when OLS-t is not available): runs are
  resampled with replacement within each N (stratified, so every N stays represented), the fit is
  redone, and the 2.5/97.5 percentiles are taken, with a small-sample correction
  (:func:`boot_draws`). This is what a report shows when there are repeats. (With 2 runs per N,
  each N's resamples take only 3 distinct values and the interval covers ~87 % in simulation, so
  OLS-t is shown instead; the bootstrap is still kept.)
* ``"ols-t"`` otherwise, when there are at least 3 distinct N: OLS standard errors with Student's t
  on n - 2 degrees of freedom. The published table (one run per cell) gets this one, because its
  bootstrap degenerates to a single point.
* ``"none"``: NaN intervals, when neither can be computed.

Both are kept whenever they can be computed (``a_ci_boot``, ``a_ci_ols``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

Z975 = 1.959963984540054  # standard normal 97.5 % quantile
MIN_BOOT_RUNS = 3  # runs at every N before the bootstrap is the interval shown
Interval = tuple[float, float]
NAN_CI: Interval = (math.nan, math.nan)
Anchor = Literal["ols", "first"]


def t975(dof: int) -> float:
    """Student's t 97.5 % quantile: closed forms for 1-2 dof, else the numerically inverted CDF."""
    if dof == 1:
        return math.tan(math.pi * 0.475)
    if dof == 2:
        return 0.95 * math.sqrt(2 / (4 * 0.975 * 0.025))
    t = np.linspace(0.0, 12.0, 120_001)
    logc = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    pdf = np.exp(logc - (dof + 1) / 2 * np.log1p(t * t / dof))
    cdf = 0.5 + np.concatenate([[0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(t))])
    return float(np.interp(0.975, cdf, t))


def percentile_ci(draws: np.ndarray) -> Interval:
    lo, hi = np.quantile(np.asarray(draws, float), [0.025, 0.975], method="inverted_cdf")
    return float(lo), float(hi)


def resample(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n) row indices, resampled with replacement within each N (x sorted)."""
    starts, counts = np.unique(x, return_index=True, return_counts=True)[1:]
    return np.hstack(
        [s + rng.integers(0, c, (n_boot, c)) for s, c in zip(starts, counts, strict=True)]
    )


def rescaled(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y with each N's deviations from its mean scaled by sqrt(k / (k - 1)) (k runs at that N), so
    that resampling k runs does not shrink their variance by the bootstrap's (k - 1) / k; single
    runs stay as they are."""
    out = y.astype(float)
    for v in np.unique(x):
        m = x == v
        if (k := m.sum()) >= 2:
            out[m] = y[m].mean() + (y[m] - y[m].mean()) * math.sqrt(k / (k - 1))
    return out


def estimator(
    x: np.ndarray, anchor: Anchor
) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(Y, YS) of shape (R, n) -> (a, b) arrays of length R, for the fixed design x = N - 1."""
    if anchor == "ols":
        xc = x - x.mean()
        sxx = xc @ xc

        def ols(y: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            b = ys @ xc / sxx
            return y.mean(axis=1) - b * x.mean(), b

        return ols
    if anchor != "first":
        raise ValueError(f"unknown anchor {anchor!r}: choose 'ols' or 'first'")
    lo, hi, span = x == x.min(), x == x.max(), x.max() - x.min()

    def first(y: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        base = np.median(ys[:, lo], axis=1)
        return np.median(y[:, lo], axis=1), (np.median(ys[:, hi], axis=1) - base) / span

    return first


def boot_draws(
    x: np.ndarray,
    y: np.ndarray,
    ys: np.ndarray,
    anchor: Anchor,
    n_boot: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """(n_boot, 2) bootstrap (a, b): runs resampled within each N, small-sample corrected.

    Two corrections keep the 95 % coverage near nominal with 3-5 runs per N (checked by simulation
    in the unit tests): deviations are rescaled before resampling (:func:`rescaled`), and the draws
    are spread about the estimate by t(n - k) / z (k = number of distinct N), the t-interval's
    allowance for a variance estimated from n - k degrees of freedom.
    """
    est = estimator(x, anchor)
    centre = np.column_stack(est(y[None], ys[None]))
    idx = resample(x, n_boot, rng)
    draws = np.column_stack(est(rescaled(x, y)[idx], rescaled(x, ys)[idx]))
    dof = x.size - np.unique(x).size
    return centre + (draws - centre) * (t975(dof) / Z975 if dof else 1.0)


def fit_line(x: np.ndarray, y: np.ndarray, ys: np.ndarray, anchor: Anchor, n_boot: int, seed: int, *,
             ols: bool) -> tuple[float, float, str, tuple[Interval, Interval], dict[str, Any]]:
    """``a``, ``b`` (b from ``ys``, which is ``y`` unless the slope is one participant's), how the
    interval shown was made (``bootstrap``, ``ols-t``, ``none``) and the (a, b) intervals shown,
    and every interval that could be computed (``draws``, ``a_ci_boot``, ``b_ci_boot``; with
    ``ols`` and 3 or more N: ``cov``, ``dof``, ``a_ci_ols``, ``b_ci_ols``)."""
    est = estimator(x, anchor)
    a, b = (float(v[0]) for v in est(y[None], ys[None]))
    out: dict[str, Any] = {}
    counts = np.unique(x, return_counts=True)[1]
    if counts.max() >= 2:
        draws = boot_draws(x, y, ys, anchor, n_boot, np.random.default_rng(seed))
        out |= dict(draws=draws, a_ci_boot=percentile_ci(draws[:, 0]), b_ci_boot=percentile_ci(draws[:, 1]))
    if anchor == "ols" and ols and counts.size >= 3:
        design = np.column_stack([np.ones_like(x), x])
        dof = len(y) - 2
        resid = y - design @ np.array([a, b])
        cov = (resid @ resid / dof) * np.linalg.inv(design.T @ design)
        half = t975(dof) * np.sqrt(np.diag(cov))
        a_ols, b_ols = (
            (float(a - half[0]), float(a + half[0])),
            (float(b - half[1]), float(b + half[1])),
        )
        out |= dict(cov=cov, dof=dof, a_ci_ols=a_ols, b_ci_ols=b_ols)
    if counts.min() >= 2 and (counts.min() >= MIN_BOOT_RUNS or "cov" not in out):
        method, shown = "bootstrap", (out["a_ci_boot"], out["b_ci_boot"])
    elif "cov" in out:
        method, shown = "ols-t", (out["a_ci_ols"], out["b_ci_ols"])
    else:
        method, shown = "none", (NAN_CI, NAN_CI)
    return a, b, method, shown, out
