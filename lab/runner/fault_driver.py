"""The runner's side of a fault run: one ``Scenario.fault`` (a :mod:`lab.faults` object), injected
at START after the senders' gate, through a few hooks over an explicit context.

:class:`FaultInjector` is what the run's phases call: :meth:`~FaultInjector.prepare` (before the
consumers start), :meth:`~FaultInjector.start` (at the gate), :meth:`~FaultInjector.check`
(while the drain waits), :meth:`~FaultInjector.finish` (after the drain),
:meth:`~FaultInjector.restore` (first thing in the cleanup, whatever happened),
:meth:`~FaultInjector.undo` (last thing in the cleanup) and :meth:`~FaultInjector.record`
(run.json's ``fault`` block). It owns the sampling during the fault
(:class:`lab.runner.fault_sampling.FaultSampling`: WAL, backlog, the disk guard's end of the fault) and the
after-the-fact analysis; the fault itself only sees :class:`RunFaultContext`, the
:class:`lab.faults.FaultContext` of the run: its settings, stack, pipeline and scenario, its
consumers through a few calls, and the :class:`lab.faults.FaultState` it writes its events,
stopped processes and stopped services into.

Safety: every stopped process is in :attr:`FaultState.stopped` until it got its SIGCONT;
:meth:`FaultInjector.restore` has the fault continue them all and start the services it stopped,
and the injection's own ``finally`` does too when it is cancelled. Killed consumers are reaped
and replaced; their replacements are the run's processes, stopped by the usual cleanup. A runner
killed outright takes every child with it (parent-death SIGKILL, which also ends a stopped process).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable
from typing import Any

import psutil

from lab.faults import Fault, FaultState, RunStopped, fault_for
from lab.measure import recovery
from lab.measure.cgroups import tree_pids
from lab.measure.sampler import Snapshot
from lab.pipelines import PIPELINES
from lab.runner.context import RunContext
from lab.runner.fault_sampling import FaultSampling, wal_summary
from lab.runner.processes import RunError
from lab.stack import children
from lab.stack.debezium import DURABLE

log = logging.getLogger(__name__)
__all__ = ["FaultInjector", "RunFaultContext", "wal_summary"]


class RunFaultContext:
    """The :class:`lab.faults.FaultContext` of one run: what a fault may use of it, and nothing else."""

    def __init__(self, run: RunContext, state: FaultState) -> None:
        self._run = run
        self.settings = run.settings
        self.stack = run.stack
        self.pipeline = run.pipeline
        self.scenario = run.scenario
        self.state = state

    def consumer(self, i: int) -> psutil.Popen:
        return self._run.consumers[i]

    def consumer_count(self) -> int:
        return len(self._run.consumers)

    def replace_consumer(self, i: int) -> Awaitable[None]:
        self._run.respawning.add(i)  # at once: its exit is no failure from here on
        return self._replace(i)

    async def _replace(self, i: int) -> None:
        run = self._run
        run.respawning.add(i)
        children.forget(run.settings, [run.consumers[i]])
        (run.scratch / f"consumer-{i}.ready").unlink(missing_ok=True)
        new = run.spawn_consumer([i])  # on the loop's thread: it dies with this one
        run.consumers[i] = new
        run.attach_consumer(i, new)
        self.state.event("replacement started", consumer=i, pid=new.pid)
        deadline = time.monotonic() + run.scenario.ready_timeout_s
        while not (run.scratch / f"consumer-{i}.ready").exists():
            if new.poll() is not None:
                raise RunError(f"replacement consumer {i} exited with {new.returncode}")
            if time.monotonic() > deadline:
                raise RunError(f"replacement consumer {i} not ready after {run.scenario.ready_timeout_s:.0f} s")
            await asyncio.sleep(0.05)
        run.respawning.discard(i)
        self.state.event("replacement ready", consumer=i, pid=new.pid)

    def replacing(self, i: int) -> bool:
        return i in self._run.respawning

    def expect_exit(self, i: int) -> None:
        self._run.ended.add(i)

    def consumer_error(self, i: int) -> str | None:
        try:
            error = json.loads((self._run.scratch / f"consumer-{i}.json").read_text()).get("error")
        except (OSError, ValueError):
            return None
        return None if error is None else str(error)

    def attach(self, participant: str) -> None:
        group = self._run.service_cgroups.get(participant)
        if group is None:
            return
        roots = self._run.stack.participants().get(participant, [])
        group.attach(pid for r in roots for pid in tree_pids(r.pid))


class FaultInjector:
    """The fault of one run and its sampling (module docstring); a part of :class:`lab.runner.Run`."""

    def __init__(self, run: RunContext) -> None:
        fault = fault_for(run.scenario)
        assert fault is not None  # built for a fault run only
        self.run = run
        self.fault: Fault = fault
        self.state = FaultState()
        self.ctx = RunFaultContext(run, self.state)
        self.samplers = FaultSampling(run.settings, run.scenario.fault, self.state,
                                      tolerate_pg_down=fault.stops_source)
        self.injected = False
        self.over_mono = 0.0  # when the injection ended (resumed, replaced, reconnected)
        self._inject: asyncio.Task[None] | None = None
        self._guard_task: asyncio.Task[None] | None = None  # the disk guard's end of the fault, once it tripped
        self.arrivals: dict[str, Any] | None = None  # the web service's, after the drain (RunPhases._account)
        self.created_at: dict[int, float] | None = None  # epoch s of every outbox row, id -> created_at

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.state.events

    @property
    def extra_ids(self) -> list[int]:
        """The ids of the rows the fault wrote itself (big-transaction), once committed."""
        return self.fault.added_ids()

    # driving ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Once the pipeline's transport exists, before the consumers start (the backlog reader)."""
        self.samplers.prepare(self.run)

    def start(self, gate_mono: float) -> None:
        """Called when the senders' gate opens: schedule the fault, start the sampling."""
        self.state.start(gate_mono)
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

    def check(self) -> None:
        """Raise the disk guard's error, or the injection's (or a helper's, e.g. a restart's
        supervision) if it failed (the drain loop calls this)."""
        if self.samplers.guard is not None:
            raise RunError(self.samplers.guard["error"])
        for task in [self._inject, *self.state.helpers, *self.samplers.tasks]:
            if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
                raise RunError(f"fault {self.run.scenario.fault}: {task.exception()}")

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
                raise RunError(f"fault {self.run.scenario.fault} not injected: the run drained after {at:.1f} s; "
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
        run, gone = self.run, []
        for i, c in enumerate(run.consumers):
            if i in run.respawning or i in run.ended or c.poll() is None:
                continue
            self.state.event("consumer exited", consumer=i, pid=c.pid, code=c.returncode,
                             error=self.ctx.consumer_error(i), replaced=False)
            self.ctx.expect_exit(i)
            gone.append(i)
        return gone

    def disk_guard_tripped(self, tripped: dict[str, Any]) -> None:
        """The run's disk guard tripped (:mod:`lab.measure.disk`, called on the loop): the stopped
        processes continue at once, the rest of the fault's end follows as a task; the run fails with
        the guard's line at its next :meth:`check`."""
        if not self.samplers.record_trip(tripped):
            return  # a second trip
        self.state.continue_stopped("continued by the disk guard")  # at once, before the cancel lands
        self._guard_task = asyncio.get_running_loop().create_task(self._guard_tripped())

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
            log.error("fault %s: restoration failed: %s: %s", self.run.scenario.fault, type(exc).__name__, exc)

    async def undo(self) -> None:
        """Last thing in the run's cleanup (a failover fails back); never raises."""
        await self.fault.undo(self.ctx)

    # what it records -------------------------------------------------------------------------
    def window(self) -> tuple[float, float]:
        """(start, end) of the fault in seconds after the gate, from its events."""
        times = [e["t_s"] for e in self.state.events]
        return (min(times), max(times)) if times else (self.fault.start_s, self.fault.start_s)

    def resume_s(self, arrivals: dict[str, Any]) -> float | None:
        """``accounting.time_to_resume_s``: the fault's own measure of when delivery resumed."""
        return self.fault.resume_s(self.state, arrivals)

    def facts(self, claim: str) -> dict[str, Any]:
        """What the verdict needs of the fault (:class:`lab.runner.verdict.FaultFacts` as a dict)."""
        lost = self.fault.lost_slot()
        return {"kind": self.fault.kind, "extra_rows": len(self.extra_ids),
                "invalidation": dict(lost) if lost is not None else None, "claim": claim,
                "stops_source": self.fault.stops_source}

    def record(self, accounting: dict[str, Any] | None, timeline: list[Snapshot] | None = None) -> dict[str, Any]:
        """The ``fault`` block of run.json; ``timeline``: the sampler's, for the phases' CPU."""
        start, end = self.window()
        pipeline = PIPELINES[self.run.scenario.pipeline]
        own = self.fault.record(pipeline, accounting)
        return {
            "spec": self.run.scenario.fault, **own,
            "hit_consumers": self.fault.hit_consumers(self.run.scenario),
            # a fault run's Debezium properties beyond the reference study (lab.stack.debezium.DURABLE)
            "debezium_properties": DURABLE if pipeline.cdc_sink else None,
            "extra_rows": len(self.extra_ids),
            "events": self.state.events, "accounting": accounting,
            **self.samplers.record(), "wal_summary": wal_summary(self.samplers.wal, start, end),
            **self.analysis(timeline),
        }

    def analysis(self, timeline: list[Snapshot] | None = None) -> dict[str, Any]:
        """``consumer_lag``, ``phases``, ``recovery_s``, the pre-fault ``bands`` it used and the
        ``excess_cpu`` until the recovery (``recovered`` False: until the last delivery)
        (:mod:`lab.measure.recovery`), from the arrivals and ``created_at``; all None when those
        were not read (the run failed before its verification). Never raises: a failure is logged."""
        out: dict[str, Any] = dict.fromkeys(("consumer_lag", "phases", "recovery_s", "recovery_bands", "excess_cpu"))
        a, created = self.arrivals, self.created_at
        if a is None or created is None or self._inject is None:
            return out
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
