"""The fault contract: what one fault kind owns, and what the runner gives it.

A fault is a class behind :class:`Fault`: it parses its own spec text (:meth:`Fault.parse`, from
the generic :class:`lab.scenario.FaultSpec`), says where it does not apply (:meth:`Fault.refusal`,
from the pipeline's capabilities, the topology and the backend, never from a pipeline's name),
injects itself (:meth:`Fault.inject`), restores what it held when the run ends early
(:meth:`Fault.restore`, and :meth:`Fault.undo` after the run's cleanup), and says what run.json
records of it (:meth:`Fault.record`) and when delivery resumed (:meth:`Fault.resume_s`).

The runner drives it through :class:`FaultContext`: the run's settings, stack, pipeline and
scenario, the stack's service control (for a fault that declares it needs it, ``needs_control``),
its consumers through a few calls, and the :class:`FaultState` the fault writes its events, its
stopped processes and its stopped services into (what the runner's cleanup and the disk guard
continue and start again). :class:`BaseFault` holds what every fault shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeVar

import psutil

from lab.scenario import BROKER_NODES, FaultSpec, Scenario
from lab.settings import Settings
from lab.stack import controls_services

if TYPE_CHECKING:
    from lab.pipelines.base import Pipeline, PipelineFactory
    from lab.stack.base import ServiceControl, Stack

log = logging.getLogger(__name__)
T = TypeVar("T")
JOIN_S = 180.0  # an injection's thread: a service's stop (60 s) and start (120 s) at most
RESUME_WAIT_S = 60.0  # a fault's service or slot should be back well within this after its injection
# run.json's fault block has always carried every kind's parameter, 0 / "" where a kind has none
PARAMS: dict[str, Any] = {"extra_s": 0.0, "keep_mb": 0, "rows": 0, "mode": ""}
TARGETS = ("consumer", "node", "none")  # what :TARGET names: a consumer index, a broker node, nothing
LASTING = ("required", "optional", "never")  # whether +DURATION is needed, may be given, or is refused


class RunStopped(Exception):
    """An injection could not go on (one line: the run's error)."""


@dataclass
class FaultState:
    """What an injection holds while it runs, shared by the fault, the runner and its sampling.

    ``events`` (run.json's ``fault.events``), the processes it SIGSTOPped and not yet continued
    (``stopped``), the services it stopped and not yet started (``down``), whether consumer exits
    are its business (``supervising``: a restart's supervision replaces them) and whether that
    supervision must wait (``paused``: a failover under way)."""

    t0: float = 0.0  # monotonic time of the senders' gate
    t0_wall: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    stopped: list[psutil.Process] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    supervising: bool = False
    paused: bool = False
    helpers: list[asyncio.Task[None]] = field(default_factory=list)  # e.g. the supervision: failures fail the run
    threads: list[threading.Event] = field(default_factory=list)  # set when an off_loop call's thread ended

    def start(self, gate_mono: float) -> None:
        self.t0 = gate_mono
        self.t0_wall = time.time() - (time.monotonic() - gate_mono)

    def event(self, what: str, *, at_mono: float | None = None, at: float | None = None, **info: Any) -> None:
        """Record an event now, or at the given monotonic and wall times (both or neither)."""
        mono, wall = (time.monotonic(), time.time()) if at_mono is None else (at_mono, at)
        self.events.append({"what": what, "t_s": round(mono - self.t0, 3), "at": wall, **info})
        log.info("fault: %s %s", what, info)

    def off_loop(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
        """``asyncio.to_thread(fn, ...)``, its thread kept track of: cancelling the injection does not
        stop a thread (a service still stopping, a Debezium still starting), so the cleanup waits for
        every one (:meth:`join_threads`) before it restores what the fault holds."""
        ended = threading.Event()
        self.threads.append(ended)

        def call() -> T:
            try:
                return fn(*args, **kwargs)
            finally:
                ended.set()

        return asyncio.to_thread(call)

    def join_threads(self, timeout: float = JOIN_S) -> int:
        """Wait up to ``timeout`` in all for the threads of :meth:`off_loop` calls; returns how many
        still run (logged: the restoration goes on regardless)."""
        deadline = time.monotonic() + timeout
        for ended in self.threads:
            ended.wait(max(0.0, deadline - time.monotonic()))
        left = sum(not e.is_set() for e in self.threads)
        if left:
            log.error("fault cleanup: %d thread(s) of the injection still run after %.0f s", left, timeout)
        return left

    def continue_stopped(self, why: str = "continued by cleanup") -> None:
        """SIGCONT every process still stopped; one event naming them; never raises."""
        continued = []
        for p in list(self.stopped):
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGCONT)
                continued.append(p.pid)
            with contextlib.suppress(ValueError):  # the injection's own finally may have taken it out
                self.stopped.remove(p)
        if continued:  # the run ended (failed, interrupted, guard) while the fault held them stopped
            self.event(why, pids=continued)

    def start_down(self, control: ServiceControl) -> None:
        """Start every service the fault stopped and did not start again; never raises."""
        self.join_threads()  # a stop or start still under way in a thread ends first
        for name in list(self.down):
            try:  # stopped for sure, then started
                control.stop_service(name)
                control.start_service(name)
                self.event("started by cleanup", service=name)
            except Exception as exc:  # the run's error says the rest; this must be seen
                log.error("fault cleanup: could not start %s again: %s", name, exc)
                self.event("start by cleanup failed", service=name, error=str(exc))
            self.down.remove(name)

    def at(self) -> dict[str, float]:
        """Each event's wall time by its name (the last of a name wins)."""
        return {e["what"]: e["at"] for e in self.events}


class FaultContext(Protocol):
    """What the runner gives a fault while it runs (:class:`lab.runner.fault_driver.RunFaultContext`)."""

    settings: Settings
    stack: Stack
    pipeline: Pipeline
    scenario: Scenario
    state: FaultState

    @property
    def control(self) -> ServiceControl:
        """The stack's service control (a fault that uses it declares ``needs_control``; without one
        the injection stops with :class:`RunStopped`)."""
        ...

    def consumer(self, i: int) -> psutil.Popen:
        """Consumer ``i``'s process (the current one: a replacement after a kill)."""
        ...

    def consumer_count(self) -> int:
        ...

    def replace_consumer(self, i: int) -> Awaitable[None]:
        """Start a replacement for consumer ``i``, which has exited, and wait until it is ready
        (marked as being replaced at once, before the first await)."""
        ...

    def replacing(self, i: int) -> bool:
        """Whether consumer ``i`` is being replaced."""
        ...

    def expect_exit(self, i: int) -> None:
        """Consumer ``i``'s exit is the fault's outcome, not a failure of the run."""
        ...

    def consumer_error(self, i: int) -> str | None:
        """The error consumer ``i`` wrote into its result file, if any."""
        ...

    def attach(self, participant: str) -> None:
        """Move a restarted service's processes into its participant's cgroup, if it has one."""
        ...


class Fault(Protocol):
    """One fault kind (module docstring); :data:`lab.faults.FAULTS` maps each kind to its class."""

    kind: ClassVar[str]  # its KIND in the spec text, its key in lab.faults.FAULTS
    family: ClassVar[str]  # run.json's fault.family: its module (two kinds of one code share it)
    # needs the stack's service control (lab.stack.base.ServiceControl, the native backend's): a
    # service, a process or a server flag of the stack it stops, kills or changes
    needs_control: ClassVar[bool]
    targets: ClassVar[str]  # TARGETS
    lasting: ClassVar[str]  # LASTING
    amount_help: ClassVar[str | None]  # what =AMOUNT is, e.g. "=ROWS"; None: takes none
    stops_service: ClassVar[bool]  # it stops a service of the stack for a while
    stops_source: ClassVar[bool]  # ... and that service is PostgreSQL (INSERTs may be refused)
    adds_messages: ClassVar[bool]  # it writes outbox rows itself: the drain waits for its injection
    target: int | None
    start_s: float
    duration_s: float

    @classmethod
    def parse(cls, spec: FaultSpec) -> Self:
        """Its own grammar beyond the shared one (:func:`lab.faults.parse` checked that); ValueError, one line."""
        ...

    def refusal(self, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
        """Why it does not apply to this run (one line), or None; ``settings`` None: the scenario only."""
        ...

    def resolved(self, scenario: Scenario, pipeline: PipelineFactory) -> Self:
        """With its default target filled in."""
        ...

    def settle_s(self) -> float:
        """How long its injection may still take once the drain is over."""
        ...

    def hit_consumers(self, scenario: Scenario) -> list[int]:
        """The consumers it hits directly (run.json's ``fault.hit_consumers``)."""
        ...

    def extra_work_s(self) -> float:
        """Extra time per message it adds to its target consumer's work, switched on by SIGUSR1 and
        off by SIGUSR2 (:mod:`lab.consumer` installs both when this is not 0)."""
        ...

    def added_ids(self) -> list[int]:
        """The ids of the outbox rows it wrote itself, once committed."""
        ...

    async def inject(self, ctx: FaultContext) -> None:
        ...

    def restore(self, ctx: FaultContext, by: str = "cleanup") -> None:
        """Undo what the injection still holds (first thing in the run's cleanup, or the retention
        guard's when it trips: ``by`` names it in the events); never raises."""
        ...

    def lost_slot(self) -> Mapping[str, Any] | None:
        """A slot it lost for good (the verdict says that loss first), or None."""
        ...

    async def undo(self, ctx: FaultContext) -> None:
        """After the run's cleanup (nothing of the run runs any more); never raises."""
        ...

    def record(self, pipeline: PipelineFactory, accounting: Mapping[str, Any] | None) -> dict[str, Any]:
        """Its fields of run.json's ``fault`` block."""
        ...

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        """Seconds until delivery resumed after it (``accounting.time_to_resume_s``), or None."""
        ...

    def accounting(self, arrivals: Mapping[str, Any]) -> dict[str, Any]:
        """Its own fields of run.json's ``accounting``, from the web service's arrivals (big-transaction:
        when its last row was worked); none by default."""
        ...


@dataclass(eq=True)
class BaseFault:
    """What every fault shares: its parameters' fields, the shared rules and the defaults of the
    hooks a fault does not need. A subclass sets the class variables of :class:`Fault` and
    overrides what differs."""

    kind: ClassVar[str] = ""
    family: ClassVar[str] = ""
    needs_control: ClassVar[bool] = False
    targets: ClassVar[str] = "none"
    lasting: ClassVar[str] = "never"
    amount_help: ClassVar[str | None] = None
    stops_service: ClassVar[bool] = False
    stops_source: ClassVar[bool] = False
    adds_messages: ClassVar[bool] = False

    target: int | None
    start_s: float
    duration_s: float

    @classmethod
    def parse(cls, spec: FaultSpec) -> Self:
        return cls(spec.target, spec.start_s, spec.duration_s or 0.0)

    def refusal(self, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
        if (why := self.target_refusal(scenario)) is not None:
            return why
        if self.needs_control and settings is not None and not controls_services(settings):
            return (f"fault {scenario.fault!r}: {self.kind} needs the native backend (LAB_BACKEND=native): "
                    f"the {settings.backend} backend's services are containers")
        return None

    def needs_debezium(self, scenario: Scenario, pipeline: PipelineFactory) -> str | None:
        """The shared rule of the faults of Debezium and its broker: the pipeline has a CDC sink."""
        if pipeline.capabilities.cdc_sink is None:
            return (f"fault {scenario.fault!r}: {self.kind} needs Debezium and a broker "
                    f"(a pipeline with a Debezium sink; {pipeline.name} has none)")
        return None

    def needs_ha(self, scenario: Scenario, settings: Settings | None, why: str) -> str | None:
        """The shared rule of the ha topology's faults (``why``: what the single topology lacks)."""
        if settings is not None and not settings.ha:
            return f"fault {scenario.fault}: {self.kind} needs the ha topology (--topology ha): {why}"
        return None

    def target_refusal(self, scenario: Scenario) -> str | None:
        """The shared rule: a consumer target names one of the N consumers, a node one of the three."""
        if self.target is None:
            return None
        if self.targets == "node" and not 1 <= self.target <= BROKER_NODES:
            return f"fault {scenario.fault!r}: no broker node {self.target} (1..{BROKER_NODES})"
        if self.targets == "consumer" and self.target >= scenario.consumers:
            return (f"fault {scenario.fault!r}: no consumer {self.target} among {scenario.consumers} "
                    f"(0..{scenario.consumers - 1})")
        return None

    def resolved(self, scenario: Scenario, pipeline: PipelineFactory) -> Self:
        if self.target is not None or self.targets == "none":
            return self
        return dataclasses.replace(self, target=1 if self.targets == "node" else 0)

    def settle_s(self) -> float:
        return RESUME_WAIT_S

    def hit_consumers(self, scenario: Scenario) -> list[int]:
        return [self.target] if self.targets == "consumer" and self.target is not None else []

    def extra_work_s(self) -> float:
        return 0.0

    def added_ids(self) -> list[int]:
        return []

    async def inject(self, ctx: FaultContext) -> None:  # pragma: no cover - every fault overrides it
        raise NotImplementedError

    def restore(self, ctx: FaultContext, by: str = "cleanup") -> None:
        ctx.state.continue_stopped(f"continued by {by}")
        if ctx.state.down:  # only a fault with the stack's service control stops a service
            ctx.state.start_down(ctx.control)

    def lost_slot(self) -> Mapping[str, Any] | None:
        return None

    async def undo(self, ctx: FaultContext) -> None:
        return None

    def params(self) -> dict[str, Any]:
        """kind, target, timing and the kind's parameters, as run.json has always stored them."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}
        return {"kind": self.kind, **own, **{k: own.get(k, v) for k, v in PARAMS.items()}}

    def record(self, pipeline: PipelineFactory, accounting: Mapping[str, Any] | None) -> dict[str, Any]:
        return {**self.params(), "slot": None, "invalidation": None, "family": self.family,
                "stops_service": self.stops_service, "stops_source": self.stops_source}

    def resume_s(self, state: FaultState, arrivals: Mapping[str, Any]) -> float | None:
        return None

    def accounting(self, arrivals: Mapping[str, Any]) -> dict[str, Any]:
        return {}


def pipeline_refusal(fault: Fault, scenario: Scenario, pipeline: PipelineFactory) -> str | None:
    """What a pipeline itself says before any kind's own rule: it has no fault runs at all
    (``fault_refusal``)."""
    why = pipeline.capabilities.fault_refusal
    if why is not None:
        return f"fault {scenario.fault!r}: {pipeline.name} has no fault runs ({why})"
    return None
