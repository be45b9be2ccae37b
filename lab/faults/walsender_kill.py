"""``walsender-kill[:I]@T``: ``pg_terminate_backend`` of the walsender holding a slot, then wait
until the slot is held again (the reader, or Debezium, reconnected). The slot is consumer I's
(default 0) on a pipeline whose consumers read their own slots, or Debezium's (no target) on a
pipeline with a CDC sink. It resumes when a walsender holds the slot again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

import psycopg

from lab.faults.base import BaseFault, FaultContext, FaultState, RunStopped
from lab.faults.supervision import held_again, holder
from lab.pipelines import PIPELINES
from lab.pipelines.wal import slot_name
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.debezium import SLOT

if TYPE_CHECKING:
    from lab.pipelines.base import PipelineFactory


@dataclass
class WalsenderKill(BaseFault):
    kind: ClassVar[str] = "walsender-kill"
    family: ClassVar[str] = "walsender_kill"
    targets: ClassVar[str] = "consumer"  # a consumer's slot; none on a pipeline with a CDC sink

    def refusal(self, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
        if self.target is not None and pipeline.cdc_sink is not None:
            return (f"fault {scenario.fault!r}: on {pipeline.name} the walsender is Debezium's; "
                    "write walsender-kill@T without a target")
        if pipeline.cdc_sink is None and not pipeline.consumer_slots:
            return (f"fault {scenario.fault!r}: walsender-kill needs a slot: {pipeline.name}'s consumers "
                    "read none and it has no Debezium")
        return super().refusal(scenario, pipeline, settings)

    def resolved(self, scenario: Scenario, pipeline: PipelineFactory) -> Self:
        return self if pipeline.cdc_sink is not None else super().resolved(scenario, pipeline)

    def hit_consumers(self, scenario: Scenario) -> list[int]:
        return [self.target] if self.target is not None else []

    def slot(self, pipeline: PipelineFactory) -> str:
        """The slot whose walsender it terminates."""
        if pipeline.cdc_sink is not None:
            return SLOT[pipeline.cdc_sink]
        assert self.target is not None
        return slot_name(self.target)

    async def inject(self, ctx: FaultContext) -> None:
        slot = self.slot(PIPELINES[ctx.scenario.pipeline])
        async with await psycopg.AsyncConnection.connect(ctx.settings.pg_dsn, autocommit=True) as conn:
            pid = await holder(conn, slot)
            if pid is None:
                raise RunStopped(f"slot {slot} has no walsender to terminate")
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            ctx.state.event("walsender terminated", slot=slot, pid=pid)
            await held_again(ctx, slot, pid, "its walsender was terminated", conn)

    def record(self, pipeline: PipelineFactory, accounting: Mapping[str, Any] | None) -> dict[str, Any]:
        return {**super().record(pipeline, accounting), "slot": self.slot(pipeline)}

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        at = state.at()
        a, b = at.get("walsender terminated"), at.get("slot held again")
        return round(b - a, 3) if a is not None and b is not None else None
