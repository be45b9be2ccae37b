"""The faults of services, a part of :class:`lab.runner.faults.FaultInjector`:
``walsender-kill``, ``debezium-kill``, ``broker-restart`` and ``postgres-restart``,
``broker-node-kill`` and ``postgres-failover``, and the supervision that replaces a consumer
which exits while a service it used restarts (the module docstring of :mod:`lab.runner.faults`
says what each does).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg

from lab.measure.cgroups import tree_pids
from lab.pipelines.wal import slot_name
from lab.runner.processes import RunError
from lab.stack.debezium import SLOT, START_TIMEOUT
from lab.stack.postgres import STOP_TIMEOUT
from lab.stack.proc import tied
from lab.stack.standby import PROMOTE_TIMEOUT

log = logging.getLogger(__name__)
RESUME_WAIT_S = 60.0  # a terminated walsender's client should be back well within this
HELD_S = 2.0  # a slot is held again once one walsender has held it this long
HOLDER_SQL = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s"
SYNC_WAIT_S = 60.0  # postgres-failover: the failover slots' synced copies on the standby, within this
# postgres-failover: the primary's stop (a fast shutdown that outlasts its timeout is killed) and
# the promotion, each within these; the cleanup waits as long for them before it fails back
FAILOVER_THREAD_S = STOP_TIMEOUT + 5.0 + PROMOTE_TIMEOUT
# how long a failover may still take once the drain is over: the slots' sync, the stop and the
# promotion, Debezium's start on the new primary and its slot held again
FAILOVER_SETTLE_S = SYNC_WAIT_S + FAILOVER_THREAD_S + START_TIMEOUT + RESUME_WAIT_S


class ServiceFaults:
    """Walsender, Debezium, restarts, node kills, the failover: a part of
    :class:`lab.runner.faults.FaultInjector`."""

    run: Any
    _event: Callable[..., None]  # FaultInjector._event
    _replace: Callable[[int], Coroutine[Any, Any, None]]  # ProcessFaults._replace
    fault: Any
    down: list[str]
    failed_over: bool
    _failing_over: bool
    _failover_thread: asyncio.Future[dict[str, float]] | None
    _supervising: bool
    _tasks: list[asyncio.Task[None]]

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
                while self.down or self._failing_over:  # noqa: ASYNC110 -- a replacement could not connect yet
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
        t0 = time.monotonic()
        await asyncio.to_thread(stop, name)
        self._event("service stopped", service=name, stop_s=round(time.monotonic() - t0, 3))
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
        """``broker-node-kill``: SIGKILL one node of the ha broker, start it again after
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
        """``postgres-failover``: once every failover slot has its synced copy on the
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
            self.failed_over = True  # from here on the cleanup fails back, whatever happens next
            # a future of its own: the cleanup waits for the thread even when this task is cancelled
            self._failover_thread = asyncio.get_running_loop().run_in_executor(
                None, functools.partial(self._native("fail_over"), immediate=mode == "immediate"))
            times = await asyncio.shield(self._failover_thread)
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
        thread = self._failover_thread
        if thread is not None and not thread.done():  # the run ended while the stop or promotion ran
            log.warning("waiting up to %.0f s for the failover under way to end before failing back", FAILOVER_THREAD_S)
            await asyncio.wait({thread}, timeout=FAILOVER_THREAD_S)
        if thread is not None and thread.done() and not thread.cancelled():
            thread.exception()  # retrieved: the run recorded or logged it
        try:
            await asyncio.to_thread(self.run.stack.fail_back)
            self.failed_over = False
        except Exception as exc:  # the next `lab stack up` tries again (NativeStack.up)
            log.error("could not fail back after postgres-failover: %s: %s", type(exc).__name__, exc)


async def _holder(conn: psycopg.AsyncConnection[Any], slot: str) -> int | None:
    row = await (await conn.execute(HOLDER_SQL, (slot,))).fetchone()
    return row[0] if row else None
