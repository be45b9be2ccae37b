"""Figures for the analysis notebook: one function per figure, each returning a ``Figure``.

Figures are built with ``matplotlib.figure.Figure`` directly, not through pyplot: nothing is shown,
no global figure registry fills up, and any backend works (Agg included). Jupyter displays a
returned figure as usual. Inputs are runs as :func:`lab.results.load_runs` returns them (or
:func:`lab.study.costmodel.published_runs`) and the cost model's results.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from lab.measure import latency
from lab.pipelines import NAMES, REGISTRY
from lab.study.costmodel import METRIC, Crossover, FanoutFit, Level, drift, headline, measured
from lab.study.ha_nodes import is_node
from lab.study.intervals import coverage_label

PIPELINE_COLORS = {name: r.colour for name, r in REGISTRY.items()}  # each pipeline's own, in its registry line
PARTICIPANT_COLORS = {
    "postgres": "C0",
    "postgres-standby": "C9",  # ha
    "debezium": "C4",
    "relay": "C7",
    "kafka": "C3",
    "rabbitmq": "C1",
    "web": "C2",
    "senders": "C5",
    "consumers": "C6",
    "runner": "C8",
    "test": "C5",
    "unattributed": "0.75",
}


def _color(pipeline: str) -> str:
    return PIPELINE_COLORS.get(pipeline, "C7")


def pipeline_color(pipeline: str) -> str:
    """A pipeline's colour in every figure (its registry line's); grey for a name not registered."""
    return _color(pipeline)


def _order(df: pd.DataFrame) -> pd.DataFrame:
    rank = {p: i for i, p in enumerate(NAMES)}
    key = df["pipeline"].map(rank).fillna(len(rank))
    return (
        df.assign(_o=key)
        .sort_values(["_o", "pipeline", "consumers"], kind="stable")
        .drop(columns="_o")
    )


def _cell_label(row: Mapping[str, Any]) -> str:
    return f"{row['pipeline']} c{int(row['consumers'])}"


def _n_axis(ax: Any, ns: Iterable[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(ns))))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("consumers N")


def headline_figure(ours: pd.DataFrame, reference: pd.DataFrame | None = None) -> Figure:
    """ms CPU/msg against N per pipeline: ours solid with interval bars (their exact coverage in the
    title, :mod:`lab.study.intervals`), published dashed.

    ``ours`` is :func:`lab.study.costmodel.headline`'s table or raw runs; ``reference`` is
    ``load_reference("headline")`` (pipeline, consumers, ms_per_msg).
    """
    table = headline(ours) if METRIC in ours else ours
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    ns: list[float] = []
    for pipeline, g in _order(table).groupby("pipeline", sort=False):
        ax.plot(g["consumers"], g["median"], "-o", color=_color(pipeline), label=pipeline)
        ok = g["lo"].notna() & g["hi"].notna()
        if ok.any():
            ax.vlines(
                g.loc[ok, "consumers"],
                g.loc[ok, "lo"],
                g.loc[ok, "hi"],
                color=_color(pipeline),
                lw=2,
            )
        ns += g["consumers"].tolist()
    if reference is not None:
        for pipeline, g in _order(reference).groupby("pipeline", sort=False):
            ax.plot(
                g["consumers"],
                g["ms_per_msg"],
                "--",
                marker="x",
                color=_color(pipeline),
                alpha=0.7,
                label=f"{pipeline} (published)",
            )
            ns += g["consumers"].tolist()
    _n_axis(ax, ns)
    ax.set_ylabel("ms CPU per message")
    covs = sorted({round(float(c), 3) for c in table.get("coverage", pd.Series(dtype=float)) if c})
    what = ("coverage " + " / ".join(coverage_label(c) for c in covs)) if covs else "none: one run per cell"
    ax.set_title(f"CPU per message vs consumers\n(bars: interval of the median, {what})", fontsize="medium")
    ax.legend(fontsize="small", ncol=2)
    return fig


def breakdown_figure(
    df: pd.DataFrame, *, per: str = "cell", include_unattributed: bool = False
) -> Figure:
    """Stacked bars of ms CPU/msg per participant: one bar per pipeline x N (median over its runs;
    ``per="run"`` for one bar per run). ``unattributed`` host CPU is not part of the metric and is
    left out unless asked for."""
    runs = _order(measured(df, producer=None))
    names = [c.removeprefix("cpu_s.") for c in runs.columns if c.startswith("cpu_s.")]
    names = sorted(
        names, key=lambda n: list(PARTICIPANT_COLORS).index(n) if n in PARTICIPANT_COLORS else 99
    )
    if not include_unattributed:
        names = [n for n in names if n != "unattributed"]
    names = [n for n in names if not is_node(n)]  # ha: each broker once, as the sum of its nodes
    ms = pd.DataFrame({n: runs[f"cpu_s.{n}"].fillna(0) * 1000 / runs["messages"] for n in names})
    ms = ms.loc[:, ms.sum() > 0]
    keys = runs[["pipeline", "consumers"]]
    if per == "cell":
        ms = ms.groupby([keys["pipeline"], keys["consumers"]], sort=False).median()
        labels = [f"{p} c{n}" for p, n in ms.index]
    elif per == "run":
        labels = [_cell_label(r) for _, r in keys.iterrows()]
    else:
        raise ValueError(f"per must be 'cell' or 'run', got {per!r}")
    fig = Figure(figsize=(max(6, 0.45 * len(labels) + 2), 4.5), layout="constrained")
    ax = fig.subplots()
    x, bottom = np.arange(len(labels)), np.zeros(len(labels))
    for name in ms.columns:
        values = ms[name].to_numpy(float)
        ax.bar(x, values, bottom=bottom, label=name, color=PARTICIPANT_COLORS.get(name))
        bottom += values
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize="small")
    ax.set_ylabel("ms CPU per message")
    ax.set_title("Where the CPU goes, per participant")
    ax.legend(fontsize="small", ncol=3)
    return fig


def fanout_figure(
    fits: Iterable[FanoutFit] | Mapping[Any, FanoutFit],
    levels: Iterable[Level] | Mapping[Any, Level],
    crossovers: Iterable[Crossover] | Mapping[Any, Crossover] = (),
) -> Figure:
    """Fan-out lines a + b·(N - 1) with their 95 % bands and runs, broker levels with their
    intervals, and each crossover N* with its interval; the measured N range is shaded."""
    fits, levels, crossovers = (
        list(v.values()) if isinstance(v, Mapping) else list(v) for v in (fits, levels, crossovers)
    )
    lo = min((f.n_range[0] for f in fits), default=1)
    hi = max((f.n_range[1] for f in fits), default=8)
    stars = [c.n_star for c in crossovers if c.n_star is not None and math.isfinite(c.n_star)]
    right = min(64.0, max([hi, *stars]) * 1.15 + 1)
    ns = np.linspace(1, right, 200)
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    ax = fig.subplots()
    ax.axvspan(lo, hi, color="0.93", zorder=0, label="measured N")
    for f in fits:
        c = _color(f.pipeline)
        ax.scatter(f.n, f.y, color=c, s=14, alpha=0.6)
        ax.plot(ns, f.predict(ns), color=c, label=f"{f.pipeline}: {f.a:.2f} + {f.b:.3f}·(N-1)")
        band = f.band(ns)
        if band is not None:
            ax.fill_between(ns, *band, color=c, alpha=0.15, lw=0)
    at: dict[str, Level] = {}
    for lv in levels:
        c = _color(lv.pipeline)
        if lv.line is not None:  # its slope is not 0: the crossover uses its fitted line
            ax.plot(ns, lv.line.predict(ns), color=c, ls="--", label=f"{lv.pipeline} fitted line")
        else:
            ax.axhline(lv.level, color=c, ls="--", label=f"{lv.pipeline} level {lv.level:.2f}")
            if math.isfinite(lv.ci[0]):
                ax.axhspan(*lv.ci, color=c, alpha=0.1, lw=0)
        at[lv.pipeline] = lv
    for cx in crossovers:
        if cx.n_star is None:
            continue
        lv = at.get(cx.broker)
        y = math.nan if lv is None else (float(lv.line.predict(cx.n_star)) if lv.line is not None else lv.level)
        kind = "inside the measured range" if cx.inside else "extrapolated"
        ax.plot(
            [cx.n_star],
            [y],
            "D",
            color=_color(cx.direct),
            mec="k",
            label=f"N* {cx.direct}/{cx.broker} ≈ {cx.n_star:.1f} ({kind})",
        )
        if math.isfinite(cx.ci[0]):
            ax.hlines(
                y, max(cx.ci[0], 1), min(cx.ci[1], right), color=_color(cx.direct), lw=3, alpha=0.6
            )
    ax.set_xlim(0.5, right)
    ax.set_xlabel("consumers N")
    ax.set_ylabel("ms CPU per message")
    ax.set_title("Fan-out cost model and crossover\n(bands and N* bars: 95 % bootstrap; level shading: "
                 "order-statistic interval of the median)", fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def claims_figure(df: pd.DataFrame) -> Figure:
    """Per run: claims lost to another consumer (skipped per message) and the spread of claims
    across consumers (min..max as a share of the fair share M/N)."""
    runs = _order(measured(df, producer=None))
    labels = [_cell_label(r) for _, r in runs.iterrows()]
    x = np.arange(len(runs))
    fair = runs["messages"].to_numpy(float) / runs["consumers"].to_numpy(float)
    fig = Figure(figsize=(max(6, 0.45 * len(runs) + 2), 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    colors = [_color(p) for p in runs["pipeline"]]
    top.bar(x, runs["skipped"].to_numpy(float) / runs["messages"].to_numpy(float), color=colors)
    top.set_yscale("symlog", linthresh=0.01)
    top.set_ylabel("skipped claims per message")
    top.set_title("Claims: lost races and balance across consumers")
    bottom.vlines(
        x,
        runs["claims_min"].to_numpy(float) / fair,
        runs["claims_max"].to_numpy(float) / fair,
        color=colors,
        lw=4,
    )
    bottom.axhline(1.0, color="0.5", lw=0.8)
    bottom.set_ylabel("claims per consumer ÷ fair share (min..max)")
    bottom.set_xticks(x, labels, rotation=60, ha="right", fontsize="small")
    return fig


def drift_figure(df: pd.DataFrame) -> Figure:
    """Each drift probe beside its origin run: ms CPU/msg and msg/s over the window, with the
    change in % (the article reads under 10 % as stand drift)."""
    d = drift(df)
    fig = Figure(figsize=(7, 3.8), layout="constrained")
    if d.empty:
        ax = fig.subplots()
        ax.text(0.5, 0.5, "no drift probe (label 'drift') with an earlier origin run", ha="center")
        ax.set_axis_off()
        return fig
    labels = [_cell_label(r) for _, r in d.iterrows()]
    x, w = np.arange(len(d)), 0.38
    for ax, col, change, title in zip(
        fig.subplots(1, 2),
        ("ms_per_msg", "msg_per_s"),
        ("cpu_change_pct", "rate_change_pct"),
        ("ms CPU per message", "messages per second (window)"),
        strict=True,
    ):
        ax.bar(x - w / 2, d[f"{col}_origin"], w, color="0.6", label="origin")
        probe = ax.bar(x + w / 2, d[f"{col}_probe"], w, color="C3", label="drift probe")
        ax.bar_label(
            probe, [f"{v:+.{1 if abs(v) >= 1 else 2}f} %" for v in d[change]], fontsize="small"
        )
        ax.set_xticks(x, labels)
        ax.set_title(title)
        ax.legend(fontsize="small", loc="lower right")
    return fig


def residual_figure(idle: pd.DataFrame) -> Figure:
    """Per cell (median over runs): ms CPU/msg as measured, without the idle floor, and the
    ``unattributed`` residual beside them (:func:`lab.study.compare.idle_table`)."""
    fig = Figure(figsize=(max(6, 0.5 * idle[["pipeline", "consumers"]].drop_duplicates().shape[0] + 2), 4.2),
                 layout="constrained")
    ax = fig.subplots()
    if idle.empty or idle["ms_per_msg_net"].isna().all():
        ax.text(0.5, 0.5, "no idle baseline with these runs", ha="center")
        ax.set_axis_off()
        return fig
    cells = _order(idle).groupby(["pipeline", "consumers"], sort=False)[
        ["ms_per_msg", "ms_per_msg_net", "unattributed_ms_per_msg"]].median()
    x, w = np.arange(len(cells)), 0.28
    ax.bar(x - w, cells["ms_per_msg"], w, color="0.55", label="as measured")
    ax.bar(x, cells["ms_per_msg_net"], w, color="C0", label="without the idle baseline")
    ax.bar(x + w, cells["unattributed_ms_per_msg"], w, color="0.8", label="unattributed (not in either)")
    ax.axhline(0, color="0.3", lw=0.6)
    ax.set_xticks(x, [f"{p} c{n}" for p, n in cells.index], rotation=60, ha="right", fontsize="small")
    ax.set_ylabel("ms CPU per message")
    ax.set_title("Idle floor and residual")
    ax.legend(fontsize="small")
    return fig


def decode_figure(decode: pd.DataFrame) -> Figure:
    """WAL decoded per message (all slots of the run) against N: fan-out decodes once per reader
    (:func:`lab.study.compare.decode_table`)."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    if decode.empty:
        ax.text(0.5, 0.5, "no slot statistics with these runs", ha="center")
        ax.set_axis_off()
        return fig
    # equal volumes overlap exactly (wal and wal-sharded, kafka and rabbitmq): shrinking markers
    # and dashes keep every line visible
    styles = iter([("-", "o", 9), ("--", "s", 7), (":", "^", 5), ("-.", "v", 3)] * 4)
    for pipeline, g in _order(decode).groupby("pipeline", sort=False):
        ls, marker, size = next(styles)
        ax.plot(g["consumers"], g["bytes_per_msg"] / 1024, ls=ls, marker=marker, ms=size,
                color=_color(pipeline), label=pipeline)
    _n_axis(ax, decode["consumers"])
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_ylabel("KiB of WAL decoded per message")
    ax.set_title("Logical decoding volume (pg_stat_replication_slots.total_bytes)")
    ax.legend(fontsize="small")
    return fig


def memory_figure(memory: pd.DataFrame) -> Figure:
    """Stacked peak RSS per participant, one bar per pipeline x N (:func:`lab.study.compare.memory_table`)."""
    fig = Figure(figsize=(max(6, 0.45 * len(memory) + 2), 4.2), layout="constrained")
    ax = fig.subplots()
    if memory.empty:
        ax.text(0.5, 0.5, "no memory readings with these runs", ha="center")
        ax.set_axis_off()
        return fig
    table = _order(memory)
    x, bottom = np.arange(len(table)), np.zeros(len(table))
    for col in (c for c in table.columns if c.endswith("_mb") and c != "total_mb"):
        values = table[col].fillna(0).to_numpy(float)
        if values.sum() <= 0:
            continue
        name = col.removesuffix("_mb")
        ax.bar(x, values, bottom=bottom, label=name, color=PARTICIPANT_COLORS.get(name))
        bottom += values
    ax.set_xticks(x, [_cell_label(r) for _, r in table.iterrows()], rotation=60, ha="right", fontsize="small")
    ax.set_ylabel("MB resident (peak in the window)")
    ax.set_title("Memory per participant")
    ax.legend(fontsize="small", ncol=3)
    return fig


def n_star_figure(answers: Iterable[Any], *,
                  title: str = "N* against the messages one Debezium start serves") -> Figure:
    """N* under each condition (a volume per start, or a rate) for each broker: every model's point
    with its 95 % interval, the range over the models as a band; "never" drawn at the top."""
    answers = list(answers)
    fig = Figure(figsize=(7.5, 4), layout="constrained")
    ax = fig.subplots()
    if not answers:
        ax.text(0.5, 0.5, "no crossover could be computed", ha="center")
        ax.set_axis_off()
        return fig
    conditions = list(dict.fromkeys(a.condition for a in answers))
    brokers = list(dict.fromkeys(a.broker for a in answers))
    finite = [v for a in answers for m in a.models for v in (m.n_star, *m.ci)
              if v is not None and math.isfinite(v)]
    top = max([*finite, 16.0]) * 1.15
    markers = {"straight direct, flat broker": "o", "straight direct, sloped broker": "s",
               "curved direct, flat broker": "^"}
    for j, broker in enumerate(brokers):
        shift = (j - (len(brokers) - 1) / 2) * 0.25
        for a in (a for a in answers if a.broker == broker):
            x = conditions.index(a.condition) + shift
            r = a.range
            if r is not None:
                ax.vlines(x, r[0], min(r[1], top), color=_color(broker), alpha=0.25, linewidth=8)
            for k, m in enumerate(a.models):
                y = top if m.n_star is None or not math.isfinite(m.n_star) else m.n_star
                lo, hi = (min(v, top) if math.isfinite(v) else top for v in m.ci) if math.isfinite(m.ci[0]) else (y, y)
                ax.errorbar(x + (k - 1) * 0.06, y, yerr=[[max(y - lo, 0)], [max(hi - y, 0)]],
                            fmt=markers.get(m.model, "o"), color=_color(broker), markersize=5, capsize=2,
                            label=f"{a.direct} vs {broker}: {m.model}" if a.condition == conditions[0] else None)
    ax.axhline(top, color="0.8", linestyle=":")
    ax.text(len(conditions) - 0.6, top, "never", va="bottom", ha="right", fontsize="small", color="0.4")
    ax.set_xticks(range(len(conditions)), conditions)
    ax.set_ylim(0, top * 1.05)
    ax.set_ylabel("N* (readers)")
    ax.set_title(title)
    ax.legend(fontsize="x-small", loc="upper left")
    return fig


def latency_figure(runs: pd.DataFrame) -> Figure:
    """p50, p95, p99 and max end-to-end latency (ms, log scale) against N, one panel per pipeline.

    ``runs`` as for :func:`lab.measure.latency.latency_table` (medians over repeats are plotted).
    """
    table = latency.latency_table(runs)
    pipes = list(dict.fromkeys(table["pipeline"])) or ["(no runs)"]
    fig = Figure(figsize=(3.2 * len(pipes) + 0.6, 3.8), layout="constrained")
    axes = fig.subplots(1, len(pipes), sharey=True, squeeze=False)[0]
    for ax, pipeline in zip(axes, pipes, strict=True):
        g = table[table["pipeline"] == pipeline]
        for stat in latency.STATS:
            ax.plot(g["consumers"], g[stat], latency.STAT_STYLE[stat], color=_color(pipeline),
                    alpha=1.0 if stat == "p50" else 0.75, label=stat)
        ns = sorted(set(g["consumers"])) or [1]
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(ns))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("consumers N")
        rate = g["rate"].median() if not g.empty else float("nan")
        ax.set_title(pipeline + (f" at {rate:g} msg/s" if rate > 0 else ""))
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("created_at → work call (ms)")
    axes[-1].legend(loc="best", fontsize="small")
    return fig
