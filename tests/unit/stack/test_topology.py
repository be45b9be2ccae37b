"""The topology setting: what ``single`` and ``ha`` render, without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.cli import build_parser
from lab.measure.services import stack_record
from lab.pipelines.rabbitmq import queue_arguments
from lab.settings import Settings, settings_env
from lab.stack import kafka_broker as kafka
from lab.stack.base import StackError, services
from lab.stack.compose import ComposeStack
from lab.stack.debezium import render_properties
from lab.stack.native import NativeStack
from lab.stack.rabbitmq_broker import HA_MEMORY_WATERMARK, RabbitMQService
from lab.stack.rabbitmq_cluster import RabbitMQCluster, queue_replicas, running_nodes
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
    assert services(ha.participants()) == ("postgres", "postgres-standby", "kafka-1", "kafka-2", "kafka-3",
                                           "rabbitmq-1", "rabbitmq-2", "rabbitmq-3")
    assert services(NativeStack(Settings()).participants()) == ("postgres", "kafka", "rabbitmq")
    assert stack_record(ha)["topology"] == "ha"


def test_compose_refuses_ha_in_one_line() -> None:
    with pytest.raises(StackError, match="single topology only") as err:
        ComposeStack(Settings(backend="compose", topology="ha")).up()
    assert "\n" not in str(err.value)
    assert ComposeStack(Settings(backend="compose")).topology == "single"


@pytest.mark.parametrize("argv", [["stack", "up"], ["stack", "down"], ["stack", "status"], ["run"],
                                  ["bench", "stack"], ["series"], ["report"]])
def test_topology_option(argv: list[str]) -> None:
    assert build_parser().parse_args([*argv, "--topology", "ha"]).topology == "ha"
    assert build_parser().parse_args(argv).topology is None


def test_ha_rabbitmq_nodes_have_their_own_names_and_ports() -> None:
    s = Settings(amqp_port=33673, rabbitmq_dist_port=33674, rabbitmq_node="lab@localhost")
    assert s.rabbitmq_nodes == [(1, "lab@localhost", 33673, 33674)] and s.amqp_endpoint_port == 33673
    ha = s.replace(topology="ha", rabbitmq_password="pw")
    assert ha.rabbitmq_nodes == [(1, "lab-1@localhost", 33683, 33684), (2, "lab-2@localhost", 33693, 33694),
                                 (3, "lab-3@localhost", 33703, 33704)]
    assert ha.amqp_endpoint_port == 33683 and ha.amqp_url.endswith("@127.0.0.1:33683/")  # clients: node 1
    assert ha.amqp_url_public == "amqp://lab@127.0.0.1:33683/"
    used = {p for n in ha.rabbitmq_nodes for p in n[2:]}
    assert not used & {33673 + 300, 33674 + 300, 33673 + 400, 33674 + 400}  # the test stacks' ports
    assert not used & {p for n in ha.kafka_nodes for p in n[1:]}
    # Debezium's sink publishes to node 1
    assert props(render_properties(ha.replace(pg_password="x"), "rabbitmq"))[
        "debezium.sink.rabbitmq.connection.port"] == "33683"


def test_ha_rabbitmq_nodes_render_their_own_config_and_share_one_private_cookie(tmp_path: Path) -> None:
    ha = Settings(topology="ha", stack_dir=tmp_path, amqp_port=33673, rabbitmq_password="pw")
    cluster = RabbitMQCluster(ha)
    assert [n.name for n in cluster.nodes] == ["rabbitmq-1", "rabbitmq-2", "rabbitmq-3"]
    assert len({n.dir for n in cluster.nodes}) == 3 and len({n.mnesia for n in cluster.nodes}) == 3
    assert {n.epmd_dir for n in cluster.nodes} == {tmp_path / "rabbitmq-1" / "epmd"}  # one epmd, node 1's
    assert [n.owns_epmd for n in cluster.nodes] == [True, False, False]
    cookies = []
    for node in cluster.nodes:
        node._write_config()
        conf = (node.etc / "rabbitmq.conf").read_text()
        assert f"listeners.tcp.1 = 127.0.0.1:{node.amqp_port}" in conf
        assert f"vm_memory_high_watermark.absolute = {HA_MEMORY_WATERMARK}" in conf
        env = node._env()
        assert env["RABBITMQ_NODENAME"] == node.node_name and env["RABBITMQ_DIST_PORT"] == str(node.dist_port)
        assert env["ERL_EPMD_PORT"] == str(ha.rabbitmq_epmd_port)
        cookie = node.home / ".erlang.cookie"
        assert cookie.stat().st_mode & 0o777 == 0o400
        cookies.append(cookie.read_text())
        assert all(cookies[-1] not in str(a) for a in env.values())  # never in the environment
    assert len(set(cookies)) == 1 and len(cookies[0]) == 40
    assert (ha.secrets_dir / "erlang.cookie").stat().st_mode & 0o777 == 0o600
    cluster.nodes[0]._write_config()  # a second start keeps the cookie
    assert (cluster.nodes[0].home / ".erlang.cookie").read_text() == cookies[0]
    # the single node: no memory limit of ours, its own cookie, its own dir
    single = RabbitMQService(ha.replace(topology="single"))
    single._write_config()
    assert single.dir == tmp_path / "rabbitmq" and single.amqp_port == 33673
    assert "vm_memory_high_watermark" not in (single.etc / "rabbitmq.conf").read_text()


def test_the_ha_quorum_queue_gets_three_members_led_from_node_one() -> None:
    assert queue_arguments(Settings()) == {"x-queue-type": "quorum"}
    assert queue_arguments(Settings(topology="ha")) == {
        "x-queue-type": "quorum", "x-quorum-initial-group-size": 3, "x-queue-leader-locator": "client-local"}


def test_cluster_and_queue_state_are_read_from_the_cli_json() -> None:
    status = ('{"running_nodes": ["a-2@localhost", "a-1@localhost", "a-3@localhost"], '
              '"disk_nodes": ["a-1@localhost", "a-2@localhost", "a-3@localhost"]}')
    assert running_nodes(status) == ["a-1@localhost", "a-2@localhost", "a-3@localhost"]
    queues = ('[{"name": "other", "members": ["a-1@localhost"], "leader": "a-1@localhost"}, '
              '{"name": "load-dbz-quorum", "members": ["a-3@localhost", "a-1@localhost", "a-2@localhost"], '
              '"leader": "a-1@localhost"}]')
    assert queue_replicas(queues, "load-dbz-quorum") == {
        "members": ["a-1@localhost", "a-2@localhost", "a-3@localhost"], "leader": "a-1@localhost"}
    assert queue_replicas(queues, "missing") == {"members": [], "leader": None}


def test_either_topology_stops_the_others_rabbitmq_too() -> None:
    single, ha = NativeStack(Settings()), NativeStack(Settings(topology="ha"))
    assert isinstance(ha.rabbitmq, RabbitMQCluster) and isinstance(single.rabbitmq, RabbitMQService)
    assert any(isinstance(s, RabbitMQCluster) for s in single._other_topology())
    assert any(isinstance(s, RabbitMQService) for s in ha._other_topology())


def test_the_nodes_join_one_after_the_other_and_a_failed_join_is_raised(monkeypatch) -> None:
    """Two joins at once can kill the loser's mnesia start for good: node 3 joins only once node 2's
    join returned, a node already in the cluster does not join again, and a failure is raised."""
    from types import SimpleNamespace

    nodes = [SimpleNamespace(node_name=f"n{i}@localhost") for i in (1, 2, 3)]
    cluster = RabbitMQCluster.__new__(RabbitMQCluster)
    cluster.nodes = nodes
    running = ["n1@localhost"]
    monkeypatch.setattr(RabbitMQCluster, "running_nodes", lambda self: list(running))
    monkeypatch.setattr(RabbitMQCluster, "clustered", lambda self: True)
    events: list[str] = []

    def join_one(self, node) -> None:
        events.append(f"start {node.node_name}")
        events.append(f"end {node.node_name}")

    monkeypatch.setattr(RabbitMQCluster, "_join_one", join_one)
    cluster._join()
    assert events == ["start n2@localhost", "end n2@localhost", "start n3@localhost", "end n3@localhost"]
    events.clear()
    running.append("n2@localhost")
    cluster._join()
    assert events == ["start n3@localhost", "end n3@localhost"]

    def always(self, node) -> None:
        raise StackError("start_app failed (69)")

    monkeypatch.setattr(RabbitMQCluster, "_join_one", always)
    with pytest.raises(StackError):
        cluster._join()
