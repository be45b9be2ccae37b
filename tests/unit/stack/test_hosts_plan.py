"""The netns host layout's pure parts: names, addresses, the setting's checks."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from lab.settings import HA_NETNS_HOSTS, NETNS_HOSTS, Settings, parse_delay, settings_env
from lab.stack import hosts
from lab.stack.base import StackError
from lab.stack.kafka_broker import KafkaService, server_properties
from lab.stack.rabbitmq_broker import RabbitMQService, inetrc


def test_hosts_come_from_the_environment_and_bad_values_are_refused_in_one_line() -> None:
    assert Settings.from_env({}).hosts == "loopback"
    assert Settings.from_env({"LAB_HOSTS": "netns"}).netns
    assert settings_env(Settings(hosts="netns"))["LAB_HOSTS"] == "netns"  # a run's children see it
    with pytest.raises(ValueError, match="LAB_HOSTS='vlan': choose one of loopback, netns"):
        Settings.from_env({"LAB_HOSTS": "vlan"})
    with pytest.raises(ValueError, match="native backend"):
        Settings(hosts="netns", backend="compose")


def test_each_host_has_its_own_address_in_one_private_24_and_clients_use_them() -> None:
    s = Settings(stack_dir=Path("/x/stack"), hosts="netns", pg_port=30432, kafka_port=30092, web_port=30080)
    net = ipaddress.ip_network(s.hosts_subnet)
    assert net.prefixlen == 24 and net.is_private and str(net).startswith("10.231.")
    addrs = [s.address(h) for h in [*NETNS_HOSTS, "runner"]]
    assert len(set(addrs)) == len(addrs) and all(ipaddress.ip_address(a) in net for a in addrs)
    assert s.address("runner").endswith(".1")
    assert f"host={s.address('postgres')} port=30432" in s.pg_dsn
    assert s.kafka_bootstrap == f"{s.address('broker')}:30092"
    assert s.web_url == f"http://{s.address('web')}:30080"
    assert s.control_url == f"http://{s.address('web')}:30081"
    assert s.debezium_host == s.address("debezium")
    assert s.rabbitmq_host == s.address("rabbitmq") != s.broker_host  # Kafka and RabbitMQ: a host each
    assert s.amqp_url_public == f"amqp://lab@{s.address('rabbitmq')}:{s.amqp_port}/"
    loop = s.replace(hosts="loopback")
    assert loop.pg_host == loop.broker_host == loop.rabbitmq_host == loop.web_host == loop.debezium_host == "127.0.0.1"


def test_two_stack_dirs_get_two_identities_and_one_dir_always_the_same() -> None:
    a, b = Settings(stack_dir=Path("/w/stacks/hosts")), Settings(stack_dir=Path("/w/stacks/hosts/test"))
    assert a.stack_id != b.stack_id and a.stack_id == Settings(stack_dir=Path("/w/stacks/hosts")).stack_id
    assert len(a.stack_id) == 6 and int(a.stack_id, 16) >= 0


def test_every_name_carries_the_prefix_and_identity_and_fits_an_interface_name() -> None:
    s = Settings(stack_dir=Path("/w/stacks/x"), hosts="netns")
    lay = hosts.layout(s)
    assert set(lay.namespaces) == set(NETNS_HOSTS)
    for ns in [lay.switch, *lay.namespaces.values()]:
        assert ns.startswith(f"fl-{s.stack_id}-")
    for host in lay.links:
        for name in (lay.links[host], lay.peer(host)):
            assert name.startswith(f"fl{s.stack_id}-") and len(name) <= 15
    assert len({*lay.links.values(), *(lay.peer(h) for h in lay.links)}) == 2 * len(lay.links)
    assert hosts.namespace(s, "postgres") == lay.namespaces["postgres"]
    assert hosts.namespace(s.replace(hosts="loopback"), "postgres") is None


def test_cleanup_selects_exactly_this_stacks_names() -> None:
    lay = hosts.layout(Settings(stack_dir=Path("/w/a"), hosts="netns"))
    other = hosts.layout(Settings(stack_dir=Path("/w/b"), hosts="netns"))
    names = [lay.switch, *lay.namespaces.values(), other.switch, "fl-", "docker0", "flannel.1"]
    assert hosts.ours(names, lay.prefix_ns) == sorted([lay.switch, *lay.namespaces.values()])
    links = [lay.runner_link, other.runner_link, "eth0", "fl" + lay.stack_id]
    assert hosts.ours(links, lay.prefix_link) == [lay.runner_link]


def test_each_host_counts_what_it_sends_to_every_other_host_and_the_runner() -> None:
    lay = hosts.layout(Settings(stack_dir=Path("/w/a"), hosts="netns"))
    script = hosts.counter_rules(lay, "postgres")
    assert "hook output" in script and lay.addresses["postgres"] not in script
    for peer in ("broker", "debezium", "web", "consumers", "runner"):
        assert f"ip daddr {lay.addresses[peer]} counter comment \"{peer}\"" in script
    listing = ('{"nftables": [{"metainfo": {}}, {"rule": {"chain": "out", "comment": "consumers", "expr": ['
               '{"match": {}}, {"counter": {"packets": 3, "bytes": 4200}}]}}, {"chain": {"name": "out"}}]}')
    assert hosts.parse_counters(listing) == {"consumers": 4200}


def test_a_link_delay_is_read_in_ms_or_us_and_needs_hosts_of_their_own() -> None:
    assert parse_delay("1ms") == 1.0 and parse_delay("250us") == 0.25 and parse_delay("2") == 2.0
    assert parse_delay("0") == 0.0
    for bad in ("x", "-1ms", "nan", "inf", "1001ms", "1 s"):
        with pytest.raises(ValueError, match="is not a delay like 1ms"):
            parse_delay(bad)
    netns = Settings.from_env({"LAB_HOSTS": "netns", "LAB_LINK_DELAY": "1ms"})
    assert netns.link_delay_ms == 1.0
    assert Settings.from_env(settings_env(netns)).link_delay_ms == 1.0  # a run's children see it
    with pytest.raises(ValueError, match="needs hosts of their own"):
        Settings(link_delay_ms=1.0)


def test_netns_without_root_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 1000)
    with pytest.raises(StackError, match="needs root") as info:
        hosts.create(Settings(stack_dir=Path("/nonexistent/stack"), hosts="netns"))
    assert "\n" not in str(info.value)


def test_without_the_ip_command_a_loopback_stack_finds_no_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    s = Settings(stack_dir=Path("/nonexistent/stack"))
    assert hosts.leftovers(s) == [] and not hosts.recorded(s)
    with pytest.raises(StackError, match="needs the ip command"):
        hosts.link_bytes(s.replace(hosts="netns"))


def test_rabbitmq_on_its_host_listens_on_its_address_and_keeps_epmd_on_the_hosts_loopback(tmp_path: Path) -> None:
    s = Settings(stack_dir=tmp_path, hosts="netns", amqp_port=30673, rabbitmq_epmd_port=30369, rabbitmq_password="pw")
    node = RabbitMQService(s)
    assert node.netns == hosts.layout(s).namespaces["rabbitmq"] and node.host == s.address("rabbitmq")
    node._write_config()
    assert f"listeners.tcp.1 = {s.address('rabbitmq')}:30673" in (node.etc / "rabbitmq.conf").read_text()
    env = node._env()  # the node name @localhost, epmd and the distribution: the host's own loopback
    assert env["ERL_EPMD_ADDRESS"] == "127.0.0.1" and "{127,0,0,1}" in env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    called = node.erl_call()
    if called is not None:  # erl_call reaches the node's epmd from inside its namespace
        assert called[0][:2] == ["nsenter", f"--net=/run/netns/{node.netns}"]
        assert called[0][called[0].index("-sname") + 1] == s.rabbitmq_node
    loop = RabbitMQService(s.replace(hosts="loopback"))
    assert loop.netns is None and loop.host == "127.0.0.1"
    called = loop.erl_call()
    assert called is None or called[0][0] != "nsenter"


def test_under_ha_each_broker_node_and_the_standby_get_a_host_of_their_own(tmp_path: Path) -> None:
    s = Settings(stack_dir=tmp_path, hosts="netns", topology="ha", kafka_port=30092, amqp_port=30673,
                 pg_port=30432, rabbitmq_node="rmq@localhost")
    lay = hosts.layout(s)
    assert set(lay.namespaces) == set(NETNS_HOSTS) | set(HA_NETNS_HOSTS) == set(s.netns_hosts)
    assert len(set(lay.addresses.values())) == len(lay.addresses) and s.address("engine") not in lay.addresses.values()
    assert s.kafka_bootstrap == ",".join(f"{s.address(h)}:{30092 + 10 * i}"
                                         for i, h in ((1, "broker"), (2, "broker-2"), (3, "broker-3")))
    assert f"host={s.address('postgres')},{s.address('postgres-standby')} port=30432,30433" in s.pg_dsn
    assert s.pg_standby_host == s.address("postgres-standby")
    lines = s.pg_passfile.read_text().splitlines()  # the password for the standby's own address too
    assert [line.split(":")[0] for line in lines] == [s.address("postgres"), s.address("postgres-standby")]
    kafka = KafkaService(s, 2)
    assert kafka.netns == lay.namespaces["broker-2"] and kafka.bootstrap == f"{s.address('broker-2')}:30112"
    props = server_properties(s, 2, tmp_path)
    assert f"listeners=PLAINTEXT://{s.address('broker-2')}:30112," in props
    assert f"3@{s.address('broker-3')}:" in props  # the voters at their hosts
    # RabbitMQ: each node named after its host, which its peers resolve from the node's inetrc
    assert [n[1] for n in s.rabbitmq_nodes] == ["rmq-1@rabbitmq", "rmq-2@rabbitmq-2", "rmq-3@rabbitmq-3"]
    assert s.amqp_url_public == f"amqp://lab@{s.address('rabbitmq')}:30683/" and s.rabbitmq_spread
    text = inetrc(s)
    assert f'{{host, {{{s.address("rabbitmq-2").replace(".", ",")}}}, ["rabbitmq-2"]}}.' in text
    assert text.endswith("{lookup, [file, native]}.\n")
    nodes = [RabbitMQService(s, i) for i in (1, 2, 3)]
    assert [n.netns for n in nodes] == [lay.namespaces[h] for h in ("rabbitmq", "rabbitmq-2", "rabbitmq-3")]
    assert all(n.owns_epmd and n.epmd_dir == n.dir / "epmd" for n in nodes)  # an epmd on every host
    env = nodes[1]._env()
    assert f"inet_dist_use_interface {{{s.address('rabbitmq-2').replace('.', ',')}}}" in \
        env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] and env["ERL_INETRC"] == str(nodes[1].etc / "inetrc")
    loop = s.replace(hosts="loopback")  # on loopback: one epmd, node 1's, every node @localhost
    assert not loop.rabbitmq_spread and [n[1] for n in loop.rabbitmq_nodes][2] == "rmq-3@localhost"
    assert "ERL_INETRC" not in RabbitMQService(loop, 2)._env() and not RabbitMQService(loop, 2).owns_epmd


def test_a_half_made_layout_whose_namespaces_still_run_processes_is_refused_not_removed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Removing the namespaces would leave PostgreSQL running where no address reaches it and no
    name finds it: `up` refuses and says to stop first."""
    s = Settings(stack_dir=Path("/x/stack"), hosts="netns")
    lay = hosts.layout(s)
    removed: list[object] = []
    monkeypatch.setattr(hosts, "require_root", lambda: None)
    monkeypatch.setattr(hosts, "complete", lambda settings: False)
    monkeypatch.setattr(hosts, "netns_names", lambda: [lay.switch, lay.namespaces["postgres"]])
    monkeypatch.setattr(hosts, "leftovers", lambda settings: [lay.switch, lay.namespaces["postgres"]])
    monkeypatch.setattr(hosts, "pids_in", lambda ns: {4242} if ns == lay.namespaces["postgres"] else set())
    monkeypatch.setattr(hosts, "remove", lambda settings: removed.append(settings))
    with pytest.raises(StackError, match=rf"half made .*{lay.namespaces['postgres']}: pid 4242.*lab stack down"):
        hosts.create(s)
    assert removed == []
    monkeypatch.setattr(hosts, "pids_in", lambda ns: set())  # nothing runs there: removed and made again
    monkeypatch.setattr(hosts, "_subnet_taken", lambda settings: "stop here")
    with pytest.raises(StackError, match="routed via stop here"):
        hosts.create(s)
    assert removed == [s]


def test_the_hosts_may_answer_the_runner_but_open_nothing_on_this_machine() -> None:
    """The root namespace drops what a host starts over the runner's link (a TCP SYN to the host's
    sshd on 0.0.0.0, UDP, a ping); the replies to the runner's own connections pass. Stateless."""
    lay = hosts.layout(Settings(stack_dir=Path("/x/stack"), hosts="netns"))
    script = hosts.runner_guard(lay)
    table = hosts.guard_table(lay)
    assert table.startswith(lay.prefix_link)
    lines = script.splitlines()
    assert lines[:3] == [f"add table inet {table}", f"delete table inet {table}", f"add table inet {table}"]
    rules = [ln for ln in lines if ln.startswith("add rule")]
    assert rules and all(f'iifname "{lay.runner_link}"' in r and r.endswith("drop") for r in rules)
    assert any("tcp flags & (syn | ack) == syn" in r for r in rules)
    assert any("udp" in r for r in rules) and any("echo-request" in r for r in rules)
    assert "ct state" not in script  # no conntrack on the measured packets
