"""``lab bench claims``: what the direct readers' claim costs against the size of the claim table.

A ``wal`` reader claims every row it reads in ``inbox_wal`` by WAL position
(:data:`lab.workload.inbox.CLAIM_LSNS`, one statement per batch of up to 100), and the table grows
by one row per message for the whole run (truncated before each run, autovacuum off, as in the
reference study). This bench takes the claim out of the run. On the stack's PostgreSQL, in a schema
of its own (:data:`SCHEMA`, dropped at the end, so nothing it does reaches the runs' table, its
``ANALYZE``'s column statistics included), a copy of ``inbox_wal`` (schema.sql's columns, key and
storage option) is filled with K claims at positions below the ones then claimed. Then N claimers,
each on a connection of its own named like the readers' claim connections, claim the same
``messages`` fresh positions with the readers' own statement and function
(:func:`lab.workload.inbox.claim_lsns`), in batches of 100, concurrently, each claimer's batch
boundaries shifted against the others' (:func:`batches`) as those of independent readers are. The
figure is the claim backends' CPU (their scheduler runtime in ``/proc``, read before and after)
per claimed message.

Each cell (condition × K × N) starts from an emptied table and reads what it left
(:mod:`lab.measure.claimtable`: rows, heap and index bytes, the index's depth) and what the claims
did to ``pg_stat_user_tables`` (``speculative_aborts``: claims that lost a race inside the insert and
left a dead row). One more batch is claimed under ``EXPLAIN (ANALYZE, BUFFERS)``: the plan the
statement got at that size (:func:`plan_summary`) and the buffers one statement touched.

Conditions (:data:`CONDITIONS`): ``reference`` as a run leaves the table (filled, never vacuumed nor
analysed: the planner knows its pages and nothing else), ``vacuumed`` (``VACUUM`` after the fill:
the visibility map set, the row count in ``pg_class``) and ``analyzed`` (``VACUUM ANALYZE``: column
statistics too).

Per condition and N, a line over K (:func:`fit_line`): the fixed cost a (µs per claimed message) and
the growth b per 100,000 rows in the table. A run's table grows from 0 to M, so its claims meet M/2
rows on average: :func:`run_cost` is a + b·M/200,000, the claim's cost per message a run of M
messages should show (``predicted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from lab.measure import claimtable
from lab.measure.vacuum import cpu_s
from lab.pg.pgoutput import format_lsn
from lab.settings import Settings
from lab.stack import get_stack
from lab.stack.base import StackError
from lab.workload.inbox import CLAIM_LSNS, CLAIMS_APPLICATION, claim_lsns
from lab.workload.retention import CREATE_LEDGER, TABLE

Say = Callable[[str], None]
SCHEMA = "claim_bench"
SIZES = (0, 5_000, 20_000, 100_000, 500_000)
CLAIMERS = (1, 4, 8, 16)
CONDITIONS = ("reference", "vacuumed", "analyzed")
MESSAGES = 2_000
BATCH = 100  # the readers' batch
STEP = 400  # bytes of WAL between two claimed positions, about a run's per message
BASE = 1 << 32  # the first position, 1/0
VOLUMES = (5_000, 20_000, 100_000)  # run volumes the fitted lines are read at

CREATE_TABLE = sql.SQL(  # as schema.sql
    "CREATE TABLE {} (wal pg_lsn NOT NULL, slot varchar(64) NOT NULL, CONSTRAINT pk_inbox_wal PRIMARY KEY (wal)) "
    "WITH (autovacuum_enabled = false)").format(sql.Identifier(TABLE))
FILL = ("INSERT INTO inbox_wal (wal, slot) SELECT '0/0'::pg_lsn + (%(base)s::numeric + i::numeric * %(step)s), "
        "'load_test_slot_' || (i %% %(n)s) FROM generate_series(0, %(k)s - 1) AS i")
PREPARE: dict[str, str | None] = {"reference": None, "vacuumed": "VACUUM inbox_wal",
                                  "analyzed": "VACUUM ANALYZE inbox_wal"}
STATS = "SELECT n_tup_ins, n_tup_del, n_dead_tup FROM pg_stat_user_tables WHERE relid = 'inbox_wal'::regclass"
EXPLAIN = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + CLAIM_LSNS


def positions(first: int, count: int) -> list[int]:
    """``count`` claim positions (LSNs) from the ``first``-th on, :data:`STEP` bytes apart."""
    return [BASE + (first + i) * STEP for i in range(count)]


def slot_of(j: int) -> str:
    return f"load_test_slot_{j}"


def batches(items: Sequence[int], size: int, first: int) -> list[list[int]]:
    """``items`` cut into batches of ``size``, the first of ``first`` (1..size): claimer j of N
    starts with ``size − j·size // N``, so no two claimers' batches line up."""
    first = min(max(1, first), size)
    out = [list(items[:first])] if items else []
    out += [list(items[i:i + size]) for i in range(first, len(items), size)]
    return out


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares y = a + b·x over ``points``; None below two distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    n = len(points)
    mx, my = sum(xs) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def run_cost(a: float, b_per_row: float, messages: int) -> float:
    """The claim's mean cost per message over a run of ``messages``, whose claims meet a table
    growing from 0 to ``messages`` rows: ``a + b·M/2``."""
    return a + b_per_row * messages / 2


def _nodes(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield node
    for child in node.get("Plans") or ():
        yield from _nodes(child)


def plan_summary(explained: Any) -> dict[str, Any]:
    """The parts of an ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of the claim that say what it did:
    its joins (node types), each node on the claim table (type, relation or index, rows it returned
    over its loops, loops) and the shared buffers the statement touched (hit + read, the top node's
    totals, which include its children), with the planning and execution times."""
    top = explained[0] if isinstance(explained, list) else explained
    plan = top["Plan"]
    nodes = list(_nodes(plan))
    joins = [n["Node Type"] for n in nodes if n["Node Type"] in ("Hash Join", "Nested Loop", "Merge Join")]
    on_table = [
        {"node": n["Node Type"], "on": n.get("Index Name") or n.get("Relation Name"),
         "rows": int(n.get("Actual Rows", 0) * n.get("Actual Loops", 1)), "loops": int(n.get("Actual Loops", 1))}
        for n in nodes if n.get("Relation Name") == TABLE and n["Node Type"] != "ModifyTable"]
    return {
        "joins": joins, "on_table": on_table,
        "shared_buffers": int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0)),
        "planning_ms": round(float(top.get("Planning Time", 0.0)), 3),
        "execution_ms": round(float(top.get("Execution Time", 0.0)), 3),
    }


def shape(summary: Mapping[str, Any]) -> str:
    """One line for the printed table: the joins, then how the claim table was read."""
    reads = ", ".join(f"{n['node']} {n['on']} ({n['rows']} rows)" for n in summary["on_table"])
    return f"{'+'.join(summary['joins']) or 'no join'}: {reads or 'no read of the table'}"


async def _claim_all(conn: psycopg.AsyncConnection[Any], cut: list[list[int]], me: str) -> tuple[int, int]:
    won = 0
    for batch in cut:
        won += len(await claim_lsns(conn, batch, me))
    return won, len(cut)


async def _stats(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int, int]:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    row = await (await conn.execute(STATS)).fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


async def _cell(control: psycopg.AsyncConnection[Any], dsn: str, condition: str, k: int, n: int,
                messages: int) -> dict[str, Any]:
    await control.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
    if k:
        await control.execute(FILL, {"base": BASE, "step": STEP, "n": n, "k": k})
    prepare = PREPARE[condition]
    if prepare is not None:
        await control.execute(prepare)
    await control.execute("SELECT pg_stat_force_next_flush()")  # the fill's counts, before the claims
    before = await _stats(control)
    options = f"-c search_path={SCHEMA},public"
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True, application_name=CLAIMS_APPLICATION,
                                                   options=options) for _ in range(n)]
    try:
        pids = [(await (await c.execute("SELECT pg_backend_pid()")).fetchone() or (0,))[0] for c in conns]
        fresh = positions(k, messages)
        cuts = [batches(fresh, BATCH, BATCH - j * BATCH // n) for j in range(n)]
        cpu0, t0 = [cpu_s(p) or 0.0 for p in pids], time.monotonic()
        done = await asyncio.gather(*(_claim_all(c, cuts[j], slot_of(j)) for j, c in enumerate(conns)))
        wall, cpu = time.monotonic() - t0, sum((cpu_s(p) or 0.0) - c0 for p, c0 in zip(pids, cpu0, strict=True))
        for c in conns:  # each backend's table counts, now
            await c.execute("SELECT pg_stat_force_next_flush()")
        after = await _stats(control)
        cur = psycopg.AsyncClientCursor(conns[0])  # literal values: the plan a claim of that batch gets
        await cur.execute(EXPLAIN, {"lsns": [format_lsn(x) for x in positions(k + messages, BATCH)],
                                    "me": slot_of(0)})
        row = await cur.fetchone()
        plan = plan_summary(row[0] if row else [{"Plan": {"Node Type": "?"}}])
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                await c.close()
    won, statements = sum(w for w, _ in done), sum(s for _, s in done)
    return {
        "condition": condition, "rows_before": k, "claimers": n, "messages": messages, "statements": statements,
        "won": won, "lost": n * messages - won, "wall_s": round(wall, 3),
        "claim_us_per_msg": round(cpu * 1e6 / messages, 2),
        "claim_us_per_statement": round(cpu * 1e6 / statements, 1) if statements else None,
        "speculative_aborts": after[1] - before[1], "inserted": after[0] - before[0],
        "table": await claimtable.read(control), "plan": plan,
    }


def fits(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per condition and N: :func:`fit_line` of µs/msg over the rows in the table, and the run cost
    it predicts at each of :data:`VOLUMES` (ms per message, as run.json's ``postgres_backends``)."""
    out = []
    for cond in dict.fromkeys(c["condition"] for c in cells):
        for n in dict.fromkeys(c["claimers"] for c in cells):
            line = fit_line([(c["rows_before"], c["claim_us_per_msg"]) for c in cells
                             if c["condition"] == cond and c["claimers"] == n])
            if line is None:
                continue
            a, b = line
            out.append({"condition": cond, "claimers": n, "a_us_per_msg": round(a, 2),
                        "b_us_per_msg_per_100k_rows": round(b * 100_000, 2),
                        "predicted_ms_per_msg": {m: round(run_cost(a, b, m) / 1000, 4) for m in VOLUMES}})
    return out


async def _bench(settings: Settings, sizes: Sequence[int], claimers: Sequence[int], messages: int,
                 conditions: Sequence[str], say: Say) -> dict[str, Any]:
    dsn = settings.pg_dsn
    cells: list[dict[str, Any]] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as control:
        await claimtable.index_shape(control)  # creates pgstattuple in public before the path changes
        await control.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        await control.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        try:
            await control.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(SCHEMA)))
            await control.execute(CREATE_TABLE)
            await control.execute(CREATE_LEDGER)  # empty: claimtable.read counts nothing pruned
            for cond in conditions:
                for k in sizes:
                    for n in claimers:
                        cell = await _cell(control, dsn, cond, k, n, messages)
                        say(f"{cond} K={k} N={n}: {cell['claim_us_per_msg']} µs/msg, "
                            f"{cell['claim_us_per_statement']} µs/statement, {shape(cell['plan'])}")
                        cells.append(cell)
        finally:
            await control.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    return {"cells": cells, "fits": fits(cells), "messages": messages, "batch": BATCH, "step_bytes": STEP}


def bench_claims(settings: Settings, *, sizes: Sequence[int] = SIZES, claimers: Sequence[int] = CLAIMERS,
                 messages: int = MESSAGES, conditions: Sequence[str] = CONDITIONS,
                 say: Say = lambda _: None) -> dict[str, Any]:
    """Every cell (module docstring) on the stack's PostgreSQL, started if it is not; returns the cells
    and the fitted lines. The native backend only: the claim backends' CPU is read in ``/proc``."""
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown condition(s) {', '.join(unknown)}: choose from {', '.join(CONDITIONS)}")
    if settings.backend != "native":
        raise StackError("lab bench claims reads the claim backends' CPU in /proc: it needs LAB_BACKEND=native")
    get_stack(settings).up()
    t0 = time.monotonic()
    out = asyncio.run(_bench(settings, sizes, claimers, messages, conditions, say))
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def table_text(out: Mapping[str, Any]) -> str:
    """The printed table: one line per cell, then the fitted lines."""
    head = (f"{'condition':<10} {'rows':>7} {'N':>3} {'µs/msg':>8} {'µs/stmt':>8} {'buffers':>8} {'depth':>5} "
            f"{'index kB':>8} {'dead':>5} {'aborts':>6}  plan")
    lines = [head]
    for c in out["cells"]:
        t, p = c["table"], c["plan"]
        depth = (t.get("index") or {}).get("depth")
        lines.append(f"{c['condition']:<10} {c['rows_before']:>7} {c['claimers']:>3} {c['claim_us_per_msg']:>8.1f} "
                     f"{c['claim_us_per_statement'] or 0:>8.0f} {p['shared_buffers']:>8} "
                     f"{'-' if depth is None else depth:>5} {t['index_bytes'] // 1024:>8} "
                     f"{t['dead_tuples'] or 0:>5} {c['speculative_aborts']:>6}  {shape(p)}")
    lines += ["", f"{'condition':<10} {'N':>3} {'a µs/msg':>9} {'b per 100k rows':>16}  predicted ms/msg at M = "
              + ", ".join(f"{m:,}" for m in VOLUMES)]
    for f in out["fits"]:
        pred = ", ".join(f"{v:.3f}" for v in f["predicted_ms_per_msg"].values())
        lines.append(f"{f['condition']:<10} {f['claimers']:>3} {f['a_us_per_msg']:>9.1f} "
                     f"{f['b_us_per_msg_per_100k_rows']:>16.1f}  {pred}")
    return "\n".join(lines) + "\n"
