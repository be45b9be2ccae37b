"""The run's phases that talk to the database and the web service: reset, drain, verify,
the slots' decode counters, latency, and the closing ``CHECKPOINT`` + cooldown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import psycopg
from psycopg import sql

from lab.measure import decoders, pgbackends, vacuum
from lab.measure.latency import due_latencies, message_latencies, summarize
from lab.measure.sampler import Sampler
from lab.measure.staircase import STOP_LEAD_S, lag_bound, staircase_due_latencies
from lab.pg.slots import drop_slots
from lab.runner.accounting import account
from lab.runner.context import RunContext
from lab.runner.processes import RunError
from lab.stack.base import DEBEZIUM_SINKS
from lab.workload.inbox import LEASE_MARK, LEASE_SEQUENCE, id_sets, sets_equal
from lab.workload.retention import claim_counts

log = logging.getLogger(__name__)
DRAIN_POLL_S = 0.1  # how often the runner asks the web service how many messages were worked
QUIET_S = 15.0  # a fault run whose work calls stopped for this long (fault over) is settled


class _StopWatch:
    """When the drain loop tests the staircase's next step (:data:`lab.measure.staircase.STOP_LEAD_S`,
    at most a quarter step, before its scheduled end, counted from the runner's gate); the last
    step is never tested."""

    def __init__(self, scenario: Any, gate: float) -> None:
        self.plan, self.step_s, self.gate, self.step = scenario.staircase, scenario.step_s, gate, 0

    def due(self, now: float) -> bool:
        if self.step >= len(self.plan) - 1:
            return False
        return now >= self.gate + self.plan[self.step][1] + self.step_s - min(STOP_LEAD_S, self.step_s / 4)


class RunPhases:
    """Reset, drain, verify and the readings after the window (a part of :class:`lab.runner.Run`, over its state)."""

    def __init__(self, run: RunContext) -> None:
        self.run = run  # the run's state, shared with its other parts and the fault injector

    async def reset(self) -> None:
        """Stop both Debezium instances, drop our slots, truncate (identity kept), reset web."""
        for sink in DEBEZIUM_SINKS:
            self.run.stack.stop_debezium(sink)
        dsn = self.run.settings.pg_dsn
        await asyncio.to_thread(drop_slots, dsn, "dbz_")
        await asyncio.to_thread(drop_slots, dsn, "load_test_slot")
        await asyncio.to_thread(drop_slots, dsn, decoders.SLOT_PREFIX)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for table in ("inbox", "inbox_wal", "messages", "messages_done"):
                await conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))
            # schema.sql has it; a server started before it did gets it here (takeover claims)
            await conn.execute(sql.SQL("CREATE SEQUENCE IF NOT EXISTS {} AS integer").format(
                sql.Identifier(LEASE_SEQUENCE)))
        await self.run._web("/load/reset", "POST")

    async def drain(self, sampler: Sampler) -> dict[str, Any]:
        """Open the senders' gate, then wait until every sent message was worked on."""
        s = self.run.scenario
        self.run.edges["gate"] = sampler.snapshot()
        await self._read_backends("gate")
        await self._watch_vacuum()
        (self.run.scratch / "start").touch()
        if self.run.injector is not None:
            self.run.injector.start(time.monotonic())
        senders_out = self.run.scratch / "senders.json"
        stair = _StopWatch(s, time.monotonic()) if s.rate_steps else None
        quiet_since, last_calls = time.monotonic(), -1
        deadline = time.monotonic() + s.drain_timeout_s
        sent_result: dict[str, Any] | None = None
        last_progress = 0.0
        while True:
            await asyncio.sleep(DRAIN_POLL_S)
            self.run._check_consumers_alive()
            self.run.disk_guard.check()
            if self.run.injector is not None:
                self.run.injector.check()
            if sent_result is None and senders_out.exists():
                sent_result = json.loads(senders_out.read_text())
            stats = await self.run._web("/load/stats")
            now = time.monotonic()
            if stair is not None and sent_result is None and stair.due(now):
                await self._check_step(stair, stats["distinct"])
            if now - last_progress >= 1.0:
                self.run.progress("drain", {"processed": stats["calls"]})
                last_progress = now
            if stats["calls"] != last_calls:
                quiet_since, last_calls = now, stats["calls"]
            if sent_result is not None:
                planned = sent_result.get("planned") or s.messages  # a staircase may stop early
                settled = sent_result["sent"] + sent_result["send_failed"] >= planned
                # a fault run may repeat calls: drained when every id was worked (distinct), or
                # when nothing was worked for QUIET_S after the fault (what is missing is lost)
                worked = stats["calls"] if self.run.injector is None else stats["distinct"]
                expected = sent_result["sent"]
                if self.run.injector is not None:  # a big transaction's rows are messages too
                    expected += len(self.run.injector.extra_ids)
                    if self.run.injector.holds_drain():
                        settled = False
                if settled and worked >= expected:
                    break
                quiet_s = QUIET_S + self.run.pipeline.redelivery_s  # a dead member's locked records
                if (settled and self.run.injector is not None and self.run.injector.over()
                        and now - max(quiet_since, self.run.injector.over_mono) > quiet_s):
                    log.warning("run %s: no work call for %.0f s after the fault: %d of %d ids worked",
                                self.run.run_id, quiet_s, stats["distinct"], sent_result["sent"])
                    break
                if sent_result["sent"] == 0:
                    break
            elif self.run.procs["senders"].poll() not in (None, 0):
                raise RunError(f"senders exited with {self.run.procs['senders'].returncode}")
            if now > deadline:
                raise RunError(f"not drained after {s.drain_timeout_s:.0f} s: {stats['calls']} processed")
        if self.run.injector is not None:
            await self.run.injector.finish()
        self.run.edges["drained"] = sampler.snapshot()
        await self._read_backends("drained")
        if self.run.vacuum_watch is not None:
            await self.run.vacuum_watch.stop("drained")
        return sent_result

    async def _read_backends(self, edge: str) -> None:
        """PostgreSQL's processes and their CPU at a window edge (:mod:`lab.measure.pgbackends`);
        native backend only, and a failure is a warning, never the run's."""
        if self.run.settings.backend != "native":
            return
        try:
            self.run.pg_edges[edge] = await pgbackends.read(self.run.settings.pg_dsn)
        except Exception as exc:
            log.warning("run %s: PostgreSQL's backends not read at %s: %s", self.run.run_id, edge, exc)

    async def _watch_vacuum(self) -> None:
        """Start polling autovacuum and the tables' counters (:mod:`lab.measure.vacuum`); a failure
        is a warning, never the run's."""
        watch = vacuum.AutovacuumWatch(self.run.settings.pg_dsn, native=self.run.settings.backend == "native")
        try:
            await watch.start()
        except Exception as exc:
            log.warning("run %s: autovacuum not watched: %s", self.run.run_id, exc)
            await watch.end()
            return
        self.run.vacuum_watch = watch

    async def vacuum_record(self) -> dict[str, Any] | None:
        """run.json's ``vacuum``: the tables once more (the consumers have exited) and what vacuuming
        the outbox costs now (outside the window), then the block."""
        watch = self.run.vacuum_watch
        if watch is None:
            return None
        await watch.end(debt=True)
        return watch.record()

    async def _check_step(self, stair: _StopWatch, worked: int) -> None:
        """The staircase's early stop (:mod:`lab.measure.staircase`): shortly before a step's end, its
        lag (rows of ``messages`` − distinct ids worked) against criterion 1's bound; above it, the
        senders start no further step."""
        rate = stair.plan[stair.step][0]
        async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
            one = await (await conn.execute("SELECT count(*) FROM outbox_record")).fetchone()
        rows = one[0] if one else 0
        lag, bound = rows - worked, lag_bound(rate, self.run.scenario.consumers, self.run.scenario.batch_size)
        if lag > bound:
            (self.run.scratch / "stop").touch()
            self.run.stair_stop = {"after_step": stair.step, "rate": rate, "lag": lag, "bound": bound,
                               "at_s": round(time.monotonic() - stair.gate, 3)}
            log.info("run %s: lag %d > %g at %g msg/s: the staircase stops", self.run.run_id, lag, bound, rate)
            stair.step = len(stair.plan)  # nothing more to check
        else:
            stair.step += 1

    async def read_slot_stats(self) -> dict[str, dict[str, Any]]:
        """WAL decoded per slot (``pg_stat_replication_slots``), read after the consumers stopped
        (their walsenders flushed their counters) and before any slot is dropped. Fan-out decodes
        the same WAL once per slot; Debezium's slot is one more. Slots are fresh every run."""
        query = (
            "SELECT s.slot_name, s.total_txns, s.total_bytes, s.spill_bytes, s.stream_bytes "
            "FROM pg_stat_replication_slots s JOIN pg_replication_slots r USING (slot_name) "
            "WHERE r.slot_type = 'logical' ORDER BY 1"
        )
        try:
            async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
                cur = await conn.execute(query)
                stats = {
                    name: {"total_txns": txns, "total_bytes": total, "spill_bytes": spill, "stream_bytes": stream}
                    for name, txns, total, spill, stream in await cur.fetchall()
                }
        except psycopg.Error as exc:  # informative only: never fails a run
            log.warning("could not read pg_stat_replication_slots: %s", exc)
            return {}
        await self._standby_copies(stats)
        return stats

    async def _standby_copies(self, stats: dict[str, dict[str, Any]]) -> None:
        """Under the ``ha`` topology: each slot's copy on the standby at the drain's end,
        ``synced`` (slot sync persisted it: a promoted standby carries it), ``temporary`` (still
        waiting for the slot to pass the standby's catalog xmin: a failover now would lose it) or
        ``absent``. Informative only."""
        standby = self.run.stack.standby
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

    async def measure_latency(self, sent: dict[str, Any]) -> None:
        """End-to-end latency of every worked message (:mod:`lab.measure.latency`), read after the drain
        while the web service still holds its arrivals: one ``/load/arrivals`` call and one query
        for the ``created_at`` of those ids. Sets ``latency_ms`` and, for an open-loop run where
        every send succeeded, ``latency_from_due_ms``. A failure is a warning and None. Not for
        ``producer="direct"`` runs, whose messages may have no outbox row."""
        if getattr(self.run.scenario, "producer", "web") != "web":
            return
        try:
            arrivals = await self.run._web("/load/arrivals")
            ids = sorted(set(arrivals["ids"]))
            async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
                if self.run.scenario.rate_steps:  # every row: the lag also counts rows never worked
                    cur = await conn.execute("SELECT id, extract(epoch FROM created_at)::float8 FROM outbox_record")
                else:
                    cur = await conn.execute(
                        "SELECT id, extract(epoch FROM created_at)::float8 FROM outbox_record WHERE id = ANY(%s)",
                        (ids,))
                created: dict[int, float] = dict(await cur.fetchall())
            self.run.flow = sorted(created.values()), sorted(arrivals["t"])  # the cost split's regressors
            self.run.latency_ms = summarize(message_latencies(arrivals["ids"], arrivals["t"], created))
            if self.run.scenario.rate_steps and sent.get("gate_opened_at"):
                self.run.stair_data = {"created_at": created, "arrivals": arrivals}
                if sent.get("send_failed") == 0:
                    plan = self.run.scenario.staircase[:sent.get("steps_sent") or 0]
                    self.run.latency_from_due_ms = summarize(
                        staircase_due_latencies(arrivals["ids"], arrivals["t"], plan, sent["gate_opened_at"]))
            if sent.get("rate") and sent.get("sent") == self.run.scenario.messages and sent.get("gate_opened_at"):
                self.run.latency_from_due_ms = summarize(
                    due_latencies(arrivals["ids"], arrivals["t"], sent["gate_opened_at"], sent["rate"])
                )
        except Exception as exc:  # never fails the run, never silent
            log.warning("run %s: latency not measured: %s: %s", self.run.run_id, type(exc).__name__, exc)

    async def verify(self) -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
            # the claims left and those a claim retention pruned (lab.workload.retention)
            rows, distinct, claims = await claim_counts(conn, self.run.pipeline.inbox_table)
            stats = await self.run._web("/load/stats")
            sets = await id_sets(conn, (await self.run._web("/load/arrivals"))["ids"], self.run.pipeline.inbox_table)
            outbox_left = None  # a pipeline that deletes finished rows: any row left was never finished
            if self.run.pipeline.consumes_outbox:
                left = await (await conn.execute("SELECT count(*) FROM messages")).fetchone()
                outbox_left = left[0] if left else None
        if self.run.scenario.producer != "web" and not sets["messages_rows"]:
            sets = {}  # the direct producers of a broker stand write no outbox row: counts only
        if self.run.injector is not None:
            self.run.accounting = await self._account()
        return {
            "inbox_rows": rows, "distinct_ids": distinct,
            "claims_min": min(claims, default=0), "claims_max": max(claims, default=0),
            "work_calls": stats["calls"], "work_distinct": stats["distinct"],
            **sets, "ids_match": sets_equal(sets) if sets else None, "outbox_left": outbox_left,
        }

    async def _account(self) -> dict[str, Any]:
        """Every message accounted for (:mod:`lab.runner.accounting`), from the web service's
        arrivals and the ids of ``messages``; for the id-keyed ``inbox`` also which consumer had
        claimed each lost id (a claim whose work never came)."""
        inj = self.run.injector
        assert inj is not None  # only a fault run is accounted for
        arrivals = await self.run._web("/load/arrivals")
        async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT id, extract(epoch FROM created_at)::float8 FROM outbox_record")
            # the lag, phases and recovery (lab.measure.recovery)
            created: dict[int, float] = dict(await cur.fetchall())
            messages = list(created)
            inj.arrivals, inj.created_at = arrivals, created
            out = account(arrivals["ids"], messages, arrivals.get("by"))
            out["lost_claimed_by"] = None
            if self.run.pipeline.inbox_table == "inbox" and out["lost"]:
                lost = sorted(set(messages) - set(arrivals["ids"]))
                cur = await conn.execute(  # by consumer name (a takeover claimant also has a lease)
                    sql.SQL("SELECT coalesce(split_part(consumer, {}, 1), '(unclaimed)'), count(*) "
                            "FROM unnest(%s::int[]) AS l(id) LEFT JOIN inbox i USING (id) GROUP BY 1 ORDER BY 1"
                            ).format(sql.Literal(LEASE_MARK)), (lost,))
                out["lost_claimed_by"] = dict(await cur.fetchall())
        out["time_to_resume_s"] = inj.resume_s(arrivals)  # the fault's own measure (lab.faults)
        extra = inj.extra_ids
        if extra:  # big-transaction: when was its last row first worked, after its commit
            at = {e["what"]: e["at"] for e in inj.events}.get("big transaction committed")
            mine, first = set(extra), dict[int, float]()
            for i, t in zip(arrivals["ids"], arrivals["t"], strict=True):
                if i in mine:
                    first.setdefault(i, t)
            out["big_transaction"] = {
                "rows": len(extra), "worked": len(first),
                "all_worked_after_s": round(max(first.values()) - at, 3)
                if at is not None and len(first) == len(mine) else None,
                "lost": len(mine) - len(first),
            }
        return out

    async def _checkpoint_and_cool(self) -> None:
        with contextlib.suppress(Exception):
            async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
                await conn.execute("CHECKPOINT")
        if self.run.scenario.cooldown_s:
            self.run.progress("cooldown", {})
            await asyncio.sleep(self.run.scenario.cooldown_s)
