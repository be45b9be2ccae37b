"""The compose backend: the same services as containers, on a local or a remote Docker engine.

Lifecycle: ``docker compose`` (v2) or ``docker-compose`` (v1.29, no ``--wait``) only *creates*
the project's containers, networks and volumes (``up --no-start``); starting, stopping, health
polling, copying configs in and reading counters go through the Docker SDK, so v1 and v2 behave
the same and nothing is bind-mounted (the engine can be another machine: ``LAB_DOCKER_HOST``).

CPU of a container is its cumulative ``cpu_stats.cpu_usage.total_usage`` (the cgroup's
counter), read at the window edges like the native backend's cgroup counters:
:meth:`ComposeStack.counters`, :mod:`lab.stack.containers`.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import tarfile
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lab.pg import slots
from lab.settings import Settings
from lab.stack.base import (
    DEBEZIUM_SINKS,
    DebeziumStart,
    Endpoints,
    ServiceStatus,
    StackError,
    check_sink,
    debezium_participant,
)
from lab.stack.containers import ContainerCounter, StatsBoard
from lab.stack.debezium import SLOT, render_properties
from lab.stack.engine import compose_command, compose_env, docker_client, engine_routed
from lab.stack.images import missing_images

log = logging.getLogger(__name__)

SERVICES = ("postgres", "kafka", "rabbitmq")
DEBEZIUM = {sink: debezium_participant(sink) for sink in DEBEZIUM_SINKS}  # service names as participant names
HEALTH_TIMEOUT = 240.0
DEBEZIUM_TIMEOUT = 180.0
Counter = Callable[[], tuple[float, float]]


#: where the containers' secrets are copied: PostgreSQL's password file (POSTGRES_PASSWORD_FILE in
#: docker-compose.yml; a directory of root's, read by the entrypoint as root), RabbitMQ's conf.d
#: entry importing the lab user's definitions (a password hash, readable by the broker's user)
PG_SECRETS = "/run"
RABBITMQ_ETC = "/etc/rabbitmq"


def secret_files(settings: Settings) -> dict[str, dict[str, dict[str, tuple[bytes, int]]]]:
    """Service -> container folder -> file name -> (content, mode) of what the lab copies into a
    container before it starts: each service's credentials as files, never in its environment."""
    from lab.stack.rabbitmq_broker import user_definitions

    definitions = f"{RABBITMQ_ETC}/lab-definitions.json"
    conf = ("# the lab user, from definitions (a password hash) imported at every boot: no guest user\n"
            "definitions.import_backend = local_filesystem\n"
            f"definitions.local.path = {definitions}\n")
    return {
        "postgres": {PG_SECRETS: {"lab-secrets/": (b"", 0o700),
                                  "lab-secrets/pg-password": (settings.secret("pg").encode() + b"\n", 0o600)}},
        "rabbitmq": {RABBITMQ_ETC: {"conf.d/": (b"", 0o755), "conf.d/90-lab-user.conf": (conf.encode(), 0o644),
                                    "lab-definitions.json": (json.dumps(user_definitions(settings)).encode(), 0o644)}},
    }


def put_files(container: Any, folder: str, files: dict[str, tuple[bytes, int]]) -> None:
    """Copy ``files`` (name -> content and mode; a name ending in ``/`` is a directory) into
    ``folder`` of a container, owned by root: a tar through the engine's API, so nothing is
    bind-mounted and the engine may be remote."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (content, mode) in files.items():
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mode, info.uid, info.gid = mode, 0, 0
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    if not container.put_archive(folder, buf.getvalue()):
        raise StackError(f"could not copy {', '.join(files)} into {container.name}")


class ComposeStack:
    """The services as containers (a :class:`~lab.stack.base.Stack`); it controls no service on its
    own (:attr:`control` None): the faults that stop, kill or fail over one are native only."""

    backend = "compose"
    topology = "single"  # the ha topology is native only: up refuses it
    control: None = None

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.files = [settings.root / "docker-compose.yml"]
        if settings.compose_images == "local":
            self.files.append(settings.root / "docker-compose.local.yml")
        elif settings.compose_images != "official":
            raise StackError(f"LAB_COMPOSE_IMAGES={settings.compose_images!r}: choose official or local")
        self.project = settings.compose_project
        self.debezium = dict(DEBEZIUM)  # sink -> service, as NativeStack.debezium is keyed
        self._client: Any = None
        self._board: StatsBoard | None = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = docker_client(self.settings)
        return self._client

    def _compose(self, *args: str) -> None:
        files = [a for f in self.files for a in ("-f", str(f))]
        profiles = [a for sink in DEBEZIUM_SINKS for a in ("--profile", sink)]
        cmd = [*compose_command(), *files, "-p", self.project, *profiles, *args]
        log.info("%s", " ".join(cmd))
        res = subprocess.run(cmd, capture_output=True, text=True, check=False,
                             env=compose_env(self.settings), cwd=self.settings.root)
        if res.returncode != 0:
            raise StackError(f"compose {' '.join(args)} failed: {res.stderr.strip()[-400:]}")

    def container(self, service: str) -> Any | None:
        found = self.client.containers.list(all=True, filters={"label": [
            f"com.docker.compose.project={self.project}", f"com.docker.compose.service={service}"]})
        return found[0] if found else None

    def endpoints(self) -> Endpoints:
        s = self.settings
        return Endpoints(pg_dsn=s.pg_dsn, kafka_bootstrap=s.kafka_bootstrap, amqp_url=s.amqp_url)

    def provision(self) -> None:
        """Check the engine; build the local images (cached) or pull the official ones."""
        if self.settings.compose_images == "local":
            from lab.stack.images import build_images

            build_images(self.settings, say=log.info)
        else:
            self.client  # noqa: B018 - the engine check
            try:
                self._compose("pull", "--quiet")
            except StackError as exc:
                raise StackError(f"{exc}; without a registry, build the images locally: "
                                 "LAB_COMPOSE_IMAGES=local lab stack images build") from None

    def up(self) -> None:
        """Create and start PostgreSQL, Kafka and RabbitMQ, wait until healthy, apply the schema."""
        if self.settings.ha:
            raise StackError("the compose backend runs the single topology only; the ha topology "
                             " needs the native backend: LAB_BACKEND=native")
        if self.settings.compose_images == "local":
            missing = missing_images(self.client, self.settings)
            if missing:
                how = ("`lab stack engine up` (copies them from this machine's engine)"
                       if self.settings.docker_host else "`lab stack images build`")
                raise StackError(f"local images missing ({', '.join(missing)}) on the engine: run {how}")
        self._compose("up", "--no-start", *SERVICES)
        for service in SERVICES:
            c = self.container(service)
            if c is None:
                raise StackError(f"compose created no {service} container")
            if c.status != "running":
                for folder, files in secret_files(self.settings).get(service, {}).items():
                    put_files(c, folder, files)
                c.start()
        for service in SERVICES:
            self._wait_healthy(service)
        self._prepare_database()

    def _wait_healthy(self, service: str, timeout: float = HEALTH_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            c = self.container(service)
            state = c.attrs["State"] if c is not None else {}
            health = state.get("Health", {}).get("Status", "none")
            if health == "healthy":
                return
            if c is None or state.get("Status") in ("exited", "dead"):
                tail = c.logs(tail=5).decode(errors="replace").strip() if c is not None else ""
                raise StackError(f"{service} container exited: {tail[-300:]}")
            if time.monotonic() > deadline:
                raise StackError(f"{service} not healthy after {timeout:.0f} s (health: {health})")
            time.sleep(0.5)

    def _prepare_database(self) -> None:
        """The lab database and schema.sql (idempotent), as the native PostgresService does."""
        from lab.stack.postgres import TEMPLATES

        s = self.settings
        admin = make_conninfo(s.pg_dsn, dbname="postgres")
        deadline = time.monotonic() + 60
        while True:  # healthy means accepting connections; the entrypoint may still restart once
            try:
                with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
                    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [s.pg_database]).fetchone() is None:
                        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(s.pg_database)))
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        with psycopg.connect(s.pg_dsn) as conn, conn.transaction():
            conn.execute((TEMPLATES / "schema.sql").read_text())

    def down(self, *, purge: bool = False) -> None:
        """Remove the project's containers and network (``purge``: its volumes too); nothing to
        remove when the stack's own engine is gone (they went with it), and nothing is contacted."""
        if not engine_routed(self.settings):
            log.warning("not contacting the Docker engine at %s: its lab bridge is not up", self.settings.engine_host)
            return
        self._compose("down", "-t", "30", *(["-v"] if purge else []))

    def start_debezium(self, sink: str, *, durable: bool = False, resume: bool = False) -> DebeziumStart:
        """Create the instance, copy its rendered application.properties in, start it, and wait
        until its replication slot streams (as the native DebeziumService.start). ``durable``
        as there; ``resume`` (a restart after ``debezium-kill``) is native only."""
        if resume:
            raise StackError("restarting Debezium from its kept slot and offsets needs LAB_BACKEND=native")
        service = DEBEZIUM[check_sink(sink)]
        self._compose("up", "--no-start", "--no-deps", service)
        c = self.container(service)
        if c is None:
            raise StackError(f"compose created no {service} container")
        if c.status == "running":
            return DebeziumStart(sink)
        t0 = time.monotonic()
        text = render_properties(self.settings, sink, compose=True, durable=durable).encode()
        put_files(c, "/debezium/config", {"application.properties": (text, 0o644)})
        c.start()

        def watch() -> None:
            c.reload()
            if c.status != "running":
                raise StackError(f"{service} exited during start-up: "
                                 f"{c.logs(tail=5).decode(errors='replace').strip()[-300:]}")

        try:
            slots.wait_streaming(self.settings.pg_dsn, SLOT[sink], timeout=DEBEZIUM_TIMEOUT, watch=watch)
        except TimeoutError as exc:
            c.stop(timeout=30)
            raise StackError(f"{service}: {exc}") from None
        return DebeziumStart(sink, start_to_streaming_s=round(time.monotonic() - t0, 2))

    def stop_debezium(self, sink: str) -> None:
        c = self.container(DEBEZIUM[check_sink(sink)])
        if c is not None and c.status == "running":
            c.stop(timeout=30)

    def status(self) -> list[ServiceStatus]:
        usage = StatsBoard(self.client, self.container, (*SERVICES, *DEBEZIUM.values())).fetch()
        out = []
        for service in [*SERVICES, *DEBEZIUM.values()]:
            c = self.container(service)
            running = c is not None and c.status == "running"
            detail: dict[str, object] = {}
            if c is not None:
                detail = {"container": c.name, "image_id": c.image.id,
                          "health": c.attrs["State"].get("Health", {}).get("Status", "none")}
            out.append(ServiceStatus(
                name=service, state="running" if running else "stopped",
                endpoint=self._endpoint(service), version=c.attrs["Config"]["Image"] if c else "",
                rss_mb=round(usage[service][1], 1) if running and service in usage else None, detail=detail))
        return out

    def _endpoint(self, service: str) -> str:
        s = self.settings
        return {"postgres": f"{s.service_host}:{s.pg_port}", "kafka": s.kafka_bootstrap,
                "rabbitmq": f"{s.service_host}:{s.amqp_port}"}.get(service, "")

    def record(self) -> dict[str, Any]:
        """What a run stores about this stack: images by content digest, the engine (its version,
        ``engine_host``: ``LAB_DOCKER_HOST`` or ``local``, where its ports were reached), and how
        each container's CPU was read (``container_cpu``: ``cgroup`` or ``engine api``;
        ``container_cgroups``: where on this host the cgroups were found beyond the usual places)."""
        from lab.stack.engine import engine_version

        return {"images": self.image_digests(), "engine": engine_version(self.client),
                "engine_host": self.settings.engine_host or "local", "services_host": self.settings.service_host,
                "container_cpu": dict(self._board.modes) if self._board else {},
                "container_cgroups": list(self._board.templates) if self._board else []}

    def image_digests(self) -> dict[str, str]:
        """Service -> image id (sha256 content digest) of every container of this project."""
        out = {}
        for service in [*SERVICES, *DEBEZIUM.values()]:
            c = self.container(service)
            if c is not None:
                out[service] = c.image.id
        return out

    def participants(self) -> dict[str, Counter]:
        """Participant -> reader of its container's (cumulative CPU s, memory MB): the services, both
        Debezium instances together (``debezium``, a run uses one) and each one (idle baseline)."""
        board = self._board = StatsBoard(self.client, self.container, (*SERVICES, *DEBEZIUM.values()))
        out: dict[str, Counter] = {s: ContainerCounter(board, (s,)) for s in SERVICES}
        out["debezium"] = ContainerCounter(board, tuple(DEBEZIUM.values()))
        for service in DEBEZIUM.values():
            out[service] = ContainerCounter(board, (service,))
        return out
