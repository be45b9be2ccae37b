"""The Docker engine the compose backend talks to: the SDK client and the compose CLI.

The engine is ``LAB_DOCKER_HOST`` (``DOCKER_HOST``-style: ``unix://``, ``tcp://``, ``ssh://``), or
the local one when it is empty. Only ``lab/stack`` imports the Docker SDK.
"""

from __future__ import annotations

import functools
import ipaddress
import shutil
import subprocess
from pathlib import Path
from typing import Any

from lab.settings import Settings, child_env, docker_host_address
from lab.stack.base import StackError
from lab.stack.netns import reachable

NO_ENGINE_HINT = "start Docker (or set LAB_DOCKER_HOST) or use the native backend (LAB_BACKEND=native)"


def engine_routed(settings: Settings) -> bool:
    """Whether the engine can be contacted without a packet leaving the machine: False only for an
    engine at a netns layout address (the stack's own, ``lab stack engine up``) whose bridge is gone."""
    host = docker_host_address(settings.engine_host)
    return host is None or reachable(host)


def require_engine_routed(settings: Settings) -> None:
    if not engine_routed(settings):
        raise StackError(f"the Docker engine at {settings.engine_host} is on a lab bridge that is not up: "
                         "lab stack engine up")


def engine_tls(tls_dir: Path) -> Any:
    """The SDK's TLS configuration for the stack's own engine: its client certificate, verified
    against its CA (:mod:`lab.stack.enginetls`)."""
    from docker.tls import TLSConfig

    return TLSConfig(client_cert=(str(tls_dir / "cert.pem"), str(tls_dir / "key.pem")),
                     ca_cert=str(tls_dir / "ca.pem"), verify=True)


@functools.cache
def _blind_api_client() -> type:
    """``docker.APIClient`` deaf to the environment's CA bundles and proxies (``trust_env`` is always
    False): requests lets ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` replace a session's own CA when
    a request names none, so the stack's CA would be ignored and its engine refused; a proxy has no
    business on the lab's bridge either."""
    import docker

    class BlindAPIClient(docker.APIClient):
        @property
        def trust_env(self) -> bool:
            return False

        @trust_env.setter
        def trust_env(self, value: bool) -> None:
            pass

    return BlindAPIClient


def own_engine_client(url: str, tls_dir: Path, *, timeout: int = 120, version: str | None = None) -> Any:
    """An SDK client (``docker.DockerClient``) of the stack's own engine at ``url``: its client
    certificate, verified against its CA (:func:`engine_tls`), whatever the environment says.
    ``version``: the API version (None: asked of the engine at once)."""
    import docker

    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = _blind_api_client()(base_url=url, timeout=timeout, tls=engine_tls(tls_dir), version=version)
    return client


def docker_client(settings: Settings) -> Any:
    """A pinged ``docker.DockerClient`` for ``settings.docker_host`` (the stack's own engine with its
    client certificate); StackError when unreachable."""
    import docker

    require_engine_routed(settings)
    try:
        if settings.docker_host:
            client = (own_engine_client(settings.docker_host, settings.engine_tls_dir) if settings.own_engine
                      else docker.DockerClient(base_url=settings.docker_host, timeout=120))
        else:
            client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        where = settings.docker_host or "the local Docker engine"
        raise StackError(f"no Docker engine reachable at {where} ({type(exc).__name__}); "
                         f"{NO_ENGINE_HINT}") from None
    return client


def engine_version(client: Any) -> str:
    v = client.version()
    return f"{v.get('Version', '?')} (API {v.get('ApiVersion', '?')})"


def compose_command() -> list[str]:
    """``docker compose`` (v2 plugin) if present, else the standalone ``docker-compose`` (v1 or v2)."""
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


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def compose_bind(settings: Settings) -> str:
    """The address the services' ports are published on, on the engine's side: 127.0.0.1 for
    services reached on loopback; the engine's own address when the lab reaches the services at
    the address it reaches the engine at (an IP, as the lab's own engine's); else every interface."""
    host = settings.service_host
    if _loopback(host):
        return "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "0.0.0.0"
    return host if docker_host_address(settings.engine_host) == host else "0.0.0.0"


def compose_env(settings: Settings) -> dict[str, str]:
    """The environment docker-compose.yml is interpolated with: ports, user names, where the
    services are reached, the engine. No password: the containers get theirs as files the lab
    copies in (:class:`lab.stack.compose.ComposeStack`), never in their environment, which any
    ``docker inspect`` shows. Ports bind 127.0.0.1 unless the services are reached from elsewhere
    (:func:`compose_bind`).
    """
    s = settings
    require_engine_routed(s)  # every compose call gets its environment here
    extra = {
        "LAB_PG_PORT": str(s.pg_port), "LAB_PG_USER": s.pg_user,
        "LAB_KAFKA_PORT": str(s.kafka_port), "LAB_KAFKA_VERSION": s.kafka_version,
        "LAB_AMQP_PORT": str(s.amqp_port),
        "LAB_SERVICES_HOST": s.service_host,
        "LAB_COMPOSE_BIND": compose_bind(s),
    }
    env = child_env(s, **extra)
    for name in ("LAB_PG_PASSWORD", "LAB_RABBITMQ_PASSWORD"):
        env.pop(name, None)
    if s.docker_host:
        env["DOCKER_HOST"] = s.docker_host
    if s.own_engine:  # the docker and compose CLIs take the client certificate from here
        env |= {"DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(s.engine_tls_dir)}
        for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # Compose v1's requests would trust these instead
            env.pop(name, None)
    return env
