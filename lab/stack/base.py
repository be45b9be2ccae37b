"""The contracts of the stack: what every backend answers (:class:`Stack`), what only a backend
that runs its services as processes of its own can do to them (:class:`ServiceControl`), and one
local service of the native backend (:class:`NativeService`).

A capability a backend lacks is never probed for: :attr:`Stack.control` is None on a backend that
cannot stop, kill or fail over its services (compose: containers), and a fault that needs it
says so (``needs_control``, :mod:`lab.faults`) and is refused there before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import psutil

if TYPE_CHECKING:
    from lab.settings import Settings

Counter = Callable[[], tuple[float, float]]
"""Reader of a container's (cumulative CPU s, memory MB)."""
ParticipantSource = list[psutil.Process] | Counter
"""How a participant's CPU is read: the roots of its local process trees now, or a container's counter."""
ErlCall = tuple[list[str], dict[str, str]]
"""``(argv, env)`` of an ``erl_call`` that evaluates the Erlang expressions on its stdin on a RabbitMQ node."""


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


@dataclass(frozen=True)
class DebeziumStart:
    """What starting one Debezium instance gave: its sink, the pids of its processes (none for a
    container) and the seconds from its start until its slot streamed (None: it ran already)."""

    sink: str
    pids: tuple[int, ...] = ()
    start_to_streaming_s: float | None = None


class Standby(Protocol):
    """The ``ha`` topology's PostgreSQL standby, as the runner and the failover read it."""

    port: int

    def slots(self) -> list[dict[str, object]]:
        """Every replication slot on the standby: ``slot``, ``synced``, ``temporary``, ..."""
        ...


class ServiceControl(Protocol):
    """What only a backend whose services are processes of its own can do to them: the faults'
    stops, kills and failover, and what its services answer only locally. Implemented by
    :class:`lab.stack.native.NativeStack` (:attr:`Stack.control`)."""

    @property
    def standby(self) -> Standby | None:
        """The ``ha`` topology's PostgreSQL standby; None without one."""
        ...

    def processes(self, participant: str) -> list[psutil.Process]:
        """The roots of one participant's process trees now (a service, a node, ``debezium``,
        ``debezium-<sink>``); empty when it does not run."""
        ...

    def kill_debezium(self, sink: str) -> int | None:
        """SIGKILL the Debezium instance of ``sink``; its pid, None when none ran."""
        ...

    def move_debezium(self, sink: str, port: int | None) -> None:
        """Point Debezium of ``sink`` at another PostgreSQL port (None: the primary) for its next start."""
        ...

    def stop_service(self, name: str) -> None:
        """Stop one always-on service or broker node, keeping its data."""
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

    def fail_back(self) -> None:
        """Undo :meth:`fail_over`: the primary serves again and the standby is rebuilt from it."""
        ...

    def queue_replicas(self, queue: str) -> dict[str, object] | None:
        """The RabbitMQ cluster's members of quorum queue ``queue`` and its leader; None on one node."""
        ...

    def erl_call(self) -> ErlCall | None:
        """How to evaluate Erlang on the RabbitMQ node (its queue's backlog without a VM to boot);
        None where that is not available (no ``erl_call``, a cluster)."""
        ...


class Stack(Protocol):
    """What the runner, the pipelines and the measurements ask of every stack backend.

    Implemented by :class:`lab.stack.native.NativeStack` (topologies ``single`` and ``ha``) and
    :class:`lab.stack.compose.ComposeStack` (``single`` only): who it is, its lifecycle, where its
    clients connect, its status, the one Debezium instance a run needs, its participants and what a
    run records of it. What only some backends can do is :attr:`control`.
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
    def control(self) -> ServiceControl | None:
        """Its services' control (:class:`ServiceControl`); None where it cannot stop, kill or fail over one."""
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

    def start_debezium(self, sink: str, *, durable: bool = False, resume: bool = False) -> DebeziumStart:
        """Start the Debezium instance of ``sink``; returns once its slot streams. ``resume``
        (restart from the kept slot and offsets) raises :class:`StackError` on compose."""
        ...

    def stop_debezium(self, sink: str) -> None:
        """Stop the Debezium instance of ``sink`` (no-op when it is not running)."""
        ...

    def participants(self) -> Mapping[str, ParticipantSource]:
        """Participant name -> how its CPU is read: the always-on services, one name per node
        (``kafka-1``..3 under ``ha``), ``debezium`` (both instances) and ``debezium-<sink>`` (one)."""
        ...

    def record(self) -> dict[str, Any]:
        """What a run stores about the stack beyond backend and topology (``images`` at least)."""
        ...


def debezium_participant(sink: str) -> str:
    """The participant of one Debezium instance (``debezium`` counts both)."""
    return f"debezium-{sink}"


def services(participants: Mapping[str, ParticipantSource]) -> tuple[str, ...]:
    """The always-on services among a stack's participants (every name but Debezium's)."""
    return tuple(n for n in participants if n != "debezium" and not n.startswith("debezium-"))


DEBEZIUM_SINKS = ("kafka", "rabbitmq")


def check_sink(sink: str) -> str:
    if sink not in DEBEZIUM_SINKS:
        raise StackError(f"unknown Debezium sink {sink!r}: choose one of {', '.join(DEBEZIUM_SINKS)}")
    return sink
