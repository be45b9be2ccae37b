"""Figures for the analysis notebook: one function per figure, each returning a ``Figure``.

Figures are built with ``matplotlib.figure.Figure`` directly, not through pyplot: nothing is shown,
no global figure registry fills up, and any backend works (Agg included). Jupyter displays a
returned figure as usual. Inputs are runs as :func:`lab.results.load_runs` returns them (or
:func:`lab.study.costmodel.published_runs`) and the cost model's results.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator, ScalarFormatter

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


def n_axis(ax: Any, ns: Iterable[float]) -> None:
    """A log2 axis of consumers N with a tick at every measured N."""
    _n_axis(ax, ns)


def finding(fig: Figure, title: str, caption: str = "") -> Figure:
    """Give ``fig`` its one message: the finding as its title (left, wrapped to the figure's width)
    and the conditions it holds under as a caption below the axes, in the image itself, so that
    the figure says what it shows when it is shared alone. Both are the image's alternative text
    on a page (:func:`lab.study.page.alt_text`)."""
    width_in = fig.get_figwidth()
    fig.suptitle(_wrap(title, width_in, 11.0), x=0.01, ha="left", fontsize=11.0)
    if caption:
        fig.supxlabel(_wrap(caption, width_in, 8.5), x=0.01, ha="left", fontsize=8.5, color="0.3")
    return fig


def _wrap(text: str, width_in: float, points: float) -> str:
    """``text`` wrapped to lines that fit ``width_in`` inches at ``points`` (an average glyph is
    about 0.55 em wide)."""
    return textwrap.fill(" ".join(text.split()), width=max(20, int(width_in * 72 / (points * 0.55)) - 2))


def spread(values: Sequence[float], gap: float) -> list[float]:
    """``values`` moved apart as little as possible so that neighbours are at least ``gap`` apart,
    in their order (the positions of direct labels at the ends of lines that end close together):
    neighbours too close form a group, spaced by ``gap`` around the mean of their own values, until
    no two groups are too close."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    groups: list[list[float]] = [[float(values[i])] for i in order]

    def start(g: list[float]) -> float:
        return sum(g) / len(g) - (len(g) - 1) * gap / 2

    merged = True
    while merged:
        merged = False
        out: list[list[float]] = []
        for g in groups:
            if out and start(out[-1]) + len(out[-1]) * gap > start(g) + 1e-12:
                out[-1] = out[-1] + g
                merged = True
            else:
                out.append(g)
        groups = out
    ys = [start(g) + k * gap for g in groups for k in range(len(g))]
    placed = [0.0] * len(ys)
    for i, y in zip(order, ys, strict=True):
        placed[i] = y
    return placed


def direct_labels(ax: Any, ends: Mapping[str, tuple[float, float]], *, fontsize: float = 9.0) -> None:
    """A label beside the last point of each line instead of a legend: ``ends`` maps the text to
    (x, y) of its line's end in data coordinates (a linear y axis whose limits are set). Labels
    that would cover each other are spread apart vertically, with a thin leader to their line; each
    takes its pipeline's colour (the text's first word). Leave room right of the last x for them."""
    if not ends:
        return
    lo, hi = ax.get_ylim()
    axes_pt = ax.get_figure().get_figheight() * 72 * 0.62  # the axes' share of the height, about
    gap = (hi - lo) * fontsize * 1.35 / axes_pt
    names = list(ends)
    ys = spread([ends[n][1] for n in names], gap)
    for name, y in zip(names, ys, strict=True):
        x, y0 = ends[name]
        dy = (y - y0) / (hi - lo) * axes_pt
        ax.annotate(name, (x, y0), xytext=(9, dy), textcoords="offset points", va="center", ha="left",
                    fontsize=fontsize, color=_color(name.split()[0]), annotation_clip=False,
                    arrowprops=None if abs(dy) < 1 else {"arrowstyle": "-", "color": "0.6", "lw": 0.6,
                                                          "shrinkA": 0, "shrinkB": 3})


def outside_legend(ax: Any, **kwargs: Any) -> Any:
    """The axes' legend right of it, outside the data (constrained layout makes room for it)."""
    opts = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0, "fontsize": "small",
            "frameon": False, **kwargs}
    return ax.legend(**opts)


def cheapest_words(table: pd.DataFrame) -> str:
    """Which pipeline is cheapest at which N, runs of N with the same cheapest joined: "wal is
    cheapest at N = 1–8, kafka at N = 16". ``table``: pipeline, consumers, median_ms."""
    if table.empty:
        return "no cell measured"
    best = table.loc[table.groupby("consumers")["median_ms"].idxmin()].sort_values("consumers")
    spans: list[tuple[str, int, int]] = []
    for p, n in zip(best["pipeline"], best["consumers"].astype(int), strict=True):
        if spans and spans[-1][0] == p:
            spans[-1] = (p, spans[-1][1], n)
        else:
            spans.append((str(p), n, n))
    words = [f"N = {a}" if a == b else f"N = {a}–{b}" for _, a, b in spans]
    first = f"{spans[0][0]} is cheapest at {words[0]}"
    return first + "".join(f", {p} at {w}" for (p, _, _), w in zip(spans[1:], words[1:], strict=True))


def _empty(fig: Figure, ax: Any, text: str) -> Figure:
    ax.text(0.5, 0.5, text, ha="center")
    ax.set_axis_off()
    return fig


def headline_figure(ours: pd.DataFrame, reference: pd.DataFrame | None = None) -> Figure:
    """ms CPU/msg against N per pipeline: ours solid with interval bars (their exact coverage in the
    caption, :mod:`lab.study.intervals`), published dashed; the title says which is cheapest where.

    ``ours`` is :func:`lab.study.costmodel.headline`'s table or raw runs; ``reference`` is
    ``load_reference("headline")`` (pipeline, consumers, ms_per_msg).
    """
    table = headline(ours) if METRIC in ours else ours
    fig = Figure(figsize=(8.4, 4.6), layout="constrained")
    ax = fig.subplots()
    ns: list[float] = []
    for pipeline, g in _order(table).groupby("pipeline", sort=False):
        ax.plot(g["consumers"], g["median"], "-o", color=_color(pipeline), label=pipeline)
        ok = g["lo"].notna() & g["hi"].notna()
        if ok.any():
            ax.vlines(g.loc[ok, "consumers"], g.loc[ok, "lo"], g.loc[ok, "hi"], color=_color(pipeline), lw=2)
        ns += g["consumers"].tolist()
    if reference is not None:
        for pipeline, g in _order(reference).groupby("pipeline", sort=False):
            ax.plot(g["consumers"], g["ms_per_msg"], "--", marker="x", color=_color(pipeline), alpha=0.7,
                    label=f"{pipeline} (published)")
            ns += g["consumers"].tolist()
    _n_axis(ax, ns)
    ax.set_ylabel("ms CPU per message (all participants)")
    ax.grid(True, axis="y", alpha=0.3)
    outside_legend(ax)
    covs = sorted({round(float(c), 3) for c in table.get("coverage", pd.Series(dtype=float)) if c})
    what = ("coverage " + " / ".join(coverage_label(c) for c in covs)) if covs else "none: one run per cell"
    caption = f"Solid: our median per cell; bars: the order-statistic interval of the median ({what})."
    if reference is not None:
        caption += " Dashed: the reference study's published table (one run per cell, 100,000 messages)."
    return finding(fig, cheapest_words(table.rename(columns={"median": "median_ms"})) + " (our medians)", caption)


def breakdown_figure(
    df: pd.DataFrame, *, per: str = "cell", include_unattributed: bool = False
) -> Figure:
    """Stacked bars of ms CPU/msg per participant: one bar per pipeline x N (median over its runs;
    ``per="run"`` for one bar per run). ``unattributed`` host CPU is not part of the metric and is
    left out unless asked for. The title names the participant that is most often the largest part."""
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
    fig = Figure(figsize=(max(6.5, 0.42 * len(labels) + 3), 4.8), layout="constrained")
    ax = fig.subplots()
    x, bottom = np.arange(len(labels)), np.zeros(len(labels))
    for name in ms.columns:
        values = ms[name].to_numpy(float)
        ax.bar(x, values, bottom=bottom, label=name, color=PARTICIPANT_COLORS.get(name))
        bottom += values
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize="small")
    ax.set_xlabel("pipeline and N consumers (c4: 4 consumers)")
    ax.set_ylabel("ms CPU per message")
    outside_legend(ax, title="participant")
    bars = "cells" if per == "cell" else "runs"
    if ms.empty or not ms.shape[1]:
        title = "No participant's CPU was read"
    else:
        top = ms.idxmax(axis=1)
        name = str(top.mode().iloc[0])
        title = f"{name} is the largest part of the cost in {int((top == name).sum())} of {len(top)} {bars}"
    caption = ("Each bar: the median of a cell's runs per participant" if per == "cell" else "Each bar: one run")
    caption += "; host CPU no participant accounts for (unattributed) " + (
        "is shown." if include_unattributed else "is left out, as from the metric.")
    return finding(fig, title, caption)


def fanout_figure(
    fits: Iterable[FanoutFit] | Mapping[Any, FanoutFit],
    levels: Iterable[Level] | Mapping[Any, Level],
    crossovers: Iterable[Crossover] | Mapping[Any, Crossover] = (),
) -> Figure:
    """Fan-out lines a + b·(N - 1) with their 95 % bands and runs, broker levels with their
    intervals, and each crossover N* with its interval; the measured N range is shaded. The title
    says where the lines meet, the caption what the bands and shading are."""
    fits, levels, crossovers = (
        list(v.values()) if isinstance(v, Mapping) else list(v) for v in (fits, levels, crossovers)
    )
    lo = min((f.n_range[0] for f in fits), default=1)
    hi = max((f.n_range[1] for f in fits), default=8)
    stars = [c.n_star for c in crossovers if c.n_star is not None and math.isfinite(c.n_star)]
    right = min(64.0, max([hi, *stars]) * 1.15 + 1)
    ns = np.linspace(1, right, 200)
    fig = Figure(figsize=(10, 4.8), layout="constrained")
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
    met = []
    for cx in crossovers:
        if cx.n_star is None:
            continue
        lv = at.get(cx.broker)
        y = math.nan if lv is None else (float(lv.line.predict(cx.n_star)) if lv.line is not None else lv.level)
        kind = "inside the measured range" if cx.inside else "extrapolated"
        ax.plot([cx.n_star], [y], "D", color=_color(cx.direct), mec="k",
                label=f"N* {cx.direct}/{cx.broker} ≈ {cx.n_star:.1f} ({kind})")
        met.append(f"{cx.direct} meets {cx.broker} at N ≈ {cx.n_star:.1f}" + ("" if cx.inside else " (extrapolated)"))
        if math.isfinite(cx.ci[0]):
            ax.hlines(y, max(cx.ci[0], 1), min(cx.ci[1], right), color=_color(cx.direct), lw=3, alpha=0.6)
    ax.set_xlim(0.5, right)
    ax.set_xlabel("consumers N")
    ax.set_ylabel("ms CPU per message")
    outside_legend(ax)
    title = ("; ".join(met) if met else "The direct readers' lines do not meet a broker's level") + " (fitted lines)"
    caption = ("Points: runs; lines: a + b·(N − 1) fitted per direct pipeline, bands its 95 % bootstrap interval; "
               "dashed: each broker's level (shaded: the order-statistic interval of its median) or its own line; "
               "diamonds: N* with its 95 % bootstrap interval; grey: the N measured.")
    return finding(fig, title, caption)


def claims_figure(df: pd.DataFrame) -> Figure:
    """Per run: claims lost to another consumer (skipped per message) and the spread of claims
    across consumers (min..max as a share of the fair share M/N)."""
    runs = _order(measured(df, producer=None))
    labels = [_cell_label(r) for _, r in runs.iterrows()]
    x = np.arange(len(runs))
    fair = runs["messages"].to_numpy(float) / runs["consumers"].to_numpy(float)
    fig = Figure(figsize=(max(6.5, 0.42 * len(runs) + 2), 6.2), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    colors = [_color(p) for p in runs["pipeline"]]
    skipped = runs["skipped"].to_numpy(float) / runs["messages"].to_numpy(float)
    top.bar(x, skipped, color=colors)
    top.set_yscale("symlog", linthresh=0.01)
    top.set_ylabel("skipped claims per message")
    bottom.vlines(
        x,
        runs["claims_min"].to_numpy(float) / fair,
        runs["claims_max"].to_numpy(float) / fair,
        color=colors,
        lw=4,
    )
    bottom.axhline(1.0, color="0.5", lw=0.8)
    bottom.set_ylabel("claims per consumer ÷ M/N")
    bottom.set_xticks(x, labels, rotation=60, ha="right", fontsize="small")
    bottom.set_xlabel("run: pipeline and N consumers")
    if len(runs) and np.nanmax(skipped) > 0:
        k = int(np.nanargmax(skipped))
        r = runs.iloc[k]
        title = (f"{r['pipeline']} loses the most claims to other readers: {skipped[k]:.2f} per message "
                 f"at N = {int(r['consumers'])}")
    else:
        title = "No consumer lost a claim to another"
    return finding(fig, title, "Top: claims a consumer lost to another, per message (symmetric log scale); "
                               "bottom: the fewest to the most messages one consumer claimed in a run, as a "
                               "share of the fair M/N (1: perfectly even).")


def drift_figure(df: pd.DataFrame) -> Figure:
    """Each drift probe beside its origin run: ms CPU/msg and msg/s over the window, with the
    change in % (the article reads under 10 % as stand drift)."""
    d = drift(df)
    fig = Figure(figsize=(7.6, 4.0), layout="constrained")
    if d.empty:
        return _empty(fig, fig.subplots(), "no drift probe (label 'drift') with an earlier origin run")
    labels = [_cell_label(r) for _, r in d.iterrows()]
    x, w = np.arange(len(d)), 0.38
    axes = fig.subplots(1, 2)
    for ax, col, change, unit in zip(
        axes,
        ("ms_per_msg", "msg_per_s"),
        ("cpu_change_pct", "rate_change_pct"),
        ("ms CPU per message", "messages per second (window)"),
        strict=True,
    ):
        ax.bar(x - w / 2, d[f"{col}_origin"], w, color="0.6", label="the cell's first run")
        probe = ax.bar(x + w / 2, d[f"{col}_probe"], w, color="C3", label="the drift probe at the end")
        ax.bar_label(
            probe, [f"{v:+.{1 if abs(v) >= 1 else 2}f} %" for v in d[change]], fontsize="small"
        )
        ax.set_xticks(x, labels)
        ax.set_xlabel("cell")
        ax.set_ylabel(unit)
        ax.margins(y=0.15)
    outside_legend(axes[1])
    first = d.iloc[0]
    title = (f"The stand moved {first['cpu_change_pct']:+.1f} % in CPU per message and "
             f"{first['rate_change_pct']:+.1f} % in throughput over the series")
    return finding(fig, title, "The series' first cell run again at its end (the drift probe) against its first "
                               "run; the reference study read changes under 10 % as the stand's drift.")


def residual_figure(idle: pd.DataFrame) -> Figure:
    """Per cell (median over runs): ms CPU/msg as measured, without the idle floor, and the
    ``unattributed`` residual beside them (:func:`lab.study.compare.idle_table`)."""
    fig = Figure(figsize=(max(6.5, 0.5 * idle[["pipeline", "consumers"]].drop_duplicates().shape[0] + 3), 4.4),
                 layout="constrained")
    ax = fig.subplots()
    if idle.empty or idle["ms_per_msg_net"].isna().all():
        return _empty(fig, ax, "no idle baseline with these runs")
    cells = _order(idle).groupby(["pipeline", "consumers"], sort=False)[
        ["ms_per_msg", "ms_per_msg_net", "unattributed_ms_per_msg"]].median()
    x, w = np.arange(len(cells)), 0.28
    ax.bar(x - w, cells["ms_per_msg"], w, color="0.55", label="as measured")
    ax.bar(x, cells["ms_per_msg_net"], w, color="C0", label="without the idle baseline")
    ax.bar(x + w, cells["unattributed_ms_per_msg"], w, color="0.8", label="unattributed (in neither)")
    ax.axhline(0, color="0.3", lw=0.6)
    ax.set_xticks(x, [f"{p} c{n}" for p, n in cells.index], rotation=60, ha="right", fontsize="small")
    ax.set_xlabel("pipeline and N consumers")
    ax.set_ylabel("ms CPU per message")
    outside_legend(ax)
    share = 100 * (1 - cells["ms_per_msg_net"] / cells["ms_per_msg"])
    title = (f"The idle baseline is {share.median():.0f} % of the cost in the median cell "
             f"({share.min():.0f}–{share.max():.0f} %)")
    return finding(fig, title, "Median over each cell's runs: the metric as measured, the same without each "
                               "participant's idle CPU over the window, and host CPU no participant accounts for.")


def decode_figure(decode: pd.DataFrame) -> Figure:
    """WAL decoded per message (all slots of the run) against N: fan-out decodes once per reader
    (:func:`lab.study.compare.decode_table`)."""
    fig = Figure(figsize=(7.6, 4.2), layout="constrained")
    ax = fig.subplots()
    if decode.empty:
        return _empty(fig, ax, "no slot statistics with these runs")
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
    outside_legend(ax)
    n = int(decode["consumers"].max())
    at = decode[decode["consumers"] == n].set_index("pipeline")["bytes_per_msg"]
    title = f"At N = {n} the pipelines decode {at.min() / 1024:.1f} to {at.max() / 1024:.1f} KiB of WAL per message"
    if len(at) > 1 and at.min() > 0:
        title += f": {at.idxmax()} {at.max() / at.min():.0f}× {at.idxmin()}"
    return finding(fig, title, "pg_stat_replication_slots.total_bytes summed over a run's slots, per message, "
                               "median over a cell's runs: every direct reader decodes the whole WAL in its own slot.")


def memory_figure(memory: pd.DataFrame) -> Figure:
    """Stacked peak RSS per participant, one bar per pipeline x N (:func:`lab.study.compare.memory_table`)."""
    fig = Figure(figsize=(max(6.5, 0.42 * len(memory) + 3), 4.6), layout="constrained")
    ax = fig.subplots()
    if memory.empty:
        return _empty(fig, ax, "no memory readings with these runs")
    table = _order(memory)
    x, bottom = np.arange(len(table)), np.zeros(len(table))
    shown = []
    for col in (c for c in table.columns if c.endswith("_mb") and c != "total_mb"):
        values = table[col].fillna(0).to_numpy(float)
        if values.sum() <= 0:
            continue
        name = col.removesuffix("_mb")
        ax.bar(x, values, bottom=bottom, label=name, color=PARTICIPANT_COLORS.get(name))
        bottom += values
        shown.append((name, float(np.median(values))))
    ax.set_xticks(x, [_cell_label(r) for _, r in table.iterrows()], rotation=60, ha="right", fontsize="small")
    ax.set_xlabel("pipeline and N consumers")
    ax.set_ylabel("MB resident (peak in the window)")
    outside_legend(ax, title="participant")
    name, mb = max(shown, key=lambda t: t[1]) if shown else ("nobody", 0.0)
    title = f"{name} holds the most memory: {mb:.0f} MB in the median cell, of {np.median(bottom):.0f} MB in all"
    return finding(fig, title, "Peak resident memory of each participant in the run window, median over a "
                               "cell's runs; PostgreSQL's shared buffers counted once.")


N_STAR_MARKERS = {"straight direct, flat broker": "o", "straight direct, sloped broker": "s",
                  "curved direct, flat broker": "^"}


def _span(r: tuple[float, float] | None) -> str:
    if r is None:
        return "no model"
    lo, hi = r
    words = ["never" if math.isinf(v) else f"{v:.0f}" for v in (lo, hi)]
    return words[0] if words[0] == words[1] else f"{words[0]}–{words[1]}"


def n_star_figure(answers: Iterable[Any], *,
                  about: str = "N* against the messages one Debezium start serves") -> Figure:
    """N* under each condition (a volume per start, or a rate) for each pair of a direct and a
    broker pipeline, one row each: every model's point with its 95 % interval, the range over the
    models as a band, "never" at the right edge. The title gives the first pair's range under each
    condition; the caption says what the figure is (``about``) and where F came from."""
    answers = list(answers)
    rows = len(answers)
    fig = Figure(figsize=(8.4, 1.9 + 0.34 * max(rows, 1)), layout="constrained")
    ax = fig.subplots()
    if not answers:
        return _empty(fig, ax, "no crossover could be computed")
    short = {a.condition: a.condition.partition(", ")[0] for a in answers}  # "M = 5,000, F fitted …" → "M = 5,000"
    sources = list(dict.fromkeys(a.condition.partition(", ")[2] for a in answers if ", " in a.condition))
    finite = [v for a in answers for m in a.models for v in (m.n_star, *m.ci)
              if v is not None and math.isfinite(v)]
    top = max([*finite, 16.0]) * 1.12
    order = sorted(range(rows), key=lambda i: ([a.condition for a in answers].index(answers[i].condition),
                                               answers[i].direct, answers[i].broker))
    labels = []
    for y, i in enumerate(order):
        a = answers[i]
        colour = _color(a.broker)
        r = a.range
        if r is not None:
            ax.hlines(y, r[0], min(r[1], top), color=colour, alpha=0.25, linewidth=9)
        for k, m in enumerate(a.models):
            x = top if m.n_star is None or not math.isfinite(m.n_star) else m.n_star
            lo, hi = ((min(v, top) if math.isfinite(v) else top for v in m.ci) if math.isfinite(m.ci[0])
                      else (x, x))
            ax.errorbar(x, y + (k - 1) * 0.18, xerr=[[max(x - lo, 0)], [max(hi - x, 0)]],
                        fmt=N_STAR_MARKERS.get(m.model, "o"), color=colour, markersize=4.5, capsize=2, lw=1)
        labels.append(f"{short[a.condition]}: {a.direct} vs {a.broker}")
    ax.set_yticks(range(rows), labels, fontsize="small")
    ax.set_ylim(rows - 0.4, -0.6)
    ax.axvline(top, color="0.75", ls=":")
    ticks = [t for t in MaxNLocator(6, integer=True).tick_values(0, top * 0.9) if 0 <= t < top * 0.9]
    ax.set_xticks([*ticks, top], [f"{t:g}" for t in ticks] + ["never"])
    ax.set_xlim(0, top * 1.04)
    ax.set_xlabel("N* (readers from which the broker costs less)")
    ax.grid(True, axis="x", alpha=0.3)
    handles: list[Artist] = [Line2D([], [], ls="none", marker=mk, color="0.3", label=name)
                             for name, mk in N_STAR_MARKERS.items()]
    handles.append(Patch(color="0.5", alpha=0.3, label="range over the models"))
    outside_legend(ax, handles=handles, title="model")
    first = answers[order[0]]
    mine = [a for a in answers if (a.direct, a.broker) == (first.direct, first.broker)]
    title = f"N* of {first.direct} against {first.broker}: " + "; ".join(
        f"{_span(a.range)} at {short[a.condition]}" for a in mine)
    caption = (f"{about}. Each marker one model's N* with its 95 % interval; 'never': that model's lines do not "
               "meet." + (f" F: {'; '.join(sources)}." if sources else ""))
    return finding(fig, title, caption)


def latency_figure(runs: pd.DataFrame) -> Figure:
    """p50, p95, p99 and max end-to-end latency (ms, log scale) against N, one panel per pipeline.

    ``runs`` as for :func:`lab.measure.latency.latency_table` (medians over repeats are plotted).
    """
    table = latency.latency_table(runs)
    pipes = list(dict.fromkeys(table["pipeline"])) or ["(no runs)"]
    fig = Figure(figsize=(3.2 * len(pipes) + 1.8, 4.2), layout="constrained")
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
        ax.set_title(pipeline)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("created_at → work call (ms)")
    outside_legend(axes[-1], title="percentile")
    rate = table["rate"].median() if not table.empty else float("nan")
    if table.empty:
        title = "No run with latency"
    else:
        p99 = table.groupby("pipeline")["p99"].median().sort_values()
        title = f"{p99.index[0]} delivers fastest: p99 {p99.iloc[0]:,.0f} ms" + (
            f" against {p99.index[-1]}'s {p99.iloc[-1]:,.0f} ms" if len(p99) > 1 else "") + " (median over N)"
    caption = "End-to-end latency from a row's created_at to its work call, median over a cell's runs" + (
        f", open loop at {rate:g} msg/s." if rate > 0 else ".")
    return finding(fig, title, caption)
