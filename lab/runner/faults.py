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
(``- confirmed_flush_lsn``), ``wal_status``, ``safe_wal_size`` and whether a walsender holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from typing import Any

import psutil
import psycopg

from lab.measure.cgroups import tree_pids
from lab.pipelines.wal import slot_name
from lab.runner.processes import RunError
from lab.stack import children
from lab.stack.debezium import DURABLE, SLOT
from lab.stack.proc import tied
from lab.workload.web import INSERT

log = logging.getLogger(__name__)
WAL_SAMPLE_S = 1.0
RESUME_WAIT_S = 60.0  # a terminated walsender's client should be back well within this
HELD_S = 2.0  # a slot is held again once one walsender has held it this long
SLOT_SQL = (
    "SELECT slot_name, pg_current_wal_lsn() - restart_lsn, pg_current_wal_lsn() - confirmed_flush_lsn, "
    "wal_status, safe_wal_size, active_pid FROM pg_replication_slots WHERE slot_type = 'logical' ORDER BY 1"
)
HOLDER_SQL = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s"


class FaultInjector:
    """The fault of one run (a helper of :class:`lab.runner.Run`, which it drives)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.fault = run.scenario.parsed_fault
        self.events: list[dict[str, Any]] = []
        self.stopped: list[psutil.Process] = []
        self.wal: list[dict[str, Any]] = []
        self.injected = False
        self.down: list[str] = []  # services this fault stopped and has not started again
        self.extra_ids: list[int] = []  # big-transaction: the ids of its rows, once committed
        self._supervising = False  # a restart replaces consumers that exit (see _supervise)
        self.over_mono = 0.0  # when the injection ended (resumed, replaced, reconnected)
        self._t0 = 0.0
        self._tasks: list[asyncio.Task[None]] = []

    # driving ---------------------------------------------------------------------------------
    def start(self, gate_mono: float) -> None:
        """Called when the senders' gate opens: schedule the fault and the WAL sampling."""
        self._t0 = gate_mono
        self._tasks = [asyncio.create_task(self._inject(), name="fault"),
                       asyncio.create_task(self.watch_wal(), name="fault-wal")]

    def check(self) -> None:
        """Raise the injection's error, if it failed (the drain loop calls this)."""
        for task in self._tasks:  # the injection, and a restart's supervision
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RunError(f"fault {self.run.scenario.fault}: {task.exception()}")

    def holds_drain(self) -> bool:
        """The drain must wait for the injection (a big transaction's rows are not known yet)."""
        return self.fault.kind == "big-transaction" and not self.over()

    def over(self) -> bool:
        """The fault was injected and its injection has ended (resumed, replaced, reconnected)."""
        return self.injected and bool(self._tasks) and self._tasks[0].done()

    def record(self, accounting: dict[str, Any] | None) -> dict[str, Any]:
        """The ``fault`` block of run.json."""
        start, end = self.window()
        return {
            "spec": self.run.scenario.fault, **self.fault.as_dict(),
            "slot": self.slot() if self.fault.kind == "walsender-kill" else None,
            # a fault run's Debezium properties beyond method.md §1.5 (lab.stack.debezium.DURABLE)
            "debezium_properties": DURABLE if self.run.pipeline.cdc_sink else None,
            "extra_rows": len(self.extra_ids),
            "events": self.events, "accounting": accounting,
            "wal": self.wal, "wal_summary": wal_summary(self.wal, start, end),
        }

    async def finish(self) -> None:
        """After the drain: the fault must have been injected and be over; sampling stops."""
        inject = self._tasks[0]
        if not inject.done():
            at = time.monotonic() - self._t0
            if not self.injected:
                raise RunError(f"fault {self.run.scenario.fault} not injected: the run drained after {at:.1f} s; "
                               "send more messages or at a lower --rate")
            left = self.fault.start_s + self.fault.duration_s - at  # a stop may outlast the drain
            await asyncio.wait_for(asyncio.shield(inject), max(0.0, left) + RESUME_WAIT_S)
        self.check()
        for task in self._tasks[1:]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def restore(self) -> None:
        """SIGCONT every process this fault stopped, cancel what is pending; never raises."""
        for task in self._tasks:
            task.cancel()
        continued = []
        for p in list(self.stopped):
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGCONT)
                continued.append(p.pid)
            self.stopped.remove(p)
        if continued:  # the run ended (failed, interrupted) while the fault held them stopped
            self._event("continued by cleanup", pids=continued)
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
        elif f.kind == "debezium-kill":
            await self._kill_debezium()
        elif f.kind == "broker-restart":
            await self._restart(self.run.pipeline.cdc_sink, f.duration_s)
        elif f.kind == "postgres-restart":
            await self._restart("postgres", f.duration_s)
        elif f.kind == "big-transaction":
            await self._big_transaction(f.rows)
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
        while True:
            while self.down:  # a replacement could not connect before the service is back
                await asyncio.sleep(0.1)
            if sink is not None and not run.stack.debezium[sink].processes():
                self._event("debezium exited", sink=sink)
                await self._start_debezium_again()
                self._event("debezium restarted by the lab", sink=sink)
            for i, c in enumerate(run.consumers):
                if i not in run.respawning and c.poll() is not None:
                    error = None
                    with contextlib.suppress(OSError, ValueError):
                        error = json.loads((run.scratch / f"consumer-{i}.json").read_text()).get("error")
                    self._event("consumer exited", consumer=i, pid=c.pid, code=c.returncode, error=error)
                    await self._replace(i)
            await asyncio.sleep(0.1)

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

    async def _big_transaction(self, rows: int) -> None:
        """``rows`` executions of the web service's INSERT in one transaction (pipelined)."""
        async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn) as conn:
            self._event("big transaction begins", rows=rows)
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(INSERT, [("helloworld",)] * rows, returning=True)
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
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn, autocommit=True) as conn:
                    while True:
                        t = round(time.monotonic() - self._t0, 3)
                        rows = await (await conn.execute(SLOT_SQL)).fetchall()
                        for name, retained, unconfirmed, status, safe, holder in rows:
                            self.wal.append({"t_s": t, "slot": name, "retained_bytes": _int(retained),
                                             "unconfirmed_bytes": _int(unconfirmed), "wal_status": status,
                                             "safe_wal_size": _int(safe), "active": holder is not None})
                        await asyncio.sleep(WAL_SAMPLE_S)
            except psycopg.Error as exc:  # informative: never fails the run
                if self.fault.kind != "postgres-restart":
                    log.warning("WAL sampling stopped: %s", exc)
                    return
                await asyncio.sleep(WAL_SAMPLE_S)  # sample again once PostgreSQL is back

    def window(self) -> tuple[float, float]:
        """(start, end) of the fault in seconds after the gate, from its events."""
        times = [e["t_s"] for e in self.events]
        return (min(times), max(times)) if times else (self.fault.start_s, self.fault.start_s)


async def _holder(conn: psycopg.AsyncConnection[Any], slot: str) -> int | None:
    row = await (await conn.execute(HOLDER_SQL, (slot,))).fetchone()
    return row[0] if row else None


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def wal_summary(samples: list[dict[str, Any]], fault_start: float, fault_end: float) -> dict[str, Any]:
    """Per slot: peak WAL retained and unconfirmed, the ``wal_status`` values seen, and the seconds
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
        }
    return out
