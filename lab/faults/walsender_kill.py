"""``walsender-kill[:I]@T``: ``pg_terminate_backend`` of the walsender holding a slot, then wait
until the slot is held again (the reader, Debezium or the relay reconnected). The slot is consumer
I's (default 0) on a pipeline whose consumers read their own slots, or, with no target, the one
slot a process of the pipeline's own streams for every consumer: Debezium's on a pipeline with a
CDC sink, a helper's (``helper_slot``: the relay's). It resumes when a walsender holds the slot again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

import psycopg

from lab.faults.base import BaseFault, FaultContext, FaultState, RunStopped
from lab.faults.supervision import held_again, holder, source_slot
from lab.pipelines.wal import slot_name
from lab.scenario import Scenario
from lab.settings import Settings

if TYPE_CHECKING:
    from lab.pipelines.base import Capabilities, PipelineFactory


@dataclass
class WalsenderKill(BaseFault):
    kind: ClassVar[str] = "walsender-kill"
    family: ClassVar[str] = "walsender_kill"
    targets: ClassVar[str] = "consumer"  # a consumer's slot; none where one slot streams for all (source_slot)

    def refusal(self, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
        caps = pipeline.capabilities
        if self.target is not None and source_slot(caps) is not None:
            whose = "Debezium's" if caps.cdc_sink is not None else f"its helper's ({', '.join(caps.helpers)})"
            return (f"fault {scenario.fault!r}: on {pipeline.name} the walsender is {whose}; "
                    "write walsender-kill@T without a target")
        if source_slot(caps) is None and not caps.consumer_slots:
            return (f"fault {scenario.fault!r}: walsender-kill needs a slot: {pipeline.name}'s consumers "
                    "read none and no process of its own streams one")
        return super().refusal(scenario, pipeline, settings)

    def resolved(self, scenario: Scenario, pipeline: PipelineFactory) -> Self:
        return self if source_slot(pipeline.capabilities) is not None else super().resolved(scenario, pipeline)

    def hit_consumers(self, scenario: Scenario) -> list[int]:
        return [self.target] if self.target is not None else []

    def slot(self, capabilities: Capabilities) -> str:
        """The slot whose walsender it terminates."""
        if (shared := source_slot(capabilities)) is not None:
            return shared
        assert self.target is not None
        return slot_name(self.target)

    async def inject(self, ctx: FaultContext) -> None:
        slot = self.slot(ctx.pipeline.capabilities)
        async with await psycopg.AsyncConnection.connect(ctx.settings.pg_dsn, autocommit=True) as conn:
            pid = await holder(conn, slot)
            if pid is None:
                raise RunStopped(f"slot {slot} has no walsender to terminate")
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            ctx.state.event("walsender terminated", slot=slot, pid=pid)
            await held_again(ctx, slot, pid, "its walsender was terminated", conn)

    def record(self, pipeline: PipelineFactory, accounting: Mapping[str, Any] | None) -> dict[str, Any]:
        return {**super().record(pipeline, accounting), "slot": self.slot(pipeline.capabilities)}

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        at = state.at()
        a, b = at.get("walsender terminated"), at.get("slot held again")
        return round(b - a, 3) if a is not None and b is not None else None
