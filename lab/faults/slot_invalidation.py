"""``slot-invalidation[=KEEP][:I]@T`` (a direct reader's slot; ``=KEEP``, default 32 MB): SIGSTOP reader I, set
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
:meth:`SlotInvalidation.restore` does it too when the run fails), the reader continued: it finds
its stream gone, cannot start its slot again ("can no longer get changes from replication
slot") and exits. The runner expects that exit (:meth:`FaultContext.expect_exit`) and reports the invalidation in
one loud line and in run.json (``fault.invalidation``); the accounting counts what no reader
worked (``lost``, their ids in ``lost_ids``), all of it the invalidated slot's: with ``wal``
(fan-out) the other readers see every row, so the loss is 0 unless the reader was alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

import psutil
import psycopg
from psycopg import sql

from lab.faults.base import BaseFault, FaultContext, RunStopped
from lab.pipelines.wal import slot_name
from lab.scenario import FaultSpec, Scenario
from lab.settings import Settings

if TYPE_CHECKING:
    from lab.pipelines.base import PipelineFactory

log = logging.getLogger(__name__)
KEEP_GUC = "max_slot_wal_keep_size"
KEEP_MB = 32  # max_slot_wal_keep_size for the run unless =KEEP says otherwise
_SIZE = re.compile(r"(?P<value>\d+)(?P<unit>MB|GB)?")
INVALIDATION_SQL = (
    "SELECT wal_status, invalidation_reason, confirmed_flush_lsn::text, "
    "pg_current_wal_lsn() - confirmed_flush_lsn, pg_current_wal_lsn() - restart_lsn "
    "FROM pg_replication_slots WHERE slot_name = %s"
)
INVALIDATE_TIMEOUT_S = 120.0  # switches, the other slots catching up, the checkpoint
READER_EXIT_S = 120.0  # a continued reader finds its slot lost and exits within this (47 s seen under load)


def megabytes(text: str, spec: str) -> int:
    """``32MB``, ``1GB`` or a bare number of MB; ValueError naming ``spec``."""
    m = _SIZE.fullmatch(text.strip())
    if m is None or int(m["value"]) < 1:
        raise ValueError(f"fault {spec!r}: KEEP {text!r} is not a size like 32MB or 1GB")
    return int(m["value"]) * (1024 if m["unit"] == "GB" else 1)


@dataclass
class SlotInvalidation(BaseFault):
    kind: ClassVar[str] = "slot-invalidation"
    family: ClassVar[str] = "slot_invalidation"
    targets: ClassVar[str] = "consumer"
    amount_help: ClassVar[str | None] = "=KEEP, the keep size"
    needs_control: ClassVar[bool] = True  # ALTER SYSTEM cannot override a flag on the server's command line
    keep_mb: int = KEEP_MB
    invalidation: dict[str, Any] | None = field(default=None, compare=False)  # what happened
    keep_set: bool = field(default=False, compare=False)  # the keep size is lowered: restore() resets it

    @classmethod
    def parse(cls, spec: FaultSpec) -> Self:
        keep = megabytes(spec.amount, spec.text) if spec.amount is not None else KEEP_MB
        return cls(spec.target, spec.start_s, spec.duration_s or 0.0, keep)

    def refusal(self, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
        if not pipeline.capabilities.consumer_slots:
            return (f"fault {scenario.fault!r}: slot-invalidation needs a direct reader's slot "
                    f"(a pipeline whose consumers read their own slots; {pipeline.name}'s do not)")
        return super().refusal(scenario, pipeline, settings)

    def settle_s(self) -> float:
        return INVALIDATE_TIMEOUT_S + READER_EXIT_S + 20.0  # switches, catch-up, checkpoint, the reader's exit

    def lost_slot(self) -> Mapping[str, Any] | None:
        return self.invalidation

    def record(self, pipeline: PipelineFactory, accounting: Mapping[str, Any] | None) -> dict[str, Any]:
        out = super().record(pipeline, accounting)
        if self.invalidation is not None:
            acc = accounting or {}
            out["invalidation"] = {**self.invalidation, "lost": acc.get("lost"), "lost_ids": acc.get("lost_ids")}
        return out

    def restore(self, ctx: FaultContext, by: str = "cleanup") -> None:
        super().restore(ctx, by)
        if not self.keep_set:
            return
        try:
            with psycopg.connect(ctx.settings.pg_dsn, autocommit=True, connect_timeout=10) as conn:
                reset_keep(conn)
            self.keep_set = False
            ctx.state.event(f"keep size reset by {by}")
        except psycopg.Error as exc:  # the stack's next start strips it (lab.stack.postgres)
            log.error("could not reset %s after the fault: %s", KEEP_GUC, exc)

    async def inject(self, ctx: FaultContext) -> None:
        """Stop reader I, lower the keep size, push the WAL past it until the server invalidates
        its slot, reset the keep size, continue the reader and wait until it exits, having found
        its slot lost (module docstring)."""
        assert self.target is not None
        i, keep_mb, slot = self.target, self.keep_mb, slot_name(self.target)
        proc = ctx.consumer(i)
        async with await psycopg.AsyncConnection.connect(ctx.settings.pg_dsn, autocommit=True) as conn:
            source = await _scalar(conn, "SELECT source FROM pg_settings WHERE name = %s", KEEP_GUC)
            if source == "command line":
                raise RunStopped(f"{KEEP_GUC} is set on this server's command line, which ALTER SYSTEM cannot "
                               "override (the compose backend): slot-invalidation needs the native stack")
            before = await _scalar(conn, sql.SQL("SHOW {}").format(sql.Identifier(KEEP_GUC)))
            segment = int(await _scalar(
                conn, "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'"))
            if keep_mb * 2**20 + 3 * segment >= ctx.settings.max_retained_wal:
                raise RunStopped(f"slot-invalidation={keep_mb}MB makes slot {slot} retain about "
                               f"{keep_mb * 2**20 + 3 * segment} "
                               f"bytes, past the disk guard's limit of {ctx.settings.max_retained_wal}: "
                               "lower KEEP or raise --max-retained-wal")
            ctx.state.stopped.append(proc)
            proc.send_signal(signal.SIGSTOP)
            ctx.state.event("stop", consumers=[i], pids=[proc.pid])
            keep = f"{keep_mb}MB"
            self.keep_set = True
            await conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(KEEP_GUC), sql.Literal(keep)))
            await conn.execute("SELECT pg_reload_conf()")
            await self._until(conn, sql.SQL("SELECT current_setting({}) = {}").format(
                sql.Literal(KEEP_GUC), sql.Literal(keep)), f"{KEEP_GUC} = {keep} after the reload")
            ctx.state.event("keep size set", keep_size=keep, was=before)
            deadline = time.monotonic() + INVALIDATE_TIMEOUT_S
            switches, state = 0, None
            while True:
                state = await (await conn.execute(INVALIDATION_SQL, (slot,))).fetchone()
                if state is None:
                    raise RunStopped(f"slot {slot} vanished during slot-invalidation")
                if state[1] is not None:  # invalidation_reason: the server let go of its WAL
                    break
                if time.monotonic() > deadline:
                    raise RunStopped(f"slot {slot} not invalidated {INVALIDATE_TIMEOUT_S:.0f} s after "
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
            invalidation: dict[str, Any] = {
                "slot": slot, "consumer": i, "wal_status": status, "invalidation_reason": reason,
                "keep_size": keep, "keep_size_before": before, "wal_switches": switches,
                "confirmed_flush_lsn": confirmed,
                "unconfirmed_bytes": None if unconfirmed is None else int(unconfirmed),
                "t_s": round(time.monotonic() - ctx.state.t0, 3), "at": time.time(),
            }
            log.error("SLOT INVALIDATED: %s (%s, wal_status %s) under %s=%s: reader %d can no longer read it; "
                      "every change after %s (%s bytes) is gone for it",
                      slot, reason, status, KEEP_GUC, keep, i, confirmed, unconfirmed)
            ctx.state.event("slot invalidated", slot=slot, wal_status=status, invalidation_reason=reason,
                        confirmed_flush_lsn=confirmed, wal_switches=switches)
            self.invalidation = invalidation
            await reset_keep(conn)
            self.keep_set = False
            ctx.state.event("keep size reset", keep_size=before)
        ctx.expect_exit(i)  # its exit is the fault's outcome, not a failure of the run
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGCONT)
        with contextlib.suppress(ValueError):
            ctx.state.stopped.remove(proc)
        ctx.state.event("resume", consumers=[i])
        try:
            code = await ctx.state.off_loop(proc.wait, READER_EXIT_S)
        except psutil.TimeoutExpired:
            proc.kill()
            code = await ctx.state.off_loop(proc.wait, 10)
            invalidation["reader_error"] = f"still running {READER_EXIT_S:.0f} s after its slot was lost: killed"
        else:
            invalidation["reader_error"] = ctx.consumer_error(i)
        invalidation["reader_exit_code"] = code
        ctx.state.event("reader exited", consumer=i, code=code, error=invalidation["reader_error"])

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
                raise RunStopped(f"the other slots did not catch up before the checkpoint: {behind} bytes retained")
            await asyncio.sleep(0.5)

    async def _until(self, conn: psycopg.AsyncConnection[Any], query: Any, what: str, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        deadline = time.monotonic() + timeout
        while not await _scalar(conn, query):
            if time.monotonic() > deadline:
                raise RunStopped(f"no {what} within {timeout:.0f} s")
            await asyncio.sleep(0.05)




def reset_keep(conn: Any) -> Any:
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


async def _scalar(conn: psycopg.AsyncConnection[Any], query: Any, *params: Any) -> Any:
    row = await (await conn.execute(query, params or None)).fetchone()
    return row[0] if row else None
