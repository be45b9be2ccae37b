"""A stopped consumer: ``consumer-dead[:I]@T+D`` SIGSTOPs consumer I (default 0) for D,
``sink-outage@T+D`` every consumer; then SIGCONT. One code with a parameter (which consumers),
two kinds: a stopped process is a real stop (no reads, no acks, no heartbeats). Every stopped
process is in :attr:`FaultState.stopped` until it got its SIGCONT, so the runner's cleanup
continues it whatever happened. It resumes at the first work call after the SIGCONT (of the
stopped consumer; of any after a sink outage)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import psutil

from lab.faults.base import BaseFault, FaultContext, FaultState
from lab.measure.recovery import first_call_after
from lab.scenario import Scenario


@dataclass
class ConsumerStop(BaseFault):
    family: ClassVar[str] = "consumer_stop"
    lasting: ClassVar[str] = "required"

    def hit_consumers(self, scenario: Scenario) -> list[int]:
        return [self.target] if self.target is not None else list(range(scenario.consumers))

    async def inject(self, ctx: FaultContext) -> None:
        indexes = [self.target] if self.target is not None else list(range(ctx.consumer_count()))
        procs = [ctx.consumer(i) for i in indexes]
        stopped = ctx.state.stopped
        try:
            for p in procs:
                stopped.append(p)
                p.send_signal(signal.SIGSTOP)
            ctx.state.event("stop", consumers=indexes, pids=[p.pid for p in procs])
            await asyncio.sleep(self.duration_s)
        finally:
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGCONT)
                with contextlib.suppress(ValueError):
                    stopped.remove(p)
        ctx.state.event("resume", consumers=indexes)

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        resumed = state.at().get("resume")
        return None if resumed is None else first_call_after(arrivals["t"], resumed, arrivals.get("by"), self.target)


@dataclass
class ConsumerDead(ConsumerStop):
    kind: ClassVar[str] = "consumer-dead"
    targets: ClassVar[str] = "consumer"


@dataclass
class SinkOutage(ConsumerStop):
    kind: ClassVar[str] = "sink-outage"
    targets: ClassVar[str] = "none"  # it hits every consumer
