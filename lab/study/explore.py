"""The committed sittings shown without a run: what ``make explore`` and the site's results page draw.

A sitting is one quiet ``lab report`` on one machine; its record (``data/sittings/<id>.json``,
committed) holds the medians of its cells and its runs. These are pure functions of
:func:`lab.study.ledger.cells`' table (one row per sitting, pipeline, N, messages and condition)
and of the crossings :func:`lab.study.ledger.crossing` measured in each sitting: the index of
sittings, every cell's median over the sittings with its range, the cost against N over sittings
and the crossing of each sitting. Nothing here starts a service or reads a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lab.pipelines import NAMES
from lab.study import crossover, plots


def _ns(values: Sequence[int] | pd.Series) -> str:
    ns = sorted({int(n) for n in values})
    return ", ".join(map(str, ns))


def index_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per sitting, oldest first: day, machine, profile, the pipelines and N it measured,
    its volumes and conditions, and how many runs its cells hold."""
    cols = ["sitting", "day", "machine", "profile", "pipelines", "consumers", "messages", "conditions", "runs"]
    if cells.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for sitting, g in cells.groupby("sitting", sort=False):
        first = g.iloc[0]
        rows.append({"sitting": sitting, "day": first["day"], "machine": first["machine"], "profile": first["profile"],
                     "pipelines": ", ".join(p for p in NAMES if p in set(g["pipeline"])),
                     "consumers": _ns(g["consumers"]),
                     "messages": ", ".join(f"{int(m):,}" for m in sorted(set(g["messages"]))),
                     "conditions": ", ".join(dict.fromkeys(str(c) for c in g["condition"])),
                     "runs": int(g["runs"].sum())})
    return pd.DataFrame(rows, columns=cols).sort_values("day", kind="stable").reset_index(drop=True)


def over_sittings(cells: pd.DataFrame) -> pd.DataFrame:
    """Each cell (pipeline, N, messages, condition) over the sittings that measured it: the median of
    their medians, the lowest and highest, and how many sittings."""
    keys = ["pipeline", "consumers", "messages", "condition"]
    cols = [*keys, "median_ms", "low_ms", "high_ms", "sittings"]
    if cells.empty:
        return pd.DataFrame(columns=cols)
    out = (cells.groupby(keys, sort=False)["median_ms"]
           .agg(median_ms="median", low_ms="min", high_ms="max", sittings="count").reset_index())
    rank = {p: i for i, p in enumerate(NAMES)}
    out = out.assign(_o=out["pipeline"].map(rank).fillna(len(rank)))
    return out.sort_values(["_o", "messages", "condition", "consumers"], kind="stable").drop(columns="_o")[cols]


def main_condition(cells: pd.DataFrame) -> tuple[int, str]:
    """The volume and condition most cells were measured at (the series' own, closed loop)."""
    top = cells.groupby(["messages", "condition"]).size().sort_values(ascending=False, kind="stable")
    m, c = top.index[0]
    return int(m), str(c)


def cost_figure(over: pd.DataFrame, *, messages: int, condition: str, pipelines: Sequence[str] = ()) -> Figure:
    """ms CPU per message against N over the sittings: the median of the sittings' medians as a
    line labelled at its end, the range over the sittings as a band (:func:`over_sittings`)."""
    at = over[(over["messages"] == messages) & (over["condition"] == condition)]
    if pipelines:
        at = at[at["pipeline"].isin(pipelines)]
    fig = Figure(figsize=(7.2, 4.6), layout="constrained")
    ax = fig.subplots()
    ns = sorted({int(n) for n in at["consumers"]}) or [1]
    ends: dict[str, tuple[float, float]] = {}
    for p, g in at.groupby("pipeline", sort=False):
        g = g.sort_values("consumers")
        colour = plots.pipeline_color(str(p))
        x = g["consumers"].to_numpy(float)
        ax.plot(x, g["median_ms"].to_numpy(float), "-o", ms=4, color=colour, lw=1.8)
        if (g["sittings"] > 1).any():
            ax.fill_between(x, g["low_ms"].to_numpy(float), g["high_ms"].to_numpy(float), color=colour, alpha=0.15,
                            lw=0)
        ends[f"{p} {g['median_ms'].iloc[-1]:.2f}"] = (float(x[-1]), float(g["median_ms"].iloc[-1]))
    plots.n_axis(ax, ns)
    ax.set_xlim(ns[0] / 2**0.35, ns[-1] * 2**1.25)
    top = float(at["high_ms"].max()) if not at.empty else 1.0
    ax.set_ylim(0, top * 1.1)
    ax.set_ylabel("ms CPU per message (all participants)")
    ax.grid(True, axis="y", alpha=0.3)
    plots.direct_labels(ax, ends)
    most = int(at["sittings"].max()) if not at.empty else 0
    title = plots.cheapest_words(at) + (f" (median over {most} sittings)" if most > 1 else " (one sitting)")
    where = "the series' own cells, closed loop" if condition == "main" else condition
    return plots.finding(fig, title, f"{messages:,} messages per start, {where}; line: the median of the "
                                      "sittings' medians; band: the lowest to the highest sitting.")


def pairs(cells: pd.DataFrame) -> list[tuple[str, str]]:
    """The crossings worth showing: the first direct pipeline (registry order: ``wal``) against each
    broker pipeline the sittings measured."""
    direct, brokers = crossover.sides(cells["pipeline"]) if not cells.empty else ([], [])
    return [(direct[0], b) for b in brokers] if direct else []


def crossings(records: Sequence[Mapping[str, Any]], which: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """:func:`crossing_rows` of every pair in ``which`` over ``records``, each sitting at its own
    volume (the messages per start most of its runs measured); a sitting that did not run both
    pipelines of a pair has no row for it."""
    from lab.study import first_screen, ledger

    frames = []
    for direct, broker in which:
        found: dict[str, Mapping[str, Any] | None] = {}
        for record in records:
            own = ledger.cells([dict(record)])
            runs = ledger.record_runs(dict(record))
            if own.empty or runs.empty or not {direct, broker} <= set(runs["pipeline"]):
                continue
            found[str(own["sitting"].iloc[0])] = ledger.crossing(dict(record), direct, broker,
                                                                 first_screen.measured_volume(runs))
        frames.append(crossing_rows(found, direct, broker))
    return pd.concat(frames, ignore_index=True) if frames else crossing_rows({}, "", "")


def crossing_rows(found: Mapping[str, Mapping[str, Any] | None], direct: str, broker: str) -> pd.DataFrame:
    """One row per sitting of the measured crossing of ``direct`` and ``broker``
    (:func:`lab.study.ledger.crossing`): between which measured N, where the lines meet, or beyond."""
    rows = []
    for sitting, c in found.items():
        between = (c or {}).get("between")
        at = (c or {}).get("at")
        rows.append({"sitting": sitting, "direct": direct, "broker": broker,
                     "from_n": between[0] if between else math.nan, "to_n": between[1] if between else math.nan,
                     "at_n": at if at is not None else math.nan, "beyond": bool((c or {}).get("beyond")),
                     "measured": c is not None})
    return pd.DataFrame(rows, columns=["sitting", "direct", "broker", "from_n", "to_n", "at_n", "beyond",
                                       "measured"])


def crossing_words(rows: pd.DataFrame, largest_n: int) -> str:
    """The crossings of the sittings in one sentence: where most of them put it, and in how many."""
    if rows.empty:
        return "no sitting measured both sides"
    direct, broker = rows["direct"].iloc[0], rows["broker"].iloc[0]
    ok = rows[rows["measured"]]
    spans = ok.dropna(subset=["from_n"])
    beyond = int(ok["beyond"].sum())
    if not spans.empty:
        common = spans.groupby(["from_n", "to_n"]).size().sort_values(ascending=False).index[0]
        held = int(((spans["from_n"] == common[0]) & (spans["to_n"] == common[1])).sum())
        return (f"{direct} and {broker} cross between N = {common[0]:.0f} and {common[1]:.0f} in {held} of "
                f"{len(rows)} sittings" + (f"; beyond N = {largest_n} in {beyond}" if beyond else ""))
    if beyond:
        return f"{direct} costs less than {broker} up to N = {largest_n} in {beyond} of {len(rows)} sittings"
    return f"{broker} costs less than {direct} at every N measured in {len(ok)} of {len(rows)} sittings"


def crossing_figure(rows: pd.DataFrame, largest_n: int) -> Figure:
    """One row per sitting: the two measured N the crossing lies between as a bar, where the lines
    meet as a dot, an arrow at the right where it lies beyond the largest N measured."""
    fig = Figure(figsize=(7.2, 1.6 + 0.38 * max(len(rows), 1)), layout="constrained")
    ax = fig.subplots()
    y = np.arange(len(rows))
    for i, r in enumerate(rows.itertuples()):
        colour = plots.pipeline_color(str(r.broker))
        if math.isfinite(r.from_n):
            ax.plot([r.from_n, r.to_n], [i, i], "-", color=colour, lw=6, alpha=0.45, solid_capstyle="butt")
        if math.isfinite(r.at_n):
            ax.plot([r.at_n], [i], "o", color=colour, ms=6)
        if r.beyond:
            ax.annotate("", (largest_n * 1.6, i), xytext=(largest_n, i),
                        arrowprops={"arrowstyle": "->", "color": colour, "lw": 1.5})
    ax.set_yticks(y, [str(s) for s in rows["sitting"]] if len(rows) else [])
    ax.set_ylim(-0.7, max(len(rows), 1) - 0.3)
    ax.invert_yaxis()
    ax.set_xscale("log", base=2)
    ax.set_xlim(0.8, largest_n * 2)
    ticks = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= largest_n * 2]
    ax.set_xticks(ticks, [str(n) for n in ticks])
    ax.minorticks_off()
    ax.set_xlabel("consumers N where the direct readers start to cost more")
    ax.set_ylabel("sitting")
    ax.grid(True, axis="x", alpha=0.3)
    return plots.finding(fig, crossing_words(rows, largest_n),
                         "Each row one sitting, at its own volume per start, closed loop: the bar spans the two "
                         "measured N the crossing lies between, the dot where the median lines meet, an arrow "
                         f"that the direct readers still cost less at N = {largest_n}.")
