"""The report's first table: every pipeline ranked by its CPU per message at a point a team chooses.

A :class:`Point` is what a team controls: N consumers, M messages per start of the pipeline (one
Debezium start, one set of slots), and a fixed rate or a closed loop. Each run's CPU is
``F + c·M`` (a fixed part per start and a steady cost per message, :mod:`lab.measure.steady`), and
at a fixed rate the idle loops and pollers cost ``a`` CPU-seconds per second on top (the floor of the
load staircases, :func:`lab.study.crossover.rate_lines`). Every measured run of a pipeline is moved
to the point:

* closed loop: ``figure − 1000·F/M_run + 1000·F/M`` ms per message (its steady cost keeps the floor
  it paid during its own closed-loop window);
* at rate R: ``figure − 1000·F/M_run − 1000·a·window/M_run + 1000·F/M + 1000·a/R``: the floor of its
  own window taken out, the floor of R msg/s spread over R messages put in. R above the fastest
  sustainable step measured at that N (an achieved rate, within the staircase's 5 % of its target)
  is not measured.

F comes from the most reliable source the series has, as in :func:`lab.study.crossover.by_volume`:
the cell fitted across volumes at every N, else F(N) as a line through the volume arm's N, else
each run's own split; a run without a split (too short to split) is used only at its own M, where
its figure is the point's.

The figure at the point is the **median of the moved runs at N**, with the order-statistic interval
of that median and its exact coverage (:func:`lab.study.intervals.median_interval`: 50 % with 2 runs,
75 % with 3). F and the floor are held fixed: their own fitting error is not in the interval.
Between two measured N at most :data:`MAX_GAP` times apart the median and both bounds are
interpolated linearly; if the cost is linear in N between them, the interpolated interval covers
the true median at least as often as both ends cover theirs (the product of the two coverages,
given as the coverage). Outside the measured N, or across a wider gap, the row says ``not measured
at N``: no number is extrapolated.

Beside the cost, what a dead consumer cost each pipeline in the fault matrix (:func:`dead_consumer`).
Pure functions over the frames the report already loads; :func:`for_study` builds the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.measure.staircase import RATE_TOLERANCE
from lab.pipelines import NAMES
from lab.study import crossover
from lab.study.costmodel import METRIC
from lab.study.fault_matrix import DEAD_CONSUMER
from lab.study.intervals import coverage_label, median_interval

# the widest gap between two measured N that a figure is interpolated across (hi / lo): the widest
# any profile's grid leaves (decision's 1, 4, 16); a series with N = 1 and 16 only says "not measured" at 4
MAX_GAP = 4.0
COLUMNS = ("rank", "pipeline", "ms_per_msg", "lo", "hi", "coverage", "x_cheapest", "runs", "basis", "note")
DEAD_COLUMNS = ("dead_backlog", "dead_waits", "dead_lost", "dead_duplicates", "dead_delivered_pct")
PLACES = {"source": "slot", "broker": "broker", "source+broker": "slot+broker"}


@dataclass(frozen=True)
class Point:
    """Where a team stands: N consumers, M messages per start (``inf``: never restarted), a fixed
    rate in msg/s or a closed loop (``rate`` 0)."""

    consumers: int
    messages: float = 100_000
    rate: float = 0.0

    def __post_init__(self) -> None:
        if self.consumers < 1:
            raise ValueError(f"consumers must be at least 1, got {self.consumers}")
        if not self.messages > 0:
            raise ValueError(f"messages per start must be positive, got {self.messages}")
        if not self.rate >= 0:
            raise ValueError(f"rate must be 0 (closed loop) or positive, got {self.rate}")

    @classmethod
    def chosen(cls, consumers: int, messages_per_start: float, rate: float) -> Point:
        """The notebook's parameters as a point: ``messages_per_start`` 0 or less is a start never
        repeated (steady costs only), ``rate`` 0 a closed loop."""
        return cls(int(consumers), math.inf if messages_per_start <= 0 else float(messages_per_start), float(rate))

    def words(self) -> str:
        """``N = 4, 100,000 messages per start, closed loop``."""
        m = "a start never repeated" if math.isinf(self.messages) else f"{self.messages:,.0f} messages per start"
        rate = f"{self.rate:,.0f} msg/s" if self.rate else "closed loop"
        return f"N = {self.consumers}, {m}, {rate}"


@dataclass(frozen=True)
class _Fixed:
    per_run: np.ndarray  # F in CPU-s of each run (0 without a split)
    steady: np.ndarray | None  # each run's own steady ms/msg (its own split), else None
    basis: str
    movable: bool  # False: no split, the runs stand only at their own M


def _ns(values: Sequence[int] | np.ndarray) -> str:
    return ", ".join(str(int(n)) for n in sorted(set(values)))


def _fixed(runs: pd.DataFrame, arm: pd.DataFrame | None) -> _Fixed:
    """F per run of one pipeline's ``runs``, from the most reliable source (module docstring)."""
    n = runs["consumers"].to_numpy(int)
    if "messages" in runs:
        fits = crossover.volume_fit(runs)
        total = fits[fits["participant"] == "total"].set_index("consumers")["fixed_cpu_s"]
        if not total.empty and set(n) <= set(total.index):
            return _Fixed(total.loc[n].to_numpy(float), None, "F fitted across volumes at every N", True)
    if arm is not None and not arm.empty and "messages" in runs:
        own = arm[arm["pipeline"].isin(set(runs["pipeline"]))]
        lines = crossover.fixed_lines(runs, own) if not own.empty else pd.DataFrame()
        if not lines.empty:
            line = lines.iloc[0]
            return _Fixed(line["f0"] + line["f1"] * (n - 1.0), None,
                          f"F fitted across volumes at N = {_ns(line['fitted_at'])}", True)
    if {"steady_ms_per_msg", "fixed_cpu_s"} <= set(runs):
        steady = pd.to_numeric(runs["steady_ms_per_msg"], errors="coerce").to_numpy(float)
        fixed = pd.to_numeric(runs["fixed_cpu_s"], errors="coerce").to_numpy(float)
        if np.isfinite(steady).any() and np.isfinite(fixed).any():
            return _Fixed(fixed, steady, "F from each run's own split", True)
    return _Fixed(np.zeros(len(runs)), None, "as measured (no cost split)", False)


def _interp(known: dict[int, float], n: int) -> tuple[float, str] | None:
    """``known[n]``, or linear between the two nearest N around n at most :data:`MAX_GAP` apart."""
    if n in known:
        return known[n], ""
    lo = max((k for k in known if k < n), default=None)
    hi = min((k for k in known if k > n), default=None)
    if lo is None or hi is None or hi / lo > MAX_GAP:
        return None
    w = (n - lo) / (hi - lo)
    return known[lo] * (1 - w) + known[hi] * w, f"between N = {lo} and {hi}"


def _bracket(measured_n: Sequence[int], n: int) -> tuple[int, ...] | None:
    """(n,) when measured, (lo, hi) when n lies between two measured N at most MAX_GAP apart, else None."""
    have = set(measured_n)
    if n in have:
        return (n,)
    lo = max((k for k in have if k < n), default=None)
    hi = min((k for k in have if k > n), default=None)
    return (lo, hi) if lo is not None and hi is not None and hi / lo <= MAX_GAP else None


def _floors(floors: pd.DataFrame | None, pipeline: str) -> tuple[dict[int, float], dict[int, float]]:
    """The pipeline's floor a (CPU-s per s) and fastest sustainable step (msg/s) per staircase N."""
    if floors is None or floors.empty:
        return {}, {}
    own = floors[floors["pipeline"] == pipeline]
    a = {int(r.consumers): float(r.a_cpu_per_s) for r in own.itertuples() if math.isfinite(r.a_cpu_per_s)}
    top = {int(r.consumers): float(max(r.rates)) for r in own.itertuples()
           if "rates" in own and isinstance(r.rates, list | tuple) and r.rates}
    return a, top


def _cell_values(runs: pd.DataFrame, fixed: _Fixed, point: Point, floor: float | None) -> np.ndarray:
    """Each run of one N moved to the point (module docstring); NaN where a run lacks what it needs."""
    y = pd.to_numeric(runs[METRIC], errors="coerce").to_numpy(float)
    m_run = pd.to_numeric(runs["messages"], errors="coerce").to_numpy(float) if "messages" in runs else np.full(
        len(runs), np.nan)
    f = fixed.per_run
    base = fixed.steady if fixed.steady is not None else y - 1000 * f / m_run
    spread = 0.0 if math.isinf(point.messages) else 1000 / point.messages
    out = base + f * spread if fixed.movable else np.full(len(runs), np.nan)
    out = np.where(m_run == point.messages, y, out)  # at its own M a run's figure is the point's, split or not
    if point.rate:
        window = pd.to_numeric(runs.get("window_s", pd.Series(np.nan, index=runs.index)),
                               errors="coerce").to_numpy(float)
        assert floor is not None
        out = out - 1000 * floor * window / m_run + 1000 * floor / point.rate
    return out


def _row(pipeline: str, runs: pd.DataFrame, point: Point, arm: pd.DataFrame | None,
         floors: pd.DataFrame | None) -> dict[str, object]:
    """One pipeline's figure at the point, or why there is none (``note``)."""
    empty: dict[str, object] = {"pipeline": pipeline, "ms_per_msg": math.nan, "lo": math.nan, "hi": math.nan,
                                "coverage": 0.0, "runs": 0, "basis": ""}
    n = point.consumers
    runs = runs[np.isfinite(pd.to_numeric(runs[METRIC], errors="coerce").to_numpy(float))] if not runs.empty else runs
    if runs.empty:  # none, or none with a figure (costmodel.measured leaves those out too)
        return empty | {"note": "no measured runs"}
    cells = _bracket(runs["consumers"].astype(int).tolist(), n)
    if cells is None:
        return empty | {"note": f"not measured at N = {n} (measured at N = {_ns(runs['consumers'])})"}
    fixed = _fixed(runs, arm)
    a, top = _floors(floors, pipeline)
    found = []
    for c in cells:
        floor = None
        if point.rate:
            got = _interp(a, c)
            fastest = _interp(top, c)
            if got is None:
                where = f"staircases at N = {_ns(list(a))}" if a else "no staircase"
                return empty | {"note": f"not measured at N = {n} at {point.rate:,.0f} msg/s: no floor at N = {c} "
                                        f"({where})"}
            # the staircases' rates are achieved ones; a step held when it achieved (1 - RATE_TOLERANCE) of its target
            if fastest is not None and point.rate * (1 - RATE_TOLERANCE) > fastest[0] * (1 + 1e-9):
                return empty | {"note": f"not measured at {point.rate:,.0f} msg/s: the fastest step sustained at "
                                        f"N = {c} is {fastest[0]:,.0f} msg/s"}
            floor = got[0]
        mask = (runs["consumers"] == c).to_numpy()
        sub = _Fixed(fixed.per_run[mask], None if fixed.steady is None else fixed.steady[mask], fixed.basis,
                     fixed.movable)
        values = _cell_values(runs[mask], sub, point, floor)
        values = values[np.isfinite(values)]
        if values.size == 0:
            own_m = set(pd.to_numeric(runs.loc[mask, "messages"], errors="coerce")) if "messages" in runs else set()
            other_m = point.messages not in own_m
            why = "no cost split to move its runs to this M" if other_m else "no usable run"
            return empty | {"note": f"not measured at N = {n}: {why}"}
        lo, hi, cov = median_interval(values)
        found.append((c, float(np.median(values)), lo, hi, cov, values.size))
    basis = fixed.basis + ("; floor from the staircases" if point.rate else "")
    if len(found) == 1:
        _, mid, lo, hi, cov, k = found[0]
        return {"pipeline": pipeline, "ms_per_msg": mid, "lo": lo, "hi": hi, "coverage": cov, "runs": k,
                "basis": f"measured at N = {n}; {basis}", "note": ""}
    (n0, m0, lo0, hi0, c0, k0), (n1, m1, lo1, hi1, c1, k1) = found
    w = (n - n0) / (n1 - n0)
    mix = lambda u, v: u * (1 - w) + v * w  # noqa: E731
    return {"pipeline": pipeline, "ms_per_msg": mix(m0, m1), "lo": mix(lo0, lo1), "hi": mix(hi0, hi1),
            "coverage": c0 * c1, "runs": k0 + k1, "basis": f"interpolated between N = {n0} and {n1}; {basis}",
            "note": ""}


def _order(pipelines: Sequence[str]) -> list[str]:
    rank = {p: i for i, p in enumerate(NAMES)}
    return sorted(dict.fromkeys(pipelines), key=lambda p: rank.get(p, len(rank)))


def cost_ranking(measured: pd.DataFrame, point: Point, *, arm: pd.DataFrame | None = None,
                 floors: pd.DataFrame | None = None, pipelines: Sequence[str] = ()) -> pd.DataFrame:
    """Every pipeline's ms CPU per message at ``point`` (:data:`COLUMNS`), cheapest first.

    ``measured``: the series' measured runs (:func:`lab.study.costmodel.measured`); ``arm``: its
    volume arm (:func:`lab.study.crossover.volume_arm`); ``floors``: :func:`lab.study.crossover.rate_lines`
    of the load staircases (needed only at a fixed rate); ``pipelines``: listed even without runs.
    Rows that have no figure at the point come last, their ``note`` saying why.
    """
    names = _order([*pipelines, *(measured["pipeline"].dropna().astype(str) if not measured.empty else [])])
    rows = [_row(p, measured[measured["pipeline"] == p] if not measured.empty else measured, point, arm, floors)
            for p in names]
    out = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("rank", "x_cheapest")])
    ok = np.isfinite(out["ms_per_msg"].to_numpy(float))
    ranked = out[ok].sort_values("ms_per_msg", kind="stable")
    out = pd.concat([ranked, out[~ok]], ignore_index=True)
    cheapest = float(ranked["ms_per_msg"].iloc[0]) if not ranked.empty else math.nan
    out["rank"] = pd.array([i + 1 if i < len(ranked) else pd.NA for i in range(len(out))], dtype="Int64")
    out["x_cheapest"] = out["ms_per_msg"] / cheapest if cheapest > 0 else math.nan
    return out[list(COLUMNS)]


def reads_a_table(pipeline: str) -> bool:
    """Its consumers read a table (no broker, no slot of their own: ``poll``'s outbox, the relay's
    work table), so a backlog the slots and brokers do not show waits there. From the class."""
    from lab.pipelines import REGISTRY

    reg = REGISTRY.get(pipeline)
    caps = reg.pipeline.capabilities if reg is not None else None
    return caps is not None and caps.cdc_sink is None and not caps.consumer_slots


def dead_consumer(table: pd.DataFrame) -> pd.DataFrame:
    """Per pipeline, what one dead consumer of several cost in the fault matrix
    (:func:`lab.study.fault_matrix.matrix_table`; its first such cell): where the backlog waited
    (``slot``, ``broker``, ``table`` or ``none``), whose messages waited, lost and duplicated
    messages, and the messages delivered while it was dead in % of those sent meanwhile."""
    cols = ["pipeline", *DEAD_COLUMNS]
    if table is None or table.empty:
        return pd.DataFrame(columns=cols)
    dead = table[(table["family"] == DEAD_CONSUMER[0]) & (table["hit"] == DEAD_CONSUMER[1])]
    rows = []
    for pipeline, g in dead.groupby("pipeline", sort=False):
        r = g.iloc[0]
        where = str(r["backlog_where"])
        place, _, rest = where.partition(" (")
        waits = str(r.get("waits", "—"))
        shown = PLACES.get(place, place)
        if place == "none" and waits in ("its messages", "every consumer") and reads_a_table(str(pipeline)):
            shown = "table"
        rows.append({"pipeline": pipeline, "dead_backlog": shown + (f" ({rest}" if rest else ""),
                     "dead_waits": waits, "dead_lost": r["lost"], "dead_duplicates": r["duplicates"],
                     "dead_delivered_pct": r.get("delivered_during_pct", math.nan)})
    out = pd.DataFrame(rows, columns=cols)
    return out.astype({"dead_lost": "Int64", "dead_duplicates": "Int64", "dead_delivered_pct": float})


def for_study(measured: pd.DataFrame, point: Point, *, arm: pd.DataFrame | None = None,
              floors: pd.DataFrame | None = None, faults: pd.DataFrame | None = None,
              pipelines: Sequence[str] = ()) -> pd.DataFrame:
    """The report's first table (:data:`COLUMNS` + :data:`DEAD_COLUMNS`): :func:`cost_ranking` at
    ``point`` with each pipeline's :func:`dead_consumer` summary from ``faults`` (the fault matrix's
    table; a pipeline without a dead-consumer cell, or no matrix, gets ``—`` and NaN)."""
    dead = dead_consumer(faults if faults is not None else pd.DataFrame())
    names = [*pipelines, *dead["pipeline"]]
    cost = cost_ranking(measured, point, arm=arm, floors=floors, pipelines=names)
    out = cost.merge(dead, on="pipeline", how="left")
    out[["dead_backlog", "dead_waits"]] = out[["dead_backlog", "dead_waits"]].fillna("—")
    return out[[*COLUMNS, *DEAD_COLUMNS]]


def _num(x: object, digits: int) -> str:
    return "—" if x is None or pd.isna(x) else f"{float(x):,.{digits}f}"  # type: ignore[arg-type]


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`for_study`'s table for reading: the interval with its coverage, ``×`` the cheapest,
    ``not measured at N`` in place of a number, the dead consumer's columns in words."""
    rows = []
    for r in table.itertuples(index=False):
        ranked = not pd.isna(r.rank)
        at_least = "≥ " if str(r.basis).startswith("interpolated") else ""  # the product of both ends'
        interval = (f"[{r.lo:.3f}, {r.hi:.3f}] ({at_least}{coverage_label(r.coverage)})"
                    if ranked and math.isfinite(r.lo) else "no interval (1 run)" if ranked else "")
        rows.append({
            "rank": int(r.rank) if ranked else "—", "pipeline": r.pipeline,
            "ms CPU per message": f"{r.ms_per_msg:.3f}" if ranked else r.note,
            "interval (coverage)": interval, "× the cheapest": f"{r.x_cheapest:.2f}" if ranked else "",
            "from": r.basis,
            "dead consumer: backlog in": r.dead_backlog, "whose messages wait": r.dead_waits,
            "lost": _num(r.dead_lost, 0), "duplicates": _num(r.dead_duplicates, 0),
            "delivered while dead (%)": _num(r.dead_delivered_pct, 0),
        })
    return pd.DataFrame(rows).set_index("rank") if rows else pd.DataFrame()


def volume(measured: pd.DataFrame) -> int:
    """The messages per start most of the series' measured runs have (its own volume)."""
    counts = measured["messages"].astype(int).value_counts()
    return int(counts[counts == counts.max()].index.min())


def at_measured(measured: pd.DataFrame, *, arm: pd.DataFrame | None = None, messages: int | None = None,
                pipelines: Sequence[str] = ()) -> pd.DataFrame:
    """Every pipeline ranked at every N the series measured at its own volume (``messages``: another
    measured one), closed loop: :func:`cost_ranking` at each of those points, with ``consumers``."""
    if measured.empty:
        return pd.DataFrame(columns=["consumers", *COLUMNS])
    m = messages or volume(measured)
    ns = sorted({int(n) for n in measured.loc[measured["messages"] == m, "consumers"]})
    return pd.concat([cost_ranking(measured, Point(n, float(m)), arm=arm, pipelines=pipelines).assign(consumers=n)
                      for n in ns], ignore_index=True)[["consumers", *COLUMNS]]


def grid(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`at_measured`'s table for reading: a row per pipeline, cheapest on average first, a
    column per N holding ``ms CPU per message (rank)``, and ``not measured`` where it was not."""
    if table.empty:
        return pd.DataFrame()
    ranked = table.dropna(subset=["rank"])
    order = list(ranked.groupby("pipeline")["rank"].mean().sort_values(kind="stable").index)
    order += [p for p in dict.fromkeys(table["pipeline"]) if p not in order]
    cells = {(r.pipeline, int(r.consumers)): (f"{r.ms_per_msg:.3f} ({int(r.rank)})" if not pd.isna(r.rank)
                                              else "not measured")
             for r in table.itertuples(index=False)}
    ns = sorted({int(n) for n in table["consumers"]})
    return pd.DataFrame([[cells.get((p, n), "not measured") for n in ns] for p in order],
                        index=pd.Index(order, name="pipeline"), columns=[f"N = {n}" for n in ns])
