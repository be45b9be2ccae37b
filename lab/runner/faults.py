"""Fault injection (issue 14): one ``Scenario.fault``, injected at START after the senders' gate.

* ``consumer-kill``: SIGKILL the consumer process, reap it, start a replacement with the same
  index (its slot, its static Kafka membership, its inbox name) and wait until it is ready.
* ``consumer-dead`` / ``sink-outage``: SIGSTOP one / every consumer process, SIGCONT after
  DURATION. A stopped process is a real stop: no reads, no acks, no heartbeats.
* ``walsender-kill``: ``pg_terminate_backend`` of the walsender holding the slot (a direct
  reader's ``load_test_slot_<i>``, or Debezium's), then wait until the slot is held again.
* ``consumer-slow``: SIGUSR1 switches the consumer's extra time per message on, SIGUSR2 off
  after DURATION (:mod:`lab.consumer` installs both handlers before it is ready).

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
import logging
import signal
import time
from typing import Any

import psutil
import psycopg

from lab.pipelines.wal import slot_name
from lab.runner.processes import RunError
from lab.stack import children
from lab.stack.debezium import SLOT

log = logging.getLogger(__name__)
WAL_SAMPLE_S = 1.0
RESUME_WAIT_S = 60.0  # a terminated walsender's client should be back well within this
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
        task = self._tasks[0] if self._tasks else None
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise RunError(f"fault {self.run.scenario.fault}: {task.exception()}")

    def over(self) -> bool:
        """The fault was injected and its injection has ended (resumed, replaced, reconnected)."""
        return self.injected and bool(self._tasks) and self._tasks[0].done()

    def record(self, accounting: dict[str, Any] | None) -> dict[str, Any]:
        """The ``fault`` block of run.json."""
        start, end = self.window()
        return {
            "spec": self.run.scenario.fault, **self.fault.as_dict(),
            "slot": self.slot() if self.fault.kind == "walsender-kill" else None,
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

    def _event(self, what: str, **info: Any) -> None:
        event = {"what": what, "t_s": round(time.monotonic() - self._t0, 3), "at": time.time(), **info}
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
        else:  # pragma: no cover - Scenario validates the kind
            raise RunError(f"unknown fault kind {f.kind}")

    async def _kill_consumer(self, i: int) -> None:
        run = self.run
        old = run.consumers[i]
        run.respawning.add(i)
        old.kill()
        self._event("kill", consumer=i, pid=old.pid)
        await asyncio.to_thread(old.wait, 10)
        children.forget(run.settings, [old])
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
            deadline = time.monotonic() + RESUME_WAIT_S
            while (now := await _holder(conn, slot)) in (None, pid):
                if time.monotonic() > deadline:
                    raise RunError(f"slot {slot} not held again {RESUME_WAIT_S:.0f} s after "
                                   "its walsender was terminated")
                await asyncio.sleep(0.05)
            self._event("slot held again", slot=slot, pid=now)

    # the source during the fault ---------------------------------------------------------------
    async def watch_wal(self) -> None:
        """Sample every logical slot each second into :attr:`wal` until cancelled."""
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
            log.warning("WAL sampling stopped: %s", exc)

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
