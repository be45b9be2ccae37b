"""While the fault run drains, :meth:`FaultSampling.watch_wal` samples every logical slot once a
second: WAL retained (``pg_current_wal_lsn() - restart_lsn``), not yet confirmed
(``- confirmed_flush_lsn``), ``wal_status``, ``safe_wal_size``, whether a walsender holds it, and
what its decoding spilled to disk (``spill_txns``, ``spill_bytes`` of ``pg_stat_replication_slots``).
With a broker, :meth:`FaultSampling.watch_backlog` samples the broker's backlog once a second too,
through the reader the pipeline gives (``Pipeline.backlog``: the Kafka group's lag, the share
group's, the quorum queue's ready + unacknowledged); a reading that fails while the broker
restarts is a gap (``backlog_gaps``), never a failure.
After the run, :meth:`lab.runner.fault_driver.FaultInjector.analysis` adds the per-consumer lag, the before / during /
after phases (rate, CPU per message per participant, latency) and the recovery time
(:mod:`lab.measure.recovery`, which defines them) from the arrivals and ``created_at``.

Disk guard (Safety): every run, fault or not, is guarded by :mod:`lab.measure.disk` (retained WAL
per slot, spill, free disk). When it trips during a fault run, :meth:`FaultSampling.record_trip`
records it and the fault driver ends the fault (its task cancelled, the fault's restoration: every
stopped process continued, a lowered keep size restored, the senders killed); the run fails with the
guard's line.

:class:`FaultSampling` is a component the runner's fault driver owns
(:class:`lab.runner.fault_driver.FaultInjector`), not a part of any fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from lab.faults import FaultState
from lab.measure import cgroups, recovery
from lab.pipelines import BacklogReader
from lab.settings import Settings

log = logging.getLogger(__name__)
SAMPLER_STOP_S = 10.0  # stop() waits this long for the samplers to end
WAL_SAMPLE_S = 1.0
BACKLOG_SAMPLE_S = 1.0  # the broker's backlog (lab.pipelines.backlog); 0 turns it off (cost measurement)
SLOT_SQL = (
    "SELECT r.slot_name, pg_current_wal_lsn() - r.restart_lsn, pg_current_wal_lsn() - r.confirmed_flush_lsn, "
    "r.wal_status, r.safe_wal_size, r.active_pid, s.spill_txns, s.spill_bytes "
    "FROM pg_replication_slots r LEFT JOIN pg_stat_replication_slots s USING (slot_name) "
    "WHERE r.slot_type = 'logical' ORDER BY 1"
)


class FaultSampling:
    """The WAL and backlog samplers of one fault run, and the record of the disk guard's trip during it
    (module docstring). ``tolerate_pg_down``: the fault stops PostgreSQL, so the WAL sampler
    reconnects instead of ending."""

    def __init__(self, settings: Settings, spec: str, state: FaultState, *, tolerate_pg_down: bool) -> None:
        self.settings = settings
        self.spec = spec
        self.state = state
        self.tolerate_pg_down = tolerate_pg_down
        self.sampling = True  # the samplers run until stop() turns this off
        self.wal: list[dict[str, Any]] = []
        self.guard: dict[str, Any] | None = None  # the disk guard's trip, once it tripped during the fault
        self.backlog: list[dict[str, Any]] = []  # the broker's backlog, sampled (watch_backlog)
        self.backlog_gaps: list[dict[str, Any]] = []  # readings that failed (a broker restarting)
        self._backlog_reader: BacklogReader | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def prepare(self, reader: Callable[[], BacklogReader | None]) -> None:
        """Once the pipeline's transport exists, before the consumers start: build the backlog reader
        (``reader``, the pipeline's) and start its sampling child if it has one (a Python child with
        librdkafka takes seconds to start on a loaded machine; started at the gate, its first reading
        came after a fault at 3 s)."""
        try:
            self._backlog_reader = reader() if BACKLOG_SAMPLE_S else None
            if self._backlog_reader is not None:
                self._backlog_reader.start()
        except Exception as exc:  # informative: never fails the run, never silent
            log.warning("no backlog sampling: %s: %s", type(exc).__name__, exc)
            self._backlog_reader = None

    def start(self) -> None:
        """At the senders' gate: the WAL sampler, and the backlog's if there is a reader."""
        self._tasks = [asyncio.create_task(self.watch_wal(), name="fault-wal")]
        if self._backlog_reader is not None:
            group = cgroups.current()  # the runner's own group by now: the child's CPU is the runner's
            for pid in self._backlog_reader.pids():
                with contextlib.suppress(OSError):
                    cgroups.move_to(group, pid)
            self._tasks.append(asyncio.create_task(self.watch_backlog(), name="fault-backlog"))

    async def stop(self) -> None:
        """End the sampling tasks: a flag their loops check, then a cancel, and a bounded wait.
        Cancelling alone is not enough: ``asyncio.wait_for`` on Python 3.11 can swallow a cancel
        that arrives as its inner await completes, and a sampler that swallowed one samples on
        (a CI run waited 10 min on a RabbitMQ backlog sampler). Whatever is still running after
        :data:`SAMPLER_STOP_S` is cancelled once more and left behind, with a warning."""
        self.sampling = False
        tasks = [t for t in self._tasks if not t.done()]
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

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The sampling tasks (one that failed fails the run, as the injection's failure does)."""
        return list(self._tasks)

    def close(self) -> None:
        """Cancel the samplers and close the backlog reader (the run's cleanup); never raises."""
        for task in self._tasks:
            task.cancel()
        if self._backlog_reader is not None:  # its task's own finally may not run before the cleanup
            self._backlog_reader.close()

    def record(self) -> dict[str, Any]:
        """The samples' part of run.json's ``fault`` block (beyond ``wal_summary``, which needs the window)."""
        return {"wal": self.wal, "max_retained_wal": self.settings.max_retained_wal, "guard": self.guard,
                "backlog": self.backlog, "backlog_gaps": self.backlog_gaps,
                "backlog_peak": recovery.backlog_peak(self.backlog)}

    async def watch_wal(self) -> None:
        """Sample every logical slot each second into :attr:`wal` until cancelled."""
        while self.sampling:
            try:
                async with await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True) as conn:
                    while self.sampling:
                        t = round(time.monotonic() - self.state.t0, 3)
                        rows = await (await conn.execute(SLOT_SQL)).fetchall()
                        for name, retained, unconfirmed, status, safe, holder, spill_txns, spill in rows:
                            self.wal.append({"t_s": t, "slot": name, "retained_bytes": _int(retained),
                                             "unconfirmed_bytes": _int(unconfirmed), "wal_status": status,
                                             "safe_wal_size": _int(safe), "active": holder is not None,
                                             "spill_txns": _int(spill_txns), "spill_bytes": _int(spill)})
                        await asyncio.sleep(WAL_SAMPLE_S)
            except psycopg.Error as exc:  # informative: never fails the run
                if not self.tolerate_pg_down:
                    log.warning("WAL sampling stopped: %s", exc)
                    return
                await asyncio.sleep(WAL_SAMPLE_S)  # sample again once PostgreSQL is back

    async def watch_backlog(self) -> None:
        """Sample the broker's backlog (:mod:`lab.pipelines.backlog`) about once a second into
        :attr:`backlog`, until cancelled; a failed reading is a gap in :attr:`backlog_gaps`. Never
        raises (the drain loop would fail the run on it)."""
        reader = self._backlog_reader
        assert reader is not None  # started only with one
        try:
            while self.sampling:
                for sample in await reader.read():
                    t_s = round(sample.pop("t") - self.state.t0, 3)
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

    def record_trip(self, tripped: dict[str, Any]) -> bool:
        """The run's disk guard tripped (:mod:`lab.measure.disk`): record it (False for a second
        trip, which is ignored); the fault driver then ends the fault."""
        if self.guard is not None:
            return False
        self.guard = tripped
        self.state.event("disk guard", **{k: v for k, v in tripped.items() if k not in ("error", "t_s")})
        return True


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
