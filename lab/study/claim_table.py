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
(:func:`lab.measure.vacuum.read_sizes`: heap and index bytes, the primary key's depth) and what the claims
did to ``pg_stat_user_tables`` (``speculative_aborts``: claims that lost a race inside the insert and
left a dead row). One more batch is claimed under ``EXPLAIN (ANALYZE, BUFFERS)``: the plan the
statement got at that size (:mod:`lab.study.claim_model`) and the buffers one statement touched.
Before the cells, :func:`plan_switch` finds, per condition, the table size at which the planner stops
reading the whole table for the claim's second branch (the claims the slot already owns) and takes
the primary key instead: it fills the table 2,500 rows at a time and asks ``EXPLAIN`` (no execution)
at each step.

Conditions (:data:`CONDITIONS`): ``reference`` as a run leaves the table (filled, never vacuumed nor
analysed: the planner knows its pages and nothing else), ``vacuumed`` (``VACUUM`` after the fill:
the visibility map set, the row count in ``pg_class``), ``analyzed`` (``VACUUM ANALYZE``: column
statistics too) and ``seqscan-off`` (the reference table, ``enable_seqscan`` off in the claimers'
sessions: the claim reads the table through the primary key at every size, which tells the plan's
share of the cost from the table's). ``random-page-cost-1.1`` (the reference table, ``random_page_cost`` 1.1 in the
claimers' sessions, a common setting for data in memory or on SSDs) is there to be asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from lab.measure.vacuum import cpu_s, read_sizes
from lab.pg.walstream import format_lsn
from lab.settings import Settings
from lab.stack import get_stack
from lab.stack.base import StackError
from lab.study.claim_model import (
    BASE,
    BATCH,
    STEP,
    batches,
    fits,
    plan_summary,
    positions,
    reads_whole_table,
    shape,
)
from lab.workload.inbox import CLAIM_LSNS, CLAIMS_APPLICATION, claim_lsns
from lab.workload.retention import TABLE

Say = Callable[[str], None]
SCHEMA = "claim_bench"
SIZES = (0, 5_000, 10_000, 20_000, 50_000, 100_000, 500_000)
CLAIMERS = (1, 4, 8, 16)
MESSAGES = 2_000
SWITCH_STEP = 2_500  # rows added between two plans of the switch search
SWITCH_MAX = 200_000
SWITCH_SLOTS = 8  # the claims of the switch search belong to 8 slots, as at N = 8


@dataclass(frozen=True)
class Condition:
    """What is done to the filled table (``prepare``) and set in the claimers' sessions."""

    prepare: str | None = None
    session: tuple[tuple[str, str], ...] = ()

    def options(self) -> str:
        return " ".join([f"-c search_path={SCHEMA},public", *(f"-c {k}={v}" for k, v in self.session)])


CONDITIONS: dict[str, Condition] = {
    "reference": Condition(),
    "vacuumed": Condition("VACUUM inbox_wal"),
    "analyzed": Condition("VACUUM ANALYZE inbox_wal"),
    "seqscan-off": Condition(session=(("enable_seqscan", "off"),)),
    "random-page-cost-1.1": Condition(session=(("random_page_cost", "1.1"),)),
}
DEFAULT_CONDITIONS = ("reference", "vacuumed", "analyzed", "seqscan-off")

CREATE_TABLE = sql.SQL(  # as schema.sql
    "CREATE TABLE {} (wal pg_lsn NOT NULL, slot varchar(64) NOT NULL, CONSTRAINT pk_inbox_wal PRIMARY KEY (wal)) "
    "WITH (autovacuum_enabled = false)").format(sql.Identifier(TABLE))
FILL = ("INSERT INTO inbox_wal (wal, slot) "
        "SELECT '0/0'::pg_lsn + (%(base)s::numeric + i::numeric * %(step)s::numeric), "
        "'load_test_slot_' || (i %% %(n)s::int8) "
        "FROM generate_series(%(first)s::int8, %(first)s::int8 + %(k)s::int8 - 1) AS i")
STATS = "SELECT n_tup_ins, n_tup_del, n_dead_tup FROM pg_stat_user_tables WHERE relid = 'inbox_wal'::regclass"
EXPLAIN_RUN = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + CLAIM_LSNS
EXPLAIN_PLAN = sql.SQL("EXPLAIN (FORMAT JSON) ") + CLAIM_LSNS


def slot_of(j: int) -> str:
    return f"load_test_slot_{j}"


async def _fill(conn: psycopg.AsyncConnection[Any], first: int, k: int, slots: int) -> None:
    """Claims of positions ``first`` … ``first + k − 1`` (:func:`positions`), slot i of ``slots`` each."""
    if k:
        await conn.execute(FILL, {"base": BASE, "step": STEP, "n": slots, "first": first, "k": k})


async def _explain(conn: psycopg.AsyncConnection[Any], query: sql.Composed, first: int) -> dict[str, Any]:
    """The plan of a claim of the batch of positions from the ``first``-th, with its values as
    literals (the plan a claim of that batch gets: the readers' statements are planned afresh)."""
    cur = psycopg.AsyncClientCursor(conn)
    await cur.execute(query, {"lsns": [format_lsn(x) for x in positions(first, BATCH)], "me": slot_of(0)})
    row = await cur.fetchone()
    return plan_summary(row[0] if row else [{"Plan": {"Node Type": "?"}}])


async def plan_switch(control: psycopg.AsyncConnection[Any], dsn: str, cond: Condition,
                      upto: int = SWITCH_MAX) -> int | None:
    """The smallest table (rows, a multiple of :data:`SWITCH_STEP`) at which the claim no longer
    reads the whole table, up to ``upto`` rows; None when it still does there."""
    await control.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, options=cond.options()) as conn:
        for k in range(0, upto + 1, SWITCH_STEP):
            await _fill(control, k - SWITCH_STEP, SWITCH_STEP if k else 0, SWITCH_SLOTS)
            if cond.prepare is not None:
                await control.execute(cond.prepare)
            if not reads_whole_table(await _explain(conn, EXPLAIN_PLAN, k)):
                return k
    return None


async def _claim_all(conn: psycopg.AsyncConnection[Any], cut: list[list[int]], me: str) -> tuple[int, int]:
    won = 0
    for batch in cut:
        won += len(await claim_lsns(conn, batch, me))
    return won, len(cut)


async def _stats(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int, int]:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    row = await (await conn.execute(STATS)).fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


async def _cell(control: psycopg.AsyncConnection[Any], dsn: str, name: str, k: int, n: int,
                messages: int) -> dict[str, Any]:
    cond = CONDITIONS[name]
    await control.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
    await _fill(control, 0, k, n)
    if cond.prepare is not None:
        await control.execute(cond.prepare)
    await control.execute("SELECT pg_stat_force_next_flush()")  # the fill's counts, before the claims
    before = await _stats(control)
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True, application_name=CLAIMS_APPLICATION,
                                                   options=cond.options()) for _ in range(n)]
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
        plan = await _explain(conns[0], EXPLAIN_RUN, k + messages)
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                await c.close()
    won, statements = sum(w for w, _ in done), sum(s for _, s in done)
    return {
        "condition": name, "rows_before": k, "claimers": n, "messages": messages, "statements": statements,
        "won": won, "lost": n * messages - won, "wall_s": round(wall, 3),
        "claim_us_per_msg": round(cpu * 1e6 / messages, 2),
        "claim_us_per_statement": round(cpu * 1e6 / statements, 1) if statements else None,
        "speculative_aborts": after[1] - before[1], "inserted": after[0] - before[0],
        "table": {**(await read_sizes(control)).get(TABLE, {}), "dead_tuples": after[2]}, "plan": plan,
    }


async def _bench(settings: Settings, sizes: Sequence[int], claimers: Sequence[int], messages: int,
                 conditions: Sequence[str], switch_max: int, say: Say) -> dict[str, Any]:
    dsn = settings.pg_dsn
    cells: list[dict[str, Any]] = []
    switches: dict[str, int | None] = {}
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as control:
        await control.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple SCHEMA public")  # pgstatindex
        await control.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        await control.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        try:
            await control.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(SCHEMA)))
            await control.execute(CREATE_TABLE)
            for name in conditions:
                switches[name] = await plan_switch(control, dsn, CONDITIONS[name], switch_max)
                say(f"{name}: the claim reads the whole table below {switches[name]} rows")
                for k in sizes:
                    for n in claimers:
                        cell = await _cell(control, dsn, name, k, n, messages)
                        say(f"{name} K={k} N={n}: {cell['claim_us_per_msg']} µs/msg, "
                            f"{cell['claim_us_per_statement']} µs/statement, {shape(cell['plan'])}")
                        cells.append(cell)
        finally:
            await control.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    return {"cells": cells, "switch_rows": switches, "fits": fits(cells, switches), "messages": messages,
            "batch": BATCH, "switch_step": SWITCH_STEP}


def bench_claims(settings: Settings, *, sizes: Sequence[int] = SIZES, claimers: Sequence[int] = CLAIMERS,
                 messages: int = MESSAGES, conditions: Sequence[str] = DEFAULT_CONDITIONS,
                 switch_max: int = SWITCH_MAX, say: Say = lambda _: None) -> dict[str, Any]:
    """Every cell (module docstring) on the stack's PostgreSQL, started if it is not; returns the
    cells, each condition's switch (searched up to ``switch_max`` rows) and the fitted model. The
    native backend only: the claim backends' CPU is read in ``/proc``."""
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown condition(s) {', '.join(unknown)}: choose from {', '.join(CONDITIONS)}")
    if settings.backend != "native":
        raise StackError("lab bench claims reads the claim backends' CPU in /proc: it needs LAB_BACKEND=native")
    get_stack(settings).up()
    t0 = time.monotonic()
    out = asyncio.run(_bench(settings, sizes, claimers, messages, conditions, switch_max, say))
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out
