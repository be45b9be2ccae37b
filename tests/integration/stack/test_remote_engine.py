"""The compose backend on an engine reached over the network: the stack's own engine
(``lab stack engine up``, a second dockerd in a network namespace on the stack's bridge) and
``LAB_DOCKER_HOST`` pointing at it.

One engine for the module, started with its data root empty (purged at the end), so the image
copy is part of what this takes; a ``wal`` run through it whose accounting must close; then a
crash (dockerd and containerd SIGKILLed with the services' containers running) after which
``down`` must leave no namespace, link, process, mount or cgroup of the engine. Skipped, with the
reason, without root, without dockerd, or without the host engine the local images are built on
(scripts/with-docker.sh starts one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.settings import ENGINE_PORT, Settings
from lab.stack.base import StackError
from tests.conftest import test_settings as native_test_settings

# 80-130 s with the image copy, in `make test`: the compose backend on an engine reached over the network
pytestmark = pytest.mark.integration
OFFSET = 250  # host-side ports (web, Debezium HTTP) apart from the native (+300) and compose (+200) tests
TIMINGS: dict[str, float] = {}


def engine_settings() -> Settings:
    base = native_test_settings(OFFSET, "engine-test")
    s = base.replace(backend="compose", compose_images="local",
                     compose_project=f"{base.compose_project}-engine-test")
    return s.replace(docker_host=s.engine_url)


@pytest.fixture(scope="module")
def engine() -> Iterator[Settings]:
    from lab.stack import remote_engine
    from lab.stack.engine import docker_client
    from lab.stack.images import build_images

    if os.geteuid() != 0:
        pytest.skip("the lab's own engine runs in a network namespace: needs root")
    if shutil.which("dockerd") is None or shutil.which("containerd") is None:
        pytest.skip("dockerd and containerd are not installed (Debian: docker.io)")
    settings = engine_settings()
    host = settings.replace(docker_host="")
    try:
        docker_client(host)
        build_images(host)  # cached: seconds when scripts/with-docker.sh built them already
    except StackError as exc:
        pytest.skip(f"no local images on this machine's engine: {exc}")
    remote_engine.down(settings, purge=True)  # leftovers of an interrupted session
    t0 = time.monotonic()
    try:
        remote_engine.up(settings)
        TIMINGS["engine up with the image copy"] = time.monotonic() - t0
        yield settings
    finally:
        from lab.stack.compose import ComposeStack

        with contextlib.suppress(StackError):  # the engine is gone already (the crash test)
            ComposeStack(settings).down(purge=True)
        remote_engine.down(settings, purge=True)


def test_engine_listens_on_its_address_only(engine: Settings) -> None:
    from lab.stack import remote_engine
    from lab.stack.proc import port_open

    info = remote_engine.status(engine)
    assert info["state"] == "running", info
    assert set(info["images"]) >= {"fanout-lab/postgres:local", "fanout-lab/kafka:4.2.2-local"}
    address = engine.address("engine")
    assert engine.docker_host == f"tcp://{address}:{ENGINE_PORT}"
    assert port_open(ENGINE_PORT, address)
    assert not port_open(ENGINE_PORT, "127.0.0.1")  # not on this namespace's loopback
    argv = Path(f"/proc/{info['pids']['dockerd']}/cmdline").read_bytes().split(b"\0")
    assert b"--host" in argv and argv[argv.index(b"--host") + 1] == f"tcp://{address}:{ENGINE_PORT}".encode()
    assert b"--tlsverify" in argv
    assert argv.count(b"--host") == 1  # no unix socket: the host's engine's is never touched
    assert os.stat(f"/proc/{info['pids']['dockerd']}/ns/net").st_ino == \
        os.stat(f"/run/netns/{info['namespace']}").st_ino


def test_the_participant_hosts_come_and_go_beside_the_engine(engine: Settings) -> None:
    """The netns hosts of the same stack dir share the engine's bridge: making and removing them
    leaves the engine, its link and the switch alone."""
    from lab.stack import hosts
    from lab.stack.proc import port_open

    participants = engine.replace(docker_host="", backend="native", hosts="netns")
    lay = hosts.layout(participants)
    hosts.create(participants)
    try:
        assert hosts.complete(participants)
        assert port_open(ENGINE_PORT, engine.address("engine"))
        with hosts.entered(lay.namespaces["consumers"]):  # a host reaches the engine's port over the bridge
            assert port_open(ENGINE_PORT, engine.address("engine"))
    finally:
        hosts.remove(participants)
    assert not set(lay.namespaces.values()) & set(hosts.netns_names())
    assert {lay.engine_ns, lay.switch} <= set(hosts.netns_names())
    assert port_open(ENGINE_PORT, engine.address("engine"))


def test_wal_run_through_the_engine(engine: Settings) -> None:
    from lab.runner import run_scenario
    from lab.scenario import Scenario
    from lab.stack.compose import ComposeStack
    from lab.stack.containers import LocalCgroup, container_usage
    from lab.stack.proc import port_open

    stack = ComposeStack(engine)
    t0 = time.monotonic()
    stack.up()
    TIMINGS["compose stack up"] = time.monotonic() - t0
    address = engine.address("engine")
    assert engine.service_host == address and f"host={address} " in engine.pg_dsn
    assert port_open(engine.pg_port, address)
    assert not port_open(engine.pg_port, "127.0.0.1")  # published at the engine's address, not here

    t0 = time.monotonic()
    result = asyncio.run(run_scenario(Scenario(pipeline="wal", consumers=2, messages=1000, senders=20,
                                               cooldown_s=0), engine))
    TIMINGS["wal run"] = time.monotonic() - t0
    assert result["success"], result["error"]  # every message worked once, nothing left behind
    assert result["backend"] == "compose"
    assert result["engine_host"] == engine.docker_host and result["services_host"] == address
    # the engine runs on this kernel: each container's counter is its cgroup file, found via its pid
    assert result["container_cpu"] == {"postgres": "cgroup", "kafka": "cgroup", "rabbitmq": "cgroup"}
    parent = f"{engine.stack_id}-engine"
    assert result["container_cgroups"] == [f"fl-{parent}/{{id}}"]
    # the cgroup found is the container's own: its counter is the one the engine API reports
    # (which answers from a once-a-second collector: up to ~1 s of an idle container behind)
    c = stack.container("postgres")
    local = LocalCgroup.find(c.id, tuple(result["container_cgroups"]))
    assert local is not None
    api_cpu, _ = container_usage(stack.client.api.stats(c.id, stream=False, one_shot=True))
    assert local.read()[0] == pytest.approx(api_cpu, abs=0.25) and api_cpu > 0.5
    cpu = result["cpu_s"]
    assert cpu["postgres"] > 0 and cpu["consumers"] > 0 and cpu["web"] > 0
    assert result["mem_mb"]["postgres"] > 10
    import json

    for name in ("postgres", "kafka", "rabbitmq"):  # whoever reaches the engine: no password shown
        text = json.dumps(stack.client.api.inspect_container(stack.container(name).id))
        assert engine.secret("pg") not in text and engine.secret("rabbitmq") not in text, name
    # the containers' CPU is part of this host's busy time: the accounting closes (within the
    # sampler's edge skew) instead of the participants' sum exceeding what the host spent
    participants = sum(v for k, v in cpu.items() if k != "unattributed")
    assert cpu["unattributed"] > -0.05 * participants, cpu


def test_down_after_a_crash_leaves_nothing(engine: Settings) -> None:
    from lab.stack import hosts, proc, remote_engine

    e = remote_engine.engine_layout(engine)
    for name in ("dockerd", "containerd"):  # a crash: the daemons die, shims and containers stay
        p = proc.running(e.state_dir / f"{name}.run")
        assert p is not None, name
        os.kill(p.pid, signal.SIGKILL)
    assert any(x.startswith("pid ") for x in remote_engine.leftovers(engine))  # containers still run
    t0 = time.monotonic()
    remote_engine.down(engine, purge=True)
    TIMINGS["engine down after the crash"] = time.monotonic() - t0
    lay = hosts.layout(engine)
    assert remote_engine.leftovers(engine) == []
    assert not [n for n in hosts.netns_names() if n.startswith(lay.prefix_ns)]
    assert not [n for n in hosts.link_names() if n.startswith(lay.prefix_link)]
    assert not e.state_dir.exists() and not e.exec_root.exists()
    print("\n" + "; ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))
