"""``debezium-kill@T`` (a pipeline with a CDC sink): SIGKILL Debezium Server, start it again
through the stack from the slot and offsets file it kept (a fault run's Debezium is ``durable``,
:data:`lab.stack.debezium.DURABLE`), wait until its slot streams. It resumes when the restarted
Debezium holds its slot (for :data:`lab.faults.supervision.HELD_S` in a row)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lab.faults.base import BaseFault, FaultContext, FaultState, RunStopped
from lab.faults.supervision import held_again, start_debezium_again
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.debezium import SLOT

if TYPE_CHECKING:
    from lab.pipelines.base import PipelineFactory


@dataclass
class DebeziumKill(BaseFault):
    kind: ClassVar[str] = "debezium-kill"
    family: ClassVar[str] = "debezium_kill"
    needs_control: ClassVar[bool] = True

    def refusal(self, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
        return self.needs_debezium(scenario, pipeline) or super().refusal(scenario, pipeline, settings)

    async def inject(self, ctx: FaultContext) -> None:
        sink = ctx.pipeline.capabilities.cdc_sink
        assert sink is not None
        pid = await ctx.state.off_loop(ctx.control.kill_debezium, sink)
        if pid is None:
            raise RunStopped(f"no Debezium Server ({sink}) to kill")
        ctx.state.event("debezium killed", sink=sink, pid=pid)
        started = await start_debezium_again(ctx)
        ctx.state.event("debezium restarted", sink=sink, pid=list(started.pids),
                        start_to_streaming_s=started.start_to_streaming_s)
        await held_again(ctx, SLOT[sink], None, "Debezium was restarted")

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        at = state.at()
        a, b = at.get("debezium killed"), at.get("slot held again")
        return round(b - a, 3) if a is not None and b is not None else None
