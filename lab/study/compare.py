"""Beyond the reference: which differences are noise, the crossover measured rather
than extrapolated, the idle floor and the residual, memory and WAL decode volume.

Inputs are runs as :func:`lab.results.load_runs` returns them and the headline table of
:func:`lab.study.costmodel.headline` (median, ``lo``/``hi`` = order-statistic interval of the median
with its exact ``coverage``: 75 % with 3 runs, never a nominal 95 %).

* :func:`cell_comparisons` — every pair of pipelines at the same N: difference, ratio and whether
  it is within noise (:func:`lab.study.costmodel.within_noise`: overlapping intervals with repeats, the
  article's 10 % rule with one run per cell).
* :func:`crossover_table` — for each direct pipeline against each broker (its flat level, or its
  fitted line when its slope is distinguishable from 0: ``broker_model``): N* from the fit over
  N ≤ ``upto`` (what the reference could do: extrapolate from 1..8), N* from every measured N,
  and the crossing read off the cells themselves (the first measured N from which the direct
  median stays at or above the broker's), with a verdict in words.
* :func:`idle_table`, :func:`memory_table`, :func:`decode_table` — the per-run views the report
  shows for the idle baseline and residual, RSS per participant, and WAL decoded per slot.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from lab.study import costmodel, crossover
from lab.study.costmodel import METRIC, measured

# ha runs: `kafka`/`rabbitmq` are the sums of their nodes (lab.study.ha_nodes), the
# standby a participant of its own
PARTICIPANTS = ("postgres", "postgres-standby", "debezium", "relay", "kafka", "rabbitmq", "web", "senders",
                "consumers", "runner")


def cell_comparisons(head: pd.DataFrame) -> pd.DataFrame:
    """Every pair of pipelines at the same N from a headline table: ``diff`` = a - b (ms/msg),
    ``ratio`` = a / b, ``within_noise`` (True: the two cells cannot be told apart)."""
    rows = []
    for n, g in head.groupby("consumers", sort=True):
        cells = list(g.itertuples(index=False))
        for i, x in enumerate(cells):
            for y in cells[i + 1:]:
                rows.append(dict(
                    consumers=int(n), a=x.pipeline, b=y.pipeline, a_median=x.median, b_median=y.median,
                    diff=x.median - y.median, ratio=x.median / y.median if y.median else math.nan,
                    within_noise=costmodel.within_noise(x._asdict(), y._asdict()),
                ))
    return pd.DataFrame(rows, columns=["consumers", "a", "b", "a_median", "b_median", "diff", "ratio",
                                       "within_noise"])


def measured_crossing(head: pd.DataFrame, direct: str, broker: str) -> dict[str, Any]:
    """The crossing read off the measured cells (no model).

    ``first_n``: the smallest measured N from which the direct median is at or above the broker's
    at every larger measured N too (None: never); ``clear``: at that N and beyond the difference is
    not within noise; ``last_below``: the largest N where direct is still clearly cheaper.
    Only N measured for both pipelines count.
    """
    d = head[head["pipeline"] == direct].set_index("consumers")
    b = head[head["pipeline"] == broker].set_index("consumers")
    ns = sorted(set(d.index) & set(b.index))
    above = [bool(d.loc[n, "median"] >= b.loc[n, "median"]) for n in ns]
    noise = [costmodel.within_noise(d.loc[n], b.loc[n]) for n in ns]
    first = next((n for k, n in enumerate(ns) if all(above[k:])), None)
    clear = first is not None and not any(noise[ns.index(first):])
    below = [n for n, up, nz in zip(ns, above, noise, strict=True) if not up and not nz]
    return dict(ns=ns, first_n=first, clear=clear, last_below=max(below) if below else None)


def _n_star(df: pd.DataFrame, direct: str, broker: str, n_boot: int, seed: int) -> costmodel.Crossover:
    fit = costmodel.fit_fanout(df, direct, n_boot=n_boot, seed=seed)
    level = costmodel.broker_level(df, broker, n_boot=n_boot, seed=seed)
    return costmodel.crossover(fit, level, n_boot=n_boot, seed=seed)


def _verdict(cell: dict[str, Any], full: costmodel.Crossover | None) -> str:
    ns = cell["ns"]
    if not ns:
        return "no N measured for both"
    top = max(ns)
    if cell["first_n"] == min(ns):
        return f"direct at or above the broker already at N={cell['first_n']}"
    if cell["first_n"] is not None:
        where = f"from N={cell['first_n']} on (measured)"
        if full is not None and full.n_star is not None and full.inside:
            where += f"; the fit puts N* at {full.n_star:.1f}"
        return "the lines cross " + where + ("" if cell["clear"] else ", within noise")
    return f"no crossing up to N={top}: direct stays below the broker at every measured N"


def crossover_table(df: pd.DataFrame, *, upto: int = 8, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Direct x broker: extrapolated N* (fit on N <= ``upto``), N* over all measured N, and the
    crossing in the cells, with a verdict. NaN where a fit is not possible (fewer than 2 N)."""
    runs = measured(df)
    head = costmodel.headline(runs, n_boot=n_boot, seed=seed)
    early = runs[runs["consumers"] <= upto]
    rows = []
    direct, brokers = crossover.sides(runs["pipeline"])  # from the registry: no pipeline named here
    for d in direct:
        for b in brokers:
            row: dict[str, Any] = dict(direct=d, broker=b, max_n=int(runs["consumers"].max()))
            parts: dict[str, costmodel.Crossover | None] = {}
            for tag, data in ((f"upto{upto}", early), ("all", runs)):
                try:
                    c = _n_star(data, d, b, n_boot, seed)
                except ValueError:
                    c = None
                parts[tag] = c
                row[f"n_star_{tag}"] = math.nan if c is None or c.n_star is None else c.n_star
                row[f"lo_{tag}"], row[f"hi_{tag}"] = (math.nan, math.nan) if c is None else c.ci
            row["inside_all"] = bool(parts["all"] is not None and parts["all"].inside)
            row["broker_model"] = parts["all"].broker_model if parts["all"] is not None else None
            row["interval_all"] = parts["all"].ci_method if parts["all"] is not None else None
            cell = measured_crossing(head, d, b)
            row |= dict(first_measured_n=cell["first_n"], clear=cell["clear"], last_clearly_below=cell["last_below"],
                        verdict=_verdict(cell, parts["all"]))
            rows.append(row)
    return pd.DataFrame(rows)


def _per_msg(runs: pd.DataFrame, col: str) -> np.ndarray:
    v = pd.to_numeric(runs[col], errors="coerce") if col in runs else pd.Series(np.nan, index=runs.index)
    return (v * 1000 / runs["messages"]).to_numpy(float)


def idle_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per measured run: ms CPU/msg as measured, without the idle floor (``net``), the idle part,
    and the ``unattributed`` residual (host busy minus every participant; not in either total)."""
    runs = measured(df)
    net = pd.to_numeric(runs.get("cpu_ms_per_msg_net", pd.Series(np.nan, index=runs.index)), errors="coerce")
    out = pd.DataFrame({
        "run_id": runs["run_id"], "pipeline": runs["pipeline"], "consumers": runs["consumers"],
        "window_s": runs["window_s"], "ms_per_msg": runs[METRIC], "ms_per_msg_net": net,
        "idle_ms_per_msg": runs[METRIC] - net,
        "unattributed_ms_per_msg": _per_msg(runs, "cpu_s.unattributed"),
    })
    out["idle_share_pct"] = 100 * out["idle_ms_per_msg"] / out["ms_per_msg"]
    return out.reset_index(drop=True)


def memory_table(df: pd.DataFrame, *, stat: str = "mem_mb_max") -> pd.DataFrame:
    """Pipeline x N: median over runs of each participant's RSS in MB (``<participant>_mb``;
    ``mem_mb_max`` = the run's peak, ``mem_mb`` = its mean) and their sum (``total_mb``)."""
    runs = measured(df)
    cols = [f"{stat}.{p}" for p in PARTICIPANTS if f"{stat}.{p}" in runs]
    if not cols:
        return pd.DataFrame()
    out = runs.groupby(["pipeline", "consumers"])[cols].median()
    out.columns = [f"{c.split('.', 1)[1]}_mb" for c in cols]
    out["total_mb"] = out.sum(axis=1)
    return out.reset_index()


def decode_table(df: pd.DataFrame) -> pd.DataFrame:
    """Pipeline x N: logical slots, MB of WAL decoded (``pg_stat_replication_slots.total_bytes``,
    summed over the run's slots; median over runs), per slot, and bytes decoded per message.
    Fan-out decodes the same WAL once per reader; a CDC pipeline decodes it once (Debezium)."""
    runs = measured(df)
    if "decoded_mb" not in runs:
        return pd.DataFrame()
    runs = runs.assign(bytes_per_msg=runs["decoded_mb"] * 2**20 / runs["messages"])
    out = runs.groupby(["pipeline", "consumers"]).agg(
        slots=("slots", "median"), decoded_mb=("decoded_mb", "median"), bytes_per_msg=("bytes_per_msg", "median"))
    out["mb_per_slot"] = out["decoded_mb"] / out["slots"].replace(0, np.nan)
    return out.reset_index()
