"""The study's view of the ``ha`` topology's nodes.

A run under ``ha`` records each node as a participant of its own: ``kafka-1``..``kafka-3``,
``rabbitmq-1``..``rabbitmq-3`` and ``postgres-standby`` (``cpu_s.<name>``, ``mem_mb.<name>``,
``mem_mb_max.<name>``, ``idle_cpu_s.<name>`` in :func:`lab.results.load_runs`), and no ``kafka``
or ``rabbitmq``. The analysis asks for a broker by its name, so :func:`rollup_nodes` adds the
broker as the sum of its nodes under that name, and keeps the per-node columns (shown by
:func:`node_table`) and ``postgres-standby`` (a participant of its own, in no broker) as they
are. A run's total (``cpu_ms_per_msg``) already counts every node once; a figure that stacks
participants takes either the brokers or their nodes, never both (:func:`is_node`).

``mem_mb_max`` of a broker is the sum of its nodes' peaks: an upper bound of the cluster's peak,
as the nodes need not peak at the same moment.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

BROKERS = ("kafka", "rabbitmq")
STANDBY = "postgres-standby"
PREFIXES = ("cpu_s", "mem_mb", "mem_mb_max", "idle_cpu_s")
_NODE = re.compile(rf"^({'|'.join(BROKERS)})-(\d+)$")


def broker_of(participant: str) -> str | None:
    """``kafka`` for ``kafka-2`` (a node of a broker), else None."""
    m = _NODE.match(participant)
    return m.group(1) if m else None


def is_node(participant: str) -> bool:
    return broker_of(participant) is not None


def node_columns(runs: pd.DataFrame, prefix: str = "cpu_s") -> dict[str, list[str]]:
    """Broker -> its nodes' columns under ``prefix`` (``cpu_s.kafka-1``, ...), in node order."""
    out: dict[str, list[str]] = {}
    for col in runs.columns:
        head, _, name = str(col).partition(".")
        broker = broker_of(name) if head == prefix else None
        if broker is not None:
            out.setdefault(broker, []).append(col)
    return {b: sorted(cols, key=lambda c: int(c.rsplit("-", 1)[1])) for b, cols in out.items()}


def rollup_nodes(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``<prefix>.kafka`` / ``<prefix>.rabbitmq`` filled in as the sum of the
    broker's node columns wherever the broker's own column is missing (an ``ha`` run); a run
    that recorded the broker itself keeps its value. Node columns and ``postgres-standby`` stay.
    Idempotent; returns a copy when anything is added."""
    out = runs
    for prefix in PREFIXES:
        for broker, cols in node_columns(runs, prefix).items():
            total = runs[cols].apply(pd.to_numeric, errors="coerce").sum(axis=1, min_count=1)
            target = f"{prefix}.{broker}"
            if target in runs:
                own = pd.to_numeric(runs[target], errors="coerce")
                rolled = own.where(own.notna(), total)
                if rolled.equals(own):
                    continue
            else:
                rolled = total
            if out is runs:
                out = runs.copy()
            out[target] = rolled
    return out


def node_table(runs: pd.DataFrame, prefix: str = "cpu_s") -> pd.DataFrame:
    """Per run with nodes: ms CPU/msg (``prefix="cpu_s"``) of each broker node, each broker's sum
    and ``postgres-standby``; empty when no run has nodes. Other prefixes give their own unit
    (MB for ``mem_mb``)."""
    cols = node_columns(runs, prefix)
    if not cols:
        return pd.DataFrame()
    has = np.zeros(len(runs), dtype=bool)
    for c in (c for cs in cols.values() for c in cs):
        has |= pd.to_numeric(runs[c], errors="coerce").notna().to_numpy()
    picked = rollup_nodes(runs)[has]
    keep = [k for k in ("run_id", "pipeline", "consumers", "topology") if k in picked]
    out = picked[keep].copy()
    scale = 1000 / picked["messages"] if prefix in ("cpu_s", "idle_cpu_s") else 1
    names = [c for broker, cs in cols.items() for c in [*cs, f"{prefix}.{broker}"]]
    if f"{prefix}.{STANDBY}" in picked:
        names.append(f"{prefix}.{STANDBY}")
    for c in names:
        out[c.split(".", 1)[1]] = pd.to_numeric(picked[c], errors="coerce") * scale
    return out.reset_index(drop=True)
