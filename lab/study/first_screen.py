"""The first screen of a report and of the site: the answer, one sentence per question a team asks,
beside one figure.

The sentences are the ledger's findings (:func:`lab.study.ledger.findings`: question, sentence,
measured or modelled, how many sittings it held in); this module only shows them. The figure is
the sitting's cost per message against N at the volume its runs measured, for the main options:
every run as a point, the median of each N as a line, each line labelled at its end, and where the
direct readers and the broker cross (:func:`lab.study.ledger.crossing`) marked. Its title says
that crossing in words, its caption the conditions.

Pure functions of runs (``pipeline, consumers, messages, ms``) and a crossing dict, so that they
are tested on hand-made data; :func:`sitting_figure` reads them from a sitting's record.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lab.study import crossover, plots
from lab.study.series import REFERENCE_PIPELINES

MAX_LINES = 5  # lines in the answer's figure: the reference's four and the cheapest other option
QUESTION = ("Is it cheaper to let N consumers read PostgreSQL's write-ahead log directly, or to put Debezium "
            "and a broker (Kafka, RabbitMQ) in between, and from which N on does the broker pay off?")


class FindingLike(Protocol):
    """What the first screen reads of a finding (:class:`lab.study.ledger.Finding`, a frozen dataclass)."""

    @property
    def question(self) -> str: ...

    @property
    def sentence(self) -> str: ...

    @property
    def kind(self) -> str: ...  # "measured" | "modelled"

    @property
    def held(self) -> str: ...  # "2 of 3 sittings"; "" with one sitting


def measured_volume(runs: pd.DataFrame) -> int:
    """The messages per start most of the runs measured (the series' own volume, not its volume arm:
    runs a record flags ``arm`` are left out when others remain)."""
    if "arm" in runs and not runs["arm"].fillna(False).astype(bool).all():
        runs = runs[~runs["arm"].fillna(False).astype(bool)]
    counts = runs["messages"].astype(int).value_counts()
    return int(counts[counts == counts.max()].index.min())


def main_pipelines(runs: pd.DataFrame, messages: int) -> list[str]:
    """The options the figure draws: the reference study's four that ran, and the cheapest other
    option at the largest N all of them measured when it is not among those; at most
    :data:`MAX_LINES`, in registry order."""
    at = runs[runs["messages"] == messages]
    present = list(dict.fromkeys(at["pipeline"]))
    chosen = [p for p in present if p in REFERENCE_PIPELINES]
    others = [p for p in present if p not in chosen]
    if others:
        common = set.intersection(*(set(at.loc[at["pipeline"] == p, "consumers"]) for p in present))
        n = max(common) if common else int(at["consumers"].max())
        cost = at[at["consumers"] == n].groupby("pipeline")["ms"].median()
        ranked = [p for p in cost.sort_values().index if p in others]
        chosen += ranked[:1] if chosen else ranked[:MAX_LINES]
    both = [*crossover.sides(chosen)[0], *crossover.sides(chosen)[1]]
    return both[:MAX_LINES]


def pair(pipelines: Sequence[str]) -> tuple[str, str] | None:
    """The direct readers and the broker whose crossing the figure marks: the first of each side in
    registry order (``wal`` and ``kafka`` when they ran)."""
    direct, brokers = crossover.sides(pipelines)
    return (direct[0], brokers[0]) if direct and brokers else None


def crossing_title(direct: str, broker: str, crossing: Mapping[str, Any] | None, ns: Sequence[int]) -> str:
    """The figure's finding in words, from the measured crossing (``between``: the two measured N
    the sign of broker − direct changes between, ``at``: where the lines meet, ``beyond``: the
    direct readers cost less at every N measured)."""
    lo, hi = min(ns), max(ns)
    if not crossing:
        return f"{direct} and {broker}: no paired runs to compare at N = {lo}–{hi}"
    between, at = crossing.get("between"), crossing.get("at")
    if between:
        a, b = between
        where = f" (the lines meet at N ≈ {at:.0f})" if at is not None and math.isfinite(at) else ""
        first, then = (broker, direct) if _broker_cheaper(crossing.get("diffs") or {}, a) else (direct, broker)
        return f"{first} costs less than {then} up to N = {a}, {then} less from N = {b}{where}"
    if crossing.get("beyond"):
        return f"{direct} costs less than {broker} at every N measured, {lo} to {hi}: no crossing up to N = {hi}"
    return f"{broker} costs less than {direct} at every N measured, {lo} to {hi}"


def _broker_cheaper(diffs: Mapping[Any, Sequence[float]], n: int) -> bool:
    """Whether the broker costs less at ``n`` in the paired differences (broker − direct, ms/msg; a
    record read back from JSON has its N as strings)."""
    d = diffs.get(n, diffs.get(str(n)))
    return bool(d) and float(np.median(np.asarray(d, float))) < 0


def answer_figure(runs: pd.DataFrame, *, messages: int, pipelines: Sequence[str],
                  crossing: Mapping[str, Any] | None = None, conditions: str = "") -> Figure:
    """ms CPU per message against N at ``messages`` per start for ``pipelines``: each run a point
    (nudged sideways per pipeline so that none hides another), the median of each N a line labelled
    at its end, and the crossing of :func:`pair` marked: a band between the two measured N it lies
    between, a dotted line where the lines meet. ``runs``: pipeline, consumers, messages, ms."""
    at = runs[(runs["messages"] == messages) & runs["pipeline"].isin(pipelines)]
    fig = Figure(figsize=(7.2, 4.7), layout="constrained")
    ax = fig.subplots()
    ns = sorted({int(n) for n in at["consumers"]}) or [1]
    shown = [p for p in pipelines if (at["pipeline"] == p).any()]
    ends: dict[str, tuple[float, float]] = {}
    for i, p in enumerate(shown):
        g = at[at["pipeline"] == p]
        med = g.groupby("consumers")["ms"].median().sort_index()
        colour = plots.pipeline_color(p)
        ax.plot(med.index, med.to_numpy(float), "-", color=colour, lw=2, zorder=2)
        ax.scatter(nudged(g["consumers"].to_numpy(float), i, len(shown)), g["ms"].to_numpy(float), s=18, color=colour,
                   alpha=0.75, edgecolor="white", linewidth=0.4, zorder=3)
        ends[f"{p} {med.iloc[-1]:.2f}"] = (float(med.index[-1]), float(med.iloc[-1]))
    plots.n_axis(ax, ns)
    ax.set_xlim(ns[0] / 2**0.35, ns[-1] * 2**1.25)  # room for the labels right of the last N
    top = float(at["ms"].max()) if not at.empty else 1.0
    ax.set_ylim(0, top * 1.12)
    ax.set_ylabel("ms CPU per message (all participants)")
    ax.grid(True, axis="y", alpha=0.3)
    which = pair(shown)
    if which is not None and crossing:
        between, meet = crossing.get("between"), crossing.get("at")
        if between:
            ax.axvspan(between[0], between[1], color="0.92", zorder=0)
        if meet is not None and math.isfinite(meet):
            ax.axvline(meet, color="0.35", ls=":", lw=1.2, zorder=1)
            ax.annotate(f"{which[0]} = {which[1]}\nat N ≈ {meet:.0f}", (meet, top * 1.1), xytext=(-4, 0),
                        textcoords="offset points", ha="right", va="top", fontsize=8.5, color="0.25")
    plots.direct_labels(ax, ends)
    title = (crossing_title(*which, crossing, ns) if which is not None
             else f"ms CPU per message against N at {messages:,} messages per start")
    return plots.finding(fig, title, conditions)


def conditions(messages: int, runs: pd.DataFrame, sitting: Mapping[str, Any] | None = None, *,
               band: bool = False) -> str:
    """The figure's caption: volume, loop, runs per cell, what the band is (``band``: one is drawn),
    and where and when (``sitting``: a row of :func:`lab.study.ledger.cells` with ``day``,
    ``machine``, ``profile``)."""
    at = runs[runs["messages"] == messages]
    per = at.groupby(["pipeline", "consumers"]).size()
    reps = (f"{per.min()}" if per.min() == per.max() else f"{per.min()}–{per.max()}") if not per.empty else "0"
    where = ""
    if sitting:
        where = f"; sitting of {sitting.get('day')} on {sitting.get('machine')} ({sitting.get('profile')} profile)"
    shaded = "; shaded: the two measured N the crossing lies between" if band else ""
    return (f"{messages:,} messages per start, closed loop; points: runs ({reps} per pipeline and N), "
            f"lines: their medians{shaded}{where}.")


def sitting_of(records: Sequence[Mapping[str, Any]], sitting_id: str) -> Mapping[str, Any] | None:
    """The record of sitting ``sitting_id`` (its file name in ``data/sittings``), or None: a report whose
    series recorded nothing has no first-screen figure rather than another sitting's."""
    return next((r for r in records if r.get("id") == sitting_id), None)


def headline_sitting(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The sitting a page of every sitting speaks of: the newest that is not a smoke test (whose
    numbers are noise), else the newest; None without any."""
    pool = [r for r in records if r.get("profile") != "smoke"] or list(records)
    return pool[-1] if pool else None


def sitting_figure(record: Mapping[str, Any]) -> Figure:
    """:func:`answer_figure` for one sitting's record, from its runs and its measured crossing."""
    from lab.study import ledger

    runs = ledger.record_runs(dict(record))
    messages = measured_volume(runs)
    pipelines = main_pipelines(runs, messages)
    which = pair(pipelines)
    crossing = ledger.crossing(dict(record), *which, messages) if which is not None else None
    cells = ledger.cells([dict(record)])
    about = cells.iloc[0].to_dict() if not cells.empty else None
    band = bool(crossing and crossing.get("between"))
    return answer_figure(runs, messages=messages, pipelines=pipelines, crossing=crossing,
                         conditions=conditions(messages, runs, about, band=band))


STYLE = """<style>
.lab-answer{display:flex;flex-wrap:wrap;gap:8px 28px;align-items:flex-start;margin:4px 0 8px}
.lab-answer-text{flex:1 1 360px;max-width:600px}
.lab-answer figure{flex:0 1 720px;margin:0;min-width:0}
.lab-answer figure img{max-width:100%;height:auto;display:block}
.lab-finding{margin:0 0 14px}
.lab-question{font-weight:600;margin:0 0 2px}
.lab-sentence{margin:0;line-height:1.45}
.lab-kind{display:inline-block;font-size:80%;padding:0 6px;border-radius:3px;margin-left:6px;white-space:nowrap}
.lab-kind.measured{background:#dcefdc;color:#1d5c1d}
.lab-kind.modelled{background:#f4ead2;color:#6b4e0e}
.lab-held{color:#555;font-size:85%;margin-left:4px;white-space:nowrap}
</style>"""


def _inline(text: str) -> str:
    """Text escaped for HTML, its Markdown code spans (a pipeline's name: `wal`) as ``<code>``."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def finding_html(f: FindingLike) -> str:
    """One finding: its question, its sentence, measured or modelled, and how often it held."""
    kind = f.kind if f.kind in ("measured", "modelled") else "modelled"
    held = f'<span class="lab-held">held in {html.escape(f.held)}</span>' if f.held else ""
    return (f'<div class="lab-finding"><p class="lab-question">{_inline(f.question)}</p>'
            f'<p class="lab-sentence">{_inline(f.sentence)}'
            f'<span class="lab-kind {kind}">{kind}</span>{held}</p></div>')


def answer_html(findings: Sequence[FindingLike], figure: str = "", *, empty: str = "") -> str:
    """The answer block: the findings beside ``figure`` (an ``<img>`` tag, :func:`lab.study.page.img_tag`).
    Without findings it says ``empty`` (what to run to get them)."""
    text = "".join(finding_html(f) for f in findings) or f'<p class="lab-sentence">{html.escape(empty)}</p>'
    fig = f"<figure>{figure}</figure>" if figure else ""
    return f'{STYLE}<section class="lab-answer" id="answer"><div class="lab-answer-text">{text}</div>{fig}</section>'


def nudged(ns: np.ndarray, i: int, k: int) -> np.ndarray:
    """x of pipeline ``i`` of ``k`` at ``ns`` on a log2 axis: spread by a few percent so that the runs
    of different pipelines at one N sit side by side."""
    return ns * 2 ** ((i - (k - 1) / 2) * 0.035)
