"""The pure parts of the compose backend on an engine reached over the network: where the services
are reached and published, the stack's own engine's names, command line and configuration, where
its containers' cgroups are, what a crash leaves mounted."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from lab.settings import NETNS_HOSTS, Settings, docker_host_address
from lab.stack import hosts
from lab.stack.containers import cgroup_template
from lab.stack.engine import compose_bind
from lab.stack.remote_engine import containerd_config, dockerd_command, engine_layout, mounts_below

CID = "5e1ccafd8bfef4324d6d17cff011945485ad921c2df58a9158a82b45609a75fc"


@pytest.mark.parametrize(("url", "host"), [
    ("tcp://10.231.7.7:2375", "10.231.7.7"),
    ("tcp://big-host:2376", "big-host"),
    ("ssh://lab@big-host", "big-host"),
    ("ssh://lab@big-host:2222", "big-host"),
    ("tcp://[fd00::7]:2375", "fd00::7"),
    ("unix:///var/run/docker.sock", None),
    ("npipe:////./pipe/docker_engine", None),
    ("", None),
    ("big-host", None),
])
def test_the_host_a_docker_host_url_names(url: str, host: str | None) -> None:
    assert docker_host_address(url) == host


def test_services_are_reached_where_the_engine_is_unless_said_otherwise() -> None:
    assert Settings().service_host == "127.0.0.1"
    remote = Settings(docker_host="tcp://10.231.7.7:2375")
    assert remote.service_host == "10.231.7.7"
    assert f"host=10.231.7.7 port={remote.pg_port} " in remote.pg_dsn
    assert remote.kafka_bootstrap == f"10.231.7.7:{remote.kafka_port}"
    assert Settings(docker_host="ssh://lab@big-host", services_host="10.0.0.9").service_host == "10.0.0.9"
    assert Settings(docker_host="unix:///run/other.sock").service_host == "127.0.0.1"


def test_ports_are_published_on_the_address_the_lab_reaches_them_at() -> None:
    assert compose_bind(Settings()) == "127.0.0.1"
    assert compose_bind(Settings(docker_host="unix:///run/other.sock")) == "127.0.0.1"
    assert compose_bind(Settings(docker_host="tcp://10.231.7.7:2375")) == "10.231.7.7"  # that interface only
    assert compose_bind(Settings(docker_host="ssh://lab@big-host")) == "0.0.0.0"  # a name: its interfaces
    # reached elsewhere than the engine's API (a NAT, another interface): every interface
    assert compose_bind(Settings(docker_host="tcp://10.231.7.7:2375", services_host="10.0.0.9")) == "0.0.0.0"


def test_the_engine_is_one_more_host_on_the_stacks_bridge() -> None:
    s = Settings(stack_dir=Path("/x/stack"))
    net = ipaddress.ip_network(s.hosts_subnet)
    others = {s.address(h) for h in [*NETNS_HOSTS, "runner"]}
    assert ipaddress.ip_address(s.address("engine")) in net and s.address("engine") not in others
    assert s.engine_url == f"tcp://{s.address('engine')}:2376"
    e = engine_layout(s)
    lay = hosts.layout(s)
    assert e.namespace == f"fl-{s.stack_id}-engine" and e.namespace.startswith(lay.prefix_ns)
    assert e.link.startswith(lay.prefix_link) and len(e.link + "p") <= hosts.IFNAMSIZ
    assert e.link not in lay.links.values()
    assert e.data_root == Path("/x/stack/engine/data")
    assert e.cgroup_parent == f"/fl-{s.stack_id}-engine"  # absolute: the same place in every hierarchy
    assert len(str(e.containerd_socket)) < 80  # a unix socket path, whatever the stack dir's length
    other = engine_layout(Settings(stack_dir=Path("/x/stack/test")))
    assert {other.namespace, other.address, str(other.exec_root)}.isdisjoint(
        {e.namespace, e.address, str(e.exec_root)})


def test_dockerd_listens_on_tcp_at_its_address_only_with_everything_its_own() -> None:
    e = engine_layout(Settings(stack_dir=Path("/x/stack")))
    argv = dockerd_command(e)
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == f"tcp://{e.address}:2376"
    assert not [a for a in argv if "unix://" in a or "docker.sock" in a]  # the host engine's socket untouched
    flags = {a: argv[i + 1] for i, a in enumerate(argv[:-1])
             if a.startswith("--") and "=" not in a and not argv[i + 1].startswith("--")}
    assert flags["--data-root"] == str(e.data_root)
    assert flags["--exec-root"] == str(e.dockerd_exec_root)
    assert flags["--pidfile"] == str(e.pidfile) != "/var/run/docker.pid"
    assert flags["--containerd"] == str(e.containerd_socket)
    assert flags["--cgroup-parent"] == e.cgroup_parent


def test_only_a_client_with_the_stacks_certificate_reaches_the_engine() -> None:
    """Its API is root on the machine: dockerd verifies every client against the stack's own CA,
    whose client key only root can read (never plain tcp, never TLS without a client check)."""
    s = Settings(stack_dir=Path("/x/stack"))
    e = engine_layout(s)
    argv = dockerd_command(e)
    assert "--tlsverify" in argv and "--tls=false" not in argv
    flags = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--tls") and a != "--tlsverify"}
    assert flags == {"--tlscacert": "/x/stack/secrets/engine/ca.pem",
                     "--tlscert": "/x/stack/secrets/engine/server-cert.pem",
                     "--tlskey": "/x/stack/secrets/engine/server-key.pem"}
    assert e.tls_dir == s.engine_tls_dir == s.secrets_dir / "engine"
    assert s.replace(docker_host=s.engine_url).own_engine and not s.own_engine
    assert not s.replace(docker_host="tcp://10.0.0.9:2376").own_engine


def test_the_engine_certificates_are_private_and_the_ca_key_is_gone(tmp_path: Path) -> None:
    """Made with openssl (umask 077): keys 0600, directory 0700, the CA's key deleted once it signed
    dockerd's certificate (for the engine's address) and the client's; both verify against the CA."""
    import os
    import stat
    import subprocess

    from lab.stack import enginetls

    tls = tmp_path / "secrets" / "engine"
    enginetls.ensure(tls, "10.231.83.7")
    assert sorted(p.name for p in tls.iterdir()) == sorted([*enginetls.FILES, "address"])
    assert stat.S_IMODE(tls.stat().st_mode) == 0o700
    for key in ("key.pem", "server-key.pem"):
        assert stat.S_IMODE((tls / key).stat().st_mode) == 0o600 and (tls / key).stat().st_uid == os.geteuid()
    for cert, purpose in (("server-cert.pem", "sslserver"), ("cert.pem", "sslclient")):
        done = subprocess.run(["openssl", "verify", "-purpose", purpose, "-CAfile", "ca.pem", cert], cwd=tls,
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    text = subprocess.run(["openssl", "x509", "-in", "server-cert.pem", "-noout", "-ext", "subjectAltName"],
                          cwd=tls, capture_output=True, text=True, check=True).stdout
    assert "IP Address:10.231.83.7" in text
    before = (tls / "cert.pem").read_bytes()
    assert enginetls.complete(tls, "10.231.83.7") and not enginetls.complete(tls, "10.231.84.7")
    enginetls.ensure(tls, "10.231.83.7")  # kept: a running engine's clients stay valid
    assert (tls / "cert.pem").read_bytes() == before
    enginetls.ensure(tls, "10.231.84.7")  # another address (the stack dir moved): made again
    assert (tls / "cert.pem").read_bytes() != before


def test_containerd_has_its_own_root_state_and_socket() -> None:
    e = engine_layout(Settings(stack_dir=Path("/x/stack")))
    conf = containerd_config(e)
    assert f'root = "{e.containerd_root}"' in conf and f'state = "{e.containerd_state}"' in conf
    assert f'address = "{e.containerd_socket}"' in conf
    assert "/run/containerd" not in conf
    assert 'disabled_plugins = ["io.containerd.grpc.v1.cri"]' in conf


def test_the_engines_cgroup_place_is_learnt_from_a_containers_pid() -> None:
    v1 = (f"4:memory:/process_api/7e96/fl-cb9416-engine/{CID}\n"  # another root in memory's hierarchy
          f"2:cpuacct:/fl-cb9416-engine/{CID}\n1:cpu:/fl-cb9416-engine/{CID}\n0::/fl-cb9416-engine/{CID}\n")
    assert cgroup_template(v1, CID) == "fl-cb9416-engine/{id}"
    assert cgroup_template("2:cpu,cpuacct:/docker/" + CID + "\n", CID) == "docker/{id}"
    assert cgroup_template(f"0::/system.slice/docker-{CID}.scope\n", CID) == "system.slice/docker-{id}.scope"
    # a pid that is not that container's here (an engine on another machine): no place learnt
    assert cgroup_template("2:cpuacct:/user.slice\n0::/user.slice\n", CID) is None
    assert cgroup_template("", CID) is None


def test_mounts_a_crash_left_are_found_deepest_first_and_only_below_the_engines_roots() -> None:
    info = "\n".join([
        "36 25 0:32 / / rw - ext4 /dev/vda rw",
        "90 36 0:50 / /x/stack/engine/data/overlay2/ab/merged rw - overlay overlay rw",
        "91 36 0:51 / /x/stack/engine/data/containers/cd/mounts/shm rw - tmpfs shm rw",
        "92 36 0:4 / /run/fanout-lab/engine-abc/docker/netns/1f rw - nsfs nsfs rw",
        "93 36 0:52 / /x/stack/engine/data2/other rw - overlay overlay rw",
        "94 36 0:53 / /var/lib/docker/overlay2/ef/merged rw - overlay overlay rw",
    ])
    found = mounts_below(info, [Path("/x/stack/engine/data"), Path("/run/fanout-lab/engine-abc")])
    assert found == ["/x/stack/engine/data/containers/cd/mounts/shm", "/x/stack/engine/data/overlay2/ab/merged",
                     "/run/fanout-lab/engine-abc/docker/netns/1f"]


def test_the_participant_hosts_leave_the_engine_and_its_switch_alone() -> None:
    lay = hosts.layout(Settings(stack_dir=Path("/x/stack")))
    assert lay.engine_kept([lay.switch, *lay.namespaces.values()]) == set()
    kept = lay.engine_kept([lay.switch, lay.engine_ns])
    assert kept == {lay.engine_ns, lay.engine_link, lay.engine_link + "p", lay.switch, lay.runner_link}
    assert kept.isdisjoint(lay.namespaces.values())


def test_engine_down_purge_names_its_data_root_not_the_stack_dir() -> None:
    """``--purge`` of ``lab stack engine down`` is not ``lab stack down --purge`` (which checks and
    deletes the whole stack dir)."""
    from lab.cli import build_parser

    args = build_parser().parse_args(["stack", "engine", "down", "--purge"])
    assert args.purge_data and not getattr(args, "purge", False)
    assert args.locks  # like `lab stack down`: refused while a run holds the stack
    assert not getattr(build_parser().parse_args(["stack", "engine", "status"]), "locks", False)


def test_the_engine_client_keeps_the_stacks_ca_whatever_the_environment_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """requests lets REQUESTS_CA_BUNDLE replace a session's own CA when a request names none (the
    engine would then be refused as unknown): the engine's client, and the compose CLI's environment,
    keep the stack's CA."""
    from lab.stack import enginetls
    from lab.stack.engine import compose_env, own_engine_client

    tls = enginetls.ensure(tmp_path / "secrets" / "engine", "10.231.83.7")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("CURL_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    client = own_engine_client("tcp://10.231.83.7:2376", tls, version="1.41")
    assert client.api.base_url == "https://10.231.83.7:2376"
    merged = client.api.merge_environment_settings("https://10.231.83.7:2376/v1.41/_ping", {}, None, None, None)
    assert merged["verify"] == str(tls / "ca.pem") and merged["cert"] == (str(tls / "cert.pem"), str(tls / "key.pem"))
    assert not merged["proxies"]
    s = Settings(stack_dir=tmp_path)
    monkeypatch.setattr("lab.stack.engine.reachable", lambda host: True)  # as with the engine up
    env = compose_env(s.replace(docker_host=s.engine_url))
    assert env["DOCKER_TLS_VERIFY"] == "1" and env["DOCKER_CERT_PATH"] == str(s.engine_tls_dir)
    assert "REQUESTS_CA_BUNDLE" not in env and "CURL_CA_BUNDLE" not in env
