"""docker-compose.yml mirrors the native stack (no Docker engine here: the file is validated)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from lab.settings import ROOT, Settings
from lab.stack.compose import compose_command, compose_properties_path
from lab.stack.debezium import render_properties
from lab.stack.postgres import SERVER_FLAGS

COMPOSE = ROOT / "docker-compose.yml"


def test_compose_config_is_valid() -> None:
    try:
        cmd = compose_command()
    except Exception as exc:
        pytest.skip(f"no docker compose client: {exc}")
    res = subprocess.run([*cmd, "-f", str(COMPOSE), "config"], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def test_same_postgres_flags_as_native() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    command = spec["services"]["postgres"]["command"]
    flags = dict(arg.split("=", 1) for arg in command if "=" in arg)
    assert flags == SERVER_FLAGS
    assert spec["services"]["postgres"]["image"] == "postgres:18"


def test_debezium_instances_are_behind_profiles() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert services["debezium-kafka"]["profiles"] == ["kafka"]
    assert services["debezium-rabbitmq"]["profiles"] == ["rabbitmq"]
    for name in ("postgres", "kafka", "rabbitmq"):
        assert "profiles" not in services[name]
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"])


@pytest.mark.parametrize("sink", ["kafka", "rabbitmq"])
def test_compose_debezium_config_matches_the_native_template(sink: str) -> None:
    committed = compose_properties_path(Settings(), sink).read_text()
    assert committed == render_properties(Settings(), sink, compose=True), (
        "docker/ is stale: run python -c 'from lab.settings import Settings; "
        "from lab.stack.compose import write_compose_properties; write_compose_properties(Settings())'"
    )
