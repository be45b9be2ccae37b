"""``Scenario.fault``: the grammar KIND[:TARGET]@START[+DURATION], each kind's rules and where it
applies (:mod:`lab.faults`), and their one-line errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lab.faults import check, fault_for, parse
from lab.scenario import Scenario


def Fault(kind: str, target: int | None, start_s: float, duration_s: float, extra_s: float = 0.0,
          keep_mb: int = 0, *, rows: int = 0, mode: str = "") -> dict[str, object]:
    """The parameters run.json records of a fault (its ``fault`` block's first fields)."""
    return {"kind": kind, "target": target, "start_s": start_s, "duration_s": duration_s, "extra_s": extra_s,
            "keep_mb": keep_mb, "rows": rows, "mode": mode}


def parse_fault(spec: str) -> dict[str, object]:
    return parse(spec).params()


def checked(**kw: object) -> Scenario:
    """A scenario whose fault :func:`lab.faults.check` accepted (its pipeline; no settings)."""
    scenario = Scenario(**kw)  # type: ignore[arg-type]
    check(scenario)
    return scenario


def parsed(**kw: object) -> dict[str, object]:
    f = fault_for(checked(**kw))
    assert f is not None
    return f.params()


@pytest.mark.parametrize(("spec", "want"), [
    ("consumer-kill:1@10s", Fault("consumer-kill", 1, 10.0, 0.0)),
    ("consumer-kill@2", Fault("consumer-kill", None, 2.0, 0.0)),
    ("consumer-dead:0@1.5s+500ms", Fault("consumer-dead", 0, 1.5, 0.5)),
    ("sink-outage@250ms+3s", Fault("sink-outage", None, 0.25, 3.0)),
    ("walsender-kill:2@4s", Fault("walsender-kill", 2, 4.0, 0.0)),
    ("consumer-slow:1@2s+4s", Fault("consumer-slow", 1, 2.0, 4.0, 0.02)),
    ("consumer-slow=50ms:0@2s+4s", Fault("consumer-slow", 0, 2.0, 4.0, 0.05)),
    ("slot-invalidation:1@3s", Fault("slot-invalidation", 1, 3.0, 0.0, 0.0, 32)),
    ("slot-invalidation=64MB@3s", Fault("slot-invalidation", None, 3.0, 0.0, 0.0, 64)),
    ("slot-invalidation=1GB:0@3s", Fault("slot-invalidation", 0, 3.0, 0.0, 0.0, 1024)),
    ("debezium-kill@3s", Fault("debezium-kill", None, 3.0, 0.0)),
    ("broker-restart@3s", Fault("broker-restart", None, 3.0, 0.0)),
    ("broker-restart@3s+2s", Fault("broker-restart", None, 3.0, 2.0)),
    ("postgres-restart@1s+500ms", Fault("postgres-restart", None, 1.0, 0.5)),
    ("big-transaction@3s", Fault("big-transaction", None, 3.0, 0.0, rows=100_000)),
    ("big-transaction=5000@3s", Fault("big-transaction", None, 3.0, 0.0, rows=5000)),
])
def test_parses(spec: str, want: dict[str, object]) -> None:
    assert parse_fault(spec) == want


@pytest.mark.parametrize(("spec", "says"), [
    ("consumer-kill", "does not read as KIND[:TARGET]@START[+DURATION]"),
    ("reboot@1s", "unknown fault kind 'reboot'"),
    ("consumer-kill:1@10s+2s", "takes no +DURATION"),
    ("consumer-dead:1@10s", "needs +DURATION"),
    ("sink-outage:1@1s+1s", "takes no :TARGET"),
    ("consumer-kill@ten", "START 'ten' is not a time"),
    ("sink-outage@1s+2m", "DURATION '2m' is not a time"),
    ("consumer-kill=5ms:1@1s", "only consumer-slow (=X"),
    ("slot-invalidation=32kB:1@1s", "KEEP '32kB' is not a size"),
    ("slot-invalidation=0MB:1@1s", "KEEP '0MB' is not a size"),
    ("slot-invalidation:1@1s+5s", "takes no +DURATION"),
    ("consumer-slow=0ms:1@1s+1s", "needs a positive extra time"),
    ("consumer-slow:1@1s", "needs +DURATION"),
    ("debezium-kill@1s+1s", "takes no +DURATION"),
    ("big-transaction@1s+1s", "takes no +DURATION"),
    ("debezium-kill:0@1s", "takes no :TARGET"),
    ("broker-restart=5@1s", "only consumer-slow (=X"),
    ("big-transaction=5ms@1s", "big-transaction=ROWS needs a positive whole number"),
    ("big-transaction=0@1s", "big-transaction=ROWS needs a positive whole number"),
])
def test_bad_input_is_one_clear_line(spec: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_fault(spec)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_scenario_validates_and_fills_the_default_target() -> None:
    assert parsed(consumers=2, fault="consumer-dead@1s+1s") == Fault("consumer-dead", 0, 1.0, 1.0)
    assert parsed(pipeline="kafka", fault="walsender-kill@1s")["target"] is None
    assert fault_for(Scenario()) is None
    assert Scenario(consumers=2, fault="consumer-kill:1@3s").slug.endswith("-consumer-kill")
    with pytest.raises(ValueError, match="no consumer 2 among 2"):
        checked(consumers=2, fault="consumer-kill:2@3s")
    with pytest.raises(ValueError, match="walsender is Debezium's"):
        checked(pipeline="rabbitmq", fault="walsender-kill:0@3s")
    with pytest.raises(ValueError, match="consumer_layout='processes'"):
        checked(consumers=2, consumer_layout="tasks", fault="sink-outage@1s+1s")
    with pytest.raises(ValueError, match="producer='web'"):
        checked(pipeline="kafka", producer="direct", fault="sink-outage@1s+1s")
    with pytest.raises(ValueError, match="unknown fault kind"):
        checked(fault="nope@1s")
    with pytest.raises(ValueError, match="slot-invalidation needs a direct reader's slot"):
        checked(pipeline="kafka", fault="slot-invalidation@1s")
    with pytest.raises(ValueError, match="slot-invalidation needs a direct reader's slot"):
        checked(pipeline="poll", fault="slot-invalidation@1s")
    with pytest.raises(ValueError, match="walsender-kill needs a slot: poll's consumers read none"):
        checked(pipeline="poll", consumers=2, fault="walsender-kill:1@3s")
    with pytest.raises(ValueError, match=r"on wal-relay the walsender is its helper's \(relay\)"):
        checked(pipeline="wal-relay", consumers=2, fault="walsender-kill:1@3s")
    assert parsed(pipeline="wal-relay", consumers=2, fault="postgres-restart@3s")["kind"] == "postgres-restart"
    assert parsed(pipeline="wal-relay", consumers=2, fault="walsender-kill@3s")["target"] is None
    with pytest.raises(ValueError, match="slot-invalidation needs a direct reader's slot"):
        checked(pipeline="kafka-share", fault="slot-invalidation@1s")
    with pytest.raises(ValueError, match="on kafka-share the walsender is Debezium's"):
        checked(pipeline="kafka-share", consumers=2, fault="walsender-kill:1@3s")
    assert parsed(pipeline="kafka-share", consumers=2, fault="consumer-kill:1@3s")["target"] == 1
    assert parsed(pipeline="poll", consumers=2, fault="consumer-kill:1@3s")["target"] == 1
    assert parsed(pipeline="wal-filtered", consumers=2, fault="slot-invalidation@1s")["target"] == 0
    assert parsed(pipeline="wal-sharded", consumers=2, fault="slot-invalidation@1s")["target"] == 0


def test_debezium_faults_need_a_broker_pipeline() -> None:
    for kind in ("debezium-kill@3s", "broker-restart@3s+1s"):
        with pytest.raises(ValueError, match="needs Debezium and a broker"):
            checked(pipeline="wal", fault=kind)
        assert parsed(pipeline="rabbitmq", fault=kind)["target"] is None
    assert parsed(pipeline="wal-sharded", fault="big-transaction@1s")["rows"] == 100_000
    assert parsed(pipeline="wal", fault="postgres-restart@1s")["kind"] == "postgres-restart"


def test_the_default_layout_is_tasks_and_processes_under_a_fault() -> None:
    # auto: the reference's tasks (measured cheaper), one process per consumer when a fault needs it
    assert Scenario().consumer_layout == "auto" and Scenario(consumers=4).layout == "tasks"
    assert Scenario(consumers=2, fault="consumer-kill:1@3s").layout == "processes"
    assert Scenario(consumers=2, consumer_layout="processes").layout == "processes"
    assert Scenario(consumers=2, consumer_layout="tasks").layout == "tasks"
    with pytest.raises(ValueError, match="unknown consumer_layout 'threads'"):
        checked(consumer_layout="threads")


def test_a_broker_node_kill_names_a_node_of_three_not_a_consumer() -> None:
    """the failover: the target is a broker node (1..3, default 1), whatever N is."""
    assert parse_fault("broker-node-kill:3@2s+5s") == Fault("broker-node-kill", 3, 2.0, 5.0)
    assert parsed(pipeline="kafka", consumers=1, fault="broker-node-kill:3@2s")["target"] == 3
    assert parsed(pipeline="rabbitmq", fault="broker-node-kill@2s+1s") == Fault(
        "broker-node-kill", 1, 2.0, 1.0)
    with pytest.raises(ValueError, match=r"no broker node 4 \(1..3\)"):
        checked(pipeline="kafka", consumers=8, fault="broker-node-kill:4@2s")
    with pytest.raises(ValueError, match=r"no broker node 0 \(1..3\)"):
        checked(pipeline="kafka", fault="broker-node-kill:0@2s")
    with pytest.raises(ValueError, match="needs Debezium and a broker"):
        checked(pipeline="wal", fault="broker-node-kill@2s")


def test_a_broker_node_kill_under_single_is_refused_before_the_stack_starts(tmp_path: Path) -> None:
    from lab.runner import run_scenario
    from lab.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", stack_dir=tmp_path / "stack")  # nothing there, nothing started
    scenario = Scenario(pipeline="kafka", consumers=2, messages=10, rate=10, fault="broker-node-kill@1s")
    with pytest.raises(ValueError, match="broker-node-kill needs the ha topology"):
        asyncio.run(run_scenario(scenario, settings))
    assert not (tmp_path / "stack").exists()


def test_a_postgres_failover_crashes_the_primary_unless_told_fast() -> None:
    """the PostgreSQL failover: ``immediate`` (a crash) by default, ``=fast`` a switchover;
    no target, no duration, no other mode, on any pipeline."""
    assert parse_fault("postgres-failover@5s") == Fault("postgres-failover", None, 5.0, 0.0, mode="immediate")
    assert parse_fault("postgres-failover=fast@20s")["mode"] == "fast"
    for pipeline in ("wal", "wal-sharded", "wal-relay", "kafka", "rabbitmq"):
        assert parsed(pipeline=pipeline, consumers=2, fault="postgres-failover@5s")["mode"] == "immediate"
    with pytest.raises(ValueError, match="postgres-failover=MODE takes immediate or fast"):
        parse_fault("postgres-failover=smart@5s")
    with pytest.raises(ValueError, match="is instantaneous and takes no"):
        parse_fault("postgres-failover@5s+3s")
    with pytest.raises(ValueError, match="takes no :TARGET"):
        parse_fault("postgres-failover:1@5s")


def test_a_postgres_failover_under_single_is_refused_before_the_stack_starts(tmp_path: Path) -> None:
    from lab.runner import run_scenario
    from lab.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", stack_dir=tmp_path / "stack")
    scenario = Scenario(pipeline="wal", consumers=2, messages=10, rate=10, fault="postgres-failover=fast@1s")
    with pytest.raises(ValueError, match="postgres-failover needs the ha topology"):
        asyncio.run(run_scenario(scenario, settings))
    assert not (tmp_path / "stack").exists()
