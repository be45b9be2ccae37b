"""The runner's side of a fault run: one ``Scenario.fault`` (a :mod:`lab.faults` object), injected
at START after the senders' gate, as the observer of the run's drain.

:class:`FaultInjector` is that observer (:class:`lab.runner.drain.Observer`): it starts the
broker's backlog reader once the transport exists (:meth:`~FaultInjector.prepare`), schedules
the fault and its sampling at the gate (:meth:`~FaultInjector.start`), fails the run when the
injection or its sampling failed (:meth:`~FaultInjector.watch`), decides when a run that may
have lost messages is drained (:meth:`~FaultInjector.drained`), waits for the injection's end
(:meth:`~FaultInjector.finish`), accounts for every message (:meth:`~FaultInjector.account`),
restores what the fault holds first thing in the cleanup and undoes it last
(:meth:`~FaultInjector.restore`, :meth:`~FaultInjector.undo`), and writes run.json's ``fault``
block with the after-the-fact analysis (:meth:`~FaultInjector.blocks`). It owns the sampling
during the fault (:class:`lab.runner.fault_sampling.FaultSampling`: WAL, backlog, the disk
guard's end of the fault); the fault itself only sees :class:`RunFaultContext`, the
:class:`lab.faults.FaultContext` of the run: its settings, stack, service control, pipeline and
scenario, its consumers through a few calls to the run's processes, and the
:class:`lab.faults.FaultState` it writes its events, stopped processes and stopped services into.

Safety: every stopped process is in :attr:`FaultState.stopped` until it got its SIGCONT;
:meth:`FaultInjector.restore` has the fault continue them all and start the services it stopped,
and the injection's own ``finally`` does too when it is cancelled. Killed consumers are reaped
and replaced; their replacements are the run's processes, stopped by the usual cleanup. A runner
killed outright takes every child with it (parent-death SIGKILL, which also ends a stopped process).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping
from typing import Any

import psutil
import psycopg
from psycopg import sql

from lab.faults import Fault, FaultState, RunStopped, fault_for
from lab.measure import recovery
from lab.measure.sampler import Sampler, Snapshot
from lab.pipelines import PIPELINES, Pipeline
from lab.runner.accounting import account
from lab.runner.assembly import verdict_of
from lab.runner.drain import PlainRun
from lab.runner.environment import RunEnv
from lab.runner.fault_sampling import FaultSampling, wal_summary
from lab.runner.processes import RunError, RunProcesses
from lab.runner.values import Accounted, Latency
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import ServiceControl, Stack
from lab.stack.debezium import DURABLE
from lab.workload.inbox import LEASE_MARK

log = logging.getLogger(__name__)
__all__ = ["FaultInjector", "RunFaultContext", "wal_summary"]
QUIET_S = 15.0  # a fault run whose work calls stopped for this long (fault over) is settled


class RunFaultContext:
    """The :class:`lab.faults.FaultContext` of one run: what a fault may use of it, and nothing else."""

    def __init__(self, env: RunEnv, procs: RunProcesses, state: FaultState) -> None:
        self._procs = procs
        self.settings: Settings = env.settings
        self.stack: Stack = env.stack
        self.pipeline: Pipeline = env.pipeline
        self.scenario: Scenario = env.scenario
        self.state = state

    @property
    def control(self) -> ServiceControl:
        control = self.stack.control
        if control is None:  # refused before the run (needs_control): a safety net
            raise RunStopped(f"fault {self.scenario.fault}: the {self.stack.backend} backend controls no service")
        return control

    def consumer(self, i: int) -> psutil.Popen:
        return self._procs.consumer(i)

    def consumer_count(self) -> int:
        return self._procs.consumer_count()

    def replace_consumer(self, i: int) -> Awaitable[None]:
        self._procs.begin_replacing(i)  # at once: its exit is no failure from here on
        return self._procs.replace(i, self.state.event)

    def replacing(self, i: int) -> bool:
        return self._procs.replacing(i)

    def expect_exit(self, i: int) -> None:
        self._procs.expect_exit(i)

    def consumer_error(self, i: int) -> str | None:
        return self._procs.consumer_error(i)

    def attach(self, participant: str) -> None:
        self._procs.attach(participant)


class FaultInjector(PlainRun):
    """The fault of one run, its sampling and its accounting (module docstring)."""

    def __init__(self, env: RunEnv, procs: RunProcesses) -> None:
        fault = fault_for(env.scenario)
        assert fault is not None  # built for a fault run only
        self.env, self.procs = env, procs
        self.fault: Fault = fault
        self.state = FaultState()
        self.ctx = RunFaultContext(env, procs, self.state)
        self.samplers = FaultSampling(env.settings, env.scenario.fault, self.state,
                                      tolerate_pg_down=fault.stops_source)
        self.injected = False
        self.over_mono = 0.0  # when the injection ended (resumed, replaced, reconnected)
        self._inject: asyncio.Task[None] | None = None
        self._guard_task: asyncio.Task[None] | None = None  # the disk guard's end of the fault, once it tripped

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.state.events

    # the drain --------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Once the pipeline's transport exists, before the consumers start: its backlog reader."""
        self.samplers.prepare(lambda: self.env.pipeline.backlog(self.env.scratch))

    def start(self, gate: float) -> None:
        """Called when the senders' gate opens: schedule the fault, start the sampling."""
        self.state.start(gate)
        self._inject = asyncio.create_task(self._injection(), name="fault")
        self.samplers.start()

    async def _injection(self) -> None:
        await asyncio.sleep(max(0.0, self.state.t0 + self.fault.start_s - time.monotonic()))
        self.injected = True
        try:
            await self.fault.inject(self.ctx)
        except RunStopped as exc:
            raise RunError(str(exc)) from None
        self.over_mono = time.monotonic()

    async def watch(self, now: float, stats: Mapping[str, Any], sent: Mapping[str, Any] | None) -> None:
        self.check()

    def check(self) -> None:
        """Raise the disk guard's error, or the injection's (or a helper's, e.g. a restart's
        supervision) if it failed."""
        if self.samplers.guard is not None:
            raise RunError(self.samplers.guard["error"])
        for task in [self._inject, *self.state.helpers, *self.samplers.tasks]:
            if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
                raise RunError(f"fault {self.env.scenario.fault}: {task.exception()}")

    def drained(self, now: float, stats: Mapping[str, Any], sent: Mapping[str, Any], settled: bool,
                quiet_since: float) -> bool:
        """A fault run may repeat calls: drained when every id was worked (distinct; a big
        transaction's rows are messages too, and its injection must be over first), or when
        nothing was worked for :data:`QUIET_S` (and the pipeline's redelivery hold) after the fault:
        what is missing is lost."""
        settled = settled and not self.holds_drain()
        if settled and stats["distinct"] >= sent["sent"] + len(self.fault.added_ids()):
            return True
        quiet_s = QUIET_S + self.env.pipeline.capabilities.redelivery_s  # a dead member's locked records
        if settled and self.over() and now - max(quiet_since, self.over_mono) > quiet_s:
            log.warning("run %s: no work call for %.0f s after the fault: %d of %d ids worked",
                        self.env.run_id, quiet_s, stats["distinct"], sent["sent"])
            return True
        return False

    def supervises(self, i: int) -> bool:
        """Whether an exit of consumer ``i`` is the fault's business (a restart's supervision)."""
        return self.state.supervising

    def holds_drain(self) -> bool:
        """The drain must wait for the injection (the rows the fault writes are not known yet)."""
        return self.fault.adds_messages and not self.over()

    def over(self) -> bool:
        """The fault was injected and its injection has ended (resumed, replaced, reconnected)."""
        return self.injected and self._inject is not None and self._inject.done()

    async def finish(self) -> None:
        """After the drain: the fault must have been injected and be over; sampling stops."""
        inject = self._inject
        assert inject is not None
        if not inject.done():
            at = time.monotonic() - self.state.t0
            if not self.injected:
                raise RunError(f"fault {self.env.scenario.fault} not injected: the run drained after {at:.1f} s; "
                               "send more messages or at a lower --rate")
            left = self.fault.start_s + self.fault.duration_s - at  # a stop may outlast the drain
            try:
                await asyncio.wait_for(asyncio.shield(inject), max(0.0, left) + self.fault.settle_s())
            except asyncio.CancelledError:
                if not (inject.cancelled() and self.samplers.guard is not None):
                    raise  # not the disk guard's doing: someone cancels the run
        self.check()
        for task in self.state.helpers:  # a restart's supervision ends with the drain
            task.cancel()
        self.exited_unreplaced()
        await self.samplers.stop()

    def exited_unreplaced(self) -> list[int]:
        """Consumers a supervised fault ended and the drain outran: on a slow machine a broker's
        stop can take longer than the rest of the messages, so every message is worked before the
        supervision sees the consumers whose connection the stop broke. Each is recorded as an exit
        (not replaced: nothing was left to work) and ended by the fault, not failed; the accounting
        still proves that nothing was lost."""
        if not self.state.supervising:
            return []
        gone = self.procs.exited()
        for i in gone:
            c = self.procs.consumer(i)
            self.state.event("consumer exited", consumer=i, pid=c.pid, code=c.returncode,
                             error=self.ctx.consumer_error(i), replaced=False)
            self.ctx.expect_exit(i)
        return gone

    # the disk guard and the cleanup -------------------------------------------------------------
    def guard_tripped(self, tripped: dict[str, Any], senders: int | None) -> None:
        """The run's disk guard tripped (:mod:`lab.measure.disk`, called on the loop; the senders,
        pid ``senders``, were killed): the stopped processes continue at once, the rest of the
        fault's end follows as a task; the run fails with the guard's line at its next check."""
        if self.samplers.record_trip(tripped):
            self.state.continue_stopped("continued by the disk guard")  # at once, before the cancel lands
            self._guard_task = asyncio.get_running_loop().create_task(self._guard_tripped())
        if senders is not None:
            self.state.event("senders killed by the disk guard", pid=senders)

    async def _guard_tripped(self) -> None:
        """The disk guard tripped during the fault: end the injection (its own finally continues what it
        stopped) and have the fault restore what it holds (the runner has killed the senders)."""
        if self._inject is not None:
            self._inject.cancel()
        self.state.continue_stopped("continued by the disk guard")
        # the rest (services started, a lowered keep size reset) may block: off the loop, once the
        # cancelled injection's threads ended
        await asyncio.to_thread(self.state.join_threads)
        await asyncio.to_thread(self.fault.restore, self.ctx, "the disk guard")

    def restore(self) -> None:
        """First thing in the run's cleanup: cancel what is pending, have the fault restore what it
        holds (SIGCONT, services started, a lowered keep size reset); never raises."""
        for task in [self._inject, *self.state.helpers]:
            if task is not None:
                task.cancel()
        self.samplers.close()
        try:
            self.state.continue_stopped()  # a thread may wait on a process the fault stopped
            self.state.join_threads()  # a cancelled injection's stop or start ends before the restoration
            self.fault.restore(self.ctx)
        except Exception as exc:  # a restoration never raises; this must still be seen
            log.error("fault %s: restoration failed: %s: %s", self.env.scenario.fault, type(exc).__name__, exc)

    async def undo(self) -> None:
        """Last thing in the run's cleanup (a failover fails back); never raises."""
        await self.fault.undo(self.ctx)

    # what it records ----------------------------------------------------------------------------
    async def account(self) -> Accounted:
        """Every message accounted for (:mod:`lab.runner.accounting`), from the web service's
        arrivals and the ids of ``messages``; for the id-keyed ``inbox`` also which consumer had
        claimed each lost id (a claim whose work never came); then the fault's own figures."""
        arrivals = await self.procs.web("/load/arrivals")
        async with await psycopg.AsyncConnection.connect(self.env.settings.pg_dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT id, extract(epoch FROM created_at)::float8 FROM outbox_record")
            created: dict[int, float] = dict(await cur.fetchall())  # the lag, phases and recovery too
            messages = list(created)
            out = account(arrivals["ids"], messages, arrivals.get("by"))
            out["lost_claimed_by"] = None
            if self.env.pipeline.capabilities.inbox_table == "inbox" and out["lost"]:
                lost = sorted(set(messages) - set(arrivals["ids"]))
                cur = await conn.execute(  # by consumer name (a takeover claimant also has a lease)
                    sql.SQL("SELECT coalesce(split_part(consumer, {}, 1), '(unclaimed)'), count(*) "
                            "FROM unnest(%s::int[]) AS l(id) LEFT JOIN inbox i USING (id) GROUP BY 1 ORDER BY 1"
                            ).format(sql.Literal(LEASE_MARK)), (lost,))
                out["lost_claimed_by"] = dict(await cur.fetchall())
        out["time_to_resume_s"] = self.fault.resume_s(self.state, arrivals)
        out.update(self.fault.accounting(arrivals))
        return Accounted(out, arrivals, created)

    def window(self) -> tuple[float, float]:
        """(start, end) of the fault in seconds after the gate, from its events."""
        times = [e["t_s"] for e in self.state.events]
        return (min(times), max(times)) if times else (self.fault.start_s, self.fault.start_s)

    def facts(self, claim: str) -> dict[str, Any]:
        """What the verdict needs of the fault (:class:`lab.runner.verdict.FaultFacts` as a dict)."""
        lost = self.fault.lost_slot()
        return {"kind": self.fault.kind, "extra_rows": len(self.fault.added_ids()),
                "invalidation": dict(lost) if lost is not None else None, "claim": claim,
                "stops_source": self.fault.stops_source}

    def blocks(self, record: Mapping[str, Any], sampler: Sampler | None, latency: Latency | None,
               accounted: Accounted | None) -> dict[str, Any]:
        """``fault_facts`` and ``fault_block``: the fault block reads the accounting the verdict
        completed."""
        facts = self.facts(self.env.scenario.claim)
        verdict = verdict_of({**record, "fault_facts": facts})
        timeline = sampler.timeline() if sampler is not None else None
        return {"fault_facts": facts, "fault_block": self.record(verdict.accounting, timeline, accounted)}

    def record(self, accounting: dict[str, Any] | None, timeline: list[Snapshot] | None = None,
               accounted: Accounted | None = None) -> dict[str, Any]:
        """The ``fault`` block of run.json; ``timeline``: the sampler's, for the phases' CPU."""
        start, end = self.window()
        pipeline = PIPELINES[self.env.scenario.pipeline]
        own = self.fault.record(pipeline, accounting)
        return {
            "spec": self.env.scenario.fault, **own,
            "hit_consumers": self.fault.hit_consumers(self.env.scenario),
            # a fault run's Debezium properties beyond the reference study (lab.stack.debezium.DURABLE)
            "debezium_properties": DURABLE if pipeline.capabilities.cdc_sink else None,
            "extra_rows": len(self.fault.added_ids()),
            "events": self.state.events, "accounting": accounting,
            **self.samplers.record(), "wal_summary": wal_summary(self.samplers.wal, start, end),
            **self.analysis(accounted, timeline),
        }

    def analysis(self, accounted: Accounted | None, timeline: list[Snapshot] | None = None) -> dict[str, Any]:
        """``consumer_lag``, ``phases``, ``recovery_s``, the pre-fault ``bands`` it used and the
        ``excess_cpu`` until the recovery (``recovered`` False: until the last delivery)
        (:mod:`lab.measure.recovery`), from the arrivals and ``created_at``; all None when those
        were not read (the run failed before its verification). Never raises: a failure is logged."""
        out: dict[str, Any] = dict.fromkeys(("consumer_lag", "phases", "recovery_s", "recovery_bands", "excess_cpu"))
        if accounted is None or self._inject is None:
            return out
        a, created = accounted.arrivals, accounted.created_at
        start, end = self.window()
        t0 = self.state.t0
        try:
            d = recovery.Deliveries(a["ids"], a["t"], a.get("by"), created, self.state.t0_wall)
            out["consumer_lag"] = recovery.consumer_lag(d)
            out["phases"] = recovery.phases(d, start, end, timeline=timeline, gate_mono=t0)
            out["recovery_s"] = recovery.recovery_s(d, start, end)
            out["recovery_bands"] = recovery.bands(d, start)
            rec = out["recovery_s"]
            if timeline:
                excess = recovery.excess_cpu(
                    timeline, t0, start, end + rec if rec is not None else max(d.end_s, end))
                out["excess_cpu"] = None if excess is None else {**excess, "recovered": rec is not None}
        except Exception as exc:  # informative: never fails the run, never silent
            log.warning("fault analysis failed: %s: %s", type(exc).__name__, exc)
        return out
