"""Before a run: nothing of an earlier run may still be alive to bill CPU or hold a port.

A run starts only when

* no process recorded by an earlier run (:mod:`lab.stack.children`) is alive,
* the ports it binds are free: the web service's two and both Debezium HTTP ports (a Debezium of
  this stack may hold its own port: the run's reset stops it),
* its participant cgroups are empty, except the stack services' own groups (the groups are
  per stack, :func:`lab.measure.cgroups.cgroup_scope`).

Otherwise it fails at once with one line naming the leftover pid; ``lab stack down`` stops
what a killed run left behind.
"""

from __future__ import annotations

from lab.measure.cgroups import occupant
from lab.settings import Settings
from lab.stack.base import DEBEZIUM_SINKS, Stack, StackError, debezium_participant
from lab.stack.children import require_clean
from lab.stack.debezium import http_port

# every topology's nodes (ha adds a standby, three Kafka and three RabbitMQ nodes)
SERVICE_GROUPS = ("postgres", "postgres-standby", "kafka", "kafka-1", "kafka-2", "kafka-3", "rabbitmq",
                  "rabbitmq-1", "rabbitmq-2", "rabbitmq-3")


def check_clean(settings: Settings, stack: Stack) -> None:
    """Raise :class:`StackError` (one line, with the pid) if a run may not start now."""
    ports = {"the web service": settings.web_port,
             "the web service's control listener": settings.control_port}
    ours: set[int] = set()
    if stack.control is not None:  # local processes (containers publish their own ports)
        ours = {p.pid for sink in DEBEZIUM_SINKS for p in stack.control.processes(debezium_participant(sink))}
        ports |= {f"Debezium Server ({sink} sink)": http_port(settings, sink) for sink in DEBEZIUM_SINKS}
    require_clean(settings, ports, ours=ours)
    left = occupant(settings, services=SERVICE_GROUPS, ignore=ours)
    if left is not None:
        group, pid = left
        raise StackError(f"pid {pid} is still in this stack's cgroup {group!r} from an earlier run; "
                         "stop it with `lab stack down` (or kill it) and run again")
