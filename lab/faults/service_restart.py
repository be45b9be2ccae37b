"""A service stopped and started again: ``broker-restart@T[+D]`` (the pipeline's broker; a
pipeline with a CDC sink) and ``postgres-restart@T[+D]`` (a fast shutdown of PostgreSQL), each
started again after D (default 0). One code with a parameter (which service), two kinds.

Stop through the stack, wait D, start again and wait until it serves (after PostgreSQL's, until
Debezium or the pipeline's helper, the relay, holds its slot again). Debezium is left to recover
by itself (its retriable errors restart its task), the relay reconnects by itself; from the stop
to the end of the drain the lab supervises (:mod:`lab.faults.supervision`). A service that it
stopped and did not start again (the run failed or was cancelled meanwhile) is started by
:meth:`BaseFault.restore`; a restarted service's processes are moved into their participant's
cgroup. It resumes at the first work call after the service started."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lab.faults.base import BaseFault, FaultContext, FaultState
from lab.faults.supervision import held_again, source_slot, supervise
from lab.measure.recovery import first_call_after
from lab.scenario import Scenario
from lab.settings import Settings

if TYPE_CHECKING:
    from lab.pipelines.base import Capabilities, PipelineFactory


@dataclass
class ServiceRestart(BaseFault):
    family: ClassVar[str] = "service_restart"
    lasting: ClassVar[str] = "optional"  # the outage before the start
    needs_control: ClassVar[bool] = True
    stops_service: ClassVar[bool] = True

    def service(self, capabilities: Capabilities) -> str:
        """The stack's service it restarts."""
        raise NotImplementedError

    async def inject(self, ctx: FaultContext) -> None:
        capabilities, control, state = ctx.pipeline.capabilities, ctx.control, ctx.state
        name = self.service(capabilities)
        supervise(ctx)
        state.down.append(name)
        t0 = time.monotonic()
        await state.off_loop(control.stop_service, name)
        state.event("service stopped", service=name, stop_s=round(time.monotonic() - t0, 3))
        await asyncio.sleep(self.duration_s)
        await state.off_loop(control.start_service, name)
        state.down.remove(name)
        ctx.attach(name)
        state.event("service started", service=name)
        slot = source_slot(capabilities)
        if slot is None or not self.stops_source:  # a broker restart leaves Debezium's source side alone
            return
        # Debezium's connections broke: it restarts its task after a retriable error (or its JVM
        # exits, and the supervision starts it again); a helper (the relay) reconnects by itself;
        # resumed once its slot is held again
        await held_again(ctx, slot, None, f"{name} started")

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        started = state.at().get("service started")
        return None if started is None else first_call_after(arrivals["t"], started, arrivals.get("by"), None)


@dataclass
class BrokerRestart(ServiceRestart):
    kind: ClassVar[str] = "broker-restart"

    def refusal(self, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
        return self.needs_debezium(scenario, pipeline) or super().refusal(scenario, pipeline, settings)

    def service(self, capabilities: Capabilities) -> str:
        assert capabilities.broker is not None  # a pipeline with a CDC sink has its broker
        return capabilities.broker


@dataclass
class PostgresRestart(ServiceRestart):
    kind: ClassVar[str] = "postgres-restart"
    stops_source: ClassVar[bool] = True

    def service(self, capabilities: Capabilities) -> str:
        return "postgres"
