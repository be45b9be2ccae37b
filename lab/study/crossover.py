"""The answer as a function of what a team controls: N* by volume per start, by rate, over models.

The crossover N* — the number of readers from which one Debezium → broker pipeline costs less CPU
per message than N direct WAL readers — is not one number. Each run pays a fixed part F (Debezium's
JVM start and warm-up above all) and a steady cost c per message (:mod:`lab.measure.steady`), so the
per-message figure of a run is ``c + F/M`` and depends on M, the messages one start serves; at a
fixed rate the idle loops and pollers are paid per second too. This module gives:

* **N\\*∞** — from the steady costs alone (a Debezium that is never restarted);
* **N\\*(M)** — for the messages one start serves (:data:`VOLUMES`; the reference study measured
  M = 100,000, closed loop);
* **N\\* by rate** — from load staircases, where each step's CPU per second is fitted as
  ``a + b·rate`` per pipeline and N (:func:`rate_lines`), at :data:`RATES` msg/s;

each over the plausible models (:data:`MODELS`): the direct readers' line straight or curved, the
broker flat or sloped. An answer is the range of the models' point estimates with each model's own
95 % interval (:func:`lab.study.costmodel.crossover`), so that what really moves N* — the model and
the conditions — is in the figure, not hidden behind one bootstrap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from lab.study import costmodel
from lab.study.costmodel import METRIC, Interval
from lab.study.linefit import percentile_ci

VOLUMES: tuple[float, ...] = (5_000, 100_000, 1_000_000, math.inf)
SPLIT_ONLY = ", from each run's split"  # the end of a condition read from the runs' own splits (no volume arm)
# N* at a fixed rate is read at 200 msg/s only: the quick staircases sustain up to 800 msg/s, so a
# figure at 1,000 msg/s lay beyond every measured step, and its per-second floors weigh a fifth as
# much there as at 200: what was left was the direct readers' slope per message against a line
# drawn past the data (3.5–3.8 readers on 2026-12-05, where closed loop put N* near 10).
RATES: tuple[float, ...] = (200.0,)
REFERENCE_POINT = "M = 100,000, closed loop"  # where the reference study measured
MODELS = ("straight direct, flat broker", "straight direct, sloped broker", "curved direct, flat broker")
NAN_CI: Interval = (math.nan, math.nan)


@dataclass(frozen=True)
class ModelCrossing:
    """N* under one model: the point estimate (None: the lines never meet), its 95 % interval, and
    whether it lies inside the measured N."""

    model: str
    n_star: float | None
    ci: Interval
    inside: bool


@dataclass(frozen=True)
class Answer:
    """N* under one condition (a volume per start, a rate), over every model that could be fitted."""

    condition: str
    direct: str
    broker: str
    models: tuple[ModelCrossing, ...]
    n_range: tuple[int, int]  # the measured N of the direct readers

    @property
    def range(self) -> tuple[float, float] | None:
        """Lowest and highest point estimate over the models; inf when some model never crosses."""
        points = [m.n_star if m.n_star is not None else math.inf for m in self.models]
        return (min(points), max(points)) if points else None

    @property
    def measured(self) -> bool:
        """Every model crosses inside the measured N: the crossing is measured, not extrapolated."""
        return bool(self.models) and all(m.inside for m in self.models)

    def words(self) -> str:
        """One line: "N* 9.8–14.1 (3 models; extrapolated beyond N = 16)"."""
        r = self.range
        if r is None:
            return f"{self.condition}: no model could be fitted"
        lo, hi = r
        span = f"{_n(lo)}" if math.isclose(lo, hi, rel_tol=0.005) else f"{_n(lo)}–{_n(hi)}"
        where = "measured" if self.measured else f"extrapolated beyond N = {self.n_range[1]}"
        models = f"{len(self.models)} model" + ("s" if len(self.models) > 1 else "")
        return f"{self.condition}: N* {span} ({models}; {where})"


def _n(x: float) -> str:
    return "never" if math.isinf(x) else f"{x:.1f}"


def _quadratic_xy(x: np.ndarray, y: np.ndarray, level: float) -> float | None:
    """Smallest N ≥ 1 where a + b·x + q·x² (x = N − 1) reaches ``level``; None when it never does."""
    if np.unique(x).size < 3:
        raise ValueError("a curve needs runs at 3 or more consumer counts")
    q, b, a = np.polyfit(x, y, 2)
    if a >= level:
        return 1.0
    roots = np.roots([q, b, a - level])
    real = sorted(float(r.real) for r in roots if abs(r.imag) < 1e-9 and r.real >= 0)
    return 1 + real[0] if real else None


def _curved(df: pd.DataFrame, direct: str, broker: str, *, n_boot: int, seed: int) -> ModelCrossing:
    d = costmodel.measured(df, direct)
    levels = costmodel.measured(df, broker)[METRIC].to_numpy(float)
    x, y = d["consumers"].to_numpy(float) - 1, d[METRIC].to_numpy(float)
    point = _quadratic_xy(x, y, float(np.median(levels)))
    rng, draws = np.random.default_rng(seed), []
    groups = [np.flatnonzero(x == n) for n in np.unique(x)]  # runs resampled within each N, on arrays
    if all(len(g) >= 2 for g in groups):
        for _ in range(n_boot):
            idx = np.concatenate([g[rng.integers(0, g.size, g.size)] for g in groups])
            lvl = float(np.median(rng.choice(levels, levels.size)))
            n = _quadratic_xy(x[idx], y[idx], lvl)
            draws.append(math.inf if n is None else n)
    # order statistics, not interpolation (percentile_ci): a draw that never crosses is inf, and the quantile
    # between two of them is inf (interpolating inf − inf gave NaN and a RuntimeWarning per call on the page)
    ci = percentile_ci(np.asarray(draws, float)) if draws else NAN_CI
    lo, hi = int(d["consumers"].min()), int(d["consumers"].max())
    return ModelCrossing(MODELS[2], point, ci, point is not None and lo <= point <= hi)


def crossings(df: pd.DataFrame, direct: str, broker: str, *, condition: str = "", n_boot: int = 1000,
              seed: int = 0) -> Answer:
    """N* between ``direct`` and ``broker`` on ``df``'s ``cpu_ms_per_msg`` under every model that can
    be fitted (a model that cannot — too few N, no slope — is left out, not guessed)."""
    fit = costmodel.fit_fanout(df, direct, n_boot=n_boot, seed=seed)
    level = costmodel.broker_level(df, broker, n_boot=n_boot, seed=seed)
    models: list[ModelCrossing] = []
    flat = costmodel.crossover(fit, dataclasses.replace(level, line=None), n_boot=n_boot, seed=seed)
    models.append(ModelCrossing(MODELS[0], flat.n_star, flat.ci, flat.inside))
    try:
        own = costmodel.fit_fanout(df, broker, n_boot=n_boot, seed=seed)
    except ValueError:
        own = None
    if own is not None:
        sloped = costmodel.crossover(fit, dataclasses.replace(level, line=own), n_boot=n_boot, seed=seed)
        models.append(ModelCrossing(MODELS[1], sloped.n_star, sloped.ci, sloped.inside))
    with contextlib.suppress(ValueError):  # fewer than 3 N: no curve
        models.append(_curved(df, direct, broker, n_boot=n_boot, seed=seed))
    return Answer(condition, direct, broker, tuple(models), fit.n_range)


def at_volume(df: pd.DataFrame, messages: float) -> pd.DataFrame:
    """``df`` with ``cpu_ms_per_msg`` replaced by each run's cost at ``messages`` per start, c + F/M,
    from its cost split (runs without one are dropped); ``messages = inf`` gives the steady cost."""
    if "steady_ms_per_msg" not in df:
        return df.iloc[0:0]
    runs = df.dropna(subset=["steady_ms_per_msg", "fixed_cpu_s"])
    fixed = 0.0 if math.isinf(messages) else 1000 * runs["fixed_cpu_s"] / messages
    return runs.assign(**{METRIC: runs["steady_ms_per_msg"] + fixed})


def by_volume(df: pd.DataFrame, direct: str, broker: str, *, volumes: Iterable[float] = VOLUMES,
              arm: pd.DataFrame | None = None, n_boot: int = 1000, seed: int = 0) -> list[Answer]:
    """N*(M) for every volume per Debezium start (N*∞ last), from the most reliable source there is:

    1. every cell of both pipelines run at two or more volumes: the fit across them per cell
       (:func:`volume_fit`);
    2. a volume arm (``arm``: runs of the same pipelines at another message count at a few N, the
       series' ``volume`` runs): F fitted across volumes at those N, as a line in N
       (:func:`fixed_lines`), and each measured run's steady cost c = its figure − F(N)/M;
    3. otherwise each run's own cost split, whose limit (a warm-up that outlasts the start of a
       short run) the condition's label says.
    """
    cells = df[df["pipeline"].isin([direct, broker])]
    fits = volume_fit(cells) if "messages" in cells else pd.DataFrame()
    per_cell = cells.groupby(["pipeline", "consumers"]).ngroups if not cells.empty else 0
    across = not fits.empty and len(fits) == per_cell
    lines = pd.DataFrame()
    if not across and arm is not None and not arm.empty and "messages" in cells:
        lines = fixed_lines(cells, arm[arm["pipeline"].isin([direct, broker])])
        if set(lines["pipeline"]) != {direct, broker}:
            lines = pd.DataFrame()
    out = []
    for m in volumes:
        label = "M = ∞ (steady)" if math.isinf(m) else f"M = {m:,.0f}"
        if across:
            runs = at_volume_fit(fits, m)
            label += ", fitted across volumes"
        elif not lines.empty:
            runs = at_volume_lines(cells, lines, m)
            at = sorted({n for ns in lines["fitted_at"] for n in ns})
            label += f", F fitted across volumes at N = {', '.join(map(str, at))}"
        else:
            runs = at_volume(cells, m)
            label += SPLIT_ONLY
        out.append(crossings(runs, direct, broker, condition=label, n_boot=n_boot, seed=seed))
    return out


def volume_arm(runs: pd.DataFrame) -> pd.DataFrame:
    """The successful runs of a series' volume arm (label ``volume``, :mod:`lab.study.series`)."""
    if runs.empty or "label" not in runs:
        return runs.iloc[0:0]
    ok = runs["success"].fillna(False).astype(bool) if "success" in runs else True
    return runs[(runs["label"].fillna("") == "volume") & ok]


def sides(pipelines: Iterable[str]) -> tuple[list[str], list[str]]:
    """The given pipelines split into the two sides of the question, in registry order: those with
    no broker (``cdc_sink`` None: the direct readers and every other broker-less design) and those
    that put Debezium and a broker in between."""
    from lab.pipelines import REGISTRY

    present = set(pipelines)
    named = [name for name in REGISTRY if name in present]
    return ([n for n in named if REGISTRY[n].pipeline.capabilities.cdc_sink is None],
            [n for n in named if REGISTRY[n].pipeline.capabilities.cdc_sink is not None])


def answers_by_volume(measured: pd.DataFrame, arm: pd.DataFrame | None = None, *, n_boot: int = 500,
                      seed: int = 0) -> tuple[list[Answer], list[str]]:
    """:func:`by_volume` for every broker-less pipeline against every broker pipeline in ``measured``;
    the second list says, a line per pair, why a pair has no answer (too few N, no cost split)."""
    direct, brokers = sides(measured["pipeline"]) if not measured.empty else ([], [])
    answers: list[Answer] = []
    notes = []
    for broker in brokers:
        for d in direct:
            try:
                answers += by_volume(measured, d, broker, arm=arm, n_boot=n_boot, seed=seed)
            except ValueError as exc:
                notes.append(f"{d} vs {broker}: no crossover ({exc})")
    return answers, notes


def fixed_lines(measured: pd.DataFrame, arm: pd.DataFrame) -> pd.DataFrame:
    """The fixed cost per start as a line in N, F(N) = F0 + F1·(N − 1), per pipeline: F from
    :func:`volume_fit` at every N where ``arm`` (runs at another message count, warm-up marks
    ignored) and ``measured`` both have runs, then a straight line through those N (a constant
    with one N). Columns: pipeline, f0, f1, fitted_at (the N), fixed_at (F at each of them)."""
    if arm.empty:
        return pd.DataFrame(columns=["pipeline", "f0", "f1", "fitted_at", "fixed_at"])
    both = pd.concat([measured, arm.assign(warmup=False)], ignore_index=True)
    both = both[both["consumers"].isin(set(arm["consumers"]))]
    fits = volume_fit(both)
    rows = []
    for pipeline, g in fits[fits["participant"] == "total"].groupby("pipeline"):
        n = g["consumers"].to_numpy(float) - 1
        f = g["fixed_cpu_s"].to_numpy(float)
        f1, f0 = np.polyfit(n, f, 1) if len(n) > 1 else (0.0, float(f[0]))
        rows.append({"pipeline": pipeline, "f0": float(f0), "f1": float(f1),
                     "fitted_at": [int(x) for x in g["consumers"]], "fixed_at": [round(float(x), 3) for x in f]})
    return pd.DataFrame(rows, columns=["pipeline", "f0", "f1", "fitted_at", "fixed_at"])


def at_volume_lines(runs: pd.DataFrame, lines: pd.DataFrame, messages: float) -> pd.DataFrame:
    """Each run's figure moved to ``messages`` per start with F(N) from :func:`fixed_lines`:
    figure − 1000·F(N)/M_run + 1000·F(N)/messages (``inf``: the steady cost alone). A run keeps
    its own scatter, so the crossings' bootstrap still sees the repeats."""
    line = lines.set_index("pipeline")
    ok = runs[runs["pipeline"].isin(line.index)]
    n = ok["consumers"].to_numpy(float) - 1
    f = line.loc[ok["pipeline"], "f0"].to_numpy(float) + line.loc[ok["pipeline"], "f1"].to_numpy(float) * n
    steady = ok[METRIC].to_numpy(float) - 1000 * f / ok["messages"].to_numpy(float)
    fixed = 0.0 if math.isinf(messages) else 1000 * f / messages
    return ok.assign(**{METRIC: steady + fixed})


def at_volume_fit(fits: pd.DataFrame, messages: float) -> pd.DataFrame:
    """One pseudo-run per pipeline and N from :func:`volume_fit`'s total: c + 1000·F/M ms/msg."""
    total = fits[fits["participant"] == "total"]
    fixed = 0.0 if math.isinf(messages) else 1000 * total["fixed_cpu_s"] / messages
    return pd.DataFrame({"pipeline": total["pipeline"], "consumers": total["consumers"],
                         METRIC: total["steady_ms_per_msg"] + fixed, "success": True, "warmup": False})


def volume_fit(df: pd.DataFrame, participants: Sequence[str] = ()) -> pd.DataFrame:
    """F and c across runs of the same cell at two or more volumes: CPU-seconds = F + c·M by least
    squares over every successful run (total, and each participant in ``participants`` from its
    ``cpu_s.<name>``). Needs no timeline, so it has none of the within-run split's limits: this is
    the estimate the volume check (``lab bench options --vary messages=…``) gives. Columns:
    pipeline, consumers, participant, fixed_cpu_s, steady_ms_per_msg, volumes, runs, and the
    slope's standard error ``steady_se`` (NaN with fewer than 3 runs)."""
    ok = df[df["success"].fillna(False).astype(bool)] if "success" in df else df
    if "warmup" in ok:
        ok = ok[~ok["warmup"].fillna(False).astype(bool)]
    rows = []
    for (pipeline, n), g in ok.groupby(["pipeline", "consumers"]):
        m = g["messages"].to_numpy(float)
        if np.unique(m).size < 2:
            continue
        cols = {"total": g[METRIC].to_numpy(float) * m / 1000}
        cols |= {p: g[f"cpu_s.{p}"].fillna(0.0).to_numpy(float) for p in participants if f"cpu_s.{p}" in g}
        for name, y in cols.items():
            (c, f), cov = np.polyfit(m, y, 1, cov=True) if len(m) > 3 else (np.polyfit(m, y, 1), None)
            se = float(np.sqrt(cov[0, 0])) * 1000 if cov is not None else math.nan
            rows.append({"pipeline": pipeline, "consumers": int(n), "participant": name, "fixed_cpu_s": float(f),
                         "steady_ms_per_msg": float(c) * 1000, "steady_se": se,
                         "volumes": sorted(set(m.astype(int).tolist())), "runs": len(m)})
    return pd.DataFrame(rows, columns=["pipeline", "consumers", "participant", "fixed_cpu_s", "steady_ms_per_msg",
                                       "steady_se", "volumes", "runs"])


def rate_lines(runs: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """CPU per second = a + b·rate per pipeline and N, from the sustainable steps of load staircases
    (run.json's ``steps``: each step's rate, achieved rate and ms CPU per message). Columns:
    pipeline, consumers, a_cpu_per_s (the floor), b_ms_per_msg (the slope), steps, rates."""
    rows = []
    points: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for run in runs:
        s = run.get("scenario") or {}
        for step in run.get("steps") or []:
            cpu = (step.get("cpu_ms_per_msg") or {}).get("total")
            rate = step.get("achieved_rate") or step.get("rate")
            if step.get("sustainable") and cpu and rate:
                points.setdefault((s["pipeline"], int(s["consumers"])), []).append(
                    (float(rate), float(cpu) * float(rate) / 1000))
    for (pipeline, n), pts in sorted(points.items()):
        rates = np.array([p[0] for p in pts])
        if np.unique(rates.round()).size < 2:
            continue
        b, a = np.polyfit(rates, np.array([p[1] for p in pts]), 1)
        rows.append({"pipeline": pipeline, "consumers": n, "a_cpu_per_s": float(a), "b_ms_per_msg": float(b) * 1000,
                     "steps": len(pts), "rates": sorted(set(rates.round().tolist()))})
    return pd.DataFrame(rows, columns=["pipeline", "consumers", "a_cpu_per_s", "b_ms_per_msg", "steps", "rates"])


def at_rate(lines: pd.DataFrame, rate: float) -> pd.DataFrame:
    """One pseudo-run per pipeline and N with its cost at ``rate`` msg/s: 1000·a/rate + b ms/msg,
    shaped like :func:`lab.results.load_runs` so the cost model reads it."""
    return pd.DataFrame({
        "pipeline": lines["pipeline"], "consumers": lines["consumers"],
        METRIC: 1000 * lines["a_cpu_per_s"] / rate + lines["b_ms_per_msg"],
        "success": True, "warmup": False, "messages": 0, "rate": rate,
    })


def by_rate(lines: pd.DataFrame, direct: str, broker: str, *, rates: Sequence[float] = RATES) -> list[Answer]:
    """N* at each fixed rate, from :func:`rate_lines`; one pseudo-run per N, so intervals come only
    from the straight line's OLS when there are 3 or more N."""
    out = []
    for r in rates:
        try:
            out.append(crossings(at_rate(lines, r), direct, broker, condition=f"{r:,.0f} msg/s"))
        except ValueError as exc:
            out.append(Answer(f"{r:,.0f} msg/s: {exc}", direct, broker, (), (0, 0)))
    return out


def answer_table(answers: Iterable[Answer]) -> pd.DataFrame:
    """One row per pair, condition and model: direct, broker, condition, model, n_star, lo, hi,
    inside; and per pair and condition a row ``model="range over models"`` with the lowest and
    highest point estimate."""
    rows = []
    for ans in answers:
        pair = {"direct": ans.direct, "broker": ans.broker, "condition": ans.condition}
        for m in ans.models:
            rows.append({**pair, "model": m.model, "n_star": m.n_star, "lo": m.ci[0], "hi": m.ci[1],
                         "inside": m.inside})
        r = ans.range
        if r is not None:
            rows.append({**pair, "model": "range over models", "n_star": None, "lo": r[0], "hi": r[1],
                         "inside": ans.measured})
    return pd.DataFrame(rows, columns=["direct", "broker", "condition", "model", "n_star", "lo", "hi", "inside"])


PARTS = ("pg.walsenders", "pg.claims", "pg.prune", "pg.inserts", "pg.shards", "pg.relay", "pg.other", "cpu_s.consumers",
         "cpu_s.web", "cpu_s.senders", "cpu_s.runner", "cpu_s.kafka", "cpu_s.rabbitmq", "cpu_s.debezium",
         "cpu_s.relay")


def slope_parts(df: pd.DataFrame, pipeline: str, *, parts: Sequence[str] = PARTS) -> pd.DataFrame:
    """What one more reader costs, part by part: each part's ms/msg fitted as a + b·(N − 1) by least
    squares over the pipeline's measured runs (PostgreSQL split into walsenders, claim backends,
    insert backends and the rest by :mod:`lab.measure.pgbackends`). The parts' slopes add up to the
    total's (least squares is linear in y); ``b_se`` is the slope's standard error (NaN below 3 N).
    Runs without the PostgreSQL breakdown are left out; an empty frame when fewer than 2 N remain."""
    runs = costmodel.measured(df, pipeline)
    if "pg.walsenders" in runs:
        runs = runs.dropna(subset=["pg.walsenders"])
    x = runs["consumers"].to_numpy(float) - 1
    cols = ["part", "a_ms_per_msg", "b_ms_per_msg", "b_se", "share_of_slope"]
    if np.unique(x).size < 2:
        return pd.DataFrame(columns=cols)
    m = runs["messages"].to_numpy(float)
    total = runs[METRIC].to_numpy(float)
    rows = []
    for part in [p for p in parts if p in runs] + ["total"]:
        y = total if part == "total" else runs[part].fillna(0.0).to_numpy(float) * 1000 / m
        if np.unique(x).size >= 3 and len(x) > 3:
            (b, a), cov = np.polyfit(x, y, 1, cov=True)
            se = float(np.sqrt(cov[0, 0]))
        else:
            b, a = np.polyfit(x, y, 1)
            se = math.nan
        rows.append({"part": part.removeprefix("cpu_s."), "a_ms_per_msg": float(a), "b_ms_per_msg": float(b),
                     "b_se": se})
    out = pd.DataFrame(rows)
    b_total = float(out.loc[out["part"] == "total", "b_ms_per_msg"].iloc[0])
    return out.assign(share_of_slope=out["b_ms_per_msg"] / b_total if b_total else math.nan)[cols]
