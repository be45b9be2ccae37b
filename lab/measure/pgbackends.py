"""PostgreSQL's CPU by what its processes do, so that a direct reader's slope has named parts.

PostgreSQL is one participant of the CPU metric, but a direct reader adds to it in two places: its
**walsender** (one process per replication connection, which decodes the whole WAL for its slot)
and its **claim backend** (the connection that runs its ``inbox`` claims). This module reads, at the
window's two edges, every server process's cumulative CPU (``/proc``: user + system of the process
itself) and what it is (``pg_stat_activity``'s backend type and application name, and for a
walsender the slot it streams from ``pg_replication_slots``), and charges each group:

* ``walsenders`` (per slot too: the readers' ``load_test_slot_*``, Debezium's ``dbz_*``);
* ``claims`` — client backends named :data:`lab.workload.inbox.CLAIMS_APPLICATION`;
* ``inserts`` — the web service's backends (:data:`lab.workload.web.APPLICATION_NAME`);
* ``shards`` — wal-sharded's ownership connections (:data:`lab.pg.shards.SHARDS_APPLICATION`);
* ``relay`` — wal-relay's hand-over connection, its work-table inserts (:data:`lab.workload.inbox.RELAY_APPLICATION`);
* ``prune`` — the claim table's pruner under a claim retention: its deletes, ``VACUUM`` and restart
  points (:data:`lab.workload.retention.PRUNE_APPLICATION`); with ``claims``, what claiming costs then;
* ``other`` — the rest of the participant: the checkpointer, WAL writer, autovacuum, the runner's own
  short connections, and any process that exited inside the window (its CPU is in the participant's
  total but in no pid read at the edges).

A process alive at both edges is charged the difference; one that started inside the window, its
whole CPU. Native backend only: in a container the server's pids are not the host's. With
decode-only slots (:mod:`lab.measure.decoders`) ``decode_only`` gives their walsenders' mean CPU per
slot: the pure cost of decoding the run's WAL once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil
import psycopg

from lab.measure.decoders import SLOT_PREFIX as DECODE_PREFIX
from lab.pg.shards import SHARDS_APPLICATION
from lab.workload.inbox import CLAIMS_APPLICATION, RELAY_APPLICATION
from lab.workload.retention import PRUNE_APPLICATION
from lab.workload.web import APPLICATION_NAME as WEB_APPLICATION

QUERY = """
SELECT a.pid, a.backend_type, coalesce(a.application_name, ''), coalesce(s.slot_name, '')
FROM pg_stat_activity a LEFT JOIN pg_replication_slots s ON s.active_pid = a.pid
"""
GROUPS = ("walsenders", "claims", "inserts", "shards", "relay", "prune")


@dataclass(frozen=True)
class Process:
    group: str  # one of GROUPS, or "" (counted in ``other``)
    slot: str
    cpu_s: float


def group_of(backend_type: str, application: str) -> str:
    """The group a server process belongs to (module docstring); "" for the rest."""
    if backend_type == "walsender":
        return "walsenders"
    if backend_type == "client backend":
        return {CLAIMS_APPLICATION: "claims", WEB_APPLICATION: "inserts", SHARDS_APPLICATION: "shards",
                RELAY_APPLICATION: "relay", PRUNE_APPLICATION: "prune"}.get(application, "")
    return ""


def _cpu(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(t.user + t.system)


async def read(dsn: str) -> dict[int, Process]:
    """Every server process now: its group, slot and cumulative CPU-seconds."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        rows = await (await conn.execute(QUERY)).fetchall()
    out = {}
    for pid, backend_type, application, slot in rows:
        cpu = _cpu(pid)
        if cpu is not None:
            out[pid] = Process(group_of(backend_type, application), slot, cpu)
    return out


def breakdown(start: Mapping[int, Process], end: Mapping[int, Process], postgres_cpu_s: float | None,
              messages: int) -> dict[str, Any]:
    """CPU-seconds and ms per message of each group over the window, the walsenders per slot,
    how many processes each group had at the end, and ``other`` = the participant's total − the
    groups (None when the total is unknown)."""
    cpu = dict.fromkeys(GROUPS, 0.0)
    count = dict.fromkeys(GROUPS, 0)
    per_slot: dict[str, float] = {}
    for pid, p in end.items():
        if not p.group:
            continue
        before = start.get(pid)
        used = p.cpu_s - before.cpu_s if before is not None else p.cpu_s
        cpu[p.group] += used
        count[p.group] += 1
        if p.slot:
            per_slot[p.slot] = round(per_slot.get(p.slot, 0.0) + used, 4)
    other = None if postgres_cpu_s is None else postgres_cpu_s - sum(cpu.values())
    every: dict[str, float | None] = {**cpu, "other": other}
    decode = [v for s, v in per_slot.items() if s.startswith(DECODE_PREFIX)]
    return {
        "decode_only": {"slots": len(decode), "cpu_s_per_slot": round(sum(decode) / len(decode), 4),
                        "ms_per_msg_per_slot": round(sum(decode) / len(decode) * 1000 / messages, 5)}
        if decode and messages > 0 else None,
        "cpu_s": {g: None if v is None else round(v, 4) for g, v in every.items()},
        "ms_per_msg": {g: None if v is None or messages <= 0 else round(v * 1000 / messages, 5)
                       for g, v in every.items()},
        "processes": count,
        "walsender_cpu_s_per_slot": per_slot,
    }
