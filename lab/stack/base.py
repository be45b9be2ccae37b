"""The contract every stack backend and every native service fulfils."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import psutil


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

    name: ClassVar[str]

    def provision(self) -> None: ...
    def start(self) -> None: ...
    def stop(self, *, purge: bool = False) -> None: ...
    def status(self) -> ServiceStatus: ...
    def processes(self) -> list[psutil.Process]: ...


DEBEZIUM_SINKS = ("kafka", "rabbitmq")


def check_sink(sink: str) -> str:
    if sink not in DEBEZIUM_SINKS:
        raise StackError(f"unknown Debezium sink {sink!r}: choose one of {', '.join(DEBEZIUM_SINKS)}")
    return sink
