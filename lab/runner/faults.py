"""Fault injection: one ``Scenario.fault``, injected at START after the senders' gate.

* ``consumer-kill``: SIGKILL the consumer process, reap it, start a replacement with the same
  index (its slot, its static Kafka membership, its inbox name) and wait until it is ready.
* ``consumer-dead`` / ``sink-outage``: SIGSTOP one / every consumer process, SIGCONT after
  DURATION. A stopped process is a real stop: no reads, no acks, no heartbeats.
* ``walsender-kill``: ``pg_terminate_backend`` of the walsender holding the slot (a direct
  reader's ``load_test_slot_<i>``, or Debezium's), then wait until the slot is held again.
* ``consumer-slow``: SIGUSR1 switches the consumer's extra time per message on, SIGUSR2 off
  after DURATION (:mod:`lab.consumer` installs both handlers before it is ready).
* ``debezium-kill``: SIGKILL Debezium Server, start it again through the stack from the slot and
  offsets file it kept (a fault run's Debezium is ``durable``, :data:`lab.stack.debezium.DURABLE`),
  wait until its slot streams.
* ``broker-restart`` / ``postgres-restart``: stop the service through the stack (PostgreSQL: fast
  shutdown), wait DURATION, start it again and wait until it serves (after PostgreSQL's, until
  Debezium holds its slot again). Debezium is left to recover by itself (its retriable errors
  restart its task); from the stop to the end of the drain the lab supervises: a consumer that
  exits is replaced, and a Debezium JVM that exits is started again from its offsets (events
  ``consumer exited``, ``debezium exited``, ``debezium restarted by the lab``).
* ``big-transaction``: one transaction of ROWS executions of the web service's INSERT.
* ``broker-node-kill`` (``ha`` only): SIGKILL one node of the three-node broker, wait
  DURATION, start it again through its cluster and wait until all three serve together; the
  same supervision as a restart. Its resume figure is the longest stop of delivery after the kill.
* ``postgres-failover`` (``ha`` only): wait until every failover slot is synced on the
  standby, stop the primary (immediate or fast), promote the standby, move Debezium to it; the
  same supervision as a restart. After the run's cleanup the lab fails back (the promoted
  standby stops, the primary starts, the standby is rebuilt from it).

A service that a fault stopped and did not start again (the run failed or was cancelled meanwhile)
is started by :meth:`FaultInjector.restore`; a restarted service's processes are moved into
their participant's cgroup (what they did before the move counts to the runner's).

Safety: every stopped process is in :attr:`FaultInjector.stopped` until it got its SIGCONT;
:meth:`FaultInjector.restore` (the runner calls it first thing in its cleanup, whatever
happened) continues them all, and the injection's own ``finally`` does too when it is cancelled.
Killed consumers are reaped and replaced; their replacements are the run's processes, stopped
by the usual cleanup. A runner killed outright takes every child with it (parent-death SIGKILL,
which also ends a stopped process).

The injector is this module's :class:`FaultInjector` and four parts of it:
:mod:`lab.runner.fault_processes` (the consumer faults and the big transaction),
:mod:`lab.runner.fault_services` (walsender, Debezium, restarts, node kills, the PostgreSQL
failover and the supervision), :mod:`lab.runner.fault_slots` (slot-invalidation) and
:mod:`lab.runner.fault_sampling` (the WAL and backlog sampling during the fault and the retention
guard).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import Any

import psutil
import psycopg

from lab.measure import cgroups, recovery
from lab.measure.sampler import Snapshot
from lab.pipelines.backlog import reader_for
from lab.runner import fault_sampling
from lab.runner.fault_processes import ProcessFaults
from lab.runner.fault_sampling import FaultSampling, wal_summary
from lab.runner.fault_services import FAILOVER_SETTLE_S, RESUME_WAIT_S, ServiceFaults
from lab.runner.fault_slots import INVALIDATE_TIMEOUT_S, KEEP_GUC, READER_EXIT_S, SlotFaults, _reset_keep
from lab.runner.processes import RunError
from lab.stack.debezium import DURABLE

log = logging.getLogger(__name__)
SAMPLER_STOP_S = 10.0  # finish() waits this long for the samplers to end
__all__ = ["FaultInjector", "check_topology", "wal_summary"]

def check_topology(scenario: Any, settings: Any) -> None:
    """ValueError (one line, before anything starts) when the fault needs the other topology."""
    f = scenario.parsed_fault
    if f is not None and f.kind == "broker-node-kill" and not settings.ha:
        raise ValueError(f"fault {scenario.fault}: broker-node-kill needs the ha topology (--topology ha): "
                         "a single broker has no other node to fail over to (broker-restart restarts it)")
    if f is not None and f.kind == "postgres-failover" and not settings.ha:
        raise ValueError(f"fault {scenario.fault}: postgres-failover needs the ha topology (--topology ha): "
                         "the single topology has no standby to promote (postgres-restart restarts it)")


class FaultInjector(ProcessFaults, SlotFaults, ServiceFaults, FaultSampling):
    """The fault of one run (a helper of :class:`lab.runner.Run`, which it drives)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.fault = run.scenario.parsed_fault
        self.events: list[dict[str, Any]] = []
        self.stopped: list[psutil.Process] = []
        self.wal: list[dict[str, Any]] = []
        self.injected = False
        self.guard: dict[str, Any] | None = None  # the retention guard, once it tripped
        self.invalidation: dict[str, Any] | None = None  # slot-invalidation: what happened
        self._keep_set = False  # slot-invalidation lowered the keep size: restore() resets it
        self._last_retained: dict[str, int] = {}
        self.down: list[str] = []  # services this fault stopped and has not started again
        self.sampling = True  # the WAL and backlog samplers run until finish() turns this off
        self.extra_ids: list[int] = []  # big-transaction: the ids of its rows, once committed
        self._supervising = False  # a restart replaces consumers that exit (see _supervise)
        self._failing_over = False  # postgres-failover under way: the supervision waits
        self.failed_over = False  # the primary was stopped for a failover: the cleanup fails back
        self._failover_thread: asyncio.Future[dict[str, float]] | None = None  # its stop and promotion
        self.over_mono = 0.0  # when the injection ended (resumed, replaced, reconnected)
        self._t0 = 0.0
        self._t0_wall = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self.backlog: list[dict[str, Any]] = []  # the broker's backlog, sampled (watch_backlog)
        self.backlog_gaps: list[dict[str, Any]] = []  # readings that failed (a broker restarting)
        self._backlog_reader: Any = None
        self.arrivals: dict[str, Any] | None = None  # the web service's, after the drain (RunPhases._account)
        self.created_at: dict[int, float] | None = None  # epoch s of every outbox row, id -> created_at

    # driving ---------------------------------------------------------------------------------
    def start(self, gate_mono: float) -> None:
        """Called when the senders' gate opens: schedule the fault, the WAL and the backlog sampling."""
        self._t0 = gate_mono
        self._t0_wall = time.time() - (time.monotonic() - gate_mono)
        self._tasks = [asyncio.create_task(self._inject(), name="fault"),
                       asyncio.create_task(self.watch_wal(), name="fault-wal")]
        if self._backlog_reader is not None:
            group = cgroups.current()  # the runner's own group by now: the child's CPU is the runner's
            for pid in self._backlog_reader.pids():
                with contextlib.suppress(OSError):
                    cgroups.move_to(group, pid)
            self._tasks.append(asyncio.create_task(self.watch_backlog(), name="fault-backlog"))

    def prepare(self) -> None:
        """Once the pipeline's transport exists, before the consumers start: build the backlog reader
        and start its sampling child if it has one (a Python child with librdkafka takes seconds to
        start on a loaded machine; started at the gate, its first reading came after a fault at 3 s)."""
        try:
            self._backlog_reader = reader_for(self.run) if fault_sampling.BACKLOG_SAMPLE_S else None
            if self._backlog_reader is not None:
                self._backlog_reader.start()
        except Exception as exc:  # informative: never fails the run, never silent
            log.warning("no backlog sampling: %s: %s", type(exc).__name__, exc)
            self._backlog_reader = None

    def check(self) -> None:
        """Raise the retention guard's error, or the injection's (or a restart's supervision's) if it
        failed (the drain loop calls this)."""
        if self.guard is not None:
            raise RunError(self.guard["error"])
        for task in self._tasks:  # the injection, and a restart's supervision
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RunError(f"fault {self.run.scenario.fault}: {task.exception()}")

    def holds_drain(self) -> bool:
        """The drain must wait for the injection (a big transaction's rows are not known yet)."""
        return self.fault.kind == "big-transaction" and not self.over()

    def over(self) -> bool:
        """The fault was injected and its injection has ended (resumed, replaced, reconnected)."""
        return self.injected and bool(self._tasks) and self._tasks[0].done()

    def record(self, accounting: dict[str, Any] | None, timeline: list[Snapshot] | None = None) -> dict[str, Any]:
        """The ``fault`` block of run.json; ``timeline``: the sampler's, for the phases' CPU."""
        start, end = self.window()
        return {
            "spec": self.run.scenario.fault, **self.fault.as_dict(),
            "slot": self.slot() if self.fault.kind == "walsender-kill" else None,
            # a fault run's Debezium properties beyond the reference study (lab.stack.debezium.DURABLE)
            "debezium_properties": DURABLE if self.run.pipeline.cdc_sink else None,
            "extra_rows": len(self.extra_ids),
            "events": self.events, "accounting": accounting,
            "wal": self.wal, "wal_summary": wal_summary(self.wal, start, end),
            "max_retained_wal": getattr(self.run.settings, "max_retained_wal", None), "guard": self.guard,
            "invalidation": self._invalidation_record(accounting),
            "backlog": self.backlog, "backlog_gaps": self.backlog_gaps,
            "backlog_peak": recovery.backlog_peak(self.backlog),
            **self.analysis(timeline),
        }

    def analysis(self, timeline: list[Snapshot] | None = None) -> dict[str, Any]:
        """``consumer_lag``, ``phases``, ``recovery_s``, the pre-fault ``bands`` it used and the
        ``excess_cpu`` until the recovery (``recovered`` False: until the last delivery)
        (:mod:`lab.measure.recovery`), from the arrivals and ``created_at``; all None when those
        were not read (the run failed before its verification). Never raises: a failure is logged."""
        out: dict[str, Any] = dict.fromkeys(("consumer_lag", "phases", "recovery_s", "recovery_bands", "excess_cpu"))
        a, created = self.arrivals, self.created_at
        if a is None or created is None or not self._tasks:
            return out
        start, end = self.window()
        try:
            d = recovery.Deliveries(a["ids"], a["t"], a.get("by"), created, self._t0_wall)
            out["consumer_lag"] = recovery.consumer_lag(d)
            out["phases"] = recovery.phases(d, start, end, timeline=timeline, gate_mono=self._t0)
            out["recovery_s"] = recovery.recovery_s(d, start, end)
            out["recovery_bands"] = recovery.bands(d, start)
            rec = out["recovery_s"]
            if timeline:
                excess = recovery.excess_cpu(
                    timeline, self._t0, start, end + rec if rec is not None else max(d.end_s, end))
                out["excess_cpu"] = None if excess is None else {**excess, "recovered": rec is not None}
        except Exception as exc:  # informative: never fails the run, never silent
            log.warning("fault analysis failed: %s: %s", type(exc).__name__, exc)
        return out

    def _invalidation_record(self, accounting: dict[str, Any] | None) -> dict[str, Any] | None:
        if self.invalidation is None:
            return None
        lost = (accounting or {}).get("lost")
        return {**self.invalidation, "lost": lost, "lost_ids": (accounting or {}).get("lost_ids")}

    async def finish(self) -> None:
        """After the drain: the fault must have been injected and be over; sampling stops."""
        inject = self._tasks[0]
        if not inject.done():
            at = time.monotonic() - self._t0
            if not self.injected:
                raise RunError(f"fault {self.run.scenario.fault} not injected: the run drained after {at:.1f} s; "
                               "send more messages or at a lower --rate")
            left = self.fault.start_s + self.fault.duration_s - at  # a stop may outlast the drain
            try:
                await asyncio.wait_for(asyncio.shield(inject), max(0.0, left) + self._settle_s())
            except asyncio.CancelledError:
                if not (inject.cancelled() and self.guard is not None):
                    raise  # not the retention guard's doing: someone cancels the run
        self.check()
        await self._stop_samplers()

    async def _stop_samplers(self) -> None:
        """End the sampling tasks: a flag their loops check, then a cancel, and a bounded wait.
        Cancelling alone is not enough: ``asyncio.wait_for`` on Python 3.11 can swallow a cancel
        that arrives as its inner await completes, and a sampler that swallowed one samples on
        (a CI run waited 10 min on a RabbitMQ backlog sampler). Whatever is still running after
        :data:`SAMPLER_STOP_S` is cancelled once more and left behind, with a warning."""
        self.sampling = False
        tasks = [t for t in self._tasks[1:] if not t.done()]
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=SAMPLER_STOP_S)
        for task in pending:
            log.warning("fault: sampler %s did not stop within %.0f s; left cancelled", task.get_name(), SAMPLER_STOP_S)
            task.cancel()
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a sampler's own error was logged by it

    def _settle_s(self) -> float:
        """How long an injection may still take once the drain is over."""
        if self.fault.kind == "slot-invalidation":  # switches, catch-up, checkpoint, the reader's exit
            return INVALIDATE_TIMEOUT_S + READER_EXIT_S + 20.0
        if self.fault.kind == "postgres-failover":
            return FAILOVER_SETTLE_S
        return RESUME_WAIT_S

    def restore(self) -> None:
        """SIGCONT every process this fault stopped, cancel what is pending, reset a lowered keep
        size; never raises."""
        for task in self._tasks:
            task.cancel()
        if self._backlog_reader is not None:  # its task's own finally may not run before the cleanup
            self._backlog_reader.close()
        self._continue_stopped()
        if self._keep_set:
            try:
                with psycopg.connect(self.run.settings.pg_dsn, autocommit=True, connect_timeout=10) as conn:
                    _reset_keep(conn)
                self._keep_set = False
                self._event("keep size reset by cleanup")
            except psycopg.Error as exc:  # the stack's next start strips it (lab.stack.postgres)
                log.error("could not reset %s after the fault: %s", KEEP_GUC, exc)

    def _continue_stopped(self, why: str = "continued by cleanup") -> None:
        continued = []
        for p in list(self.stopped):
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGCONT)
                continued.append(p.pid)
            self.stopped.remove(p)
        if continued:  # the run ended (failed, interrupted, guard) while the fault held them stopped
            self._event(why, pids=continued)
        for name in list(self.down):  # stopped by the fault, never started again
            try:  # its stop may still be under way in a thread: finish it, then start
                self.run.stack.stop_service(name)
                self.run.stack.start_service(name)
                self._event("started by cleanup", service=name)
            except Exception as exc:  # the run's error says the rest; this must be seen
                log.error("fault cleanup: could not start %s again: %s", name, exc)
                self._event("start by cleanup failed", service=name, error=str(exc))
            self.down.remove(name)

    def _event(self, what: str, *, at_mono: float | None = None, at: float | None = None, **info: Any) -> None:
        """Record an event now, or at the given monotonic and wall times (both or neither)."""
        mono, wall = (time.monotonic(), time.time()) if at_mono is None else (at_mono, at)
        event = {"what": what, "t_s": round(mono - self._t0, 3), "at": wall, **info}
        self.events.append(event)
        log.info("fault: %s %s", what, info)

    async def _inject(self) -> None:
        f = self.fault
        await asyncio.sleep(max(0.0, self._t0 + f.start_s - time.monotonic()))
        self.injected = True
        if f.kind == "consumer-kill":
            await self._kill_consumer(f.target)
        elif f.kind == "consumer-dead":
            await self._stop([f.target], f.duration_s)
        elif f.kind == "sink-outage":
            await self._stop(list(range(len(self.run.consumers))), f.duration_s)
        elif f.kind == "walsender-kill":
            await self._kill_walsender()
        elif f.kind == "consumer-slow":
            await self._slow(f.target, f.duration_s)
        elif f.kind == "slot-invalidation":
            await self._invalidate(f.target, f.keep_mb)
        elif f.kind == "debezium-kill":
            await self._kill_debezium()
        elif f.kind == "broker-restart":
            await self._restart(self.run.pipeline.cdc_sink, f.duration_s)
        elif f.kind == "postgres-restart":
            await self._restart("postgres", f.duration_s)
        elif f.kind == "big-transaction":
            await self._big_transaction(f.rows)
        elif f.kind == "broker-node-kill":
            await self._kill_node(f"{self.run.pipeline.cdc_sink}-{f.target}", f.duration_s)
        elif f.kind == "postgres-failover":
            await self._failover(f.mode)
        else:  # pragma: no cover - Scenario validates the kind
            raise RunError(f"unknown fault kind {f.kind}")
        self.over_mono = time.monotonic()


    def window(self) -> tuple[float, float]:
        """(start, end) of the fault in seconds after the gate, from its events."""
        times = [e["t_s"] for e in self.events]
        return (min(times), max(times)) if times else (self.fault.start_s, self.fault.start_s)
