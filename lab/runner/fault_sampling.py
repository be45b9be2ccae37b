"""While the fault run drains, :meth:`FaultInjector.watch_wal` samples every logical slot once a
second: WAL retained (``pg_current_wal_lsn() - restart_lsn``), not yet confirmed
(``- confirmed_flush_lsn``), ``wal_status``, ``safe_wal_size``, whether a walsender holds it, and
what its decoding spilled to disk (``spill_txns``, ``spill_bytes`` of ``pg_stat_replication_slots``).
With a broker, :meth:`FaultInjector.watch_backlog` samples the broker's backlog once a second too
(:mod:`lab.pipelines.backlog`: the Kafka group's lag, the quorum queue's ready + unacknowledged);
a reading that fails while the broker restarts is a gap (``backlog_gaps``), never a failure.
After the run, :meth:`FaultInjector.analysis` adds the per-consumer lag, the before / during /
after phases (rate, CPU per message per participant, latency) and the recovery time
(:mod:`lab.measure.recovery`, which defines them) from the arrivals and ``created_at``.

Disk guard (Safety): every run, fault or not, is guarded by :mod:`lab.measure.disk` (retained WAL
per slot, spill, free disk). When it trips during a fault run, :meth:`FaultSampling.disk_guard_tripped`
ends the fault at once (its task cancelled, every stopped process continued; a lowered keep size is
reset by the cleanup's :meth:`~lab.runner.faults.FaultInjector.restore`) and the run fails with the
guard's line.

A part of :class:`lab.runner.faults.FaultInjector`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

log = logging.getLogger(__name__)
WAL_SAMPLE_S = 1.0
BACKLOG_SAMPLE_S = 1.0  # the broker's backlog (lab.pipelines.backlog); 0 turns it off (cost measurement)
SLOT_SQL = (
    "SELECT r.slot_name, pg_current_wal_lsn() - r.restart_lsn, pg_current_wal_lsn() - r.confirmed_flush_lsn, "
    "r.wal_status, r.safe_wal_size, r.active_pid, s.spill_txns, s.spill_bytes "
    "FROM pg_replication_slots r LEFT JOIN pg_stat_replication_slots s USING (slot_name) "
    "WHERE r.slot_type = 'logical' ORDER BY 1"
)


class FaultSampling:
    """The WAL and backlog samplers and the disk guard's end of the fault: a part of
    :class:`lab.runner.faults.FaultInjector`."""

    run: Any
    _event: Callable[..., None]  # FaultInjector._event
    _continue_stopped: Callable[..., None]  # FaultInjector._continue_stopped
    fault: Any
    sampling: bool
    wal: list[dict[str, Any]]
    guard: dict[str, Any] | None
    backlog: list[dict[str, Any]]
    backlog_gaps: list[dict[str, Any]]
    _backlog_reader: Any
    _tasks: list[asyncio.Task[None]]
    _t0: float

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

    def disk_guard_tripped(self, tripped: dict[str, Any]) -> None:
        """The run's disk guard tripped (:mod:`lab.measure.disk`): end the fault now; the run fails
        with the guard's line (:meth:`~lab.runner.faults.FaultInjector.check`)."""
        if self.guard is not None:
            return
        self.guard = tripped
        self._event("disk guard", **{k: v for k, v in tripped.items() if k not in ("error", "t_s")})
        if self._tasks:  # the injection: its own finally continues what it stopped
            self._tasks[0].cancel()
        self._continue_stopped("continued by the disk guard")


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
