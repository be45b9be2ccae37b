"""``consumer-slow[=X][:I]@T+D``: consumer I's work takes X longer per message (default 20 ms)
for D. SIGUSR1 switches the extra time on, SIGUSR2 off (:mod:`lab.consumer` installs both
handlers, with X, before it is ready). It resumes at the consumer's first work call after that."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import psutil

from lab.faults.base import BaseFault, FaultContext, FaultState
from lab.measure.recovery import first_call_after
from lab.scenario import FaultSpec, seconds

SLOW_EXTRA_S = 0.020  # the extra time per message unless =X says otherwise


@dataclass
class ConsumerSlow(BaseFault):
    kind: ClassVar[str] = "consumer-slow"
    family: ClassVar[str] = "consumer_slow"
    targets: ClassVar[str] = "consumer"
    lasting: ClassVar[str] = "required"
    amount_help: ClassVar[str | None] = "=X, its extra time per message"
    extra_s: float = SLOW_EXTRA_S

    @classmethod
    def parse(cls, spec: FaultSpec) -> Self:
        extra = seconds(spec.amount, "X", spec.text) if spec.amount is not None else SLOW_EXTRA_S
        if extra <= 0:
            raise ValueError(f"fault {spec.text!r}: consumer-slow needs a positive extra time per message")
        return cls(spec.target, spec.start_s, spec.duration_s or 0.0, extra)

    def extra_work_s(self) -> float:
        return self.extra_s

    async def inject(self, ctx: FaultContext) -> None:
        assert self.target is not None
        proc = ctx.consumer(self.target)
        try:
            proc.send_signal(signal.SIGUSR1)
            ctx.state.event("slow", consumer=self.target, extra_s=self.extra_s)
            await asyncio.sleep(self.duration_s)
        finally:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGUSR2)
        ctx.state.event("normal", consumer=self.target)

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        normal = state.at().get("normal")
        return None if normal is None else first_call_after(arrivals["t"], normal, arrivals.get("by"), self.target)
