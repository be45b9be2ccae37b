"""The matrix as tables (:func:`matrix_table`, one row per cell; per slot; per pipeline), its
figures and its reading in plain sentences, every figure read from the cells
(:mod:`lab.study.fault_matrix.cells`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from lab.study.fault_matrix.cells import (
    COLUMNS,
    DEAD_CONSUMER,
    cell_row,
    fault_of,
    fault_window,
    kind_of,
    num,
    peak,
    per_slot,
    recorded,
    rows_of,
    slot_slope,
    timeline,
)
from lab.study.plots import finding, outside_legend

# whole numbers (or <NA>)
COUNTS = ("lost", "duplicates", "max_burst", "broker_backlog_peak", "healthy_lag_peak", "hit_lag_peak")


def one_consumer_stopped(t: pd.DataFrame) -> pd.Series:
    """The cells whose fault stopped one consumer of several (the backlog a dead consumer leaves)."""
    return (t["family"] == DEAD_CONSUMER[0]) & (t["hit"] == DEAD_CONSUMER[1])


def _clean(results: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each pipeline's ms CPU/msg in its successful clean cell (the last one, if several)."""
    return {r["scenario"]["pipeline"]: num(r.get("cpu_ms_per_msg")) for r in results
            if r.get("success") and not (r.get("scenario") or {}).get("fault") and r.get("scenario")}


def matrix_table(results: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per cell (:data:`COLUMNS`), in the order run: what each fault cost each pipeline."""
    clean = _clean(results)
    table = pd.DataFrame([cell_row(r, clean) for r in results], columns=list(COLUMNS))
    return table.astype({c: "Int64" for c in COUNTS})


def wal_table(results: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Per fault cell and slot: peak WAL retained and unconfirmed (MB), the retained slope over the
    fault (KB/s), ``wal_status`` values seen, seconds after the fault until back in band."""
    rows = []
    for run in results:
        f = fault_of(run)
        summary: dict[str, Any] = f["wal_summary"] if isinstance(f.get("wal_summary"), dict) else {}
        window = fault_window(run) if f else None
        for slot, samples in per_slot(run).items():
            info: dict[str, Any] = summary[slot] if isinstance(summary.get(slot), dict) else {}
            rows.append({
                "pipeline": (run.get("scenario") or {}).get("pipeline"),
                "spec": (run.get("scenario") or {}).get("fault"),
                "slot": slot, "retained_peak_mb": peak([s.get("retained_bytes") for s in samples]) / 2**20,
                "unconfirmed_peak_mb": peak([s.get("unconfirmed_bytes") for s in samples]) / 2**20,
                "slope_kb_s": slot_slope(samples, window) / 1024,
                "wal_status": ",".join(info.get("wal_status") or sorted({str(s.get("wal_status")) for s in samples})),
                "back_in_band_s": num(info.get("recovered_after_s")),
            })
    return pd.DataFrame(rows, columns=["pipeline", "spec", "slot", "retained_peak_mb", "unconfirmed_peak_mb",
                                       "slope_kb_s", "wal_status", "back_in_band_s"])


def by_pipeline(table: pd.DataFrame) -> pd.DataFrame:
    """The matrix per pipeline, for choosing between architectures: fault cells run, cells that
    lost messages and how many, duplicates, the slowest resume, the median and longest recovery,
    the most WAL any slot retained, and where a dead consumer's backlog lived."""
    t = table[table["fault"] != "none"]
    rows = []
    for pipeline, g in t.groupby("pipeline", sort=False):
        dead = g.loc[one_consumer_stopped(g), "backlog_where"]
        rows.append({
            "pipeline": pipeline, "fault_cells": len(g), "cells_with_loss": int(positive(g["lost"]).sum()),
            "lost": g["lost"].sum(min_count=1), "duplicates": g["duplicates"].sum(min_count=1),
            "worst_resume_s": g["resume_s"].max(), "median_recovery_s": g["recovery_s"].median(),
            "worst_recovery_s": g["recovery_s"].max(), "wal_peak_mb": g["wal_peak_mb"].max(),
            "dead_consumer_backlog": dead.iloc[0] if not dead.empty else "—",
        })
    return pd.DataFrame(rows, columns=["pipeline", "fault_cells", "cells_with_loss", "lost", "duplicates",
                                       "worst_resume_s", "median_recovery_s", "worst_recovery_s", "wal_peak_mb",
                                       "dead_consumer_backlog"])


def shown(table: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """The table for reading: numbers rounded, what was not measured as ``—``."""
    return table.round(digits).astype(object).where(table.notna(), "—")


def wal_figure(results: Sequence[dict[str, Any]], kind: str = "consumer-dead") -> Any:
    """WAL retained on the source over time, one panel per pipeline, one line per slot, for the
    ``kind`` cell of each pipeline; the fault's window shaded. None when no such cell has samples."""
    from matplotlib.figure import Figure

    cells = [r for r in results if kind_of((r.get("scenario") or {}).get("fault")) == kind and per_slot(r)]
    if not cells:
        return None
    fig = Figure(figsize=(3.4 * len(cells), 3.2), layout="constrained")
    axes = fig.subplots(1, len(cells), sharey=True, squeeze=False)[0]
    for ax, run in zip(axes, cells, strict=True):
        for slot, samples in sorted(per_slot(run).items()):
            ax.plot([s["t_s"] for s in samples], [num(s.get("retained_bytes")) / 2**20 for s in samples],
                    label=slot, lw=1.2)
        window = fault_window(run)
        if window:
            ax.axvspan(*window, color="tab:red", alpha=0.12, label="fault")
        ax.set(title=f"{run['scenario']['pipeline']}", xlabel="s after the gate")
        ax.grid(alpha=0.3)
        outside_legend(ax, fontsize="x-small")
    axes[0].set_ylabel("WAL retained (MB)")
    peaks = {run["scenario"]["pipeline"]: max((num(s.get("retained_bytes")) / 2**20 for ss in per_slot(run).values()
                                               for s in ss), default=0.0) for run in cells}
    most = max(peaks, key=lambda p: peaks[p])
    return finding(fig, f"{kind}: {most} pins the most WAL on the source, {peaks[most]:,.0f} MB at its peak",
                   "WAL each replication slot retains over the run, one panel per pipeline; shaded: the fault.")


def lag_figure(results: Sequence[dict[str, Any]], kind: str = "consumer-dead") -> Any:
    """Per pipeline's ``kind`` cell: each consumer's lag (messages) and the broker's backlog over time,
    the fault's window shaded. None when no cell sampled either."""
    from matplotlib.figure import Figure

    cells = [r for r in results if kind_of((r.get("scenario") or {}).get("fault")) == kind
             and (rows_of(r, "consumer_lag") or rows_of(r, "backlog"))]
    if not cells:
        return None
    fig = Figure(figsize=(3.4 * len(cells), 3.2), layout="constrained")
    axes = fig.subplots(1, len(cells), sharey=True, squeeze=False)[0]
    for ax, run in zip(axes, cells, strict=True):
        lag = timeline(run, "consumer_lag")
        hit_consumers = set(recorded(run).get("hit_consumers") or ())
        for c, g in (lag.groupby("consumer") if not lag.empty else []):
            hit = " (hit)" if c in hit_consumers else ""
            ax.plot(g["t_s"], g["lag_messages"], lw=1.2, label=f"consumer {c}{hit}")
        backlog = timeline(run, "backlog")
        if not backlog.empty:
            ax.plot(backlog["t_s"], backlog["messages"], "k--", lw=1, label=f"in {backlog['where'].iloc[0]}")
        window = fault_window(run)
        if window:
            ax.axvspan(*window, color="tab:red", alpha=0.12)
        ax.set(title=run["scenario"]["pipeline"], xlabel="s after the gate")
        ax.grid(alpha=0.3)
        outside_legend(ax, fontsize="x-small")
    axes[0].set_ylabel("messages behind")
    return finding(fig, f"{kind}: where the messages wait while a consumer is dead, pipeline by pipeline",
                   "Each consumer's lag (messages claimed by nobody yet) and the broker's backlog, sampled every "
                   "second; shaded: the fault.")


def _list(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "none"


def _fmt(x: Any, unit: str = "", digits: int = 1) -> str:
    return "—" if pd.isna(x) else f"{float(x):,.{digits}f}{unit}"


def positive(column: pd.Series) -> pd.Series:
    """``column > 0`` with what was not measured as False."""
    return (pd.to_numeric(column, errors="coerce") > 0).fillna(False).astype(bool)


def reading(table: pd.DataFrame) -> list[str]:
    """The matrix in plain sentences, every figure read from ``table`` (:func:`matrix_table`)."""
    t = table[table["fault"] != "none"]
    if t.empty:
        return ["No fault cell has run yet."]
    out = []
    lossy = t[positive(t["lost"])]
    measured = t["lost"].notna()
    lossy_cells = _list([f"{r.pipeline} {r.fault} ({int(r.lost):,})" for r in lossy.itertuples()])
    out.append(f"**Losses**: {int((t['lost'] == 0).fillna(False).sum())} of {int(measured.sum())} accounted cells "
               "lost nothing" + (f"; lost messages in {lossy_cells}." if not lossy.empty else "."))
    dup = t[positive(t["duplicates"])].sort_values("duplicates", ascending=False)
    out.append("**Duplicates** (re-worked, at-least-once): "
               + (_list([f"{r.pipeline} {r.fault} {int(r.duplicates):,} (burst {_fmt(r.max_burst, digits=0)})"
                         for r in dup.itertuples()]) + "." if not dup.empty else "none in any cell."))
    dead = t[one_consumer_stopped(t)]
    if not dead.empty:
        out.append("**A dead consumer** (WAL retained on the source, peak and slope over the fault; where the "
                   "backlog lived; the healthy consumer's peak lag): " + _list([
                       f"{r.pipeline}: {_fmt(r.wal_peak_mb, ' MB', 2)} at {_fmt(r.wal_slope_kb_s, ' KB/s')}, "
                       f"backlog in {r.backlog_where}, healthy lag {_fmt(r.healthy_lag_peak, ' msgs', 0)}"
                       for r in dead.itertuples()]) + ".")
    resume = t.dropna(subset=["resume_s"])
    if not resume.empty:
        fast, slow = resume.loc[resume["resume_s"].idxmin()], resume.loc[resume["resume_s"].idxmax()]
        out.append(f"**Resume** after the fault ranged from {fast['resume_s']:.2f} s ({fast['pipeline']} "
                   f"{fast['fault']}) to {slow['resume_s']:.2f} s ({slow['pipeline']} {slow['fault']}).")
    rec = t.dropna(subset=["recovery_s"])
    if not rec.empty:
        worst = rec.loc[rec["recovery_s"].idxmax()]
        out.append(f"**Recovery** (rate and lag back in the pre-fault band): median {rec['recovery_s'].median():.1f} s "
                   f"over {len(rec)} cells, longest {worst['recovery_s']:.1f} s "
                   f"({worst['pipeline']} {worst['fault']}).")
    cost = t.dropna(subset=["cpu_vs_clean_ms"])
    if not cost.empty:
        by = cost.groupby("pipeline")["cpu_vs_clean_ms"].median()
        out.append("**CPU of a fault** (median over faults, ms CPU/msg above the clean cell at the same rate): "
                   + _list([f"{p} {v:+.3f}" for p, v in by.items()]) + ".")
    failed = t[~t["success"].astype(bool) & ~positive(t["lost"])]
    if not failed.empty:
        out.append("**Failed without a loss** (the run's error says why): "
                   + _list([f"{r.pipeline} {r.fault}: {str(r.error).splitlines()[0][:160]}"
                            for r in failed.itertuples()]) + ".")
    load = table["loadavg_1m"].dropna()
    if not load.empty:
        out.append(f"Measured with a 1-min load average of {load.min():.1f}-{load.max():.1f} "
                   f"(median {load.median():.1f}); "
                   "times are slower on a loaded machine, the counts are not.")
    return out
