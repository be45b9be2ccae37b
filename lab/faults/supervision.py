"""What the faults of services share: waiting until a slot is held again, starting Debezium again
from its offsets, and the supervision during a service's outage.

Supervision: from a service's stop to the end of the drain the lab acts as a process supervisor
would: a consumer that exits (its connection to the restarted service broke) is replaced, and a
Debezium JVM that exits is started again from its offsets (events ``consumer exited``,
``debezium exited``, ``debezium restarted by the lab``). Replacements start at once and wait for
readiness side by side: after a PostgreSQL restart every consumer exits, and a wal-sharded
replacement is only ready once all N have joined again, so waiting for each in turn would never end.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import psycopg

from lab.faults.base import RESUME_WAIT_S, FaultContext, RunStopped
from lab.stack.base import DebeziumStart, debezium_participant
from lab.stack.debezium import SLOT
from lab.stack.proc import tied

if TYPE_CHECKING:
    from lab.pipelines.base import Capabilities

HELD_S = 2.0  # a slot is held again once one walsender has held it this long
HOLDER_SQL = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s"


def source_slot(capabilities: Capabilities) -> str | None:
    """The one slot a process of the pipeline's own streams for every consumer: Debezium's on a
    pipeline with a CDC sink, a helper's (``helper_slot``, the relay's), else None."""
    if capabilities.cdc_sink is not None:
        return SLOT[capabilities.cdc_sink]
    return capabilities.helper_slot


async def holder(conn: psycopg.AsyncConnection[Any], slot: str) -> int | None:
    row = await (await conn.execute(HOLDER_SQL, (slot,))).fetchone()
    return row[0] if row else None


async def held_again(ctx: FaultContext, slot: str, old: int | None, after: str,
                     conn: psycopg.AsyncConnection[Any] | None = None) -> None:
    """Wait until a walsender other than ``old`` holds ``slot`` for :data:`HELD_S` in a row
    (Debezium holds it for a moment while it searches its resume position, lets go, and may
    retry 10 s later), then record ``slot held again`` at the start of that hold."""
    if conn is None:
        async with await psycopg.AsyncConnection.connect(ctx.settings.pg_dsn, autocommit=True) as own:
            return await held_again(ctx, slot, old, after, own)
    deadline = time.monotonic() + RESUME_WAIT_S
    since: tuple[int, float, float] | None = None  # (pid, monotonic, wall) of the current hold
    while True:
        now = await holder(conn, slot)
        if now in (None, old):
            since = None
        elif since is None or since[0] != now:
            since = (now, time.monotonic(), time.time())
        elif time.monotonic() - since[1] >= HELD_S:
            break
        if time.monotonic() > deadline:
            raise RunStopped(f"slot {slot} not held again {RESUME_WAIT_S:.0f} s after {after}")
        await asyncio.sleep(0.05)
    ctx.state.event("slot held again", slot=slot, pid=since[0], at_mono=since[1], at=since[2])


async def start_debezium_again(ctx: FaultContext) -> DebeziumStart:
    """Start the pipeline's Debezium from its kept slot and offsets, tied to the runner as the run's
    first one is, and move it into its participant's cgroup; what its start says."""
    sink = ctx.pipeline.capabilities.cdc_sink
    assert sink is not None
    with tied():  # like the run's first Debezium: it dies with the runner
        started = await ctx.state.off_loop(ctx.stack.start_debezium, sink, durable=True, resume=True)
    ctx.attach("debezium")
    return started


def supervise(ctx: FaultContext) -> None:
    """Start the supervision (module docstring) as one of the state's helpers, until the run ends."""
    ctx.state.supervising = True
    ctx.state.helpers.append(asyncio.create_task(_supervise(ctx), name="fault-supervise"))


async def _supervise(ctx: FaultContext) -> None:
    state, sink = ctx.state, ctx.pipeline.capabilities.cdc_sink
    replacing: dict[int, asyncio.Task[None]] = {}
    try:
        while True:
            while state.down or state.paused:  # noqa: ASYNC110 -- a replacement could not connect yet
                await asyncio.sleep(0.1)
            if sink is not None and not ctx.control.processes(debezium_participant(sink)):
                state.event("debezium exited", sink=sink)
                await start_debezium_again(ctx)
                state.event("debezium restarted by the lab", sink=sink)
            for i, task in list(replacing.items()):
                if task.done():
                    del replacing[i]
                    task.result()  # a replacement that never got ready fails the run
            for i in range(ctx.consumer_count()):
                c = ctx.consumer(i)
                if not ctx.replacing(i) and i not in replacing and c.poll() is not None:
                    state.event("consumer exited", consumer=i, pid=c.pid, code=c.returncode,
                                error=ctx.consumer_error(i))
                    replacing[i] = asyncio.ensure_future(ctx.replace_consumer(i))
            await asyncio.sleep(0.1)
    finally:
        for task in replacing.values():
            task.cancel()
