"""``consumer-kill[:I]@T``: SIGKILL consumer I (default 0), reap it, start a replacement with the
same index (its slot, its static Kafka membership, its inbox name) and wait until it is ready.
It resumes at the replacement's first work call after the kill."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from lab.faults.base import BaseFault, FaultContext, FaultState
from lab.measure.recovery import first_call_after


@dataclass
class ConsumerKill(BaseFault):
    kind: ClassVar[str] = "consumer-kill"
    family: ClassVar[str] = "consumer_kill"
    targets: ClassVar[str] = "consumer"

    async def inject(self, ctx: FaultContext) -> None:
        assert self.target is not None  # resolved: consumer 0 by default
        old = ctx.consumer(self.target)
        replacement = ctx.replace_consumer(self.target)  # marked as being replaced before the kill
        old.kill()
        ctx.state.event("kill", consumer=self.target, pid=old.pid)
        await ctx.state.off_loop(old.wait, 10)
        await replacement

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        killed = state.at().get("kill")
        return None if killed is None else first_call_after(arrivals["t"], killed, arrivals.get("by"), self.target)
