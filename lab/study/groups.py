"""Which runs may be pooled: the analysis never mixes runs that were not measured alike.

Two runs are *comparable* when they agree on everything that changes ms CPU/msg other than the
pipeline and N: the producer (web or direct), the open-loop ``rate`` (0: closed loop), the work
delay, the message count, the topology of the load (``senders``, ``batch_size``) and the
``cpu_method`` the run was measured with (:mod:`lab.measure.provenance`; runs stored before it was
recorded count as ``unrecorded``), the connection ``reset``, the ``consumer_layout``, the inbox ``claim``
and the direct readers' ``claim_retention`` (runs stored before it existed kept every claim), the
stack's ``backend`` (native or compose), the injected ``fault``, the stack's ``topology`` (``single``
nodes or the fault-tolerant ``ha`` ones) and the ``harness`` (the web + senders implementation).
:func:`check` refuses a mixture in one line; :func:`select` picks one comparable group for an
analysis (``series_id=""``: the newest series) and names it.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lab.study.ha_nodes import rollup_nodes
from lab.workload import HARNESS_BEFORE

KEYS = ("producer", "rate", "work_delay_ms", "messages", "senders", "batch_size", "cpu_method",
        "reset", "consumer_layout", "claim", "claim_retention", "backend", "fault", "topology", "harness",
        "decode_slots")
# A run stored before a field existed was measured the way the lab worked then: no reset on a
# reused connection, one process per consumer, the reference's inbox claim, the native stack.
DEFAULTS: dict[str, Any] = {"producer": "web", "rate": 0.0, "work_delay_ms": 0.0, "cpu_method": "unrecorded",
                            "reset": "none", "consumer_layout": "processes", "claim": "owner",
                            "claim_retention": "never", "backend": "native", "fault": "",
                            "topology": "single", "harness": HARNESS_BEFORE, "decode_slots": 0}


class NotComparable(ValueError):
    """Runs that must not be pooled were given together."""


def keys(runs: pd.DataFrame) -> pd.DataFrame:
    """The comparability columns present in ``runs`` (defaults filled in for older runs)."""
    cols = {k: runs[k].fillna(DEFAULTS[k]) if k in DEFAULTS else runs[k] for k in KEYS if k in runs}
    return pd.DataFrame(cols, index=runs.index)


def _fmt(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return str(int(v))
    return str(v)


def describe(group: dict[str, Any]) -> str:
    """``{"messages": 5000, "rate": 0, ...}`` -> "5000 messages, closed loop, ..." (words)."""
    parts = []
    for k, v in group.items():
        if k == "rate":
            parts.append("closed loop" if not v else f"open loop at {_fmt(v)} msg/s")
        elif k == "work_delay_ms":
            parts.append("no work delay" if not v else f"{_fmt(v)} ms work delay")
        elif k == "messages":
            parts.append(f"{_fmt(v)} messages")
        elif k == "senders":
            parts.append(f"{_fmt(v)} senders")
        elif k == "batch_size":
            parts.append(f"batch {_fmt(v)}")
        elif k == "producer":
            parts.append(f"{v} producer")
        elif k == "cpu_method":
            parts.append(f"CPU by {v}")
        elif k == "reset":
            parts.append("no reset on reuse" if v == "none" else f"{v} on reuse")
        elif k == "consumer_layout":
            parts.append(f"consumers as {v}")
        elif k == "claim":
            parts.append(f"{v} claim")
        elif k == "claim_retention":
            parts.append("claims kept" if v == "never" else f"claims pruned {v}")
        elif k == "backend":
            parts.append(f"{v} stack")
        elif k == "fault":
            parts.append(f"fault {v}" if v else "no fault")
        elif k == "topology":
            parts.append(f"{v} topology")
        elif k == "harness":
            parts.append(f"harness: {v}")
    return ", ".join(parts)


def groups(runs: pd.DataFrame) -> list[dict[str, Any]]:
    """The distinct comparable groups of ``runs``, each with its run count (``runs``)."""
    k = keys(runs)
    if k.empty or not len(k.columns):
        return [{"runs": len(runs)}] if len(runs) else []
    counts = k.astype(str).value_counts(sort=False)
    out = []
    for values, n in counts.items():
        values = values if isinstance(values, tuple) else (values,)
        first = k[(k.astype(str) == pd.Series(values, index=k.columns)).all(axis=1)].iloc[0]
        out.append({**first.to_dict(), "runs": int(n)})
    return out


def check(runs: pd.DataFrame) -> None:
    """Raise :class:`NotComparable` (one line, listing the groups) when ``runs`` mix groups."""
    found = groups(runs)
    if len(found) > 1:
        listed = "; ".join(f"{describe({k: v for k, v in g.items() if k != 'runs'})} ({g['runs']} runs)"
                           for g in found)
        raise NotComparable(f"refusing to pool runs that were not measured alike: {listed}")


def select(runs: pd.DataFrame, series_id: str = "") -> tuple[pd.DataFrame, str]:
    """The runs of one comparable group and its name.

    ``series_id`` given: that series' runs, which must form one group. Empty: the newest series
    (the series of the most recently started run that has one; every run when none has), which
    must form one group too. Failed and warm-up runs are kept (the analysis lists them); only
    measured runs decide the group. Raises :class:`NotComparable` or ValueError in one line.
    """
    if runs.empty:
        raise ValueError("no runs stored: run a series first")
    if series_id:
        picked = runs[runs["series_id"] == series_id] if "series_id" in runs else runs.iloc[:0]
        if picked.empty:
            raise ValueError(f"no runs stored for series {series_id!r}")
    elif "series_id" in runs and runs["series_id"].notna().any():
        with_id = runs[runs["series_id"].notna()].sort_values("started_at")
        series_id = str(with_id["series_id"].iloc[-1])
        picked = runs[runs["series_id"] == series_id]
    else:
        picked = runs
    ok = picked
    for col, want in (("success", True), ("warmup", False)):
        if col in ok:
            ok = ok[ok[col].fillna(not want).astype(bool) == want]
    check(ok)
    found = groups(ok)
    what = describe({k: v for k, v in found[0].items() if k != "runs"}) if found else "no measured runs"
    name = f"series {series_id}: {what}" if series_id else f"every stored run: {what}"
    return rollup_nodes(picked), name  # ha: each broker also as the sum of its nodes
