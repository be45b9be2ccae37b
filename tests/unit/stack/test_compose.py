"""docker-compose.yml mirrors the native stack: the same flags, read from the native modules."""

from __future__ import annotations

import re
import string
import subprocess

import pytest
import yaml

from lab.settings import ROOT, Settings
from lab.stack import debezium
from lab.stack import kafka_broker as kafka
from lab.stack.compose import ComposeStack
from lab.stack.containers import container_usage
from lab.stack.engine import compose_command, compose_env
from lab.stack.images import LOCAL_IMAGES, local_tag
from lab.stack.postgres import SERVER_FLAGS

COMPOSE = ROOT / "docker-compose.yml"
LOCAL = ROOT / "docker-compose.local.yml"


def _services(path=COMPOSE) -> dict:
    return yaml.safe_load(path.read_text())["services"]


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, LOCAL]])
def test_compose_config_is_valid(files) -> None:
    try:
        cmd = compose_command()
    except Exception as exc:
        pytest.skip(f"no docker compose client: {exc}")
    args = [a for f in files for a in ("-f", str(f))]
    res = subprocess.run([*cmd, *args, "config"], capture_output=True, text=True, check=False,
                         env=compose_env(Settings(pg_port=41234)))
    assert res.returncode == 0, res.stderr
    assert "127.0.0.1:41234" in res.stdout or "41234" in res.stdout  # the lab's port, interpolated


def test_same_postgres_flags_as_native() -> None:
    command = _services()["postgres"]["command"]
    flags = dict(arg.split("=", 1) for arg in command if "=" in arg)
    assert flags == SERVER_FLAGS
    assert _services()["postgres"]["image"] == "postgres:18"


def test_same_kafka_jvm_and_broker_settings_as_native() -> None:
    env = _services()["kafka"]["environment"]
    assert env["KAFKA_HEAP_OPTS"].split() == list(kafka.HEAP_OPTS)
    assert env["KAFKA_JVM_PERFORMANCE_OPTS"].split() == list(kafka.JVM_OPTS)
    assert _services()["kafka"]["image"] == f"apache/kafka:{Settings().kafka_version}"
    native = kafka.server_properties(Settings(), 1, ROOT)  # the single topology's node
    props = dict(ln.split("=", 1) for ln in native.splitlines() if re.match(r"^[a-z.]+=\d+$", ln))
    assert props  # the replication factors, ISR and group delay
    for name, value in props.items():
        if name == "node.id":
            continue
        assert env["KAFKA_" + name.upper().replace(".", "_")] == value, name


def test_same_debezium_jvm_and_version_as_native() -> None:
    for sink in ("kafka", "rabbitmq"):
        service = _services()[f"debezium-{sink}"]
        assert service["environment"]["JAVA_OPTS"].split() == list(debezium.JAVA_OPTS)
        assert service["image"].endswith(":" + Settings().debezium_version)
        assert service["profiles"] == [sink]


def test_ports_bind_loopback_unless_told_and_nothing_is_bind_mounted() -> None:
    for name, service in _services().items():
        for port in service.get("ports", []):
            assert port.startswith("${LAB_COMPOSE_BIND:-127.0.0.1}:"), name
        for volume in service.get("volumes", []):
            assert not volume.startswith((".", "/")), f"{name}: a bind mount breaks a remote engine"
    assert compose_env(Settings())["LAB_COMPOSE_BIND"] == "127.0.0.1"
    assert compose_env(Settings(services_host="192.0.2.7"))["LAB_COMPOSE_BIND"] == "0.0.0.0"


def test_local_override_only_swaps_images() -> None:
    local = _services(LOCAL)
    assert set(local) == set(_services())
    for name, service in local.items():
        assert set(service) == {"image"}
        assert service["image"] == LOCAL_IMAGES["debezium" if name.startswith("debezium") else name]


def test_the_local_kafka_image_is_tagged_with_its_version() -> None:
    assert local_tag(Settings(kafka_version="4.2.2"), "kafka") == "fanout-lab/kafka:4.2.2-local"
    assert local_tag(Settings(), "postgres") == "fanout-lab/postgres:local"
    assert compose_env(Settings(kafka_version="4.3.1"))["LAB_KAFKA_VERSION"] == "4.3.1"


def test_image_templates_substitute_cleanly() -> None:
    for name in LOCAL_IMAGES:
        text = (ROOT / "lab/stack/templates/images" / f"{name}.Dockerfile").read_text()
        ids = set(string.Template(text).get_identifiers())
        assert "base" in ids, name


def test_compose_images_setting_is_checked() -> None:
    with pytest.raises(Exception, match="LAB_COMPOSE_IMAGES"):
        ComposeStack(Settings(compose_images="mine"))
    assert ComposeStack(Settings(compose_images="local")).files[-1] == LOCAL


def test_container_usage_reads_cumulative_counters() -> None:
    v1 = {"cpu_stats": {"cpu_usage": {"total_usage": 2_500_000_000}},
          "memory_stats": {"usage": 300 * 2**20, "stats": {"total_inactive_file": 100 * 2**20}}}
    assert container_usage(v1) == (2.5, 200.0)
    v2 = {"cpu_stats": {"cpu_usage": {"total_usage": 10**9}},
          "memory_stats": {"usage": 50 * 2**20, "stats": {"inactive_file": 0}}}
    assert container_usage(v2) == (1.0, 50.0)
    assert container_usage({}) == (0.0, 0.0)  # a stopped container


def test_no_password_reaches_a_containers_environment() -> None:
    """`docker inspect` shows a container's environment to whoever reaches the engine: no password
    goes there, from the compose file or from the environment the lab runs compose with."""
    # each file on its own: merged, the override's services (an image each) would hide the compose file's
    services = [*_services(COMPOSE).items(), *_services(LOCAL).items()]
    assert [n for n, s in services if s.get("environment")]  # the check sees environments at all
    for name, service in services:
        env = service.get("environment") or {}
        for key, value in env.items():
            assert "PASS" not in key.upper() or key.endswith("_FILE"), (name, key)
            assert "PASSWORD" not in str(value) or str(value).startswith("/"), (name, key, value)
    s = Settings(pg_password="pg-secret-1234", rabbitmq_password="mq-secret-5678")
    env = compose_env(s)
    assert not [k for k, v in env.items() if "secret-1234" in v or "secret-5678" in v]


def test_the_containers_get_their_credentials_as_files() -> None:
    """PostgreSQL's password as the file POSTGRES_PASSWORD_FILE names (root's, 0600); RabbitMQ's user as
    definitions with a salted hash, imported from conf.d: the password itself is in no file of it."""
    import io
    import json
    import tarfile

    from lab.stack.compose import put_files, secret_files

    s = Settings(pg_password="pg-secret-1234", rabbitmq_password="mq-secret-5678")
    files = secret_files(s)
    pg_file = _services(COMPOSE)["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"]
    folder, name = pg_file.rsplit("/", 2)[0], "/".join(pg_file.rsplit("/", 2)[1:])
    assert files["postgres"][folder][name] == (b"pg-secret-1234\n", 0o600)
    rabbit = files["rabbitmq"]["/etc/rabbitmq"]
    conf = rabbit["conf.d/90-lab-user.conf"][0].decode()
    assert "definitions.local.path = /etc/rabbitmq/lab-definitions.json" in conf
    definitions = json.loads(rabbit["lab-definitions.json"][0])
    assert definitions["users"][0]["name"] == s.rabbitmq_user and "password" not in definitions["users"][0]
    assert b"mq-secret-5678" not in b"".join(c for c, _ in rabbit.values())

    class Container:
        name = "postgres-1"

        def __init__(self) -> None:
            self.got: dict[str, bytes] = {}

        def put_archive(self, path: str, data: bytes) -> bool:
            self.got[path] = data
            return True

    c = Container()
    put_files(c, folder, files["postgres"][folder])
    with tarfile.open(fileobj=io.BytesIO(c.got[folder])) as tar:
        members = {m.name: (m.isdir(), m.mode, m.uid) for m in tar.getmembers()}
    assert members == {"lab-secrets": (True, 0o700, 0), "lab-secrets/pg-password": (False, 0o600, 0)}
