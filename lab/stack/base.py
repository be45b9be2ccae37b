"""The contract every stack backend and every native service fulfils."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import psutil

if TYPE_CHECKING:
    from lab.settings import Settings
    from lab.stack.rabbitmq_broker import RabbitMQService
    from lab.stack.rabbitmq_cluster import RabbitMQCluster
    from lab.stack.standby import PostgresStandby

Counter = Callable[[], tuple[float, float]]
"""Reader of a container's (cumulative CPU s, memory MB)."""


class StackError(RuntimeError):
    """A problem the user can fix; its message is one line saying what and how."""


@dataclass(frozen=True)
class ServiceStatus:
    """What ``lab stack status`` shows for one service."""

    name: str
    state: str  # "running" | "stopped"
    pids: list[int] = field(default_factory=list)
    endpoint: str = ""
    version: str = ""
    rss_mb: float | None = None
    detail: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Endpoints:
    pg_dsn: str
    kafka_bootstrap: str
    amqp_url: str


class NativeService(Protocol):
    """One local service of the native stack.

    ``provision`` fetches and caches artifacts (idempotent, no process started);
    ``start`` is a no-op when our process is already running and raises :class:`StackError`
    when a port or data dir is taken by someone else; ``stop`` stops exactly the processes
    this service started (by pid); ``processes`` are the roots of the process trees whose
    CPU counts as this participant.
    """

    @property
    def name(self) -> str: ...  # a class attribute, or per instance for a cluster's node

    def provision(self) -> None: ...
    def start(self) -> None: ...
    def stop(self, *, purge: bool = False) -> None: ...
    def status(self) -> ServiceStatus: ...
    def processes(self) -> list[psutil.Process]: ...


class Stack(Protocol):
    """What the runner, the pipelines and the measurements ask of a stack backend.

    Implemented by :class:`lab.stack.native.NativeStack` (topologies ``single`` and ``ha``) and
    :class:`lab.stack.compose.ComposeStack` (``single`` only). A capability a backend lacks is a
    method that raises :class:`StackError` with one line naming what is needed (the faults on
    compose), or an attribute that is None (``standby``, ``rabbitmq``, :meth:`counters`).
    """

    @property
    def backend(self) -> str:
        """``native`` (local processes) or ``compose`` (containers); stored in run.json."""
        ...

    @property
    def settings(self) -> Settings:
        """The settings the stack was built from (ports, hosts, data dirs)."""
        ...

    @property
    def topology(self) -> str:
        """``single`` or ``ha`` (three broker nodes per broker, a PostgreSQL standby)."""
        ...

    @property
    def standby(self) -> PostgresStandby | None:
        """The ``ha`` topology's PostgreSQL standby; None without one."""
        ...

    @property
    def rabbitmq(self) -> RabbitMQService | RabbitMQCluster | None:
        """The local RabbitMQ service or cluster (queue replicas, backlog); None when it is a container."""
        ...

    @property
    def service_names(self) -> tuple[str, ...]:
        """The always-on participants, one name per node (``kafka-1``..3 under ``ha``)."""
        ...

    def endpoints(self) -> Endpoints:
        """Where clients reach PostgreSQL, Kafka and RabbitMQ."""
        ...

    def provision(self) -> None:
        """Fetch and cache artifacts or images; starts nothing; idempotent."""
        ...

    def up(self) -> None:
        """Start every always-on service; returns once they serve."""
        ...

    def down(self, *, purge: bool = False) -> None:
        """Stop what this stack started (``purge``: its data too)."""
        ...

    def status(self) -> list[ServiceStatus]:
        """One line per service or node, for ``lab stack status``."""
        ...

    def start_debezium(self, sink: str, *, durable: bool = False, resume: bool = False) -> object:
        """Start the Debezium instance of ``sink``; returns once its slot streams. ``resume``
        (restart from the kept slot and offsets) raises :class:`StackError` on compose."""
        ...

    def stop_debezium(self, sink: str) -> None:
        """Stop the Debezium instance of ``sink`` (no-op when it is not running)."""
        ...

    def kill_debezium(self, sink: str) -> int | None:
        """SIGKILL the Debezium instance of ``sink`` (a fault); its pid, None when none ran."""
        ...

    def stop_service(self, name: str) -> None:
        """Stop one always-on service or broker node, keeping its data (a fault)."""
        ...

    def start_service(self, name: str) -> None:
        """Start a stopped service or broker node again; returns once it serves."""
        ...

    def kill_node(self, name: str) -> list[int]:
        """SIGKILL one broker node (``ha``); the pids killed."""
        ...

    def fail_over(self, *, immediate: bool = False) -> dict[str, float]:
        """Stop the primary and promote the standby (``ha``); seconds of stop and promotion."""
        ...

    def move_debezium(self, sink: str, port: int | None) -> None:
        """Point Debezium of ``sink`` at another PostgreSQL port (None: the primary) for its next start."""
        ...

    def fail_back(self) -> None:
        """Undo :meth:`fail_over`: the primary serves again and the standby is rebuilt from it."""
        ...

    def participants(self) -> dict[str, list[psutil.Process]]:
        """Participant name -> roots of its process trees (local processes only)."""
        ...

    def debezium_processes(self, sink: str) -> list[psutil.Process]:
        """Roots of the process trees of the Debezium instance of ``sink`` (local processes only)."""
        ...

    def counters(self) -> dict[str, Counter] | None:
        """Participant -> container CPU/memory reader; None when CPU is read from local process trees."""
        ...

    def record(self) -> dict[str, Any]:
        """What a run stores about the stack beyond backend and topology (``images`` at least)."""
        ...


DEBEZIUM_SINKS = ("kafka", "rabbitmq")


def check_sink(sink: str) -> str:
    if sink not in DEBEZIUM_SINKS:
        raise StackError(f"unknown Debezium sink {sink!r}: choose one of {', '.join(DEBEZIUM_SINKS)}")
    return sink
