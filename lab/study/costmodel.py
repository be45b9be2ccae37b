"""Cost model: ms CPU/msg = a + b·(N - 1) per fan-out pipeline, flat broker levels, crossover N*.

Input is runs as :func:`lab.results.load_runs` returns them (one row per run), or the published
tables shaped the same way (:func:`published_runs`). Only successful, non-warm-up runs count, one
point per run, so repeats weigh in.

95 % intervals of a fit, and which one a report shows (``FanoutFit.ci_method``): :mod:`lab.study.linefit`.

Medians of a cell or of a broker's runs get a distribution-free order-statistic interval labelled
with its exact coverage (:mod:`lab.study.intervals`; 75 % for 3 runs), not a nominal 95 %.
Only comparable runs are ever pooled (:mod:`lab.study.groups`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lab.pipelines import NAMES
from lab.results import load_reference
from lab.study import groups
from lab.study.ha_nodes import rollup_nodes
from lab.study.intervals import median_interval
from lab.study.linefit import NAN_CI, Anchor, Interval, boot_draws, fit_line, percentile_ci, t975

METRIC = "cpu_ms_per_msg"
NOISE_REL = 0.10  # the article's rule: under 10 % is stand drift


def measured(df: pd.DataFrame, pipeline: str | None = None, *, producer: str | None = "web") -> pd.DataFrame:
    """Successful, non-warm-up runs with a finite metric (of one pipeline when given).

    Raises :class:`lab.study.groups.NotComparable` (one line) when they mix runs measured
    differently (message count, rate, work delay, load topology, CPU method).

    ``producer``: only runs of that producer mode (``"web"``: the study; ``"direct"``: the
    broker-native stand, which is not comparable with it); None keeps both. Runs stored before
    the field existed count as ``"web"``.
    """
    if df.empty:
        return df
    ok = np.isfinite(pd.to_numeric(df[METRIC], errors="coerce").to_numpy(float))
    if producer is not None and "producer" in df:
        ok &= (df["producer"].fillna("web") == producer).to_numpy()
    for col, want in (("success", True), ("warmup", False)):
        if col in df:
            ok &= df[col].fillna(not want).astype(bool).to_numpy() == want
    if pipeline is not None:
        ok &= (df["pipeline"] == pipeline).to_numpy()
    out = df[ok]
    groups.check(out)  # never pool runs that were not measured alike (lab.study.groups)
    return rollup_nodes(out)  # ha: `kafka`/`rabbitmq` as the sum of their nodes (lab.study.ha_nodes)


def participant_ms(df: pd.DataFrame, participant: str) -> np.ndarray:
    """One participant's CPU in ms per configured message, per run (missing = 0)."""
    return (
        df[f"cpu_s.{participant}"].fillna(0).to_numpy(float) * 1000 / df["messages"].to_numpy(float)
    )


@dataclass(frozen=True, eq=False)
class FanoutFit:
    """ms CPU/msg = a + b·(N - 1) for one pipeline, with 95 % intervals (module docstring)."""

    pipeline: str
    a: float
    b: float
    a_ci: Interval
    b_ci: Interval
    ci_method: str  # bootstrap | ols-t | none
    anchor: Anchor
    slope_from: str | None
    n: np.ndarray = field(repr=False)  # consumers per run, sorted
    y: np.ndarray = field(repr=False)  # ms CPU/msg per run
    ys: np.ndarray = field(repr=False)  # what b was fitted on (y, or one participant's ms/msg)
    a_ci_boot: Interval = NAN_CI
    b_ci_boot: Interval = NAN_CI
    a_ci_ols: Interval = NAN_CI
    b_ci_ols: Interval = NAN_CI
    cov: np.ndarray | None = field(default=None, repr=False)  # OLS covariance of (a, b)
    dof: int = 0
    draws: np.ndarray | None = field(default=None, repr=False)  # bootstrap (a, b) rows

    @property
    def n_range(self) -> tuple[int, int]:
        return int(self.n.min()), int(self.n.max())

    @property
    def runs_per_n(self) -> dict[int, int]:
        values, counts = np.unique(self.n, return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts, strict=True)}

    def predict(self, n: Any) -> np.ndarray:
        """Model ms/msg at consumer count(s) n."""
        return self.a + self.b * (np.asarray(n, float) - 1)

    def band(self, n: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """95 % interval of the model line at n, from the shown method (None when there is none)."""
        x = np.asarray(n, float) - 1
        if self.ci_method == "bootstrap" and self.draws is not None:
            pred = self.draws[:, :1] + self.draws[:, 1:] * x
            return np.quantile(pred, 0.025, axis=0), np.quantile(pred, 0.975, axis=0)
        if self.ci_method == "ols-t" and self.cov is not None:
            se = np.sqrt(self.cov[0, 0] + 2 * x * self.cov[0, 1] + x * x * self.cov[1, 1])
            mid = self.predict(n)
            return mid - t975(self.dof) * se, mid + t975(self.dof) * se
        return None


def fit_fanout(
    df: pd.DataFrame,
    pipeline: str,
    *,
    anchor: Anchor = "ols",
    slope_from: str | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> FanoutFit:
    """Fit ms CPU/msg = a + b·(N - 1) over the pipeline's successful, non-warm-up runs.

    ``anchor="ols"``: least squares over every run. ``anchor="first"``: the article's way
   : a = the median at the smallest N, b = the rise from the smallest to the
    largest N per extra consumer. ``slope_from="postgres"`` fits b on that participant's ms/msg
    instead of the total (the article's "PG pays ≈ 9.4 CPU-s per extra reader"); with OLS, a is then
    ȳ - b·x̄ (least squares given b) and only the bootstrap interval exists.
    Raises ValueError when the runs cover fewer than 2 distinct N.
    """
    runs = measured(df, pipeline).sort_values("consumers", kind="stable")
    n = runs["consumers"].to_numpy(int)
    if np.unique(n).size < 2:
        raise ValueError(
            f"{pipeline}: a slope needs runs at 2 or more consumer counts, got {sorted(set(n))}"
        )
    x, y = n - 1.0, runs[METRIC].to_numpy(float)
    ys = y if slope_from is None else participant_ms(runs, slope_from)
    a, b, method, shown, out = fit_line(x, y, ys, anchor, n_boot, seed, ols=slope_from is None)
    return FanoutFit(pipeline, a, b, *shown, method, anchor, slope_from, n, y, ys, **out)


@dataclass(frozen=True, eq=False)
class Level:
    """A broker pipeline's cost: the median ms/msg over its runs (order-statistic interval with its
    exact ``coverage``, :mod:`lab.study.intervals`), and its own fitted line when that line's slope
    is distinguishable from 0 (``line``; the crossover then uses it instead of the flat level)."""

    pipeline: str
    level: float
    ci: Interval  # NaN with a single run
    values: np.ndarray = field(repr=False)  # the runs' ms/msg
    at: int | None  # only runs at this N, or all N
    slope: float  # the pipeline's own b (all its runs), NaN when not fittable
    slope_ci: Interval
    slope_nonzero: bool | None  # b's shown interval excludes 0; None without an interval
    coverage: float = 0.0  # of ``ci`` (exact, order statistics)
    line: FanoutFit | None = field(default=None, repr=False)  # set when slope_nonzero

    @property
    def model(self) -> str:
        return "fitted line" if self.line is not None else "flat level"


def broker_level(
    df: pd.DataFrame, pipeline: str, *, at: int | None = None, n_boot: int = 2000, seed: int = 0
) -> Level:
    """Flat level of a broker pipeline (median over runs; ``at=N`` keeps runs at that N only).

    The interval is the order-statistic interval of the median with its exact coverage
    (:func:`lab.study.intervals.median_interval`). The level is only meaningful if the pipeline's own
    slope is not distinguishable from 0 (``slope_nonzero``); when it is, ``line`` holds the fit and
    :func:`crossover` uses it.
    The article's "flat CDC line" is the Kafka cell at N = 8: ``broker_level(df, "kafka", at=8)``.
    """
    runs = measured(df, pipeline)
    if at is not None:
        runs = runs[runs["consumers"] == at]
    values = runs[METRIC].to_numpy(float)
    if values.size == 0:
        raise ValueError(f"{pipeline}: no successful measured runs" + (f" at N={at}" if at else ""))
    lo, hi, coverage = median_interval(values)
    own = None
    try:
        own = fit_fanout(df, pipeline, n_boot=n_boot, seed=seed)
        slope, slope_ci = own.b, own.b_ci
    except ValueError:
        slope, slope_ci = math.nan, NAN_CI
    nonzero = None if math.isnan(slope_ci[0]) else not slope_ci[0] <= 0 <= slope_ci[1]
    return Level(pipeline, float(np.median(values)), (lo, hi), values, at, slope, slope_ci, nonzero,
                 coverage, own if nonzero and at is None else None)


@dataclass(frozen=True, eq=False)
class Crossover:
    """Where a fan-out line meets a broker level: N* = 1 + (level - a) / b."""

    direct: str
    broker: str
    n_star: float | None  # None: b <= 0, the line never rises to the level
    ci: Interval  # 2.5/97.5 % of the draws; inf where a draw has b <= 0
    ci_method: str  # bootstrap | parametric-t | none (from the fit)
    level_resampled: bool  # False: the level had one run and was held fixed
    p_never: float  # share of draws with b <= 0
    n_range: tuple[int, int]  # the fit's measured N
    inside: bool  # N* within the measured range (measured) or not (extrapolated)
    broker_model: str = "flat level"  # or "fitted line" (the broker's slope is not 0)


def _draw_line(fit: FanoutFit, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray] | None:
    """(a, b) draws the way the fit's interval was made, or None without one."""
    if fit.ci_method == "bootstrap":
        a, b = boot_draws(fit.n - 1.0, fit.y, fit.ys, fit.anchor, n_boot, rng).T
        return a, b
    if fit.ci_method == "ols-t" and fit.cov is not None:
        z = rng.multivariate_normal(np.zeros(2), fit.cov, n_boot, method="eigh")
        ab = np.array([fit.a, fit.b]) + z / np.sqrt(rng.chisquare(fit.dof, n_boot) / fit.dof)[:, None]
        return ab[:, 0], ab[:, 1]
    return None


def crossover(fit: FanoutFit, level: Level, *, n_boot: int = 2000, seed: int = 0) -> Crossover:
    """N* where ``fit`` reaches the broker, with a 95 % interval from resampling both.

    The broker is its flat level, or its own fitted line when that line's slope is distinguishable
    from 0 (``level.line``): then N* = 1 + (a_broker - a) / (b - b_broker), and there is no crossing
    unless the direct line is the steeper one. A fit is redrawn the way its interval was made:
    stratified bootstrap of its runs, or, with one run per N, (a, b) from the OLS estimate's
    multivariate t (a parametric bootstrap). The flat level is a bootstrap of its runs' median, or
    fixed when it has one run. N* < 1 means the direct line is already above the broker at N = 1.
    """
    rng = np.random.default_rng(seed)
    line = level.line
    la, lb = (level.level, 0.0) if line is None else (line.a, line.b)
    n_star = None if fit.b <= lb else 1 + (la - fit.a) / (fit.b - lb)
    drawn = _draw_line(fit, n_boot, rng)
    resampled = level.values.size >= 2
    if drawn is None:
        ci, p_never = NAN_CI, math.nan
    else:
        a, b = drawn
        if line is not None:
            other = _draw_line(line, n_boot, rng)
            lvl, lslope = other if other is not None else (np.full(n_boot, la), np.full(n_boot, lb))
        else:
            lslope, lvl = np.zeros(n_boot), np.full(n_boot, level.level)
            if resampled:
                lvl = np.median(
                    level.values[rng.integers(0, level.values.size, (n_boot, level.values.size))], axis=1
                )
        rise = b - lslope
        with np.errstate(divide="ignore", invalid="ignore"):
            draws = np.where(rise > 0, 1 + (lvl - a) / rise, np.inf)
        ci, p_never = percentile_ci(draws), float(np.mean(rise <= 0))
    lo, hi = fit.n_range
    inside = n_star is not None and lo <= n_star <= hi
    method = fit.ci_method if fit.ci_method != "ols-t" else "parametric-t"
    return Crossover(
        fit.pipeline, level.pipeline, n_star, ci, method, resampled, p_never, (lo, hi), inside,
        level.model,
    )


def headline(df: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0, metric: str = METRIC) -> pd.DataFrame:
    """Pipeline x N: median ms CPU/msg, run count n, and the order-statistic interval of the median
    (lo, hi) with its exact ``coverage`` (:func:`lab.study.intervals.median_interval`: 95 % or more
    from 6 runs; [min, max] below that, e.g. 75 % with 3 runs; NaN and 0 with a single run). Warm-up
    and failed runs are excluded. ``metric``: another per-run column (e.g. the speed-normalised one).
    ``n_boot`` and ``seed`` are kept for callers; the interval needs no resampling."""
    rows = []
    runs = measured(df)
    for (pipeline, n), g in runs.groupby(["pipeline", "consumers"], sort=False):
        v = pd.to_numeric(g[metric], errors="coerce").dropna().to_numpy(float)
        if not v.size:
            continue
        lo, hi, coverage = median_interval(v)
        rows.append(dict(pipeline=pipeline, consumers=int(n), median=float(np.median(v)), n=v.size,
                         lo=lo, hi=hi, coverage=coverage))
    out = pd.DataFrame(rows, columns=["pipeline", "consumers", "median", "n", "lo", "hi", "coverage"])
    order = {p: i for i, p in enumerate(NAMES)}
    out = out.assign(_o=out["pipeline"].map(order).fillna(len(order)))
    return (
        out.sort_values(["_o", "pipeline", "consumers"]).drop(columns="_o").reset_index(drop=True)
    )


def within_noise(
    x: float | Mapping[str, Any], y: float | Mapping[str, Any], *, rel: float = NOISE_REL
) -> bool:
    """Whether two cells differ by no more than noise.

    A cell is a number or a headline row (``median``, ``lo``, ``hi``). When both cells have finite
    intervals, noise means the intervals overlap. Otherwise (one run per cell) the article's rule
    applies: a difference under 10 % of the larger value is stand drift (it measured
    a 10 % drift, so 2.16 vs 2.21 is noise and 1.19 vs 2.35 is not).
    """

    def parts(c: float | Mapping[str, Any]) -> tuple[float, float, float]:
        if isinstance(c, Mapping | pd.Series):
            return float(c["median"]), float(c.get("lo", math.nan)), float(c.get("hi", math.nan))
        return float(c), math.nan, math.nan

    (xm, xl, xh), (ym, yl, yh) = parts(x), parts(y)
    if all(math.isfinite(v) for v in (xl, xh, yl, yh)):
        return xl <= yh and yl <= xh
    return abs(xm - ym) < rel * max(abs(xm), abs(ym))


def drift(df: pd.DataFrame) -> pd.DataFrame:
    """Each drift probe (``label`` containing "drift") beside its origin: the first earlier
    successful, non-warm-up run of the same pipeline, N and message count (rows are in time order).
    Rates are messages / window_s; changes are in % of the origin."""
    rows = []
    labels = df.get("label", pd.Series("", index=df.index)).fillna("").astype(str)
    base = measured(df)
    for pos, (i, probe) in enumerate(df.iterrows()):
        if "drift" not in labels[i].lower():
            continue
        same = base[
            (base["pipeline"] == probe["pipeline"])
            & (base["consumers"] == probe["consumers"])
            & (base["messages"] == probe["messages"])
            & base.index.isin(df.index[:pos])
        ]
        if same.empty:
            continue
        o = same.iloc[0]
        rate_o, rate_p = o["messages"] / o["window_s"], probe["messages"] / probe["window_s"]
        rows.append(
            dict(
                probe_run=probe.get("run_id"),
                origin_run=o.get("run_id"),
                pipeline=probe["pipeline"],
                consumers=int(probe["consumers"]),
                ms_per_msg_origin=o[METRIC],
                ms_per_msg_probe=probe[METRIC],
                cpu_change_pct=100 * (probe[METRIC] / o[METRIC] - 1),
                msg_per_s_origin=rate_o,
                msg_per_s_probe=rate_p,
                rate_change_pct=100 * (rate_p / rate_o - 1),
            )
        )
    return pd.DataFrame(rows)


def runs_from_table(table: pd.DataFrame, value: str = "ms_per_msg") -> pd.DataFrame:
    """A published pipeline x N table (e.g. ``load_reference("headline")``) as successful,
    non-warm-up runs, one per row, with ``cpu_ms_per_msg`` taken from ``value``."""
    out = table.rename(columns={value: METRIC}).assign(success=True, warmup=False)
    return out.assign(
        run_id=[f"ref-{p}-c{n}" for p, n in zip(out["pipeline"], out["consumers"], strict=True)]
    )


def published_runs() -> pd.DataFrame:
    """The published sweep as runs, shaped like :func:`lab.results.load_runs`: 18 rows in time order
    (the warm-up and the drift probe flagged ``warmup``), ``cpu_ms_per_msg`` as in the results JSON
    (3 dp; the headline table rounds it to 2), ``cpu_s.test`` = the load-test process (our senders +
    consumers + runner), ``debezium`` NaN where none ran."""
    p, t = load_reference("participants"), load_reference("throughput")
    df = p.merge(
        t[["seq", "processed", "skipped", "claims_min", "claims_max", "ops_per_msg"]], on="seq"
    )
    parts = ["postgres", "kafka", "rabbitmq", "debezium", "web", "test"]
    return pd.DataFrame(
        {
            "run_id": [
                f"ref-{s:02d}-{r}-c{c}"
                for s, r, c in zip(df["seq"], df["reference_name"], df["consumers"], strict=True)
            ],
            "started_at": None,
            "pipeline": df["pipeline"],
            "consumers": df["consumers"],
            "messages": df["messages"],
            "warmup": df["warmup"],
            "label": df["label"].fillna(""),
            "success": True,
            "error": None,
            "window_s": df["window_s"],
            METRIC: df["ms_per_msg"],
            **{f"cpu_s.{c}": df[c] for c in parts},
            "sent": df["processed"],
            "processed": df["processed"],
            "skipped": df["skipped"],
            "work_calls": df["processed"],
            "work_distinct": df["processed"],
            "claims_min": df["claims_min"],
            "claims_max": df["claims_max"],
            "db_ops": (df["ops_per_msg"] * df["processed"]).round(),
        }
    ).sort_values("run_id", ignore_index=True)
