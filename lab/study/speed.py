"""Does the speed probe earn its place? Runs taken on a slow machine, and the verdicts with and
without speed normalisation (the probe itself is :mod:`lab.measure.probe`).

Every run stores ``speed.unit_ms_median`` (the probe's ms per fixed unit of work over the run's
window) and ``cpu_ms_per_msg_norm`` (ms/msg × speed). :func:`spread` compares the raw and the
normalised spread of repeated runs of one cell; :func:`verdicts` the pairwise verdicts of a series
(which pipeline pairs differ beyond noise) computed on either; :func:`slow_runs` flags runs whose
probe was much slower than the group's median (``SLOW_FACTOR``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.measure.probe import SLOW_FACTOR
from lab.study import compare, costmodel
from lab.study.costmodel import METRIC, measured

NORM = "cpu_ms_per_msg_norm"
UNIT = "speed.unit_ms_median"


def has_probe(runs: pd.DataFrame) -> bool:
    return NORM in runs and UNIT in runs and runs[NORM].notna().any()


def slow_runs(df: pd.DataFrame, *, factor: float = SLOW_FACTOR) -> pd.DataFrame:
    """Measured runs whose probe unit took more than ``factor`` × the median of all runs shown."""
    runs = measured(df)
    if not has_probe(runs):
        return pd.DataFrame(columns=["run_id", "pipeline", "consumers", "probe_ms", "times_median"])
    unit = pd.to_numeric(runs[UNIT], errors="coerce")
    ratio = unit / unit.median()
    out = runs.assign(probe_ms=unit, times_median=ratio)[ratio > factor]
    return out[["run_id", "pipeline", "consumers", "probe_ms", "times_median"]].reset_index(drop=True)


def spread(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell with 2+ runs: raw and normalised ms/msg spread ((max - min) / median, %) and the
    coefficient of variation of each."""
    runs = measured(df)
    if not has_probe(runs):
        return pd.DataFrame()
    rows = []
    for (p, n), g in runs.groupby(["pipeline", "consumers"]):
        if len(g) < 2:
            continue
        row = dict(pipeline=p, consumers=int(n), runs=len(g))
        for tag, col in (("raw", METRIC), ("normalised", NORM)):
            v = pd.to_numeric(g[col], errors="coerce").dropna().to_numpy(float)
            row[f"{tag}_median_ms"] = float(np.median(v))
            row[f"{tag}_spread_pct"] = 100 * (v.max() - v.min()) / np.median(v)
            row[f"{tag}_cv_pct"] = 100 * v.std(ddof=1) / v.mean()
        rows.append(row)
    return pd.DataFrame(rows)


def verdicts(df: pd.DataFrame) -> pd.DataFrame:
    """Every pipeline pair at the same N judged on raw and on normalised ms/msg: ``raw`` and
    ``normalised`` are "different" or "within noise"; ``changed`` marks the pairs that flip."""
    runs = measured(df)
    if not has_probe(runs):
        return pd.DataFrame()
    out = []
    for tag, col in (("raw", METRIC), ("normalised", NORM)):
        pairs = compare.cell_comparisons(costmodel.headline(runs, metric=col))
        out.append(pairs.set_index(["consumers", "a", "b"])["within_noise"].map(
            {True: "within noise", False: "different"}).rename(tag))
    both = pd.concat(out, axis=1).reset_index()
    both["changed"] = both["raw"] != both["normalised"]
    return both
