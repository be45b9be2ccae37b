"""The fault kinds, registered by kind; the kind is the first word of ``Scenario.fault``.

A fault is its module (a class behind :class:`~lab.faults.base.Fault`) and one line in
:data:`FAULTS`. :func:`parse` reads a spec text (the shared grammar of :func:`lab.scenario.parse_fault`,
then the rules every kind declares: whether it takes ``:TARGET``, ``+DURATION``, ``=AMOUNT``, then
its own); :func:`check` says in one line why a scenario's fault does not apply to its pipeline,
topology or backend, before anything starts; :func:`fault_for` gives the run its fault, default
target filled in.
"""

from __future__ import annotations

from lab.faults.base import BaseFault, Fault, FaultContext, FaultState, RunStopped, pipeline_refusal
from lab.faults.big_transaction import BigTransaction
from lab.faults.consumer_kill import ConsumerKill
from lab.faults.consumer_slow import ConsumerSlow
from lab.faults.consumer_stop import ConsumerDead, SinkOutage
from lab.faults.debezium_kill import DebeziumKill
from lab.faults.failover import PostgresFailover
from lab.faults.node_kill import BrokerNodeKill
from lab.faults.service_restart import BrokerRestart, PostgresRestart
from lab.faults.slot_invalidation import SlotInvalidation
from lab.faults.walsender_kill import WalsenderKill
from lab.pipelines import PIPELINES, PipelineFactory
from lab.scenario import Scenario, parse_fault
from lab.settings import Settings

FAULTS: dict[str, type[Fault]] = {
    "consumer-kill": ConsumerKill,
    "consumer-dead": ConsumerDead,
    "sink-outage": SinkOutage,
    "walsender-kill": WalsenderKill,
    "consumer-slow": ConsumerSlow,
    "slot-invalidation": SlotInvalidation,
    "debezium-kill": DebeziumKill,
    "broker-restart": BrokerRestart,
    "postgres-restart": PostgresRestart,
    "big-transaction": BigTransaction,
    "broker-node-kill": BrokerNodeKill,
    "postgres-failover": PostgresFailover,
}
KINDS = tuple(FAULTS)


def parse(spec: str) -> Fault:
    """``KIND[=AMOUNT][:TARGET]@START[+DURATION]`` -> its kind's :class:`Fault`; ValueError, one line."""
    s = parse_fault(spec)
    cls = FAULTS.get(s.kind)
    if cls is None:
        raise ValueError(f"unknown fault kind {s.kind!r} in {spec!r}: choose one of {', '.join(KINDS)}")
    if s.target is not None and cls.targets == "none":
        raise ValueError(f"fault {spec!r}: {s.kind} takes no :TARGET (it hits every consumer)")
    if cls.lasting == "required" and not s.duration_s:
        raise ValueError(f"fault {spec!r}: {s.kind} needs +DURATION (how long it lasts), e.g. {s.kind}@5s+3s")
    if cls.lasting == "never" and s.duration_s is not None:
        raise ValueError(f"fault {spec!r}: {s.kind} is instantaneous and takes no +DURATION")
    if s.amount is not None and cls.amount_help is None:
        taking = [f"{k} ({c.amount_help})" for k, c in FAULTS.items() if c.amount_help is not None]
        raise ValueError(f"fault {spec!r}: only {', '.join(taking[:-1])} and {taking[-1]} take =")
    return cls.parse(s)


def check(scenario: Scenario, settings: Settings | None = None) -> None:
    """ValueError (one line) when ``scenario``'s fault does not parse or does not apply to its
    pipeline (by the pipeline's capabilities), or, given ``settings``, to the topology or the
    backend; nothing without a fault. The CLI and :func:`lab.runner.run_scenario` call it before
    anything starts."""
    if not scenario.fault:
        return
    why = refusal(parse(scenario.fault), scenario, PIPELINES[scenario.pipeline], settings)
    if why is not None:
        raise ValueError(why)


def refusal(fault: Fault, scenario: Scenario, pipeline: PipelineFactory, settings: Settings | None) -> str | None:
    """Why ``fault`` does not apply (one line), or None: the pipeline's own word first
    (:func:`~lab.faults.base.pipeline_refusal`), then the kind's rules (:meth:`Fault.refusal`)."""
    return pipeline_refusal(fault, scenario, pipeline) or fault.refusal(scenario, pipeline, settings)


def fault_for(scenario: Scenario) -> Fault | None:
    """The scenario's fault with its default target filled in (None without one); a fresh object
    per call: a run's fault keeps what its injection did."""
    if not scenario.fault:
        return None
    return parse(scenario.fault).resolved(scenario, PIPELINES[scenario.pipeline])


__all__ = ["FAULTS", "KINDS", "BaseFault", "Fault", "FaultContext", "FaultState", "RunStopped", "check",
           "fault_for", "parse", "refusal"]
