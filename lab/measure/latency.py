"""End-to-end latency of a run, its achieved send rate, and the latency table and figure.

A message's **end-to-end latency** is the wall-clock time from its row's ``created_at``
(PostgreSQL's ``now()`` of the autocommit INSERT, i.e. when the web service's INSERT started)
to the **first** arrival of its id at the work endpoint (``/send-email``, stamped with
``time.time()`` by the web service). Both clocks are the same host clock. A redelivered id counts
once, at its first arrival; the later arrivals are duplicates of work already done.

Quantiles are **nearest-rank**: the q-quantile is the smallest observed value with at least a
fraction q of the samples at or below it (numpy ``method="inverted_cdf"``). Every reported
percentile is therefore a latency some message really had, and p100 is the max.

Latency from ``created_at`` starts once the row exists: time a message spent waiting in an
overloaded sender or web service is not in it. For open-loop runs :func:`due_latencies` counts
from each message's due time instead (no coordinated omission); the senders also report their
send latency from the due time (``send_p50_ms`` ...), and :func:`achieved_rate` falls when the
sender ends late.

Pure functions only (no I/O): :mod:`lab.runner` fetches the arrivals and ``created_at`` values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
STATS = ("p50", "p95", "p99", "max")
STAT_STYLE = {"p50": "-o", "p95": "--s", "p99": "-.^", "max": ":v"}


def first_arrivals(ids: Sequence[int], t: Sequence[float]) -> dict[int, float]:
    """The earliest arrival time of each id, from the work endpoint's parallel (id, t) lists."""
    if len(ids) != len(t):
        raise ValueError(f"arrivals: {len(ids)} ids but {len(t)} times")
    first: dict[int, float] = {}
    for i, ti in zip(ids, t, strict=True):
        if ti < first.get(i, math.inf):
            first[i] = ti
    return first


def message_latencies(ids: Sequence[int], t: Sequence[float],
                      created_at: Mapping[int, float]) -> np.ndarray:
    """Per-message latency in ms: first arrival (epoch s) minus ``created_at[id]`` (epoch s).

    One value per distinct arrived id, in ascending id order. An arrived id without a
    ``created_at`` is an error (the arrivals and the outbox do not belong to the same run).
    """
    first = first_arrivals(ids, t)
    missing = [i for i in first if i not in created_at]
    if missing:
        raise ValueError(f"{len(missing)} arrived ids have no created_at (e.g. id {missing[0]})")
    order = sorted(first)
    arrived = np.fromiter((first[i] for i in order), dtype=float, count=len(order))
    created = np.fromiter((created_at[i] for i in order), dtype=float, count=len(order))
    return (arrived - created) * 1000.0


def due_latencies(ids: Sequence[int], t: Sequence[float], gate_opened_at: float,
                  rate: float) -> np.ndarray:
    """Open loop: per-message latency in ms from its **due time** to its first arrival.

    Unlike :func:`message_latencies` this includes the time a message waited in a late sender
    or a stalled web service before its row existed. The senders do not record which id
    answered which due time; ids are handed out in INSERT order and sends start in due order,
    so the k-th smallest arrived id is matched with ``gate_opened_at + k / rate``. The mean is
    exact whatever the matching (the sum of arrivals minus the sum of due times); quantiles are
    exact up to the reordering of requests in flight together. Meaningful when every message
    was sent (a failed send would shift the matching).
    """
    if rate <= 0:
        raise ValueError(f"due times need a positive rate, got {rate}")
    first = first_arrivals(ids, t)
    arrived = np.fromiter((first[i] for i in sorted(first)), dtype=float, count=len(first))
    due = gate_opened_at + np.arange(arrived.size) / rate
    return (arrived - due) * 1000.0


def summarize(latencies_ms: Sequence[float] | np.ndarray) -> dict[str, float | int | None]:
    """``{p50, p95, p99, max, mean, n}`` in ms (nearest-rank quantiles, 3 decimals).

    Empty input gives ``n = 0`` and None for every statistic.
    """
    x = np.asarray(latencies_ms, dtype=float)
    if x.size == 0:
        return {**dict.fromkeys((*QUANTILES, "max", "mean")), "n": 0}
    out: dict[str, float | int | None] = {
        k: round(float(np.quantile(x, q, method="inverted_cdf")), 3) for k, q in QUANTILES.items()
    }
    out["max"] = round(float(x.max()), 3)
    out["mean"] = round(float(x.mean()), 3)
    out["n"] = int(x.size)
    return out


def achieved_rate(senders: Mapping[str, Any], window_s: float | None) -> float | None:
    """Messages per second the senders really delivered into the outbox (2xx responses).

    * open loop (``senders["rate"] > 0``): ``sent / (last_send_at - gate_opened_at)``, i.e.
      successful sends over the time from the gate opening (message 0 is due then) to the last
      successful response. On schedule this is ``M / ((M - 1) / R + last latency)`` ≈ R; a
      sender (or web service) that falls behind finishes late, and the rate drops below R by
      exactly the time it lost. It is an average: a stall that is caught up before the end
      shows in the due-time latencies (``send_max_ms``, :func:`due_latencies`), not here.
    * closed loop: ``sent / window_s``, the run's throughput over its CPU window (first send
      completion to last work completion).

    None when the times needed are missing or the span is not positive.
    """
    sent = senders.get("sent") or 0
    if (senders.get("rate") or 0) > 0:
        t0, t1 = senders.get("gate_opened_at"), senders.get("last_send_at")
        span = t1 - t0 if t0 is not None and t1 is not None else None
    else:
        span = window_s
    if not sent or not span or span <= 0:
        return None
    return round(sent / span, 2)


# The notebook's views --------------------------------------------------------------------------

def _latency_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Successful measured runs that have a latency summary."""
    if runs.empty or "latency_ms.p50" not in runs:
        return runs.iloc[0:0]
    keep = runs["success"].astype(bool) & runs["latency_ms.p50"].notna()
    if "warmup" in runs:
        keep &= ~runs["warmup"].fillna(False).astype(bool)
    return runs[keep]


def latency_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per pipeline x N: median over its runs of p50/p95/p99/max (ms), for open-loop
    runs ``due_p50``/``due_p99`` (latency from the due time, :func:`due_latencies`), target
    and achieved rate, ms CPU/msg at that rate, and the number of runs.

    ``runs`` is :func:`lab.results.load_runs` (filter it to one series first); failed runs,
    warm-ups and runs without latency are left out.
    """
    ok = _latency_runs(runs)
    cols = [f"latency_ms.{k}" for k in STATS]
    if ok.empty:
        return pd.DataFrame(columns=["pipeline", "consumers", *STATS, "rate", "achieved_rate",
                                     "cpu_ms_per_msg", "runs"])
    due = [f"latency_from_due_ms.{k}" for k in ("p50", "p99") if f"latency_from_due_ms.{k}" in ok]
    g = ok.groupby(["pipeline", "consumers"])
    table = g[[*cols, *due, "rate", "achieved_rate", "cpu_ms_per_msg"]].median()
    table = table.rename(columns={c: "due_" + c.rsplit(".", 1)[1] for c in due})
    table["runs"] = g.size()
    table = table.rename(columns=dict(zip(cols, STATS, strict=True))).reset_index()
    from lab.pipelines import NAMES  # the registry's order (its modules load the broker clients: only here)

    rank = {p: i for i, p in enumerate(NAMES)}
    table = table.sort_values(["pipeline", "consumers"],
                              key=lambda s: s.map(rank) if s.name == "pipeline" else s)
    return table.reset_index(drop=True)


def schedule_table(results: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Did the open-loop senders keep their schedule? One row per run (warm-ups left out):
    target and achieved rate, and the send latency counted from each message's due time
    (p50, p95, max in ms; a sender that falls behind shows here first)."""
    rows = []
    for r in results:
        s, snd = r.get("scenario") or {}, r.get("senders") or {}
        if s.get("warmup"):
            continue
        rows.append({"run_id": r.get("run_id"), "pipeline": s.get("pipeline"),
                     "consumers": s.get("consumers"), "success": r.get("success"),
                     "rate": s.get("rate"), "achieved_rate": r.get("achieved_rate"),
                     **{k: snd.get(k) for k in ("send_p50_ms", "send_p95_ms", "send_max_ms")}})
    return pd.DataFrame(rows)
