"""``postgres-failover[=MODE]@T`` (the ``ha`` topology): once every failover slot has its synced
copy on the standby, stop the primary (MODE ``immediate``, the default: a crash, what the
asynchronous standby had not received is gone; ``fast``: a fast shutdown streams every commit
first, a planned switchover) and promote the standby. The direct readers, the consumers' claim
connections, the web service's pool and the runner find the new primary through the DSN's host
list (a consumer that exits is replaced, the supervision of :mod:`lab.faults.supervision`), and
so does the relay of ``wal-relay``, which confirms its slot only behind hand-overs the standby
flushed (:mod:`lab.pipelines.wal_relay`: a helper that writes rows and confirms its slot behind
them must, or the synced slot can be past rows the promoted standby lacks); Debezium, which
takes one host, is killed and started again pointed at the new primary, from its synced slot
and its offsets. The fault waits until the slot of the pipeline's own streaming process
(Debezium's, the relay's) is held again on the new primary. After the run's cleanup it fails
back (:meth:`PostgresFailover.undo`: the promoted standby stops, the primary starts, the standby
is rebuilt from it). Its resume figure is the longest stop of delivery after the primary's stop."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

import psycopg

from lab.faults.base import RESUME_WAIT_S, BaseFault, FaultContext, FaultState, RunStopped
from lab.faults.supervision import held_again, source_slot, start_debezium_again, supervise
from lab.measure.recovery import longest_stall_after
from lab.scenario import FaultSpec, Scenario
from lab.settings import Settings
from lab.stack.debezium import START_TIMEOUT
from lab.stack.postgres import STOP_TIMEOUT
from lab.stack.standby import PROMOTE_TIMEOUT

if TYPE_CHECKING:
    from lab.pipelines.base import PipelineFactory
    from lab.stack.base import Standby

log = logging.getLogger(__name__)
FAILOVER_MODES = ("immediate", "fast")  # how the primary stops
SYNC_WAIT_S = 60.0  # the failover slots' synced copies on the standby, within this
# the primary's stop (a fast shutdown that outlasts its timeout is killed) and the promotion, each
# within these; the cleanup waits as long for them before it fails back
FAILOVER_THREAD_S = STOP_TIMEOUT + 5.0 + PROMOTE_TIMEOUT
# how long a failover may still take once the drain is over: the slots' sync, the stop and the
# promotion, Debezium's start on the new primary and its slot held again
FAILOVER_SETTLE_S = SYNC_WAIT_S + FAILOVER_THREAD_S + START_TIMEOUT + RESUME_WAIT_S


@dataclass
class PostgresFailover(BaseFault):
    kind: ClassVar[str] = "postgres-failover"
    family: ClassVar[str] = "failover"
    amount_help: ClassVar[str | None] = "=MODE"
    needs_control: ClassVar[bool] = True
    stops_service: ClassVar[bool] = True
    stops_source: ClassVar[bool] = True
    mode: str = FAILOVER_MODES[0]
    failed_over: bool = field(default=False, compare=False)  # the primary was stopped: undo() fails back
    thread: asyncio.Future[dict[str, float]] | None = field(default=None, compare=False)  # stop, promotion

    @classmethod
    def parse(cls, spec: FaultSpec) -> Self:
        mode = (spec.amount or FAILOVER_MODES[0]).strip()
        if mode not in FAILOVER_MODES:
            raise ValueError(f"fault {spec.text!r}: postgres-failover=MODE takes {' or '.join(FAILOVER_MODES)}")
        return cls(spec.target, spec.start_s, spec.duration_s or 0.0, mode)

    def refusal(self, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
        return (self.needs_ha(scenario, settings, "the single topology has no standby to promote "
                              "(postgres-restart restarts it)")
                or super().refusal(scenario, pipeline, settings))

    def settle_s(self) -> float:
        return FAILOVER_SETTLE_S

    async def inject(self, ctx: FaultContext) -> None:
        control, state = ctx.control, ctx.state
        standby = control.standby
        if standby is None:
            raise RunStopped("postgres-failover needs the ha topology's standby")
        waited, copies = await self._slots_synced(ctx, standby)
        state.event("slots synced on the standby", waited_s=waited, slots=copies)
        state.paused = True
        supervise(ctx)
        sink = ctx.pipeline.capabilities.cdc_sink
        try:
            state.event("primary stopping", mode=self.mode)
            self.failed_over = True  # from here on the cleanup fails back, whatever happens next
            # a future of its own: the cleanup waits for the thread even when this task is cancelled
            self.thread = asyncio.get_running_loop().run_in_executor(
                None, functools.partial(control.fail_over, immediate=self.mode == "immediate"))
            times = await asyncio.shield(self.thread)
            state.event("standby promoted", **times, slots=await state.off_loop(standby.slots))
            if sink is not None:  # its JVM retries the old primary's one address: move it
                control.move_debezium(sink, standby.port)
                pid = await state.off_loop(control.kill_debezium, sink)
                state.event("debezium stopped to move", sink=sink, pid=pid)
                started = await start_debezium_again(ctx)
                state.event("debezium started on the new primary", sink=sink, pid=list(started.pids),
                            start_to_streaming_s=started.start_to_streaming_s)
        finally:
            state.paused = False
        # Debezium was moved, the relay reconnects by itself: either holds its slot again
        if (slot := source_slot(ctx.pipeline.capabilities)) is not None:
            await held_again(ctx, slot, None, "the standby was promoted")

    async def _slots_synced(self, ctx: FaultContext, standby: Standby) -> tuple[float, list[dict[str, Any]]]:
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
        async with await psycopg.AsyncConnection.connect(ctx.settings.pg_primary_dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT slot_name FROM pg_replication_slots WHERE failover ORDER BY 1")
            wanted = {r[0] for r in await cur.fetchall()}
            nudged = 0.0
            while True:
                copies = [c for c in await ctx.state.off_loop(standby.slots) if c["slot"] in wanted]
                if {c["slot"] for c in copies if c["synced"] and not c["temporary"]} == wanted:
                    return round(time.monotonic() - t0, 3), copies
                if time.monotonic() - t0 > SYNC_WAIT_S:
                    raise RunStopped(f"failover slots not synchronised to the standby within {SYNC_WAIT_S:.0f} s "
                                     f"(a promotion now would lose them): {copies}; a new slot needs a few "
                                     "seconds of traffic first (Debezium confirms only the positions of the "
                                     "changes it streamed): inject the fault later, e.g. @20s")
                if time.monotonic() - nudged >= 1.0:
                    await conn.execute("SELECT pg_log_standby_snapshot()")
                    nudged = time.monotonic()
                await asyncio.sleep(0.2)

    async def undo(self, ctx: FaultContext) -> None:
        """Undo a failover (:meth:`lab.stack.base.ServiceControl.fail_back`: the promoted standby
        stops, the primary starts, the standby is rebuilt); never raises."""
        if not self.failed_over:
            return
        thread = self.thread
        if thread is not None and not thread.done():  # the run ended while the stop or promotion ran
            log.warning("waiting up to %.0f s for the failover under way to end before failing back", FAILOVER_THREAD_S)
            await asyncio.wait({thread}, timeout=FAILOVER_THREAD_S)
        if thread is not None and thread.done() and not thread.cancelled():
            thread.exception()  # retrieved: the run recorded or logged it
        try:
            await asyncio.to_thread(ctx.control.fail_back)
            self.failed_over = False
        except Exception as exc:  # the next `lab stack up` tries again (NativeStack.up)
            log.error("could not fail back after postgres-failover: %s: %s", type(exc).__name__, exc)

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        stopping = state.at().get("primary stopping")
        return None if stopping is None else longest_stall_after(arrivals["t"], stopping)
