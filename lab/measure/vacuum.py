"""What a run leaves for vacuum: the tables' tuple counters and autovacuum's CPU over the window.

A pipeline that deletes or updates rows (``poll`` deletes every finished outbox row) leaves dead
tuples that autovacuum has to remove; the CDC pipelines only insert. Two readings make that cost
visible in run.json (``vacuum``):

* **tables** — ``pg_stat_user_tables`` of :data:`TABLES` at the gate, at the drain and after the
  consumers exited (their backends flush their counters when they end): live and dead tuples,
  inserts, updates, deletes, (auto)vacuum counts and PostgreSQL 18's ``total_autovacuum_time``
  (wall milliseconds, cost-delay sleeps included); ``delta`` is end − gate for the cumulative
  counters, the end value for ``n_live_tup`` and ``n_dead_tup``; ``dead_max`` the most dead tuples
  seen during the window (read every :data:`TABLE_EVERY` polls).
* **autovacuum** — the CPU of the autovacuum worker backends (``pg_stat_activity.backend_type``),
  read from ``/proc`` (scheduler runtime, :func:`cpu_s`), every :data:`POLL_S` during the window:
  a worker alive at the gate is charged what it used after it, one that started inside the
  window all of its CPU up to its last reading. A worker that starts and ends between two polls
  is not seen, and the CPU a worker uses after its last poll is not counted: the figure is a lower
  bound; ``workers_seen`` against the tables' ``autovacuum_count`` delta says how much was seen.
  Native backend only (in a container the server's pids are not the host's). The launcher's CPU
  is kept apart. Everything here is also in PostgreSQL's total (``other`` in
  ``derived.postgres_backends``).
* **autovacuum, from the server's log** — the lab's server logs every autovacuum and autoanalyze
  action with its own resource usage (``log_autovacuum_min_duration = 0``, lab.stack.postgres): the
  log lines written between the gate and the drain (:func:`autovacuum_actions`) give every action
  inside the window, however short, with the CPU PostgreSQL measured for it (10 ms resolution):
  ``from_log``, exact where the polls give a lower bound. Native backend only (the log is a file of
  the stack's).
* **debt** — with the default ``autovacuum_naptime`` (60 s) a run of a few tens of seconds mostly
  ends before autovacuum comes, and the next run's reset truncates what it left. After the
  consumers exited (outside the window), the runner therefore runs one ``VACUUM`` of the outbox's
  tables (:data:`DEBT_TABLES`) on its own connection and reads that backend's CPU before and after
  (native backend; ``wall_s`` everywhere): what cleaning up after the run costs, for every pipeline
  (insert-only tables are vacuumed too, to set their visibility map).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

log = logging.getLogger(__name__)
TABLES = ("messages", "messages_done", "inbox", "inbox_wal")
CUMULATIVE = ("n_tup_ins", "n_tup_upd", "n_tup_del", "n_tup_hot_upd", "vacuum_count", "autovacuum_count",
              "autoanalyze_count", "total_autovacuum_time")
GAUGES = ("n_live_tup", "n_dead_tup")
POLL_S = 1.0  # every run pays for this poll (runner and PostgreSQL CPU): once a second, as the disk guard
TABLE_EVERY = 1  # polls between two readings of the tables (1 s)
TABLES_QUERY = "SELECT relname, to_jsonb(s) FROM pg_stat_user_tables s WHERE relname = ANY(%s)"
WORKERS_QUERY = ("SELECT pid, backend_type FROM pg_stat_activity "
                 "WHERE backend_type IN ('autovacuum worker', 'autovacuum launcher')")
LAUNCHER = "autovacuum launcher"
DEBT_TABLES = ("messages", "messages_done")  # the outbox and where poll moves its finished rows


CLAIM_TABLES = ("inbox_wal", "inbox")  # their primary keys are the claims' race (lab.workload.inbox)
SIZES_QUERY = ("SELECT c.relname, pg_relation_size(c.oid), pg_indexes_size(c.oid), i.indexrelid::regclass::text "
               "FROM pg_class c LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
               "WHERE c.relname = ANY(%s) AND c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace")


async def read_sizes(conn: psycopg.AsyncConnection[Any]) -> dict[str, dict[str, Any]]:
    """The claim tables' size after a run: heap and index bytes and, through ``pgstatindex``
    (``pgstattuple``, created when missing), the primary key's depth, leaf pages and leaf density:
    how big the table a claim searches had grown. Outside the window (it reads the whole index).
    The tables of the connection's current schema (``lab bench claims`` reads its own copy)."""
    out: dict[str, dict[str, Any]] = {}
    for name, heap, index, pkey in await (await conn.execute(SIZES_QUERY, (list(CLAIM_TABLES),))).fetchall():
        out[name] = {"heap_bytes": int(heap), "index_bytes": int(index)}
        if not pkey:
            continue
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            row = await (await conn.execute(
                "SELECT tree_level, leaf_pages, avg_leaf_density FROM pgstatindex(%s)", (pkey,))).fetchone()
        except psycopg.Error as exc:  # no pgstattuple on this server: sizes only
            log.info("index depth not read: %s", exc)
            continue
        if row is not None:
            out[name] |= {"index_depth": int(row[0]) + 1, "leaf_pages": int(row[1]),
                          "leaf_density_pct": None if row[2] is None or row[2] != row[2] else round(float(row[2]), 1)}
    return out


async def read_tables(conn: psycopg.AsyncConnection[Any]) -> dict[str, dict[str, float]]:
    """Each of :data:`TABLES` (those that exist): its counters of :data:`CUMULATIVE` and
    :data:`GAUGES` (a counter this server does not have is left out)."""
    rows = await (await conn.execute(TABLES_QUERY, (list(TABLES),))).fetchall()
    return {name: {k: float(v[k]) for k in (*GAUGES, *CUMULATIVE) if v.get(k) is not None} for name, v in rows}


def table_deltas(start: Mapping[str, Mapping[str, float]], end: Mapping[str, Mapping[str, float]]
                 ) -> dict[str, dict[str, float]]:
    """Per table in both readings: end − start of every cumulative counter, the end value of the
    gauges (module docstring)."""
    out: dict[str, dict[str, float]] = {}
    for name in sorted(start.keys() & end.keys()):
        a, b = start[name], end[name]
        row = {k: b[k] for k in GAUGES if k in b}
        row.update({k: round(b[k] - a[k], 3) for k in CUMULATIVE if k in a and k in b})
        out[name] = row
    return out


def cpu_s(pid: int) -> float | None:
    """A server process's CPU-seconds: its scheduler runtime (``/proc/<pid>/schedstat``, in ns: a
    vacuum of a few thousand rows takes less than one clock tick), else ``utime + stime``; None
    when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(t.user + t.system)


async def vacuum_cost(conn: psycopg.AsyncConnection[Any], native: bool) -> dict[str, Any]:
    """One ``VACUUM`` of :data:`DEBT_TABLES` on ``conn`` (autocommit): its backend's CPU-seconds
    (native backend only, else None), its wall time, and the dead tuples it found."""
    row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    pid = row[0]
    dead = await (await conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0)::int8 FROM pg_stat_user_tables WHERE relname = ANY(%s)",
        (list(DEBT_TABLES),))).fetchone()

    def cpu() -> float | None:
        return cpu_s(pid) if native else None

    before, t0 = cpu(), time.monotonic()
    await conn.execute(sql.SQL("VACUUM {}").format(sql.SQL(", ").join(sql.Identifier(t) for t in DEBT_TABLES)))
    wall, after = time.monotonic() - t0, cpu()
    return {"tables": list(DEBT_TABLES), "dead_tup": dead[0] if dead else None,
            "cpu_s": None if before is None or after is None else round(after - before, 6),
            "wall_s": round(wall, 4)}


_ACTION = re.compile(r'automatic (vacuum|analyze) of table "([^"]+)"')
_USAGE = re.compile(r"system usage: CPU: user: ([\d.]+) s, system: ([\d.]+) s, elapsed: ([\d.]+) s")


def autovacuum_actions(text: str) -> list[dict[str, Any]]:
    """The autovacuum and autoanalyze actions in a piece of the server's log: kind (``vacuum`` or
    ``analyze``), table (``db.schema.table``) and the CPU (user + system) and elapsed seconds
    PostgreSQL gives on the action's ``system usage`` line (a continuation line of the same message)."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        found = _ACTION.search(line)
        if found:
            current = {"kind": found[1], "table": found[2]}
            continue
        used = _USAGE.search(line)
        if used and current is not None:
            out.append({**current, "cpu_s": round(float(used[1]) + float(used[2]), 3),
                        "elapsed_s": float(used[3])})
            current = None
    return out


def summed(actions: list[dict[str, Any]]) -> dict[str, Any]:
    """run.json's ``from_log``: how many actions of each kind and their CPU and elapsed seconds."""
    return {"actions": len(actions), "vacuums": sum(a["kind"] == "vacuum" for a in actions),
            "analyzes": sum(a["kind"] == "analyze" for a in actions),
            "cpu_s": round(sum(a["cpu_s"] for a in actions), 3),
            "elapsed_s": round(sum(a["elapsed_s"] for a in actions), 3),
            "tables": sorted({a["table"].rsplit(".", 1)[-1] for a in actions})}


def _log_size(path: Path | None) -> int | None:
    try:
        return path.stat().st_size if path is not None else None
    except OSError:
        return None


def _log_since(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


@dataclass
class WorkerCpu:
    """One autovacuum process as the polls saw it: CPU at its first and last reading, and whether it
    was already alive at the window's start (then only what it used after the first reading counts)."""

    kind: str
    first: float
    last: float
    at_start: bool


def charged_cpu(workers: Mapping[int, WorkerCpu]) -> dict[str, float]:
    """CPU-seconds of the workers and of the launcher over the window (module docstring)."""
    out = {"workers": 0.0, "launcher": 0.0}
    for w in workers.values():
        used = w.last - w.first if w.at_start else w.last
        out["launcher" if w.kind == LAUNCHER else "workers"] += max(0.0, used)
    return {k: round(v, 4) for k, v in out.items()}


@dataclass
class AutovacuumWatch:
    """Polls autovacuum during the window: :meth:`start` at the gate, :meth:`stop` at the drain."""

    dsn: str
    native: bool
    log_path: Path | None = None  # the server's log (native backend): the actions inside the window
    poll_s: float = POLL_S
    workers: dict[int, WorkerCpu] = field(default_factory=dict)
    tables: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    dead_max: dict[str, float] = field(default_factory=dict)
    polls: int = 0
    debt: dict[str, Any] | None = None
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)  # the claim tables after the run
    from_log: dict[str, Any] | None = None
    _conn: psycopg.AsyncConnection[Any] | None = None
    _task: asyncio.Task[None] | None = None
    _log_at: int | None = None

    async def start(self) -> None:
        self._log_at = _log_size(self.log_path)
        self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=5)
        self.tables["gate"] = await read_tables(self._conn)
        await self._poll_workers(at_start=True)
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self._poll_workers(at_start=False)
                if self.polls % TABLE_EVERY == 0:
                    assert self._conn is not None
                    self._dead(await read_tables(self._conn))
            except Exception as exc:  # a reading never fails the run
                log.warning("autovacuum not read: %s", exc)
                return

    async def _poll_workers(self, *, at_start: bool) -> None:
        assert self._conn is not None
        self.polls += 1
        if not self.native:
            return
        for pid, kind in await (await self._conn.execute(WORKERS_QUERY)).fetchall():
            cpu = cpu_s(pid)
            if cpu is None:
                continue
            seen = self.workers.get(pid)
            if seen is None:
                self.workers[pid] = WorkerCpu(kind, cpu, cpu, at_start)
            else:
                seen.last = cpu

    def _dead(self, reading: Mapping[str, Mapping[str, float]]) -> None:
        for name, row in reading.items():
            if "n_dead_tup" in row:
                self.dead_max[name] = max(self.dead_max.get(name, 0.0), row["n_dead_tup"])

    async def stop(self, edge: str = "drained") -> None:
        """End the polls, read the tables once more as ``edge``; never raises."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        if self.log_path is not None and self._log_at is not None:
            try:
                self.from_log = summed(autovacuum_actions(_log_since(self.log_path, self._log_at)))
            except OSError as exc:
                log.warning("autovacuum's log not read: %s", exc)
        if self._conn is None:
            return
        try:
            await self._poll_workers(at_start=False)
            self.tables[edge] = await read_tables(self._conn)
            self._dead(self.tables[edge])
        except Exception as exc:
            log.warning("autovacuum not read at %s: %s", edge, exc)

    async def end(self, *, debt: bool = False) -> None:
        """The tables once more after the consumers exited (``end``), with ``debt`` the cost of
        vacuuming them (module docstring), and close; never raises."""
        if self._conn is None:
            return
        try:
            self.tables["end"] = await read_tables(self._conn)
            if debt:
                self.debt = await vacuum_cost(self._conn, self.native)
            self.sizes = await read_sizes(self._conn)
        except Exception as exc:
            log.warning("tables not read after the run: %s", exc)
        with contextlib.suppress(Exception):
            await self._conn.close()
        self._conn = None

    def record(self) -> dict[str, Any]:
        """run.json's ``vacuum`` block (module docstring)."""
        last = self.tables.get("end") or self.tables.get("drained")
        cpu = charged_cpu(self.workers) if self.native else None
        return {
            "tables": self.tables,
            "delta": table_deltas(self.tables["gate"], last) if "gate" in self.tables and last else None,
            "dead_max": self.dead_max,
            "debt": self.debt,
            **({"sizes": self.sizes} if self.sizes else {}),
            "autovacuum": {
                "cpu_s": None if cpu is None else cpu["workers"],
                "launcher_cpu_s": None if cpu is None else cpu["launcher"],
                "workers_seen": sum(1 for w in self.workers.values() if w.kind != LAUNCHER),
                "poll_s": self.poll_s, "polls": self.polls, "lower_bound": True,
                **({"from_log": self.from_log} if self.from_log is not None else {}),
            },
        }
