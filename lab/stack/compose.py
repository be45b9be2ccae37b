"""The compose backend: the same services as containers, for hosts with a Docker engine.

Lifecycle goes through the ``docker compose`` CLI on ``docker-compose.yml`` (the Docker SDK
has no compose API); state, CPU and memory are read through the Docker SDK. CPU of a
container is its cumulative ``cpu_stats.cpu_usage.total_usage`` (nanoseconds), read at the
window edges like the native backend's process counters (DESIGN.md §2).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.settings import Settings, child_env
from lab.stack.base import DEBEZIUM_SINKS, Endpoints, ServiceStatus, StackError, check_sink

SERVICES = ("postgres", "kafka", "rabbitmq")
PROJECT = "fanout-lab"


def compose_command() -> list[str]:
    """``docker compose`` (v2 plugin) if present, else the standalone ``docker-compose``."""
    docker = shutil.which("docker")
    if docker and subprocess.run(
        [docker, "compose", "version"], capture_output=True, check=False
    ).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy:
        return [legacy]
    raise StackError(
        "neither `docker compose` nor `docker-compose` is installed; install Docker Compose "
        "or use the native backend (LAB_BACKEND=native, the default)"
    )


@dataclass(frozen=True)
class ContainerCpu:
    """Cumulative CPU and current memory of one compose service's container."""

    service: str
    client: Any

    def read(self) -> tuple[float, float]:
        """(cpu seconds since container start, memory MB)."""
        container = _container(self.client, self.service)
        if container is None:
            return 0.0, 0.0
        stats = container.stats(stream=False)
        cpu = stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
        mem = stats.get("memory_stats", {}).get("usage", 0) / 2**20
        return cpu, mem


def _container(client: Any, service: str) -> Any | None:
    found = client.containers.list(
        filters={"label": [f"com.docker.compose.project={PROJECT}",
                           f"com.docker.compose.service={service}"]}
    )
    return found[0] if found else None


def compose_properties_path(settings: Settings, sink: str) -> Path:
    return settings.root / "docker" / f"debezium-{sink}.properties"


def write_compose_properties(settings: Settings) -> list[Path]:
    """Render the Debezium configs docker-compose.yml mounts, from the native templates."""
    from lab.stack.debezium import render_properties

    paths = []
    for sink in DEBEZIUM_SINKS:
        path = compose_properties_path(settings, sink)
        path.parent.mkdir(exist_ok=True)
        path.write_text(render_properties(settings, sink, compose=True))
        paths.append(path)
    return paths


class ComposeStack:
    backend = "compose"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.file = settings.root / "docker-compose.yml"

    def _client(self) -> Any:
        import docker

        try:
            client = docker.from_env()
            client.ping()
        except Exception as exc:
            raise StackError(
                f"no Docker engine reachable ({type(exc).__name__}); start Docker or use the "
                "native backend (LAB_BACKEND=native, the default)"
            ) from None
        return client

    def _compose(self, *args: str) -> None:
        cmd = [*compose_command(), "-f", str(self.file), "-p", PROJECT, *args]
        s = self.settings  # the stack's secrets reach compose's ${...} through the environment
        env = child_env(LAB_PG_PASSWORD=s.secret("pg"), LAB_RABBITMQ_PASSWORD=s.secret("rabbitmq"))
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if res.returncode != 0:
            raise StackError(f"{' '.join(cmd[-len(args):])} failed: {res.stderr.strip()[-300:]}")

    def endpoints(self) -> Endpoints:
        s = self.settings
        return Endpoints(pg_dsn=s.pg_dsn, kafka_bootstrap=s.kafka_bootstrap, amqp_url=s.amqp_url)

    def provision(self) -> None:
        self._client()
        write_compose_properties(self.settings)
        self._compose("pull", "--quiet")

    def up(self) -> None:
        self._client()
        self._compose("up", "-d", "--wait", *SERVICES)

    def down(self, *, purge: bool = False) -> None:
        self._compose("--profile", "kafka", "--profile", "rabbitmq", "down", *(["-v"] if purge else []))

    def start_debezium(self, sink: str) -> None:
        check_sink(sink)
        self._compose("--profile", sink, "up", "-d", f"debezium-{sink}")

    def stop_debezium(self, sink: str) -> None:
        check_sink(sink)
        self._compose("--profile", sink, "stop", "-t", "30", f"debezium-{sink}")

    def status(self) -> list[ServiceStatus]:
        client = self._client()
        out = []
        for service in [*SERVICES, "debezium-kafka", "debezium-rabbitmq"]:
            c = _container(client, service)
            state = "running" if c is not None and c.status == "running" else "stopped"
            out.append(ServiceStatus(name=service, state=state, version=(c.image.tags or [""])[0] if c else ""))
        return out

    def participants(self) -> dict[str, list[ContainerCpu]]:
        client = self._client()
        return {
            "postgres": [ContainerCpu("postgres", client)],
            "kafka": [ContainerCpu("kafka", client)],
            "rabbitmq": [ContainerCpu("rabbitmq", client)],
            "debezium": [ContainerCpu("debezium-kafka", client), ContainerCpu("debezium-rabbitmq", client)],
        }
