"""The drain: open the senders' gate, then wait until every sent message was worked on.

There is one drain loop (:class:`Drain`) and one observer of it per run (:class:`Observer`): the
plain run (:class:`PlainRun`, the null observer: drained once every sent message had its work
call), the load staircase (:class:`Staircase`: it may stop the senders early) or the fault
(:class:`lab.runner.fault_driver.FaultInjector`: it injects, samples and accounts for its own
events, and decides when a run that lost messages is drained). Beyond the drain, the observer
restores what it holds when the run ends, and writes its own blocks of the run's record.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

import psycopg

from lab.measure.disk import DiskGuard
from lab.measure.sampler import Sampler
from lab.measure.staircase import STOP_LEAD_S, lag_bound, step_rows, warm_summary
from lab.measure.staircase import summary as step_summary
from lab.runner.environment import RunEnv
from lab.runner.processes import RunError, RunProcesses
from lab.runner.values import Accounted, Drained, Latency
from lab.runner.windows import Windows

log = logging.getLogger(__name__)
DRAIN_POLL_S = 0.1  # how often the runner asks the web service how many messages were worked


class Observer(Protocol):
    """What watches one run's drain beside the wait for every message, and answers for it."""

    def prepare(self) -> None:
        """Once the pipeline's transport exists, before the consumers start."""

    def start(self, gate: float) -> None:
        """The senders' gate opened (monotonic ``gate``)."""

    async def watch(self, now: float, stats: Mapping[str, Any], sent: Mapping[str, Any] | None) -> None:
        """Every poll of the drain (``stats``: the web service's counts; ``sent``: the senders'
        result once they finished); raises to fail the run."""

    def drained(self, now: float, stats: Mapping[str, Any], sent: Mapping[str, Any], settled: bool,
                quiet_since: float) -> bool:
        """Whether the drain is over, once the senders finished (``settled``: every planned message
        was sent or refused; ``quiet_since``: the last time the work calls moved)."""

    def supervises(self, i: int) -> bool:
        """Whether an exit of consumer ``i`` is the observer's business, not the run's failure."""

    async def finish(self) -> None:
        """After the drain."""

    def guard_tripped(self, tripped: dict[str, Any], senders: int | None) -> None:
        """The disk guard tripped (the senders, pid ``senders``, were killed); called on the loop."""

    async def account(self) -> Accounted | None:
        """After the verification: every message accounted for (fault runs), else None."""

    def restore(self) -> None:
        """First thing in the run's cleanup: undo what it still holds; never raises."""

    async def undo(self) -> None:
        """Last thing in the run's cleanup; never raises."""

    def blocks(self, record: Mapping[str, Any], sampler: Sampler | None, latency: Latency | None,
               accounted: Accounted | None) -> dict[str, Any]:
        """Its own blocks of the run's record, from the record so far (``fault_facts`` and
        ``fault_block``, or ``staircase``)."""


class PlainRun:
    """The null observer: a run without a fault or a staircase, drained once every sent message
    had its work call."""

    def prepare(self) -> None:
        return None

    def start(self, gate: float) -> None:
        return None

    async def watch(self, now: float, stats: Mapping[str, Any], sent: Mapping[str, Any] | None) -> None:
        return None

    def drained(self, now: float, stats: Mapping[str, Any], sent: Mapping[str, Any], settled: bool,
                quiet_since: float) -> bool:
        return settled and stats["calls"] >= sent["sent"]

    def supervises(self, i: int) -> bool:
        return False

    async def finish(self) -> None:
        return None

    def guard_tripped(self, tripped: dict[str, Any], senders: int | None) -> None:
        return None

    async def account(self) -> Accounted | None:
        return None

    def restore(self) -> None:
        return None

    async def undo(self) -> None:
        return None

    def blocks(self, record: Mapping[str, Any], sampler: Sampler | None, latency: Latency | None,
               accounted: Accounted | None) -> dict[str, Any]:
        return {}


class Staircase(PlainRun):
    """The load staircase's early stop (:mod:`lab.measure.staircase`): shortly before a step's end
    (:data:`~lab.measure.staircase.STOP_LEAD_S`, at most a quarter step, counted from the gate; the
    last step is never tested), its lag (rows of the outbox − distinct ids worked) against
    criterion 1's bound; above it, the senders start no further step. Its record block is
    ``staircase`` with ``steps``, ``max_sustainable_rate`` and ``warm`` (None without a warm phase)."""

    def __init__(self, env: RunEnv) -> None:
        self.env = env
        self.plan, self.step_s = env.scenario.staircase, env.scenario.step_s
        self.gate, self.step = 0.0, 0
        self.stop: dict[str, Any] | None = None  # why the runner stopped it early

    def start(self, gate: float) -> None:
        self.gate = gate

    def due(self, now: float) -> bool:
        """Whether the current step is to be tested now (never the last step)."""
        if self.step >= len(self.plan) - 1:
            return False
        return now >= self.gate + self.plan[self.step][1] + self.step_s - min(STOP_LEAD_S, self.step_s / 4)

    async def watch(self, now: float, stats: Mapping[str, Any], sent: Mapping[str, Any] | None) -> None:
        if sent is not None or not self.due(now):
            return
        rate, s = self.plan[self.step][0], self.env.scenario
        async with await psycopg.AsyncConnection.connect(self.env.settings.pg_dsn, autocommit=True) as conn:
            one = await (await conn.execute("SELECT count(*) FROM outbox_record")).fetchone()
        lag, bound = (one[0] if one else 0) - stats["distinct"], lag_bound(rate, s.consumers, s.batch_size)
        if lag <= bound:
            self.step += 1
            return
        (self.env.scratch / "stop").touch()
        self.stop = {"after_step": self.step, "rate": rate, "lag": lag, "bound": bound,
                     "at_s": round(time.monotonic() - self.gate, 3)}
        log.info("run %s: lag %d > %g at %g msg/s: the staircase stops", self.env.run_id, lag, bound, rate)
        self.step = len(self.plan)  # nothing more to check

    def blocks(self, record: Mapping[str, Any], sampler: Sampler | None, latency: Latency | None,
               accounted: Accounted | None) -> dict[str, Any]:
        """run.json's ``steps``, ``max_sustainable_rate`` and ``staircase``, from the rows'
        ``created_at``, the work calls and the sampler's timeline; a failure to compute them is
        logged and leaves ``steps`` None (the run's own verdict stands)."""
        s, sent = self.env.scenario, record["sent"]
        rates = [r for r, _, _ in self.plan]
        out: dict[str, Any] = {"steps": None, "max_sustainable_rate": None,
                               "staircase": {"rates": rates, "step_s": s.step_s, "warm_s": s.warm_s,
                                             "stop": self.stop},
                               "warm": None}
        if latency is None or latency.created_at is None or latency.arrivals is None:
            return {"staircase": out}
        if not sent.get("gate_opened_at"):
            return {"staircase": out}
        warm = s.warm
        try:
            steps = step_rows(
                self.plan[:sent.get("steps_sent") or 0], gate_at=sent["gate_opened_at"], step_s=s.step_s,
                created_at=latency.created_at, arrival_ids=latency.arrivals["ids"],
                arrival_t=latency.arrivals["t"], consumers=s.consumers, batch_size=s.batch_size,
                timeline=sampler.timeline() if sampler is not None else None,
                groups=sampler.groups if sampler is not None else None, warm=warm)
            warmed = warm_summary(warm, gate_at=sent["gate_opened_at"], warm_s=s.warm_s,
                                  first_step_s=self.plan[0][1], created_at=latency.created_at,
                                  arrival_ids=latency.arrivals["ids"], arrival_t=latency.arrivals["t"])
        except Exception as exc:  # a measurement: never fails the run, never silent
            log.warning("run %s: steps not measured: %s: %s", self.env.run_id, type(exc).__name__, exc)
            return {"staircase": out}
        if warmed is not None and not warmed["cleared"]:
            log.warning("run %s: %d warm messages still waited as the first step began: it ran on a backlog",
                        self.env.run_id, warmed["lag_at_first_step"])
        block = step_summary(steps, rates, stop=self.stop)
        return {"staircase": {"steps": steps, "max_sustainable_rate": block["max_sustainable_rate"],
                              "staircase": {**block, "step_s": s.step_s, "warm_s": s.warm_s}, "warm": warmed}}


class Drain:
    """The one drain loop of a run, watched by its :class:`Observer`."""

    def __init__(self, env: RunEnv, procs: RunProcesses, guard: DiskGuard, observer: Observer) -> None:
        self.env, self.procs, self.guard, self.observer = env, procs, guard, observer

    async def run(self, windows: Windows) -> Drained:
        """Open the senders' gate, then wait until the observer says every sent message was worked."""
        s, observer = self.env.scenario, self.observer
        await windows.gate()
        (self.env.scratch / "start").touch()
        observer.start(time.monotonic())
        senders_out = self.env.scratch / "senders.json"
        quiet_since, last_calls, last_progress = time.monotonic(), -1, 0.0
        deadline = time.monotonic() + s.drain_timeout_s
        sent: dict[str, Any] | None = None
        while True:
            await asyncio.sleep(DRAIN_POLL_S)
            self.procs.check_alive(observer.supervises)
            self.guard.check()
            if sent is None and senders_out.exists():
                sent = json.loads(senders_out.read_text())
            stats = await self.procs.web("/load/stats")
            now = time.monotonic()
            await observer.watch(now, stats, sent)
            if now - last_progress >= 1.0:
                self.env.progress("drain", {"processed": stats["calls"]})
                last_progress = now
            if stats["calls"] != last_calls:
                quiet_since, last_calls = now, stats["calls"]
            if sent is not None:
                planned = sent.get("planned") or s.messages  # a staircase may stop early
                settled = sent["sent"] + sent["send_failed"] >= planned
                if observer.drained(now, stats, sent, settled, quiet_since) or sent["sent"] == 0:
                    break
            elif (code := self.procs.senders_failed()) is not None:
                raise RunError(f"senders exited with {code}")
            if now > deadline:
                raise RunError(f"not drained after {s.drain_timeout_s:.0f} s: {stats['calls']} processed")
        await observer.finish()
        await windows.drained()
        return Drained(sent)
