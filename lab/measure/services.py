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
from lab.stack.base import Stack, services

GroupFor = Callable[[str, list[psutil.Process]], CpuGroup | None]


def service_participants(stack: Stack, group: GroupFor) -> list[Participant]:
    """Participants for the stack's always-on services and its Debezium (both instances as one):
    a container counter, or process roots asked at every tree walk with a cgroup from ``group``
    (name, current roots)."""
    sources = stack.participants()
    parts = []
    for name in (*services(sources), "debezium"):
        source = sources[name]
        if callable(source):
            parts.append(Participant(name, [], counter=source))
        else:
            parts.append(Participant(name, _roots(stack, name), cgroup=group(name, source)))
    return parts


def _roots(stack: Stack, name: str) -> Callable[[], Iterable[Any]]:
    """The service's process roots, asked again at every walk (a restarted service is the same participant)."""
    def roots() -> Iterable[Any]:
        source = stack.participants()[name]
        return [] if callable(source) else source
    return roots


def is_local(stack: Stack) -> bool:
    """Whether the stack's services are processes of this host (their CPU is in its busy time)."""
    return stack.backend == "native" or not stack.settings.engine_host


def stack_record(stack: Stack) -> dict[str, Any]:
    """What a run stores about its stack: ``backend``, ``topology`` and, for containers, ``images`` (service
    -> image id, the content digest of the image each container ran), ``engine`` (version) and
    ``container_cpu`` (service -> how its counter was read: ``cgroup`` or ``engine api``)."""
    return {"backend": stack.backend, "topology": stack.topology, **stack.record()}
