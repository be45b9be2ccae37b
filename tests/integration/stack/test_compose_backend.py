"""The compose backend on a real Docker engine: lifecycle, every pipeline, the container CPU reader.

Uses its own compose project and ports (the native test stack's + 200), so it never meets the
native test stack or a user's stack; the local images (``lab stack images build``, cached outside
the checkout) since no registry may be reachable. Without an engine (or without what the images
are built from) every test here is skipped with the reason; scripts/with-docker.sh (``make test``,
``.ci/run``) starts dockerd and builds the images first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from lab.settings import Settings
from lab.stack.base import StackError
from tests.conftest import test_settings as native_test_settings
from tests.integration.checks import scalar

pytestmark = pytest.mark.integration
OFFSET = 200  # above the native test stack's ports (configured + 300)
BURN_NS = 3_000_000_000


def compose_settings() -> Settings:
    base = native_test_settings()
    o = OFFSET
    return base.replace(
        backend="compose", compose_images="local", compose_project="fanout-lab-test",
        stack_dir=base.stack_dir.parent / "compose-test", data_dir=base.stack_dir.parent / "compose-test" / "data",
        pg_port=base.pg_port + o, kafka_port=base.kafka_port + o, amqp_port=base.amqp_port + o,
        web_port=base.web_port + o,
    )


@pytest.fixture(scope="module")
def engine() -> object:
    from lab.stack.engine import docker_client
    from lab.stack.images import build_images

    settings = compose_settings()
    try:
        client = docker_client(settings)
    except StackError as exc:
        pytest.skip(f"no Docker engine: {exc}")
    try:
        build_images(settings)  # cached: seconds when scripts/with-docker.sh built them already
    except StackError as exc:
        pytest.skip(f"local images cannot be built here: {exc}")
    return client


@pytest.fixture(scope="module")
def compose(engine: object) -> Iterator[object]:
    from lab.stack.compose import ComposeStack

    stack = ComposeStack(compose_settings())
    stack.down(purge=True)  # leftovers of an interrupted session
    stack.up()
    try:
        yield stack
    finally:
        stack.down(purge=True)


def test_up_and_status(compose: object) -> None:
    settings = compose.settings
    states = {s.name: s for s in compose.status()}
    for name in ("postgres", "kafka", "rabbitmq"):
        assert states[name].state == "running", name
        assert states[name].version.startswith("fanout-lab/"), states[name].version
        assert states[name].detail["health"] == "healthy"
    assert states["postgres"].endpoint == f"127.0.0.1:{settings.pg_port}"
    assert {states[f"debezium-{s}"].state for s in ("kafka", "rabbitmq")} == {"stopped"}
    # the schema the lab applied, reached through the published port
    assert scalar(settings, "SELECT count(*) FROM pg_publication WHERE pubname = 'load_test_pub'") == 1
    assert scalar(settings, "SHOW wal_level") == "logical"
    assert scalar(settings, "SHOW max_wal_senders") == "64"


def test_no_container_shows_a_password(compose: object) -> None:
    """Whoever reaches the engine sees every container's configuration (`docker inspect`): neither
    password is in any of them (they went in as files; that they work is what the schema applied
    above and the rabbitmq run below show)."""
    import json

    settings = compose.settings
    secrets = [settings.secret("pg"), settings.secret("rabbitmq")]
    inspected = [compose.client.api.inspect_container(c.id) for c in compose.client.containers.list(
        all=True, filters={"label": f"com.docker.compose.project={settings.compose_project}"})]
    assert len(inspected) >= 3
    for attrs in inspected:
        text = json.dumps(attrs)
        assert not [x for x in secrets if x in text], attrs["Name"]


# The default tier runs one real run on containers: kafka at N = 2 goes through every kind of container
# the backend drives (PostgreSQL, Debezium started on demand, the broker), reads each one's CPU and
# memory from the engine, and reaches them all through their published ports. What a pipeline does is
# the same on either backend and every pipeline's native tests run by default; what the containers
# are told (broker settings, share groups' included) is checked against the native stack's by
# tests/unit/stack/test_compose.py; RabbitMQ's container is asserted healthy (test_up_and_status) and
# Debezium's RabbitMQ sink starts against it (test_down_removes_the_project). The other pipelines
# and consumer counts are the matrix's.
CASES = [(p, n) for p in ("wal", "wal-sharded", "kafka", "rabbitmq", "poll", "wal-filtered", "wal-relay",
                          "kafka-share") for n in (1, 2)]
DEFAULT = {("kafka", 2)}
BROKER = {"kafka": "kafka", "rabbitmq": "rabbitmq", "kafka-share": "kafka"}  # the pipeline's broker participant


@pytest.mark.parametrize(("pipeline", "consumers"), [
    pytest.param(p, n, marks=() if (p, n) in DEFAULT else (pytest.mark.matrix,), id=f"{p}-{n}")
    for p, n in CASES])
def test_pipeline_run_succeeds(compose: object, pipeline: str, consumers: int) -> None:
    from lab.runner import run_scenario
    from lab.scenario import Scenario

    scenario = Scenario(pipeline=pipeline, consumers=consumers, messages=1000, senders=20, cooldown_s=0)
    result = asyncio.run(run_scenario(scenario, compose.settings))
    assert result["success"], result["error"]  # the Success predicate of the reference study
    assert result["backend"] == "compose"
    assert set(result["images"]) >= {"postgres", "kafka", "rabbitmq"}
    assert all(v.startswith("sha256:") for v in result["images"].values())
    assert result["container_cpu"]["postgres"] in ("cgroup", "engine api")
    cpu = result["cpu_s"]
    assert cpu["postgres"] > 0 and cpu["consumers"] > 0 and cpu["web"] > 0
    if pipeline in BROKER:
        assert cpu["debezium"] > 0 and cpu[BROKER[pipeline]] > 0
    if pipeline == "wal-relay":  # the relay is a local process beside the containers
        assert cpu["relay"] > 0 and result["helpers"]["relay"]["rows"] >= 1000
    assert result["mem_mb"]["postgres"] > 10


def test_container_cpu_reader_against_a_known_burn(engine: object) -> None:
    """A container burns exactly BURN_NS of CPU by its own clock (schedstat), then sleeps; both
    readers of its counter (cgroup file, engine API) must agree with that within ±2 %."""
    from lab.stack.containers import LocalCgroup, container_usage
    from lab.stack.images import BASE

    script = (f"t=0; while (( t < {BURN_NS} )); do read t _ < /proc/self/schedstat; done; "
              "echo burned; exec sleep 600")
    c = engine.containers.run(BASE, ["bash", "-c", script], detach=True,
                              labels={"org.fanout-lab.test": "cpu-reader"})
    try:
        deadline = time.monotonic() + 180  # 3 s of CPU, however long a loaded machine takes
        while b"burned" not in c.logs():
            assert time.monotonic() < deadline, "the burner never finished"
            time.sleep(0.2)
        expected = BURN_NS / 1e9
        api_cpu, api_mem = container_usage(engine.api.stats(c.id, stream=False, one_shot=True))
        assert api_cpu == pytest.approx(expected, rel=0.02)
        assert 0 < api_mem < 64
        local = LocalCgroup.find(c.id)
        if local is not None:  # a local engine: the same counter, straight from the cgroup
            cpu, _ = local.read()
            assert cpu == pytest.approx(expected, rel=0.02)
            assert cpu == pytest.approx(api_cpu, abs=0.01)  # the idle container adds nothing
    finally:
        c.remove(force=True)


def test_down_removes_the_project(compose: object) -> None:
    compose.start_debezium("rabbitmq")
    assert compose.container("debezium-rabbitmq").status == "running"
    compose.down(purge=True)
    left = compose.client.containers.list(all=True, filters={"label": "com.docker.compose.project=fanout-lab-test"})
    assert left == []
    assert [s.state for s in compose.status()] == ["stopped"] * 5
