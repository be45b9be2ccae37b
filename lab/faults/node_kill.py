"""``broker-node-kill[:NODE]@T[+D]`` (a pipeline with a CDC sink, the ``ha`` topology): SIGKILL
broker node NODE (1..3, default 1: RabbitMQ's quorum leader, where every client connects; a
Kafka node leading about a third of the partitions), start it again through its cluster after D
(default 0). The other two hold a majority (Kafka's ISR of 2 with ``min.insync.replicas`` 2;
RabbitMQ's quorum queue elects a leader among them): a client that lost its node reconnects,
and one that exits is replaced once the node is back (the supervision of :mod:`lab.faults.supervision`).
Its resume figure is the longest stop of delivery after the kill (the others go on)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lab.faults.base import BaseFault, FaultContext, FaultState
from lab.faults.supervision import supervise
from lab.measure.recovery import longest_stall_after
from lab.scenario import Scenario
from lab.settings import Settings

if TYPE_CHECKING:
    from lab.pipelines.base import PipelineFactory


@dataclass
class BrokerNodeKill(BaseFault):
    kind: ClassVar[str] = "broker-node-kill"
    family: ClassVar[str] = "node_kill"
    targets: ClassVar[str] = "node"
    lasting: ClassVar[str] = "optional"
    needs_control: ClassVar[bool] = True
    stops_service: ClassVar[bool] = True

    def refusal(self, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
        return (self.target_refusal(scenario) or self.needs_debezium(scenario, pipeline)
                or self.needs_ha(scenario, settings, "a single broker has no other node to fail over to "
                                 "(broker-restart restarts it)")
                or super().refusal(scenario, pipeline, settings))

    async def inject(self, ctx: FaultContext) -> None:
        name, control, state = f"{ctx.pipeline.capabilities.broker}-{self.target}", ctx.control, ctx.state
        supervise(ctx)
        state.down.append(name)
        pids = await state.off_loop(control.kill_node, name)
        state.event("node killed", node=name, pids=pids)
        await asyncio.sleep(self.duration_s)
        await state.off_loop(control.start_service, name)
        state.down.remove(name)
        ctx.attach(name)
        state.event("node started", node=name, pid=[p.pid for p in control.processes(name)[:1]])

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        killed = state.at().get("node killed")
        return None if killed is None else longest_stall_after(arrivals["t"], killed)
