"""Fault injection (issue 14): one ``Scenario.fault``, injected at START after the senders' gate.

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
* ``broker-node-kill`` (``ha`` only, issue 15): SIGKILL one node of the three-node broker, wait
  DURATION, start it again through its cluster and wait until all three serve together; the
  same supervision as a restart. Its resume figure is the longest stop of delivery after the kill.
* ``postgres-failover`` (``ha`` only, issue 15): wait until every failover slot is synced on the
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

While the fault run drains, :meth:`FaultInjector.watch_wal` samples every logical slot once a
second: WAL retained (``pg_current_wal_lsn() - restart_lsn``), not yet confirmed
(``- confirmed_flush_lsn``), ``wal_status``, ``safe_wal_size``, whether a walsender holds it, and
what its decoding spilled to disk (``spill_txns``, ``spill_bytes`` of ``pg_stat_replication_slots``).
With a broker, :meth:`FaultInjector.watch_backlog` samples the broker's backlog once a second too
(:mod:`lab.pipelines.backlog`: the Kafka group's lag, the quorum queue's ready + unacknowledged);
a reading that fails while the broker restarts is a gap (``backlog_gaps``), never a failure.
After the run, :meth:`FaultInjector.analysis` adds the per-consumer lag, the before / during /
after phases (rate, CPU per message per participant, latency) and the recovery time
(:mod:`lab.measure.recovery`, which defines them) from the arrivals and ``created_at``.

Retention guard (issue 14, Safety): each sample also checks every slot against
``Settings.max_retained_wal`` (``LAB_MAX_RETAINED_WAL``, ``lab run --max-retained-wal``, default
2 GB). A slot whose retained WAL plus three times its growth over the last second reaches the
limit trips it: the fault is ended at once (its task cancelled, every stopped process continued, a
lowered keep size restored), the senders are killed (the load is what writes the WAL) and the run
fails with one line naming the slot, the bytes and the limit; its cleanup drops the slots. The
projection is what keeps the slots below the limit although sampling is once a second.

``slot-invalidation`` (a direct reader's slot; ``=KEEP``, default 32 MB): SIGSTOP reader I, set
``max_slot_wal_keep_size`` to KEEP with ``ALTER SYSTEM`` + ``pg_reload_conf()`` (the lab's
PostgreSQL reads that flag from a file, :data:`lab.stack.postgres.RELOADABLE`), then push the
current WAL position past the slot's reserve. Writing KEEP of rows would take minutes at a
fixed rate, so the lab closes WAL segments instead: a one-row ``pg_logical_emit_message``
(non-transactional, ignored by pgoutput without ``messages``) and ``pg_switch_wal()``, repeated
until slot I retains KEEP + 2 segments, each costing one new segment file (16 MB of disk
writes). The other readers' slots keep up, but a logical slot's ``restart_lsn`` only moves at a
running-transactions record: ``pg_log_standby_snapshot()`` writes one and the lab waits until
every other slot retains less than half of KEEP, so the ``CHECKPOINT`` that follows invalidates
slot I alone (``wal_status`` 'lost', ``invalidation_reason`` 'wal_removed'; the checkpointer
also terminates its walsender). The keep size is then reset (``ALTER SYSTEM RESET``, reload;
:meth:`FaultInjector.restore` does it too when the run fails), the reader continued: it finds
its stream gone, cannot start its slot again ("can no longer get changes from replication
slot") and exits. The runner expects that exit (``Run.ended``) and reports the invalidation in
one loud line and in run.json (``fault.invalidation``); the accounting counts what no reader
worked (``lost``, their ids in ``lost_ids``), all of it the invalidated slot's: with ``wal``
(fan-out) the other readers see every row, so the loss is 0 unless the reader was alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

from lab.measure import cgroups, recovery
from lab.measure.cgroups import tree_pids
from lab.measure.sampler import Snapshot
from lab.pipelines.backlog import reader_for
from lab.pipelines.wal import slot_name
from lab.runner.processes import RunError
from lab.stack import children
from lab.stack.debezium import DURABLE, SLOT
from lab.stack.proc import tied
from lab.workload.web import INSERT_QUERY

log = logging.getLogger(__name__)
WAL_SAMPLE_S = 1.0
BACKLOG_SAMPLE_S = 1.0  # the broker's backlog (lab.pipelines.backlog); 0 turns it off (cost measurement)
RESUME_WAIT_S = 60.0  # a terminated walsender's client should be back well within this
HELD_S = 2.0  # a slot is held again once one walsender has held it this long
SLOT_SQL = (
    "SELECT r.slot_name, pg_current_wal_lsn() - r.restart_lsn, pg_current_wal_lsn() - r.confirmed_flush_lsn, "
    "r.wal_status, r.safe_wal_size, r.active_pid, s.spill_txns, s.spill_bytes "
    "FROM pg_replication_slots r LEFT JOIN pg_stat_replication_slots s USING (slot_name) "
    "WHERE r.slot_type = 'logical' ORDER BY 1"
)
HOLDER_SQL = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s"
KEEP_GUC = "max_slot_wal_keep_size"
INVALIDATION_SQL = (
    "SELECT wal_status, invalidation_reason, confirmed_flush_lsn::text, "
    "pg_current_wal_lsn() - confirmed_flush_lsn, pg_current_wal_lsn() - restart_lsn "
    "FROM pg_replication_slots WHERE slot_name = %s"
)
INVALIDATE_TIMEOUT_S = 120.0  # switches, the other slots catching up, the checkpoint
READER_EXIT_S = 120.0  # a continued reader finds its slot lost and exits within this (47 s seen under load)
GUARD_GROWTH_SAMPLES = 3.0  # trip when retained + this many seconds of growth reach the limit
SAMPLER_STOP_S = 10.0  # finish() waits this long for the samplers to end
SYNC_WAIT_S = 60.0  # postgres-failover: the failover slots' synced copies on the standby, within this


def check_topology(scenario: Any, settings: Any) -> None:
    """ValueError (one line, before anything starts) when the fault needs the other topology."""
    f = scenario.parsed_fault
    if f is not None and f.kind == "broker-node-kill" and not settings.ha:
        raise ValueError(f"fault {scenario.fault}: broker-node-kill needs the ha topology (--topology ha): "
                         "a single broker has no other node to fail over to (broker-restart restarts it)")
    if f is not None and f.kind == "postgres-failover" and not settings.ha:
        raise ValueError(f"fault {scenario.fault}: postgres-failover needs the ha topology (--topology ha): "
                         "the single topology has no standby to promote (postgres-restart restarts it)")


class FaultInjector:
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
        self.failed_over = False  # the standby was promoted: the cleanup fails back (fail_back)
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
            self._backlog_reader = reader_for(self.run) if BACKLOG_SAMPLE_S else None
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
            # a fault run's Debezium properties beyond method.md §1.5 (lab.stack.debezium.DURABLE)
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
        """``consumer_lag``, ``phases``, ``recovery_s`` and the pre-fault ``bands`` it used
        (:mod:`lab.measure.recovery`), from the arrivals and ``created_at``; all None when those
        were not read (the run failed before its verification). Never raises: a failure is logged."""
        out: dict[str, Any] = dict.fromkeys(("consumer_lag", "phases", "recovery_s", "recovery_bands"))
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

    # the faults ------------------------------------------------------------------------------
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

    async def _kill_consumer(self, i: int) -> None:
        run = self.run
        old = run.consumers[i]
        run.respawning.add(i)
        old.kill()
        self._event("kill", consumer=i, pid=old.pid)
        await asyncio.to_thread(old.wait, 10)
        await self._replace(i)

    async def _replace(self, i: int) -> None:
        """Start a replacement for consumer ``i``, which has exited, and wait until it is ready."""
        run = self.run
        run.respawning.add(i)
        children.forget(run.settings, [run.consumers[i]])
        (run.scratch / f"consumer-{i}.ready").unlink(missing_ok=True)
        new = run.spawn_consumer([i])  # on the loop's thread: it dies with this one
        run.consumers[i] = new
        run.attach_consumer(i, new)
        self._event("replacement started", consumer=i, pid=new.pid)
        deadline = time.monotonic() + run.scenario.ready_timeout_s
        while not (run.scratch / f"consumer-{i}.ready").exists():
            if new.poll() is not None:
                raise RunError(f"replacement consumer {i} exited with {new.returncode}")
            if time.monotonic() > deadline:
                raise RunError(f"replacement consumer {i} not ready after {run.scenario.ready_timeout_s:.0f} s")
            await asyncio.sleep(0.05)
        run.respawning.discard(i)
        self._event("replacement ready", consumer=i, pid=new.pid)

    async def _stop(self, indexes: list[int], duration: float) -> None:
        procs = [self.run.consumers[i] for i in indexes]
        try:
            for p in procs:
                self.stopped.append(p)
                p.send_signal(signal.SIGSTOP)
            self._event("stop", consumers=indexes, pids=[p.pid for p in procs])
            await asyncio.sleep(duration)
        finally:
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGCONT)
                with contextlib.suppress(ValueError):
                    self.stopped.remove(p)
        self._event("resume", consumers=indexes)

    async def _slow(self, i: int, duration: float) -> None:
        proc = self.run.consumers[i]
        try:
            proc.send_signal(signal.SIGUSR1)
            self._event("slow", consumer=i, extra_s=self.fault.extra_s)
            await asyncio.sleep(duration)
        finally:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGUSR2)
        self._event("normal", consumer=i)

    async def _invalidate(self, i: int, keep_mb: int) -> None:
        """``slot-invalidation`` (module docstring): stop reader ``i``, lower the keep size, push
        the WAL past it until the server invalidates its slot, reset the keep size, continue the
        reader and wait until it exits, having found its slot lost."""
        run, slot = self.run, slot_name(i)
        proc = run.consumers[i]
        async with await psycopg.AsyncConnection.connect(run.settings.pg_dsn, autocommit=True) as conn:
            source = await _scalar(conn, "SELECT source FROM pg_settings WHERE name = %s", KEEP_GUC)
            if source == "command line":
                raise RunError(f"{KEEP_GUC} is set on this server's command line, which ALTER SYSTEM cannot "
                               "override (the compose backend): slot-invalidation needs the native stack")
            before = await _scalar(conn, sql.SQL("SHOW {}").format(sql.Identifier(KEEP_GUC)))
            segment = int(await _scalar(conn, "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'"))
            if keep_mb * 2**20 + 3 * segment >= run.settings.max_retained_wal:
                raise RunError(f"slot-invalidation={keep_mb}MB makes slot {slot} retain about {keep_mb * 2**20 + 3 * segment} "
                               f"bytes, past the retention guard's limit of {run.settings.max_retained_wal}: "
                               "lower KEEP or raise --max-retained-wal")
            self.stopped.append(proc)
            proc.send_signal(signal.SIGSTOP)
            self._event("stop", consumers=[i], pids=[proc.pid])
            keep = f"{keep_mb}MB"
            self._keep_set = True
            await conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(KEEP_GUC), sql.Literal(keep)))
            await conn.execute("SELECT pg_reload_conf()")
            await self._until(conn, sql.SQL("SELECT current_setting({}) = {}").format(
                sql.Literal(KEEP_GUC), sql.Literal(keep)), f"{KEEP_GUC} = {keep} after the reload")
            self._event("keep size set", keep_size=keep, was=before)
            deadline = time.monotonic() + INVALIDATE_TIMEOUT_S
            switches, state = 0, None
            while True:
                state = await (await conn.execute(INVALIDATION_SQL, (slot,))).fetchone()
                if state is None:
                    raise RunError(f"slot {slot} vanished during slot-invalidation")
                if state[1] is not None:  # invalidation_reason: the server let go of its WAL
                    break
                if time.monotonic() > deadline:
                    raise RunError(f"slot {slot} not invalidated {INVALIDATE_TIMEOUT_S:.0f} s after "
                                   f"{switches} WAL switches (wal_status {state[0]})")
                if (state[4] or 0) < keep_mb * 2**20 + 2 * segment:
                    await conn.execute("SELECT pg_logical_emit_message(false, 'fanout-lab', 'wal switch')")
                    await conn.execute("SELECT pg_switch_wal()")
                    switches += 1
                    continue
                await self._others_caught_up(conn, slot, keep_mb * 2**20 // 2, deadline)
                await conn.execute("CHECKPOINT")
                await asyncio.sleep(0.2)
            status, reason, confirmed, unconfirmed, _ = state
            self.invalidation = {
                "slot": slot, "consumer": i, "wal_status": status, "invalidation_reason": reason,
                "keep_size": keep, "keep_size_before": before, "wal_switches": switches,
                "confirmed_flush_lsn": confirmed, "unconfirmed_bytes": _int(unconfirmed),
                "t_s": round(time.monotonic() - self._t0, 3), "at": time.time(),
            }
            log.error("SLOT INVALIDATED: %s (%s, wal_status %s) under %s=%s: reader %d can no longer read it; "
                      "every change after %s (%s bytes) is gone for it",
                      slot, reason, status, KEEP_GUC, keep, i, confirmed, unconfirmed)
            self._event("slot invalidated", slot=slot, wal_status=status, invalidation_reason=reason,
                        confirmed_flush_lsn=confirmed, wal_switches=switches)
            await _reset_keep(conn)
            self._keep_set = False
            self._event("keep size reset", keep_size=before)
        run.ended.add(i)  # its exit is the fault's outcome, not a failure of the run
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGCONT)
        with contextlib.suppress(ValueError):
            self.stopped.remove(proc)
        self._event("resume", consumers=[i])
        try:
            code = await asyncio.to_thread(proc.wait, READER_EXIT_S)
        except psutil.TimeoutExpired:
            proc.kill()
            code = await asyncio.to_thread(proc.wait, 10)
            self.invalidation["reader_error"] = f"still running {READER_EXIT_S:.0f} s after its slot was lost: killed"
        else:
            self.invalidation["reader_error"] = _reader_error(run.scratch / f"consumer-{i}.json")
        self.invalidation["reader_exit_code"] = code
        self._event("reader exited", consumer=i, code=code, error=self.invalidation["reader_error"])

    async def _others_caught_up(self, conn: psycopg.AsyncConnection[Any], slot: str, below: int,
                                deadline: float) -> None:
        """Log running transactions until every other slot retains less than ``below`` bytes (a
        logical slot's restart point only moves at such a record), so the checkpoint spares them."""
        while True:
            await conn.execute("SELECT pg_log_standby_snapshot()")
            rows = await (await conn.execute(
                "SELECT slot_name, pg_current_wal_lsn() - restart_lsn FROM pg_replication_slots "
                "WHERE slot_name <> %s AND restart_lsn IS NOT NULL", (slot,))).fetchall()
            behind = {name: int(b) for name, b in rows if b is not None and b >= below}
            if not behind:
                return
            if time.monotonic() > deadline:
                raise RunError(f"the other slots did not catch up before the checkpoint: {behind} bytes retained")
            await asyncio.sleep(0.5)

    async def _until(self, conn: psycopg.AsyncConnection[Any], query: Any, what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not await _scalar(conn, query):
            if time.monotonic() > deadline:
                raise RunError(f"no {what} within {timeout:.0f} s")
            await asyncio.sleep(0.05)

    def slot(self) -> str:
        """The slot whose walsender ``walsender-kill`` terminates."""
        pipeline = self.run.pipeline
        if pipeline.cdc_sink is not None:
            return SLOT[pipeline.cdc_sink]
        return slot_name(self.fault.target)

    async def _kill_walsender(self) -> None:
        slot, dsn = self.slot(), self.run.settings.pg_dsn
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            pid = await _holder(conn, slot)
            if pid is None:
                raise RunError(f"slot {slot} has no walsender to terminate")
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            self._event("walsender terminated", slot=slot, pid=pid)
            await self._held_again(conn, slot, pid, "its walsender was terminated")

    async def _held_again(self, conn: psycopg.AsyncConnection[Any], slot: str, old: int | None, after: str) -> None:
        """Wait until a walsender other than ``old`` holds ``slot`` for :data:`HELD_S` in a row
        (Debezium holds it for a moment while it searches its resume position, lets go, and may
        retry 10 s later), then record ``slot held again`` at the start of that hold."""
        deadline = time.monotonic() + RESUME_WAIT_S
        since: tuple[int, float, float] | None = None  # (pid, monotonic, wall) of the current hold
        while True:
            now = await _holder(conn, slot)
            if now in (None, old):
                since = None
            elif since is None or since[0] != now:
                since = (now, time.monotonic(), time.time())
            elif time.monotonic() - since[1] >= HELD_S:
                break
            if time.monotonic() > deadline:
                raise RunError(f"slot {slot} not held again {RESUME_WAIT_S:.0f} s after {after}")
            await asyncio.sleep(0.05)
        self._event("slot held again", slot=slot, pid=since[0], at_mono=since[1], at=since[2])

    def _native(self, method: str) -> Any:
        found = getattr(self.run.stack, method, None)
        if found is None:
            raise RunError(f"fault {self.fault.kind} needs LAB_BACKEND=native (the stack has no {method})")
        return found

    def _attach(self, participant: str) -> None:
        """Move a restarted service's process trees into its participant's cgroup, if it has one."""
        group = getattr(self.run, "service_cgroups", {}).get(participant)
        if group is None:
            return
        roots = self.run.stack.participants().get(participant, [])
        group.attach(pid for r in roots for pid in tree_pids(r.pid))

    async def _start_debezium_again(self) -> None:
        sink = self.run.pipeline.cdc_sink
        with tied():  # like the run's first Debezium: it dies with the runner
            await asyncio.to_thread(self._native("start_debezium"), sink, durable=True, resume=True)
        self._attach("debezium")

    async def _kill_debezium(self) -> None:
        sink = self.run.pipeline.cdc_sink
        pid = await asyncio.to_thread(self._native("kill_debezium"), sink)
        if pid is None:
            raise RunError(f"no Debezium Server ({sink}) to kill")
        self._event("debezium killed", sink=sink, pid=pid)
        await self._start_debezium_again()
        service = self.run.stack.debezium[sink]
        self._event("debezium restarted", sink=sink, pid=[p.pid for p in service.processes()],
                    start_to_streaming_s=service.last_start_s)
        async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
            await self._held_again(conn, SLOT[sink], None, "Debezium was restarted")

    def supervises(self, i: int) -> bool:
        """Whether an exit of consumer ``i`` is this fault's business (a restart's supervision)."""
        return self._supervising

    async def _supervise(self) -> None:
        """From a service's stop to the end of the drain, replace every consumer that exits (its
        connection to the restarted service broke), and start Debezium again from its offsets
        if its JVM exits, as a process supervisor would; each exit and restart is an event."""
        run, sink = self.run, self.run.pipeline.cdc_sink
        # Replacements start at once and wait for readiness side by side: after a PostgreSQL
        # restart every consumer exits, and a wal-sharded replacement is only ready once all N
        # have joined again, so waiting for each in turn would never end.
        replacing: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                while self.down or self._failing_over:  # a replacement could not connect yet
                    await asyncio.sleep(0.1)
                if sink is not None and not run.stack.debezium[sink].processes():
                    self._event("debezium exited", sink=sink)
                    await self._start_debezium_again()
                    self._event("debezium restarted by the lab", sink=sink)
                for i, task in list(replacing.items()):
                    if task.done():
                        del replacing[i]
                        task.result()  # a replacement that never got ready fails the run
                for i, c in enumerate(run.consumers):
                    if i not in run.respawning and i not in replacing and c.poll() is not None:
                        error = None
                        with contextlib.suppress(OSError, ValueError):
                            error = json.loads((run.scratch / f"consumer-{i}.json").read_text()).get("error")
                        self._event("consumer exited", consumer=i, pid=c.pid, code=c.returncode, error=error)
                        run.respawning.add(i)
                        replacing[i] = asyncio.create_task(self._replace(i), name=f"fault-replace-{i}")
                await asyncio.sleep(0.1)
        finally:
            for task in replacing.values():
                task.cancel()

    async def _restart(self, name: str, outage_s: float) -> None:
        stop, start = self._native("stop_service"), self._native("start_service")
        self._supervising = True
        self._tasks.append(asyncio.create_task(self._supervise(), name="fault-supervise"))
        self.down.append(name)
        await asyncio.to_thread(stop, name)
        self._event("service stopped", service=name)
        await asyncio.sleep(outage_s)
        await asyncio.to_thread(start, name)
        self.down.remove(name)
        self._attach(name)
        self._event("service started", service=name)
        sink = self.run.pipeline.cdc_sink
        if sink is None or name != "postgres":  # a broker restart leaves Debezium's source side alone
            return
        # Debezium's connections broke: it restarts its task after a retriable error (or its JVM
        # exits, and the supervision starts it again); resumed once it holds its slot again
        async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
            await self._held_again(conn, SLOT[sink], None, f"{name} started")

    async def _kill_node(self, name: str, outage_s: float) -> None:
        """``broker-node-kill`` (issue 15): SIGKILL one node of the ha broker, start it again after
        ``outage_s``. The other two hold a majority (Kafka's ISR of 2 with ``min.insync.replicas``
        2; RabbitMQ's quorum queue elects a leader among them): a client that lost its node
        reconnects, and one that exits is replaced once the node is back, as after a restart."""
        start = self._native("start_service")
        self._supervising = True
        self._tasks.append(asyncio.create_task(self._supervise(), name="fault-supervise"))
        self.down.append(name)
        pids = await asyncio.to_thread(self._native("kill_node"), name)
        self._event("node killed", node=name, pids=pids)
        await asyncio.sleep(outage_s)
        await asyncio.to_thread(start, name)
        self.down.remove(name)
        self._attach(name)
        self._event("node started", node=name, pid=[p.pid for p in self.run.stack.service(name).processes()[:1]])

    async def _failover(self, mode: str) -> None:
        """``postgres-failover`` (issue 15): once every failover slot has its synced copy on the
        standby (a slot not synced yet would not survive: the wait is recorded), stop the
        primary (``immediate``: a crash; ``fast``: a switchover) and promote the standby.
        The direct readers, the consumers' claim connections, the web service's pool and this
        runner find the new primary through the DSN's host list (a consumer that exits is
        replaced, as after a restart); Debezium, which takes one host, is killed and started
        again pointed at the new primary, from its synced slot and its offsets. The cleanup
        fails back (:meth:`fail_back`)."""
        stack = self.run.stack
        standby = getattr(stack, "standby", None)
        if standby is None:
            raise RunError("postgres-failover needs the ha topology's standby")
        waited, copies = await self._slots_synced(standby)
        self._event("slots synced on the standby", waited_s=waited, slots=copies)
        self._supervising = True
        self._failing_over = True
        self._tasks.append(asyncio.create_task(self._supervise(), name="fault-supervise"))
        sink = self.run.pipeline.cdc_sink
        try:
            self._event("primary stopping", mode=mode)
            times = await asyncio.to_thread(self._native("fail_over"), immediate=mode == "immediate")
            self.failed_over = True
            self._event("standby promoted", **times, slots=await asyncio.to_thread(standby.slots))
            if sink is not None:  # its JVM retries the old primary's one address: move it
                stack.move_debezium(sink, standby.port)
                pid = await asyncio.to_thread(self._native("kill_debezium"), sink)
                self._event("debezium stopped to move", sink=sink, pid=pid)
                await self._start_debezium_again()
                service = stack.debezium[sink]
                self._event("debezium started on the new primary", sink=sink,
                            pid=[p.pid for p in service.processes()], start_to_streaming_s=service.last_start_s)
        finally:
            self._failing_over = False
        if sink is not None:
            async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
                await self._held_again(conn, SLOT[sink], None, "Debezium was moved")

    async def _slots_synced(self, standby: Any) -> tuple[float, list[dict[str, Any]]]:
        """Wait until every failover slot of the primary has a synced, persistent copy on the
        standby; the seconds waited and the copies.

        A slot's first synced copy stays temporary until the primary's slot has moved past the
        standby's own horizon (its ``catalog_xmin`` and ``restart_lsn``; the standby logs "could
        not synchronize replication slot ... could lead to data loss" meanwhile), and a logical
        slot only moves at a running-transactions record, which the primary's background writer
        logs every 15 s, and only while WAL is written. A run's slots are seconds old at the
        fault, so the lab writes such a record once a second while it waits
        (``pg_log_standby_snapshot()``, as for slot-invalidation); a long-lived slot in
        production has long passed that point."""
        t0 = time.monotonic()
        async with await psycopg.AsyncConnection.connect(self.run.settings.pg_primary_dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT slot_name FROM pg_replication_slots WHERE failover ORDER BY 1")
            wanted = {r[0] for r in await cur.fetchall()}
            nudged = 0.0
            while True:
                copies = [c for c in await asyncio.to_thread(standby.slots) if c["slot"] in wanted]
                if {c["slot"] for c in copies if c["synced"] and not c["temporary"]} == wanted:
                    return round(time.monotonic() - t0, 3), copies
                if time.monotonic() - t0 > SYNC_WAIT_S:
                    raise RunError(f"failover slots not synchronised to the standby within {SYNC_WAIT_S:.0f} s "
                                   f"(a promotion now would lose them): {copies}; a new slot needs a few "
                                   "seconds of traffic first (Debezium confirms only the positions of the "
                                   "changes it streamed): inject the fault later, e.g. @20s")
                if time.monotonic() - nudged >= 1.0:
                    await conn.execute("SELECT pg_log_standby_snapshot()")
                    nudged = time.monotonic()
                await asyncio.sleep(0.2)

    async def fail_back(self) -> None:
        """After the run's cleanup: undo a failover (:meth:`lab.stack.native.NativeStack.fail_back`:
        the promoted standby stops, the primary starts, the standby is rebuilt); never raises."""
        if not self.failed_over:
            return
        try:
            await asyncio.to_thread(self.run.stack.fail_back)
            self.failed_over = False
        except Exception as exc:  # the next `lab stack up` tries again (NativeStack.up)
            log.error("could not fail back after postgres-failover: %s: %s", type(exc).__name__, exc)

    async def _big_transaction(self, rows: int) -> None:
        """``rows`` executions of the web service's INSERT in one transaction (pipelined)."""
        async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn) as conn:
            self._event("big transaction begins", rows=rows)
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(INSERT_QUERY, [("helloworld",)] * rows, returning=True)
                ids = []
                while True:
                    ids += [r[0] for r in await cur.fetchall()]
                    if not cur.nextset():
                        break
        self.extra_ids = ids
        self._event("big transaction committed", rows=len(ids), first_id=min(ids), last_id=max(ids))

    # the source during the fault ---------------------------------------------------------------
    async def watch_wal(self) -> None:
        """Sample every logical slot each second into :attr:`wal` until cancelled."""
        while self.sampling:
            try:
                async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
                    while self.sampling:
                        t = round(time.monotonic() - self._t0, 3)
                        rows = await (await conn.execute(SLOT_SQL)).fetchall()
                        for name, retained, unconfirmed, status, safe, holder, spill_txns, spill in rows:
                            self.wal.append({"t_s": t, "slot": name, "retained_bytes": _int(retained),
                                             "unconfirmed_bytes": _int(unconfirmed), "wal_status": status,
                                             "safe_wal_size": _int(safe), "active": holder is not None,
                                             "spill_txns": _int(spill_txns), "spill_bytes": _int(spill)})
                        if self.guard is None:
                            await self._guard(conn, [(r[0], _int(r[1])) for r in rows])
                        await asyncio.sleep(WAL_SAMPLE_S)
            except psycopg.Error as exc:  # informative: never fails the run
                if self.fault.kind not in ("postgres-restart", "postgres-failover"):
                    log.warning("WAL sampling stopped: %s", exc)
                    return
                await asyncio.sleep(WAL_SAMPLE_S)  # sample again once PostgreSQL is back

    async def watch_backlog(self) -> None:
        """Sample the broker's backlog (:mod:`lab.pipelines.backlog`) about once a second into
        :attr:`backlog`, until cancelled; a failed reading is a gap in :attr:`backlog_gaps`. Never
        raises (the drain loop would fail the run on it)."""
        reader = self._backlog_reader
        try:
            while self.sampling:
                for sample in await reader.read():
                    t_s = round(sample.pop("t") - self._t0, 3)
                    if t_s < 0:  # read before the gate (the child started earlier)
                        continue
                    if "error" in sample:
                        self.backlog_gaps.append({"t_s": t_s, "where": reader.where, "error": sample["error"]})
                    else:
                        self.backlog.append({"t_s": t_s, "where": reader.where, **sample})
                await asyncio.sleep(BACKLOG_SAMPLE_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # informative: never fails the run, never silent
            log.warning("backlog sampling stopped: %s: %s", type(exc).__name__, exc)
        finally:
            with contextlib.suppress(Exception):
                await reader.aclose()

    async def _guard(self, conn: psycopg.AsyncConnection[Any], retained: list[tuple[str, int | None]]) -> None:
        """The retention guard (module docstring): trip on the first slot whose retained WAL plus
        :data:`GUARD_GROWTH_SAMPLES` samples of its growth reach ``Settings.max_retained_wal``."""
        limit = self.run.settings.max_retained_wal
        for name, now in retained:
            if now is None:  # invalidated: it retains nothing any more
                continue
            growth = max(0, now - self._last_retained.get(name, now))
            self._last_retained[name] = now
            if now + GUARD_GROWTH_SAMPLES * growth < limit:
                continue
            self.guard = {
                "slot": name, "retained_bytes": now, "growth_bytes_per_sample": growth, "limit_bytes": limit,
                "error": (f"WAL retention guard: slot {name} retains {now} bytes ({now / 2**20:.1f} MB, "
                          f"+{growth} bytes in the last second), too close to the limit of {limit} "
                          f"bytes ({limit / 2**20:.1f} MB; LAB_MAX_RETAINED_WAL, --max-retained-wal): "
                          f"fault {self.run.scenario.fault} ended, run failed"),
            }
            log.error("%s", self.guard["error"])
            self._event("retention guard", slot=name, retained_bytes=now, limit_bytes=limit)
            if self._tasks:  # the injection: its own finally continues what it stopped
                self._tasks[0].cancel()
            self._continue_stopped("continued by the retention guard")
            senders = getattr(self.run, "procs", {}).get("senders")
            if senders is not None and senders.poll() is None:  # the load writes the WAL: end it too
                with contextlib.suppress(psutil.Error):
                    senders.kill()
                self._event("senders killed by the retention guard", pid=senders.pid)
            if self._keep_set:
                await _reset_keep(conn)
                self._keep_set = False
                self._event("keep size reset by the retention guard")
            return

    def window(self) -> tuple[float, float]:
        """(start, end) of the fault in seconds after the gate, from its events."""
        times = [e["t_s"] for e in self.events]
        return (min(times), max(times)) if times else (self.fault.start_s, self.fault.start_s)


def _reset_keep(conn: Any) -> Any:
    """``ALTER SYSTEM RESET max_slot_wal_keep_size`` and a reload, on a sync or an async connection
    (await the result of the latter)."""
    if isinstance(conn, psycopg.AsyncConnection):
        async def reset() -> None:
            await conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(KEEP_GUC)))
            await conn.execute("SELECT pg_reload_conf()")
        return reset()
    conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(KEEP_GUC)))
    conn.execute("SELECT pg_reload_conf()")
    return None


async def _holder(conn: psycopg.AsyncConnection[Any], slot: str) -> int | None:
    row = await (await conn.execute(HOLDER_SQL, (slot,))).fetchone()
    return row[0] if row else None


async def _scalar(conn: psycopg.AsyncConnection[Any], query: Any, *params: Any) -> Any:
    row = await (await conn.execute(query, params or None)).fetchone()
    return row[0] if row else None


def _reader_error(path: Path) -> str | None:
    """The error an ended reader wrote into its result file (None: it wrote none)."""
    try:
        return json.loads(path.read_text()).get("error")
    except (OSError, ValueError):
        return None


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def wal_summary(samples: list[dict[str, Any]], fault_start: float, fault_end: float) -> dict[str, Any]:
    """Per slot: peak WAL retained and unconfirmed, the ``wal_status`` values seen, what logical
    decoding spilled to disk (``spill_txns``, ``spill_bytes``: cumulative counters of
    ``pg_stat_replication_slots``, their last sample), and the seconds
    from the end of the fault until the unconfirmed WAL is back within its pre-fault band (the
    highest value sampled before the fault; None when it never was, or there was no sample before)."""
    out: dict[str, Any] = {}
    for slot in sorted({s["slot"] for s in samples}):
        rows = [s for s in samples if s["slot"] == slot]
        before = [s["unconfirmed_bytes"] or 0 for s in rows if s["t_s"] < fault_start]
        band = max(before) if before else None
        back = next((s["t_s"] for s in rows if s["t_s"] >= fault_end and band is not None
                     and (s["unconfirmed_bytes"] or 0) <= band), None)
        out[slot] = {
            "retained_bytes_max": max((s["retained_bytes"] or 0 for s in rows), default=0),
            "unconfirmed_bytes_max": max((s["unconfirmed_bytes"] or 0 for s in rows), default=0),
            "pre_fault_band_bytes": band,
            "wal_status": sorted({s["wal_status"] for s in rows if s["wal_status"]}),
            "min_safe_wal_size": min((s["safe_wal_size"] for s in rows if s["safe_wal_size"] is not None),
                                     default=None),
            "recovered_after_s": round(back - fault_end, 3) if back is not None else None,
            "spill_txns": max((s.get("spill_txns") or 0 for s in rows), default=0),
            "spill_bytes": max((s.get("spill_bytes") or 0 for s in rows), default=0),
        }
    return out
