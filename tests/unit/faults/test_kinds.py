"""Every fault kind as pure functions: its grammar (the rules it declares and its own), where it
applies (by a pipeline's capabilities, the topology and the backend, never by a pipeline's name),
its default target, what it records, which consumers it hits and when it says delivery resumed."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

import pytest

from lab.faults import FAULTS, KINDS, FaultState, check, fault_for, parse
from lab.faults import refusal as faults_refusal
from lab.faults.base import LASTING, PARAMS, TARGETS
from lab.faults.big_transaction import BigTransaction
from lab.pipelines import PIPELINES, Capabilities
from lab.scenario import Scenario
from lab.settings import Settings
from lab.study.fault_matrix import HA_KINDS, KIND_ORDER

SINGLE, HA = Settings(), Settings().replace(topology="ha")
COMPOSE = HA.replace(backend="compose")  # ha too: only the backend refuses
SPEC = {  # a valid spec of every kind, with its target where it takes one
    "consumer-kill": "consumer-kill:1@3s", "consumer-dead": "consumer-dead:1@3s+2s", "sink-outage": "sink-outage@3s+2s",
    "walsender-kill": "walsender-kill@3s", "consumer-slow": "consumer-slow=5ms:1@3s+2s",
    "slot-invalidation": "slot-invalidation=64MB:1@3s", "debezium-kill": "debezium-kill@3s",
    "broker-restart": "broker-restart@3s+1s", "postgres-restart": "postgres-restart@3s",
    "big-transaction": "big-transaction=10@3s", "broker-node-kill": "broker-node-kill:2@3s+1s",
    "postgres-failover": "postgres-failover=fast@3s",
}


class Poll:
    """A pipeline none of the faults knows by name: no slot of its consumers', no Debezium (the defaults)."""

    name: ClassVar[str] = "poll"
    capabilities: ClassVar[Capabilities] = Capabilities()


class Relay(Poll):
    name: ClassVar[str] = "relay"
    capabilities: ClassVar[Capabilities] = Capabilities(consumer_slots=True)


class Queue(Poll):
    name: ClassVar[str] = "queue"
    capabilities: ClassVar[Capabilities] = Capabilities(cdc_sink="rabbitmq", broker="rabbitmq")


class Handed(Poll):
    """A pipeline whose one slot a helper of its own streams and hands over to the consumers."""

    name: ClassVar[str] = "handed"
    capabilities: ClassVar[Capabilities] = Capabilities(helpers={"relay": "lab.relay"}, helper_slot="handed_slot")


def refusal(spec: str, pipeline: Any, settings: Settings | None = SINGLE, consumers: int = 2) -> str | None:
    scenario = Scenario(consumers=consumers, fault=spec)
    return faults_refusal(parse(spec), scenario, pipeline, settings)


def test_the_registry_is_typed_by_kind_and_covers_what_the_study_plans() -> None:
    assert sorted(KINDS) == sorted(KIND_ORDER + HA_KINDS) == sorted(SPEC)
    for kind, cls in FAULTS.items():
        assert cls.kind == kind and cls.targets in TARGETS and cls.lasting in LASTING
        assert cls.family and cls.__module__ == f"lab.faults.{cls.family}", kind  # a fault is its module
        assert not cls.stops_source or cls.stops_service  # PostgreSQL is a service


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_parses_and_records_the_parameters_run_json_always_had(kind: str) -> None:
    f = parse(SPEC[kind])
    assert type(f) is FAULTS[kind] and f.start_s == 3.0
    params = f.params()  # type: ignore[attr-defined]
    assert list(params)[:4] == ["kind", "target", "start_s", "duration_s"] and params["kind"] == kind
    assert set(params) == {"kind", "target", "start_s", "duration_s", *PARAMS}
    rec = f.record(PIPELINES["kafka"], None)
    assert {"family", "stops_service", "stops_source", "slot", "invalidation"} <= set(rec)
    assert parse(SPEC[kind]) == f  # a value: its injection's state does not take part


@pytest.mark.parametrize("kind", KINDS)
def test_the_declared_rules_refuse_in_one_line(kind: str) -> None:
    cls = FAULTS[kind]
    bad = []
    if cls.targets == "none":
        bad.append((f"{kind}:1@1s" + ("+1s" if cls.lasting == "required" else ""), "takes no :TARGET"))
    if cls.lasting == "required":
        bad.append((f"{kind}@1s", "needs +DURATION"))
    if cls.lasting == "never":
        bad.append((f"{kind}@1s+1s", "takes no +DURATION"))
    if cls.amount_help is None:
        bad.append((f"{kind}=1@1s" + ("+1s" if cls.lasting == "required" else ""), "take ="))
    assert bad
    for spec, says in bad:
        with pytest.raises(ValueError, match=re.escape(says)) as info:
            parse(spec)
        assert "\n" not in str(info.value)


def test_where_a_fault_applies_follows_the_pipelines_capabilities_not_its_name() -> None:
    assert refusal("walsender-kill@1s", Poll) is not None and "walsender-kill needs a slot" in str(
        refusal("walsender-kill@1s", Poll))
    assert refusal("walsender-kill:1@1s", Relay) is None and refusal("walsender-kill@1s", Queue) is None
    assert "the walsender is Debezium's" in str(refusal("walsender-kill:1@1s", Queue))
    assert "needs a direct reader's slot" in str(refusal("slot-invalidation@1s", Poll))
    assert refusal("slot-invalidation@1s", Relay) is None
    for kind in ("debezium-kill@1s", "broker-restart@1s", "broker-node-kill@1s"):
        assert "needs Debezium and a broker" in str(refusal(kind, Relay, HA))
        assert refusal(kind, Queue, HA) is None
    for spec in ("consumer-kill:1@1s", "consumer-dead@1s+1s", "sink-outage@1s+1s", "consumer-slow@1s+1s",
                 "postgres-restart@1s", "big-transaction@1s"):
        assert refusal(spec, Poll) is None, spec


def test_targets_topology_and_backend() -> None:
    assert "no consumer 2 among 2" in str(refusal("consumer-kill:2@1s", Poll))
    assert "no broker node 4 (1..3)" in str(refusal("broker-node-kill:4@1s", Queue, HA))
    assert refusal("broker-node-kill:3@1s", Queue, HA, consumers=1) is None  # a node, not a consumer
    assert "needs the ha topology" in str(refusal("broker-node-kill@1s", Queue, SINGLE))
    assert "needs the ha topology" in str(refusal("postgres-failover@1s", Poll, SINGLE))
    assert refusal("postgres-failover@1s", Poll, HA) is None
    assert refusal("postgres-failover@1s", Poll, None) is None  # the scenario alone: no topology known
    for kind, cls in FAULTS.items():
        why = refusal(SPEC[kind], Queue if kind != "slot-invalidation" else Relay, COMPOSE)
        if cls.needs_control:
            assert why is not None and "needs the native backend" in why, kind
        elif kind != "walsender-kill":
            assert why is None, kind


def test_check_refuses_through_the_registered_pipeline() -> None:
    check(Scenario())  # no fault
    check(Scenario(pipeline="kafka", consumers=2, fault="debezium-kill@1s"), SINGLE)
    with pytest.raises(ValueError, match="needs Debezium and a broker"):
        check(Scenario(pipeline="wal-sharded", consumers=2, fault="debezium-kill@1s"))
    with pytest.raises(ValueError, match="unknown fault kind"):
        check(Scenario(fault="nope@1s"))


def test_default_targets_and_the_consumers_hit() -> None:
    def resolved(spec: str, pipeline: str = "wal", n: int = 3) -> Any:
        f = fault_for(Scenario(pipeline=pipeline, consumers=n, fault=spec))
        return f.target, f.hit_consumers(Scenario(consumers=n))  # type: ignore[union-attr]

    assert resolved("consumer-kill@1s") == (0, [0])
    assert resolved("consumer-dead:2@1s+1s") == (2, [2])
    assert resolved("sink-outage@1s+1s") == (None, [0, 1, 2])
    assert resolved("walsender-kill@1s") == (0, [0]) and resolved("walsender-kill@1s", "kafka") == (None, [])
    assert resolved("broker-node-kill@1s", "rabbitmq") == (1, [])
    assert resolved("postgres-restart@1s") == (None, []) and resolved("big-transaction@1s") == (None, [])


def _state(**at: float) -> FaultState:
    s = FaultState()
    s.events = [{"what": what.replace("_", " "), "t_s": 0.0, "at": t} for what, t in at.items()]
    return s


ARRIVALS = {"t": [10.0, 10.5, 11.0, 14.0, 14.2], "by": [0, 1, 0, 1, 0]}


@pytest.mark.parametrize(("spec", "events", "want"), [
    ("consumer-kill:1@1s", {"kill": 10.6}, 3.4),  # consumer 1's next call
    ("consumer-dead:1@1s+1s", {"stop": 9.0, "resume": 10.2}, 0.3),
    ("sink-outage@1s+1s", {"stop": 9.0, "resume": 10.2}, 0.3),  # any consumer's
    ("consumer-slow:0@1s+1s", {"slow": 9.0, "normal": 11.5}, 2.7),
    ("walsender-kill:0@1s", {"walsender_terminated": 10.0, "slot_held_again": 12.25}, 2.25),
    ("debezium-kill@1s", {"debezium_killed": 10.0, "slot_held_again": 13.0}, 3.0),
    ("postgres-restart@1s+1s", {"service_stopped": 9.0, "service_started": 11.2}, 2.8),
    ("broker-node-kill:1@1s", {"node_killed": 10.8}, 3.0),  # the longest stall after the kill
    ("postgres-failover@1s", {"primary_stopping": 9.5}, 3.0),
    ("big-transaction@1s", {"big_transaction_committed": 10.0}, None),
    ("slot-invalidation:0@1s", {"slot_invalidated": 10.0}, None),  # the reader never reads again
])
def test_each_fault_says_when_delivery_resumed(spec: str, events: dict[str, float], want: float | None) -> None:
    f = fault_for(Scenario(pipeline="kafka" if "debezium" in spec or "node" in spec else "wal", consumers=2,
                           fault=spec))
    assert f is not None
    got = f.resume_s(_state(**events), ARRIVALS)
    assert got == (pytest.approx(want) if want is not None else None)
    assert f.resume_s(FaultState(), ARRIVALS) is None  # not injected: nothing resumed


def test_a_big_transaction_accounts_for_its_own_rows() -> None:
    """Its figures are its own: from its rows and its commit, never from an event found by its name."""
    f = parse("big-transaction=3@1s")
    assert isinstance(f, BigTransaction)
    arrivals = {"ids": [1, 10, 11, 10, 12], "t": [99.0, 100.5, 101.0, 101.5, 102.25]}
    assert f.accounting(arrivals) == {}  # nothing committed: nothing of its own
    f.ids, f.committed_at = [10, 11, 12], 100.0
    assert f.accounting(arrivals) == {"big_transaction": {"rows": 3, "worked": 3, "all_worked_after_s": 2.25,
                                                          "lost": 0}}
    assert f.accounting({"ids": [10, 11], "t": [100.5, 101.0]}) == {
        "big_transaction": {"rows": 3, "worked": 2, "all_worked_after_s": None, "lost": 1}}
    assert parse("consumer-kill:1@1s").accounting(arrivals) == {}


def test_a_slot_invalidation_records_its_loss_and_a_slow_consumer_its_extra_work() -> None:
    f = parse("slot-invalidation:1@1s")
    assert f.lost_slot() is None and f.record(PIPELINES["wal"], {"lost": 3})["invalidation"] is None
    f = dataclasses.replace(f, invalidation={"slot": "load_test_slot_1"})  # type: ignore[type-var]
    rec = f.record(PIPELINES["wal"], {"lost": 3, "lost_ids": [[1, 3]]})
    assert rec["invalidation"] == {"slot": "load_test_slot_1", "lost": 3, "lost_ids": [[1, 3]]}
    assert parse("consumer-slow=7ms:1@1s+1s").extra_work_s() == pytest.approx(0.007)
    assert parse("consumer-kill@1s").extra_work_s() == 0.0
    assert parse("walsender-kill:1@1s").record(PIPELINES["wal"], None)["slot"] == "load_test_slot_1"
    assert parse("walsender-kill@1s").record(PIPELINES["kafka"], None)["slot"].startswith("dbz_")


def test_a_pipeline_can_refuse_every_fault() -> None:
    class Shared(Poll):
        name: ClassVar[str] = "shared"
        capabilities: ClassVar[Capabilities] = Capabilities(
            fault_refusal="its records come back only when their locks expire")

    for spec in SPEC.values():
        assert "shared has no fault runs (its records come back" in str(refusal(spec, Shared, HA))
    assert refusal("consumer-kill:1@1s", Handed) is None and refusal("broker-restart@1s", Queue) is None


def test_a_helpers_slot_takes_the_walsender_source_and_failover_faults() -> None:
    """The relay outlives its walsender, PostgreSQL's restart and a failover (it confirms its slot
    behind the standby); its slot is the untargeted walsender-kill's, as Debezium's is."""
    assert refusal("walsender-kill@1s", Handed) is None and refusal("postgres-restart@1s+1s", Handed) is None
    assert "on handed the walsender is its helper's (relay); write walsender-kill@T without a target" in str(
        refusal("walsender-kill:1@1s", Handed))
    f = parse("walsender-kill@1s").resolved(Scenario(consumers=2), Handed)
    assert f.target is None and f.hit_consumers(Scenario(consumers=2)) == []
    assert f.record(Handed, None)["slot"] == "handed_slot"  # type: ignore[attr-defined]
    assert refusal("postgres-failover=fast@1s", Handed, HA) is None
    assert refusal("postgres-failover@1s", Handed, HA) is None
    assert "needs the ha topology" in str(refusal("postgres-failover@1s", Handed, SINGLE))
    for kind in ("debezium-kill@1s", "broker-restart@1s", "slot-invalidation@1s"):
        assert refusal(kind, Handed) is not None, kind
