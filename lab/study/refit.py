"""N*(M) with the fixed cost per start refitted in every bootstrap draw.

The quick model moves each run to another volume with F(N) = f0 + f1·(N − 1), fitted once from the
volume arm (:func:`lab.study.crossover.fixed_lines`); the models' intervals then resample the runs
with that F held fixed, so F's own error is in none of them, though about 0.1 CPU-s of F moves N*
by one reader. Here every draw resamples the runs of every cell at every volume (each within its
pipeline, N and message count), refits F across the volumes at the N the arm has, moves the runs to
the volume asked for and reads N* under the straight-direct, flat-broker model (the direct
readers' least-squares line against the broker's median): the percentile interval of the draws
carries F's error together with the runs'. A draw whose lines never meet counts as inf (order
statistics, as :func:`lab.study.linefit.percentile_ci`).

The resampling is within cells, not over blocks: the quick profile's arm rides in its first block
only, so a block bootstrap would drop the arm from half the draws. A cell with one run (every arm
cell of the quick and reference profiles) has nothing to resample: its run is scattered instead by a
relative deviation drawn from the same pipeline's cells that have two or more runs (the assumption,
stated: an arm run scatters as that pipeline's other runs do).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from lab.study.costmodel import METRIC, Interval
from lab.study.linefit import percentile_ci

N_BOOT = 400


def _groups(runs: pd.DataFrame) -> tuple[dict[tuple[str, int, int], np.ndarray], dict[str, np.ndarray]]:
    """``(pipeline, N, messages)`` → the runs' ms CPU per message, each cell's deviations from its
    mean scaled by sqrt(k / (k − 1)) as the line fits' bootstrap does (:func:`lab.study.linefit.rescaled`),
    so that resampling k runs does not shrink their spread; and per pipeline the pool of those
    deviations relative to their cell's mean."""
    out: dict[tuple[str, int, int], np.ndarray] = {}
    pool: dict[str, list[np.ndarray]] = {}
    for (p, n, m), g in runs.groupby(["pipeline", "consumers", "messages"]):
        v = g[METRIC].to_numpy(float)
        k = v.size
        if k > 1:
            v = v.mean() + (v - v.mean()) * math.sqrt(k / (k - 1))
            pool.setdefault(str(p), []).append((v - v.mean()) / v.mean())
        out[(str(p), int(n), int(m))] = v
    return out, {p: np.concatenate(d) for p, d in pool.items()}


def _fixed(sample: dict[tuple[str, int, int], np.ndarray], pipeline: str, ns: Sequence[int]) -> tuple[float, float]:
    """F(N) = f0 + f1·(N − 1) of one draw: CPU-s = F + c·M by least squares at each N in ``ns``."""
    fs = []
    for n in ns:
        m = np.concatenate([np.full(v.size, k[2], float) for k, v in sample.items() if k[:2] == (pipeline, n)])
        y = np.concatenate([v * k[2] / 1000 for k, v in sample.items() if k[:2] == (pipeline, n)])
        fs.append(np.polyfit(m, y, 1)[1])
    if len(ns) == 1:
        return float(fs[0]), 0.0
    f1, f0 = np.polyfit(np.asarray(ns, float) - 1, np.asarray(fs), 1)
    return float(f0), float(f1)


def _n_star(sample: dict[tuple[str, int, int], np.ndarray], lines: dict[str, tuple[float, float]],
            direct: str, broker: str, main: int, volume: float) -> float:
    """The flat-broker N* of one draw's runs at ``main`` messages, moved to ``volume``."""
    def moved(pipeline: str) -> tuple[np.ndarray, np.ndarray]:
        f0, f1 = lines[pipeline]
        xs, ys = [], []
        for (p, n, m), v in sample.items():
            if p == pipeline and m == main:
                f = f0 + f1 * (n - 1)
                extra = 0.0 if math.isinf(volume) else 1000 * f / volume
                xs.append(np.full(v.size, n - 1.0))
                ys.append(v - 1000 * f / m + extra)
        return np.concatenate(xs), np.concatenate(ys)

    x, y = moved(direct)
    b, a = np.polyfit(x, y, 1)
    level = float(np.median(moved(broker)[1]))
    return math.inf if b <= 0 else 1 + (level - a) / b


def intervals(main_runs: pd.DataFrame, arm: pd.DataFrame, direct: str, broker: str,
              volumes: Iterable[float], *, n_boot: int = N_BOOT, seed: int = 0) -> dict[float, Interval]:
    """The percentile interval (nominal 95 %; with two runs per cell its real coverage is lower, as
    every interval drawn from two runs) of the flat-broker N* at each of ``volumes`` with F refitted in
    every draw, from ``main_runs`` (successful measured runs at one message count) and ``arm`` (runs
    of the same pipelines at other counts). Empty when F cannot be refitted: an arm without both
    pipelines, a pipeline with no cell of 2 or more runs (nothing says how its runs scatter), or
    fewer than 2 N of the direct readers."""
    cols = ["pipeline", "consumers", "messages", METRIC]
    both = [direct, broker]
    main_runs = main_runs[main_runs["pipeline"].isin(both)][cols].dropna()
    arm = arm[arm["pipeline"].isin(both)][cols].dropna()
    if main_runs.empty or arm.empty or main_runs["messages"].nunique() != 1:
        return {}
    main = int(main_runs["messages"].iloc[0])
    at = {p: sorted(set(arm.loc[arm["pipeline"] == p, "consumers"]) & set(main_runs.loc[main_runs["pipeline"] == p,
                                                                                           "consumers"]))
          for p in both}
    if not all(at.values()) or main_runs.loc[main_runs["pipeline"] == direct, "consumers"].nunique() < 2:
        return {}
    groups, pool = _groups(pd.concat([main_runs, arm[arm["consumers"].isin(set(at[direct]) | set(at[broker]))]]))
    if not all(p in pool for p in both):  # no pipeline's runs scatter anywhere: nothing to draw from
        return {}
    rng = np.random.default_rng(seed)
    vols = [float(v) for v in volumes]
    draws: dict[float, list[float]] = {v: [] for v in vols}

    def draw(key: tuple[str, int, int], v: np.ndarray) -> np.ndarray:
        if v.size > 1:
            return v[rng.integers(0, v.size, v.size)]
        return v * (1 + pool[key[0]][rng.integers(0, pool[key[0]].size, v.size)])

    for _ in range(n_boot):
        sample = {k: draw(k, v) for k, v in groups.items()}
        lines = {p: _fixed(sample, p, at[p]) for p in both}
        for v in vols:
            draws[v].append(_n_star(sample, lines, direct, broker, main, v))
    return {v: percentile_ci(np.asarray(d, float)) for v, d in draws.items()}


# -- F refitted block by block ------------------------------------------------------------------

def _by_key(runs: pd.DataFrame) -> dict[tuple[str, int, int], np.ndarray]:
    return {(str(p), int(n), int(m)): g[METRIC].to_numpy(float)
            for (p, n, m), g in runs.groupby(["pipeline", "consumers", "messages"])}


def _merged(parts: Sequence[dict[tuple[str, int, int], np.ndarray]]) -> dict[tuple[str, int, int], np.ndarray]:
    out: dict[tuple[str, int, int], list[np.ndarray]] = {}
    for part in parts:
        for k, v in part.items():
            out.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in out.items()}


def _fitted_at(sample: dict[tuple[str, int, int], np.ndarray], pipeline: str, main: int) -> list[int]:
    """The N at which ``pipeline`` ran at ``main`` messages and at another volume in ``sample``."""
    vols: dict[int, set[int]] = {}
    for p, n, m in sample:
        if p == pipeline:
            vols.setdefault(n, set()).add(m)
    return sorted(n for n, ms in vols.items() if main in ms and len(ms) > 1)


def _block_n_star(sample: dict[tuple[str, int, int], np.ndarray], direct: str, broker: str, main: int,
                  volumes: Sequence[float]) -> tuple[dict[str, tuple[float, float]], list[float]] | None:
    at = {p: _fitted_at(sample, p, main) for p in (direct, broker)}
    if not all(at.values()) or len({n for p, n, m in sample if p == direct and m == main}) < 2:
        return None
    lines = {p: _fixed(sample, p, ns) for p, ns in at.items()}
    return lines, [_n_star(sample, lines, direct, broker, main, v) for v in volumes]


def by_block(runs: pd.DataFrame, direct: str, broker: str, volumes: Iterable[float], *, n_boot: int = N_BOOT,
             seed: int = 0) -> dict[str, object]:
    """The flat-broker N* at each of ``volumes`` with F refitted block by block: from each block's
    own runs (its main runs at one message count and its volume-arm runs at another, F(N) =
    f0 + f1·(N − 1) fitted at the N where the block has both), and a block bootstrap (whole blocks
    drawn with replacement, F refitted in every draw), so that F's error and the drift between
    blocks are in the interval together. ``runs``: the measured and arm runs of one sitting with
    ``pipeline``, ``consumers``, ``messages``, ``block`` (the series' block the run ran in),
    ``arm`` and the metric. Empty unless two or more blocks each fit F for both pipelines.

    With B blocks the draws take at most C(2B − 1, B) distinct values (3 with two blocks), so the
    percentile interval is about the blocks' own [min, max]: for two blocks its real coverage is
    about 50 % (that of the median by two values), not its nominal 95 %; ``coverage`` says so."""
    from lab.study.intervals import order_coverage

    both = [direct, broker]
    cols = ["pipeline", "consumers", "messages", METRIC, "block", "arm"]
    if runs.empty or not set(cols) <= set(runs.columns):
        return {}
    runs = runs[runs["pipeline"].isin(both)][cols].dropna()
    main_runs = runs[~runs["arm"].astype(bool)]
    if main_runs.empty or main_runs["messages"].nunique() != 1:
        return {}
    main = int(main_runs["messages"].iloc[0])
    vols = [float(v) for v in volumes]
    per: dict[int, dict[tuple[str, int, int], np.ndarray]] = {}
    rows = []
    for b, g in runs.groupby("block"):
        part = _by_key(g)
        fit = _block_n_star(part, direct, broker, main, vols)
        if fit is None:
            continue
        per[int(b)] = part
        lines, stars = fit
        rows.append({"block": int(b), "fitted_at": _fitted_at(part, direct, main),
                     "volumes": sorted({m for p, n, m in part if p == direct}),
                     "f": {p: (round(f0, 3), round(f1, 4)) for p, (f0, f1) in lines.items()},
                     "n_star": dict(zip(vols, stars, strict=True))})
    if len(per) < 2:
        return {}
    rng = np.random.default_rng(seed)
    keys = sorted(per)
    draws: dict[float, list[float]] = {v: [] for v in vols}
    for _ in range(n_boot):
        drawn = [keys[i] for i in rng.integers(0, len(keys), len(keys))]
        fit = _block_n_star(_merged([per[k] for k in drawn]), direct, broker, main, vols)
        if fit is None:
            continue
        for v, x in zip(vols, fit[1], strict=True):
            draws[v].append(x)
    return {"main": main, "blocks": rows,
            "intervals": {v: percentile_ci(np.asarray(d, float)) for v, d in draws.items() if d},
            "coverage": round(order_coverage(len(per), 1), 3)}
