"""``single`` against ``ha``: what the fault-tolerant topology costs, cell by cell, per
participant, per broker, and where the architectures cross once both sides are fault-tolerant.

Input is runs of both topologies as :func:`lab.results.load_runs` returns them (``topology``:
``single`` or ``ha``; a run stored before the field existed is ``single``). Each topology is taken
through :func:`lab.study.costmodel.measured` on its own, so the runs of one side must be
comparable among themselves, and an ``ha`` run's brokers are the sums of their nodes
(:mod:`lab.study.ha_nodes`).

Intervals. A cell's median carries its order-statistic interval and exact coverage
(:func:`lab.study.intervals.median_interval`: [min, max] covers 75 % with 3 runs). A ratio of two
medians (``ha`` ÷ ``single``) is bounded by ``[lo_ha / hi_single, hi_ha / lo_single]``, which holds
whenever both intervals do: its coverage is at least the product of theirs (56 % with 3 runs a
side), and ``coverage`` says so. The two sides are measured in blocks (one topology, then the
other: a stack cannot switch topology between two runs), so the machine's drift between the
blocks is in the ratio too; the ``unattributed`` residual of each side says how quiet it was.

The article's "a production broker is three nodes, so multiply by three" is the ``x3`` column:
the measured multiplier of the broker's own CPU divided by 3.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from lab.study import compare, costmodel, crossover
from lab.study.ha_nodes import STANDBY
from lab.study.intervals import median_interval

TOPOLOGIES = ("single", "ha")
ARTICLE_FACTOR = 3.0  # "production runs three brokers: multiply by three", never measured there
# participants whose ha cost differs by construction: the brokers (three nodes each) and the
# source (a physical walsender for the standby, and the standby itself)
SHOWN = ("postgres", STANDBY, "debezium", "relay", "kafka", "rabbitmq", "consumers", "web", "senders")


def topology_of(runs: pd.DataFrame) -> pd.Series:
    col = runs["topology"] if "topology" in runs else pd.Series(None, index=runs.index, dtype=object)
    return col.fillna("single").astype(str)


def split(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Topology -> its measured runs (successful, not warm-up, brokers rolled up); a topology
    without runs is left out. Raises :class:`lab.study.groups.NotComparable` when the runs of one
    topology were not measured alike."""
    if df.empty:
        return {}
    which = topology_of(df)
    out = {}
    for t in TOPOLOGIES:
        runs = costmodel.measured(df[which == t])
        if not runs.empty:
            out[t] = runs
    return out


def _cell(values: np.ndarray) -> dict[str, float]:
    v = values[np.isfinite(values)]
    if not v.size:
        return dict(median=math.nan, lo=math.nan, hi=math.nan, coverage=0.0, n=0)
    lo, hi, cov = median_interval(v)
    return dict(median=float(np.median(v)), lo=lo, hi=hi, coverage=cov, n=int(v.size))


def _ratio(ha: dict[str, float], single: dict[str, float]) -> dict[str, float]:
    """ha ÷ single of two cells: the ratio of medians and its bound (see the module docstring)."""
    ratio = ha["median"] / single["median"] if single["median"] else math.nan
    if single["coverage"] and ha["coverage"] and single["lo"] > 0:
        lo, hi, cov = ha["lo"] / single["hi"], ha["hi"] / single["lo"], ha["coverage"] * single["coverage"]
    else:
        lo = hi = math.nan
        cov = 0.0
    return dict(ratio=ratio, ratio_lo=lo, ratio_hi=hi, ratio_coverage=cov)


def _pair_rows(sides: dict[str, pd.DataFrame], values: Any) -> list[dict[str, Any]]:
    """One row per pipeline x N present under both topologies; ``values(runs)`` gives the per-run
    figure compared (ms/msg)."""
    if set(TOPOLOGIES) - set(sides):
        return []
    single, ha = sides["single"], sides["ha"]
    rows = []
    for (pipeline, n), s in single.groupby(["pipeline", "consumers"], sort=False):
        h = ha[(ha["pipeline"] == pipeline) & (ha["consumers"] == n)]
        if h.empty:
            continue
        a, b = _cell(values(s)), _cell(values(h))
        rows.append(dict(
            pipeline=pipeline, consumers=int(n),
            single=a["median"], single_lo=a["lo"], single_hi=a["hi"], single_n=a["n"],
            ha=b["median"], ha_lo=b["lo"], ha_hi=b["hi"], ha_n=b["n"],
            **_ratio(b, a),
        ))
    return rows


def _ordered(rows: list[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
    out = pd.DataFrame(rows, columns=columns)
    if out.empty:
        return out
    direct, brokers = crossover.sides(out["pipeline"])  # the registry's order, broker-less first
    order = {p: i for i, p in enumerate([*direct, *brokers])}
    out = out.assign(_o=out["pipeline"].map(order).fillna(len(order)))
    return out.sort_values(["_o", "pipeline", "consumers"]).drop(columns="_o").reset_index(drop=True)


_PAIR = ["pipeline", "consumers", "single", "single_lo", "single_hi", "single_n", "ha", "ha_lo", "ha_hi",
         "ha_n", "ratio", "ratio_lo", "ratio_hi", "ratio_coverage"]


def cell_table(df: pd.DataFrame) -> pd.DataFrame:
    """Pipeline x N: the total ms CPU/msg (every participant) under ``single`` and under ``ha``,
    each median with its interval, and ha ÷ single with its bound. Empty unless both topologies
    have runs of the cell."""
    def total(runs: pd.DataFrame) -> np.ndarray:
        return pd.to_numeric(runs[costmodel.METRIC], errors="coerce").to_numpy(float)

    return _ordered(_pair_rows(split(df), total), _PAIR)


def participant_table(df: pd.DataFrame) -> pd.DataFrame:
    """Pipeline x N x participant (:data:`SHOWN`, where it ran): its ms CPU/msg under both
    topologies and ha ÷ single. ``postgres-standby`` exists only under ``ha``: its single side is 0
    and its ratio NaN; the added cost is then ``ha - single``."""
    sides = split(df)
    rows: list[dict[str, Any]] = []
    for p in SHOWN:
        col = f"cpu_s.{p}"
        if not any(col in r for r in sides.values()):
            continue

        def values(runs: pd.DataFrame, col: str = col, p: str = p) -> np.ndarray:
            if col not in runs:
                return np.zeros(len(runs))
            return costmodel.participant_ms(runs, p)

        for r in _pair_rows(sides, values):
            if r["single"] == 0 and r["ha"] == 0:
                continue  # not a participant of this pipeline (no broker in wal, say)
            rows.append({**r, "participant": p, "added": r["ha"] - r["single"]})
    out = _ordered(rows, ["participant", *_PAIR, "added"])
    return out[["pipeline", "consumers", "participant", *_PAIR[2:], "added"]] if not out.empty else out


def multiplier_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per broker pipeline: what ``ha`` multiplies, at every N and over all N (``consumers`` 0):
    the broker's own CPU (its three nodes against its one), the source's (primary plus standby
    against the primary), and the pipeline's total; ``x3`` is the broker's multiplier ÷ 3, the
    article's unmeasured "times three" (1.0: the article was right)."""
    sides = split(df)
    if set(TOPOLOGIES) - set(sides):
        return pd.DataFrame()
    rows = []
    for broker in crossover.sides(set(df["pipeline"]))[1]:
        s_all = sides["single"][sides["single"]["pipeline"] == broker]
        h_all = sides["ha"][sides["ha"]["pipeline"] == broker]
        if s_all.empty or h_all.empty:
            continue
        ns = sorted(set(s_all["consumers"]) & set(h_all["consumers"]))
        for n in [*ns, 0]:
            s = s_all if n == 0 else s_all[s_all["consumers"] == n]
            h = h_all if n == 0 else h_all[h_all["consumers"] == n]
            row: dict[str, Any] = dict(pipeline=broker, consumers=int(n), runs_single=len(s), runs_ha=len(h))
            for what, per_run in (
                ("broker", lambda r, b=broker: costmodel.participant_ms(r, b)),
                ("source", lambda r: costmodel.participant_ms(r, "postgres")
                 + (costmodel.participant_ms(r, STANDBY) if f"cpu_s.{STANDBY}" in r else 0.0)),
                ("total", lambda r: pd.to_numeric(r[costmodel.METRIC], errors="coerce").to_numpy(float)),
            ):
                a, b = _cell(per_run(s)), _cell(per_run(h))
                rt = _ratio(b, a)
                row |= {f"{what}_single": a["median"], f"{what}_ha": b["median"], f"{what}_x": rt["ratio"],
                        f"{what}_x_lo": rt["ratio_lo"], f"{what}_x_hi": rt["ratio_hi"]}
                if what == "broker":
                    row["coverage"] = rt["ratio_coverage"]
            row["x3"] = row["broker_x"] / ARTICLE_FACTOR
            rows.append(row)
    return pd.DataFrame(rows)


def crossover_table(df: pd.DataFrame, *, upto: int = 8, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """:func:`lab.study.compare.crossover_table` of each topology's runs, one after the other
    (``topology`` column): where direct readers and a broker cross when both are fault-tolerant."""
    parts = []
    for t, runs in split(df).items():
        table = compare.crossover_table(runs, upto=upto, n_boot=n_boot, seed=seed)
        if not table.empty:
            parts.append(table.assign(topology=t))
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    return out[["topology", *[c for c in out.columns if c != "topology"]]]


LATENCY = ("p50", "p99")  # the percentiles :func:`latency_table` compares


def latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Latency at a fixed rate: pipeline x N x percentile (:data:`LATENCY`, ms from an
    outbox row's ``created_at`` to its work call, ``latency_ms``) under ``single`` and ``ha``, each
    the median over the cell's runs with its interval, and ha ÷ single with its bound. Only
    open-loop runs without a fault count, and a cell pairs runs of the same rate (``rate``
    column); empty unless both topologies have such runs."""
    if df.empty or "rate" not in df:
        return pd.DataFrame(columns=["rate", "percentile", *_PAIR])
    rate = pd.to_numeric(df["rate"], errors="coerce")
    clean = df["fault"].fillna("").astype(str) == "" if "fault" in df else pd.Series(True, index=df.index)
    runs = df[(rate > 0) & clean]
    rows = []
    for r, same in runs.groupby(pd.to_numeric(runs["rate"], errors="coerce"), sort=True):
        sides = split(same)
        for q in LATENCY:
            col = f"latency_ms.{q}"
            if col not in same:
                continue

            def values(x: pd.DataFrame, col: str = col) -> np.ndarray:
                return pd.to_numeric(x[col], errors="coerce").to_numpy(float)

            rows += [dict(rate=float(r), percentile=q, **row) for row in _pair_rows(sides, values)]
    out = _ordered(rows, ["rate", "percentile", *_PAIR])
    if out.empty:
        return out
    return out.sort_values(["rate", "percentile"], kind="stable").reset_index(drop=True)


def quietness(df: pd.DataFrame) -> pd.DataFrame:
    """Per topology: runs, when, and the median ``unattributed`` ms per message (host CPU no
    participant accounts for) with the median steal: how quiet each block of the comparison was."""
    rows = []
    for t, runs in split(df).items():
        un = pd.to_numeric(runs.get("cpu_s.unattributed", pd.Series(np.nan, index=runs.index)), errors="coerce")
        steal = pd.to_numeric(runs.get("steal_pct", pd.Series(np.nan, index=runs.index)), errors="coerce")
        rows.append(dict(topology=t, runs=len(runs), first=str(runs["started_at"].min())[:19],
                         last=str(runs["started_at"].max())[:19],
                         unattributed_ms_per_msg=float(np.nanmedian(un * 1000 / runs["messages"]))
                         if un.notna().any() else math.nan,
                         steal_pct=float(np.nanmedian(steal)) if steal.notna().any() else math.nan))
    return pd.DataFrame(rows)


def figure(cells: pd.DataFrame) -> Figure:
    """Total ms CPU/msg against N per pipeline, ``single`` solid and ``ha`` dashed, each median
    with its interval (:func:`cell_table`'s columns)."""
    from lab.study.plots import finding, outside_legend, pipeline_color

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for pipeline, g in cells.groupby("pipeline", sort=False):
        color = pipeline_color(str(pipeline))
        for t, style, dodge in (("single", "-o", 1 / 1.03), ("ha", "--s", 1.03)):  # bars side by side
            x = g["consumers"] * dodge
            ax.plot(x, g[t], style, color=color, label=f"{pipeline} {t}")
            ok = g[f"{t}_lo"].notna() & g[f"{t}_hi"].notna()
            ax.vlines(x[ok], g.loc[ok, f"{t}_lo"], g.loc[ok, f"{t}_hi"], color=color, lw=2)
    if not cells.empty:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sorted(set(cells["consumers"]))))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        outside_legend(ax)
    ax.set_xlabel("consumers N")
    ax.set_ylabel("ms CPU per message (every participant)")
    ratio = (cells["ha"] / cells["single"]).median() if not cells.empty else float("nan")
    title = (f"ha costs {ratio:.2f}× single per message in the median cell" if math.isfinite(ratio)
             else "No cell measured under both topologies")
    return finding(fig, title, "Solid: single, dashed: ha; each point the median of a cell's runs, bars its "
                               "order-statistic interval.")
