"""The stack's services as measured participants, whatever the backend.

The native backend's services are local process trees (each put in its own cgroup by the
caller); the compose backend's are containers, possibly on another host, whose cumulative CPU
and memory the stack reads through the engine (``ComposeStack.counters``). Callers ask here and
never look at the backend themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import psutil

from lab.measure.cgroups import CpuGroup
from lab.measure.sampler import Participant

Counter = Callable[[], tuple[float, float]]
Source = list[psutil.Process] | Counter
GroupFor = Callable[[str, list[psutil.Process]], CpuGroup | None]


SINGLE_SERVICES = ("postgres", "kafka", "rabbitmq")


def service_names(stack: Any) -> tuple[str, ...]:
    """The stack's always-on participants: one per node (the ``ha`` topology's ``kafka-1``..3
    and ``postgres-standby``; the compose backend runs the single topology only)."""
    return tuple(getattr(stack, "service_names", SINGLE_SERVICES))


def service_sources(stack: Any, names: tuple[str, ...]) -> dict[str, Source]:
    """Name -> the service's process roots (native) or its container counter (compose).

    Names: those of :func:`service_names`, ``debezium`` (both instances) and
    ``debezium-<sink>`` (one instance).
    """
    counters = getattr(stack, "counters", None)
    if counters is not None:
        c = counters()
        return {n: c[n] for n in names}
    roots = stack.participants()
    return {n: stack.debezium[n.split("-", 1)[1]].processes() if n.startswith("debezium-") else roots[n]
            for n in names}


def service_participants(stack: Any, names: tuple[str, ...], group: GroupFor) -> list[Participant]:
    """Participants for the stack's services: a container counter, or process roots asked at
    every tree walk with a cgroup from ``group`` (name, current roots)."""
    sources = service_sources(stack, names)
    parts = []
    for name, source in sources.items():
        if callable(source):
            parts.append(Participant(name, [], counter=source))
        else:
            parts.append(Participant(name, _roots(stack, name), cgroup=group(name, source)))
    return parts


def _roots(stack: Any, name: str) -> Callable[[], Iterable[Any]]:
    """The service's process roots, asked again at every walk (a restarted service is the same participant)."""
    def roots() -> Iterable[Any]:
        source = service_sources(stack, (name,))[name]
        return [] if callable(source) else source
    return roots


def is_local(stack: Any) -> bool:
    """Whether the stack's services are processes of this host (their CPU is in its busy time)."""
    return getattr(stack, "backend", "native") == "native" or not stack.settings.docker_host


def stack_record(stack: Any) -> dict[str, Any]:
    """What a run stores about its stack: ``backend``, ``topology`` and, for containers, ``images`` (service
    -> image id, the content digest of the image each container ran), ``engine`` (version) and
    ``container_cpu`` (service -> how its counter was read: ``cgroup`` or ``engine api``)."""
    record = getattr(stack, "record", None)
    return {"backend": getattr(stack, "backend", "native"),
            "topology": getattr(stack, "topology", "single"),  # compose: single only
            **(record() if record else {"images": None})}
