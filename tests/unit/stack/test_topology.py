"""The topology setting (issue 15): what ``single`` and ``ha`` render, without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.cli import build_parser
from lab.measure.services import stack_record
from lab.settings import Settings, settings_env
from lab.stack import kafka
from lab.stack.base import StackError
from lab.stack.compose import ComposeStack
from lab.stack.debezium import render_properties
from lab.stack.native import NativeStack
from lab.stack.standby import STANDBY_SLOT, standby_flags


def props(text: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and not ln.startswith("#"))


def test_topology_comes_from_the_environment_and_is_checked() -> None:
    assert Settings.from_env({}).topology == "single"
    assert Settings.from_env({"LAB_TOPOLOGY": "ha"}).ha
    assert settings_env(Settings(topology="ha"))["LAB_TOPOLOGY"] == "ha"  # a run's children see it
    with pytest.raises(ValueError, match="LAB_TOPOLOGY='triple'"):
        Settings.from_env({"LAB_TOPOLOGY": "triple"})


def test_ha_nodes_have_their_own_ports_derived_from_the_configured_ones() -> None:
    s = Settings(kafka_port=34092, kafka_controller_port=34093, pg_port=30432)
    assert s.kafka_nodes == [(1, 34092, 34093)] and s.kafka_bootstrap == "127.0.0.1:34092"
    ha = s.replace(topology="ha")
    assert ha.kafka_nodes == [(1, 34102, 34103), (2, 34112, 34113), (3, 34122, 34123)]
    assert ha.kafka_bootstrap == "127.0.0.1:34102,127.0.0.1:34112,127.0.0.1:34122"
    assert ha.pg_standby_port == 30433
    # the test stacks' ports (300 and 400 above) never meet the ha nodes' of the base ones
    used = {p for n in ha.kafka_nodes for p in n[1:]}
    assert not used & {34092 + 300, 34093 + 300, 34092 + 400, 34093 + 400}


def test_ha_kafka_nodes_form_a_quorum_of_three_with_replication_three_and_min_isr_two(tmp_path: Path) -> None:
    ha = Settings(topology="ha", kafka_port=34092, kafka_controller_port=34093)
    nodes = [props(kafka.server_properties(ha, i, tmp_path / f"n{i}")) for i in (1, 2, 3)]
    assert [n["node.id"] for n in nodes] == ["1", "2", "3"]
    assert {n["controller.quorum.voters"] for n in nodes} == {
        "1@127.0.0.1:34103,2@127.0.0.1:34113,3@127.0.0.1:34123"}
    assert len({n["listeners"] for n in nodes}) == 3 and len({n["log.dirs"] for n in nodes}) == 3
    for n in nodes:
        assert n["default.replication.factor"] == n["offsets.topic.replication.factor"] == "3"
        assert n["min.insync.replicas"] == n["transaction.state.log.min.isr"] == "2"
    single = props(kafka.server_properties(Settings(), 1, tmp_path))
    assert single["controller.quorum.voters"] == f"1@127.0.0.1:{Settings().kafka_controller_port}"
    assert single["default.replication.factor"] == single["min.insync.replicas"] == "1"
    assert kafka.replication(ha) == {"replication_factor": 3, "min_insync_replicas": 2}


def test_debezium_creates_a_failover_slot_only_under_ha() -> None:
    for sink in ("kafka", "rabbitmq"):
        single = props(render_properties(Settings(pg_password="x", rabbitmq_password="y"), sink))
        ha = props(render_properties(Settings(topology="ha", pg_password="x", rabbitmq_password="y"), sink))
        assert single["debezium.source.slot.failover"] == "false"
        assert ha["debezium.source.slot.failover"] == "true"
    ha = props(render_properties(Settings(topology="ha", pg_password="x", rabbitmq_password="y"), "kafka"))
    assert ha["debezium.sink.kafka.producer.acks"] == "all"
    assert ha["debezium.sink.kafka.producer.bootstrap.servers"].count(",") == 2


def test_standby_streams_from_its_slot_with_feedback_and_slot_sync(tmp_path: Path) -> None:
    flags = standby_flags(Settings(topology="ha", pg_port=30432), tmp_path / "pgpass")
    assert flags["primary_slot_name"] == STANDBY_SLOT
    assert flags["hot_standby_feedback"] == flags["sync_replication_slots"] == "on"
    conninfo = flags["primary_conninfo"]
    assert "dbname=lab" in conninfo and "port=30432" in conninfo and "password" not in conninfo.replace(
        "passfile", "")


def test_every_node_is_a_participant_of_its_own() -> None:
    ha = NativeStack(Settings(topology="ha"))
    assert ha.service_names == ("postgres", "postgres-standby", "kafka-1", "kafka-2", "kafka-3", "rabbitmq")
    assert NativeStack(Settings()).service_names == ("postgres", "kafka", "rabbitmq")
    assert stack_record(ha)["topology"] == "ha"


def test_compose_refuses_ha_in_one_line() -> None:
    with pytest.raises(StackError, match="single topology only") as err:
        ComposeStack(Settings(backend="compose", topology="ha")).up()
    assert "\n" not in str(err.value)
    assert ComposeStack(Settings(backend="compose")).topology == "single"


@pytest.mark.parametrize("argv", [["stack", "up"], ["stack", "down"], ["stack", "status"], ["run"],
                                  ["bench", "stack"]])
def test_topology_option(argv: list[str]) -> None:
    assert build_parser().parse_args([*argv, "--topology", "ha"]).topology == "ha"
    assert build_parser().parse_args(argv).topology is None
