"""The run's phases around its drain, each a function over the run's environment and processes
that returns what it read (:mod:`lab.runner.values`): the set-up before the gate, what is read once
the consumers stopped (:func:`settle`), the verification (:func:`check`) and the closing
``CHECKPOINT`` + cooldown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg
from psycopg import sql

from lab.measure import decoders
from lab.measure.latency import due_latencies, message_latencies, summarize
from lab.measure.staircase import staircase_due_latencies
from lab.pg.slots import drop_slots
from lab.runner.drain import Observer
from lab.runner.environment import RunEnv
from lab.runner.processes import RunProcesses
from lab.runner.values import Checked, Latency, Settled
from lab.runner.windows import Windows
from lab.stack.base import DEBEZIUM_SINKS
from lab.stack.proc import tied
from lab.workload.inbox import LEASE_SEQUENCE, id_sets, sets_equal
from lab.workload.retention import claim_counts

log = logging.getLogger(__name__)


async def set_up(env: RunEnv, procs: RunProcesses, observer: Observer, decode_only: decoders.DecodeOnly) -> None:
    """Everything before the window: the web service, a clean state, the pipeline's transport, the
    senders waiting at their gate, the consumers and the pipeline's helpers, the readiness gates,
    the decode-only slots streaming, the CDC source."""
    env.progress("setup", {})
    await procs.start_web()
    await reset(env, procs)
    await env.pipeline.prepare()
    observer.prepare()  # once the transport exists (a fault's backlog reader), before the consumers
    procs.start_senders()
    await procs.start_consumers()
    await procs.start_helpers()
    env.progress("ready", {})
    await env.pipeline.wait_ready()
    await decode_only.start()  # Scenario.decode_slots, streaming before the gate
    with tied():  # the run's Debezium dies with this runner, like its other processes
        await env.pipeline.start_source()


async def reset(env: RunEnv, procs: RunProcesses) -> None:
    """Stop both Debezium instances, drop our slots, truncate (identity kept), reset web."""
    for sink in DEBEZIUM_SINKS:
        env.stack.stop_debezium(sink)
    dsn = env.settings.pg_dsn
    await asyncio.to_thread(drop_slots, dsn, "dbz_")
    await asyncio.to_thread(drop_slots, dsn, "load_test_slot")
    await asyncio.to_thread(drop_slots, dsn, decoders.SLOT_PREFIX)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for table in ("inbox", "inbox_wal", "messages", "messages_done"):
            await conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))
        # schema.sql has it; a server started before it did gets it here (takeover claims)
        await conn.execute(sql.SQL("CREATE SEQUENCE IF NOT EXISTS {} AS integer").format(
            sql.Identifier(LEASE_SEQUENCE)))
    await procs.web("/load/reset", "POST")


async def settle(env: RunEnv, windows: Windows) -> Settled:
    """Once the consumers stopped and the windows closed, before any slot is dropped: the WAL each
    slot decoded, and autovacuum's block."""
    return Settled(await read_slot_stats(env), await windows.vacuum_record())


async def read_slot_stats(env: RunEnv) -> dict[str, dict[str, Any]]:
    """WAL decoded per slot (``pg_stat_replication_slots``), read after the consumers stopped
    (their walsenders flushed their counters) and before any slot is dropped. Fan-out decodes
    the same WAL once per slot; Debezium's slot is one more. Slots are fresh every run."""
    query = (
        "SELECT s.slot_name, s.total_txns, s.total_bytes, s.spill_bytes, s.stream_bytes "
        "FROM pg_stat_replication_slots s JOIN pg_replication_slots r USING (slot_name) "
        "WHERE r.slot_type = 'logical' ORDER BY 1"
    )
    try:
        async with await psycopg.AsyncConnection.connect(env.settings.pg_dsn, autocommit=True) as conn:
            cur = await conn.execute(query)
            stats = {
                name: {"total_txns": txns, "total_bytes": total, "spill_bytes": spill, "stream_bytes": stream}
                for name, txns, total, spill, stream in await cur.fetchall()
            }
    except psycopg.Error as exc:  # informative only: never fails a run
        log.warning("could not read pg_stat_replication_slots: %s", exc)
        return {}
    await _standby_copies(env, stats)
    return stats


async def _standby_copies(env: RunEnv, stats: dict[str, dict[str, Any]]) -> None:
    """Under the ``ha`` topology: each slot's copy on the standby at the drain's end,
    ``synced`` (slot sync persisted it: a promoted standby carries it), ``temporary`` (still
    waiting for the slot to pass the standby's catalog xmin: a failover now would lose it) or
    ``absent``. Informative only."""
    control = env.stack.control
    standby = control.standby if control is not None else None
    if standby is None or not stats:
        return
    try:
        copies = {s["slot"]: s for s in await asyncio.to_thread(standby.slots)}
    except psycopg.Error as exc:
        log.warning("could not read the standby's slots: %s", exc)
        return
    for name, v in stats.items():
        copy = copies.get(name)
        v["standby"] = "absent" if copy is None else "temporary" if copy["temporary"] else "synced"


async def check(env: RunEnv, procs: RunProcesses, observer: Observer, sent: dict[str, Any]) -> Checked:
    """The verification's counts, the observer's accounting (a fault run's) and every worked
    message's latency."""
    checks = await verify(env, procs)
    return Checked(checks, await observer.account(), await measure_latency(env, procs, sent))


async def verify(env: RunEnv, procs: RunProcesses) -> dict[str, Any]:
    """run.json's counters beyond the senders' and consumers' own: the inbox's rows and distinct
    claims, claims per owner, the web service's work calls, the id sets, the outbox left."""
    inbox = env.pipeline.capabilities.inbox_table
    async with await psycopg.AsyncConnection.connect(env.settings.pg_dsn, autocommit=True) as conn:
        # the claims left and those a claim retention pruned (lab.workload.retention)
        rows, distinct, claims = await claim_counts(conn, inbox)
        stats = await procs.web("/load/stats")
        sets = await id_sets(conn, (await procs.web("/load/arrivals"))["ids"], inbox)
        outbox_left = None  # a pipeline that deletes finished rows: any row left was never finished
        if env.pipeline.capabilities.consumes_outbox:
            left = await (await conn.execute("SELECT count(*) FROM messages")).fetchone()
            outbox_left = left[0] if left else None
    if env.scenario.producer != "web" and not sets["messages_rows"]:
        sets = {}  # the direct producers of a broker stand write no outbox row: counts only
    return {
        "inbox_rows": rows, "distinct_ids": distinct,
        "claims_min": min(claims, default=0), "claims_max": max(claims, default=0),
        "work_calls": stats["calls"], "work_distinct": stats["distinct"],
        **sets, "ids_match": sets_equal(sets) if sets else None, "outbox_left": outbox_left,
    }


async def measure_latency(env: RunEnv, procs: RunProcesses, sent: dict[str, Any]) -> Latency:
    """End-to-end latency of every worked message (:mod:`lab.measure.latency`), read after the drain
    while the web service still holds its arrivals: one ``/load/arrivals`` call and one query for
    the ``created_at`` of those ids; for an open-loop run where every send succeeded, also from each
    message's due time. A failure is a warning and nothing measured. Not for ``producer="direct"``
    runs, whose messages may have no outbox row."""
    s = env.scenario
    if s.producer != "web":
        return Latency()
    try:
        arrivals = await procs.web("/load/arrivals")
        ids = sorted(set(arrivals["ids"]))
        async with await psycopg.AsyncConnection.connect(env.settings.pg_dsn, autocommit=True) as conn:
            if s.rate_steps:  # every row: the lag also counts rows never worked
                cur = await conn.execute("SELECT id, extract(epoch FROM created_at)::float8 FROM outbox_record")
            else:
                cur = await conn.execute(
                    "SELECT id, extract(epoch FROM created_at)::float8 FROM outbox_record WHERE id = ANY(%s)",
                    (ids,))
            created: dict[int, float] = dict(await cur.fetchall())
        flow = sorted(created.values()), sorted(arrivals["t"])
        latency = summarize(message_latencies(arrivals["ids"], arrivals["t"], created))
        from_due = None
        stair = bool(s.rate_steps and sent.get("gate_opened_at"))
        if stair and sent.get("send_failed") == 0:
            plan = s.warm + s.staircase[:sent.get("steps_sent") or 0]  # every message of the run
            from_due = summarize(staircase_due_latencies(arrivals["ids"], arrivals["t"], plan, sent["gate_opened_at"]))
        if sent.get("rate") and sent.get("sent") == s.messages and sent.get("gate_opened_at"):
            from_due = summarize(due_latencies(arrivals["ids"], arrivals["t"], sent["gate_opened_at"], sent["rate"]))
        return Latency(latency, from_due, flow, created if stair else None, arrivals if stair else None)
    except Exception as exc:  # never fails the run, never silent
        log.warning("run %s: latency not measured: %s: %s", env.run_id, type(exc).__name__, exc)
        return Latency()


async def checkpoint_and_cool(env: RunEnv) -> None:
    """``CHECKPOINT`` (a failure is ignored), then the scenario's cooldown."""
    with contextlib.suppress(Exception):
        async with await psycopg.AsyncConnection.connect(env.settings.pg_dsn, autocommit=True) as conn:
            await conn.execute("CHECKPOINT")
    if env.scenario.cooldown_s:
        env.progress("cooldown", {})
        await asyncio.sleep(env.scenario.cooldown_s)
