"""The native backend: the four services as local processes on loopback.

PostgreSQL, Kafka and RabbitMQ run for as long as the stack is up (an idle broker is still a
participant); each Debezium Server instance runs only during its own run.

``settings.topology`` chooses the nodes: ``single`` (one of each, the reference's stack) or
``ha``: three Kafka KRaft nodes (:class:`lab.stack.kafka_broker.KafkaCluster`), three
clustered RabbitMQ nodes (:class:`lab.stack.rabbitmq_cluster.RabbitMQCluster`) and a PostgreSQL
streaming standby with failover slots (:mod:`lab.stack.standby`), each node a participant of its
own (``kafka-1``..``kafka-3``, ``rabbitmq-1``..``rabbitmq-3``, ``postgres-standby``). One stack
dir runs one topology at a time: ``up`` refuses, in one line, while nodes of the other one run.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from typing import Any

import psutil

from lab.pg import slots
from lab.settings import Settings
from lab.stack import children, hosts, leftover_slots, proc, remote_engine, stackdir
from lab.stack.base import (
    DEBEZIUM_SINKS,
    DebeziumStart,
    Endpoints,
    ErlCall,
    NativeService,
    ServiceStatus,
    StackError,
    check_sink,
    debezium_participant,
)
from lab.stack.debezium import DebeziumService
from lab.stack.kafka_broker import KafkaCluster, KafkaService
from lab.stack.postgres import PostgresService, reset_altered
from lab.stack.provision import java_home
from lab.stack.rabbitmq_broker import RabbitMQService
from lab.stack.rabbitmq_cluster import RabbitMQCluster
from lab.stack.standby import PostgresStandby, configure_primary

log = logging.getLogger(__name__)


class NativeStack:
    """``up``/``down``/``status`` of the always-on services plus on-demand Debezium (a
    :class:`~lab.stack.base.Stack`), and the control of those services, which are processes of its
    own (its :class:`~lab.stack.base.ServiceControl`: :attr:`control` is itself)."""

    backend = "native"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topology = settings.topology
        self.postgres = PostgresService(settings)
        self.standby = PostgresStandby(settings) if settings.ha else None
        self.kafka: KafkaService | KafkaCluster = KafkaCluster(settings) if settings.ha else KafkaService(settings)
        self.rabbitmq: RabbitMQService | RabbitMQCluster = (
            RabbitMQCluster(settings) if settings.ha else RabbitMQService(settings))
        self.debezium = {sink: DebeziumService(settings, sink) for sink in DEBEZIUM_SINKS}
        self.skipped: dict[str, str] = {}  # service -> why it needs root (set by provision and up)

    def _startable(self) -> list[NativeService]:
        """The services this user can start: without root, RabbitMQ 4.0 (a chroot) or an
        uninstalled 3.10 is left out and recorded in :attr:`skipped` (the wal pipelines, Kafka
        and Debezium do not need it)."""
        why = self.rabbitmq.root_needed()
        self.skipped = {self.rabbitmq.name: why} if why else {}
        return [s for s in self.services if s.name not in self.skipped]

    @property
    def services(self) -> list[NativeService]:
        """The always-on services, in start order."""
        standby = [self.standby] if self.standby is not None else []
        return [self.postgres, *standby, self.kafka, self.rabbitmq]

    def _other_topology(self) -> list[NativeService]:
        """The services of the topology not chosen (they share this stack dir)."""
        s = self.settings.replace(topology="single" if self.settings.ha else "ha")
        if s.ha:
            return [PostgresStandby(s), KafkaCluster(s), RabbitMQCluster(s)]
        return [KafkaService(s), RabbitMQService(s)]

    @property
    def control(self) -> NativeStack:
        """Its services are processes of its own: it controls them itself."""
        return self

    def endpoints(self) -> Endpoints:
        s = self.settings
        return Endpoints(pg_dsn=s.pg_dsn, kafka_bootstrap=s.kafka_bootstrap, amqp_url=s.amqp_url)

    def provision(self) -> None:
        """Check Java 21+ and fetch and cache every artifact; starts nothing. Creates (and
        marks) the stack dir, or refuses a directory that is not the lab's (:mod:`lab.stack.stackdir`)."""
        stackdir.claim(self.settings.stack_dir)
        java_home(self.settings)  # cached artifacts skip every Java call: check it here
        for service in [*self._startable(), self.debezium["kafka"]]:
            log.info("provisioning %s", service.name)
            service.provision()

    def up(self) -> None:
        """Start what is not running; on failure stop what this call started, then re-raise."""
        self.provision()
        other = [s.name for s in self._other_topology() if s.processes()]
        if other:
            now = "single" if self.settings.ha else "ha"
            raise StackError(f"this stack runs topology {now} ({', '.join(other)}); stop it first "
                             f"(`lab stack down --topology {now}`)")
        self._check_layout()
        if self.settings.netns:
            hosts.create(self.settings)
        if self.standby is not None and self.standby.promoted():  # a failover never undone
            self.fail_back()
        started: list[NativeService] = []
        try:
            for service in self._startable():
                if not self._running(service):
                    log.info("starting %s", service.name)
                    started.append(service)
                    service.start()
                if service is self.postgres:  # the topology's slot and setting on the primary
                    leftover_slots.drop_pending(self.settings)
                    configure_primary(self.settings)
                    reset_altered(self.settings.pg_primary_dsn)  # what a killed fault run left changed
        except BaseException:
            with proc.deferred_signals():  # a second SIGTERM does not cut the rollback short
                for service in reversed(started):
                    with contextlib.suppress(Exception):
                        service.stop()
            raise

    def _on_hosts(self) -> NativeStack | None:
        """This stack as it runs on hosts of its own, when it does and these settings say loopback
        (``down`` and ``status`` reach its services at their hosts' addresses without ``--hosts``)."""
        if self.settings.netns or not hosts.recorded(self.settings):
            return None
        return NativeStack(self.settings.replace(hosts="netns"))

    def _check_layout(self) -> None:
        """Refuse, in one line, to start on one host layout while services run on the other (the
        services of a stack dir run either all on loopback or all on their own hosts)."""
        s = self.settings
        if s.netns:
            hosts.require_root()
        running = [svc.name for svc in self.services if svc.processes()]
        on_hosts = hosts.recorded(s)
        if running and on_hosts != s.netns:
            now = "netns" if on_hosts else "loopback"
            raise StackError(f"this stack runs on hosts {now} ({', '.join(running)}); stop it first "
                             f"(`lab stack down`) or use --hosts {now}")

    def _running(self, service: NativeService) -> bool:
        if isinstance(service, KafkaCluster | RabbitMQCluster):
            return all(node.processes() for node in service.nodes)
        return bool(service.processes())

    def down(self, *, purge: bool = False) -> None:
        """Stop everything this stack started (by pid), a killed run's processes first
        (:mod:`lab.stack.children`), the nodes of either topology; returns once all exited.
        ``purge`` also deletes all state (no slot is dropped: the cluster goes), the stack's own
        engine taken down first: only a stack dir the lab claimed, stacks nested in it purged first,
        each by its own ``down`` under its own lock (:mod:`lab.stack.stackdir`)."""
        on_hosts = self._on_hosts()
        if on_hosts is not None:
            return on_hosts.down(purge=purge)
        errors: list[str] = []
        if purge:
            stackdir.check_purgeable(self.settings.stack_dir)  # refused before anything stops
            nested = stackdir.nested_stacks(self.settings.stack_dir)
            with stackdir.locked(nested):  # one in use is refused, naming its command, before anything stops
                for inner in nested:  # deepest first, each with its own down: hosts, link delay, engine too
                    log.warning("purging the stack nested in %s first", inner)
                    try:
                        inner_settings = self.settings.replace(stack_dir=inner, hosts="loopback", link_delay_ms=0.0)
                        NativeStack(inner_settings).down(purge=True)
                    except Exception as exc:
                        errors.append(f"nested stack {inner}: {exc}")
            if errors:
                raise StackError("could not purge: " + "; ".join(errors) + f"; state kept in {self.settings.stack_dir}")
        try:
            children.stop_all(self.settings)
        except Exception as exc:
            errors.append(str(exc))
        # the other topology's nodes too: `down` stops whatever this stack dir runs
        for service in [*self.debezium.values(), *self._other_topology(), *reversed(self.services)]:
            if service is self.postgres and not purge and service.processes():  # a purge deletes the slots too
                leftover_slots.drop_all(self.settings, errors)
            try:
                service.stop(purge=purge)
            except Exception as exc:  # keep stopping the others
                errors.append(f"{service.name}: {exc}")
        if purge and not errors and remote_engine.exists(self.settings):  # its data root is in the stack dir
            try:
                remote_engine.down(self.settings, purge=True)
            except Exception as exc:
                errors.append(f"engine: {exc}")
        if not errors:  # the hosts last: a namespace lives on while a process runs in it
            try:
                hosts.remove(self.settings)
            except Exception as exc:
                errors.append(str(exc))
        if purge and not errors:  # a node that did not stop keeps its pid file: down can find it again
            stackdir.remove(self.settings.stack_dir)
        if errors:
            kept = f"; state kept in {self.settings.stack_dir} (not purged)" if purge else ""
            raise StackError("could not stop cleanly: " + "; ".join(errors) + kept)

    def status(self) -> list[ServiceStatus]:
        """One line per node: the cluster's Kafka nodes each on their own, and the other
        topology's nodes too while they run (a status asked without ``--topology``)."""
        on_hosts = self._on_hosts()
        if on_hosts is not None:
            return on_hosts.status()
        out: list[Any] = []
        other = [s for s in self._other_topology() if s.processes()]
        for service in [*self.services, *other, *self.debezium.values()]:
            out += service.statuses() if isinstance(service, KafkaCluster | RabbitMQCluster) else [service.status()]
        return out

    def start_debezium(self, sink: str, *, durable: bool = False, resume: bool = False) -> DebeziumStart:
        """Start one Debezium instance (:meth:`DebeziumService.start`: ``durable`` in fault runs,
        ``resume`` to restart it from its kept slot and offsets)."""
        service = self.debezium[check_sink(sink)]
        service.start(durable=durable, resume=resume)
        return DebeziumStart(sink, tuple(p.pid for p in service.processes()), service.last_start_s)

    def kill_debezium(self, sink: str) -> int | None:
        """SIGKILL one Debezium instance (a fault); its pid, or None when none ran."""
        return self.debezium[check_sink(sink)].kill()

    def service(self, name: str) -> NativeService:
        """One always-on service by name (``postgres``, ``kafka``, ``rabbitmq``), or under ``ha``
        one broker node (``kafka-2``, ``rabbitmq-1``)."""
        found = {s.name: s for s in self.services}
        for node in self._nodes():
            found[node.name] = node
        if name not in found:
            raise StackError(f"unknown service {name!r}: choose one of {', '.join(found)}")
        return found[name]

    def _cluster_of(self, name: str) -> NativeService | None:
        """The cluster a node name belongs to (None: not a node)."""
        for cluster in (self.kafka, self.rabbitmq):
            if isinstance(cluster, KafkaCluster | RabbitMQCluster) and name in {n.name for n in cluster.nodes}:
                return cluster
        return None

    def _nodes(self) -> list[KafkaService | RabbitMQService]:
        """The broker nodes of the ``ha`` topology's clusters (none under ``single``)."""
        return [n for c in (self.kafka, self.rabbitmq) if isinstance(c, KafkaCluster | RabbitMQCluster)
                for n in c.nodes]

    def stop_service(self, name: str) -> None:
        """Stop one always-on service (or one broker node), keeping its data (a fault:
        ``broker-restart``, ``postgres-restart``; PostgreSQL's is a fast shutdown). Its slots,
        topics, queues and offsets survive for :meth:`start_service`."""
        self.service(name).stop()

    def start_service(self, name: str) -> None:
        """Start one always-on service again; returns once it serves. A broker node is started by
        its cluster, which starts the nodes not running and returns once all of them serve
        together (all three brokers listed; the RabbitMQ node back in node 1's cluster)."""
        cluster = self._cluster_of(name)
        (cluster or self.service(name)).start()

    def kill_node(self, name: str) -> list[int]:
        """SIGKILL one broker node's process trees (``broker-node-kill``: a crash, no controlled
        shutdown); returns the pids killed, once they are gone."""
        if self._cluster_of(name) is None:
            nodes = [n.name for n in self._nodes()]
            raise StackError(f"{name!r} is not a broker node of this stack (nodes: {', '.join(nodes) or 'none'}: "
                             "broker nodes exist under the ha topology)")
        # the node's own recorded tree only (proc.terminate with SIGKILL, which counts a zombie
        # as gone): node 1's epmd, in a directory of its own, serves the other two nodes here,
        # where on three hosts each would have its own
        node = next(n for n in self._nodes() if n.name == name)
        state_dir = node.state_dir if isinstance(node, KafkaService) else node.dir
        root = proc.running(state_dir)
        pids = [] if root is None else [root.pid, *(c.pid for c in _children(root))]
        proc.terminate(state_dir, timeout=0, sig=signal.SIGKILL)
        return pids

    def fail_over(self, *, immediate: bool = False) -> dict[str, float]:
        """``postgres-failover`` (``ha`` only): stop the primary (a fast shutdown, which
        first streams every committed change to the standby; ``immediate``: a crash, what was not
        streamed yet is gone), then promote the standby. Clients find it through
        :attr:`Settings.pg_dsn`'s host list; Debezium, which takes one host, is moved by the
        caller (:meth:`move_debezium`). Returns the seconds of the stop and of the promotion."""
        if self.standby is None:
            raise StackError("postgres-failover needs the ha topology (a standby to promote)")
        t0 = time.monotonic()
        self.postgres.stop(immediate=immediate)
        stopped = round(time.monotonic() - t0, 3)
        return {"stop_s": stopped, "promote_s": self.standby.promote()}

    def move_debezium(self, sink: str, port: int | None) -> None:
        """Point one Debezium instance at another PostgreSQL port (the promoted standby's, or
        None: the primary's again) for its next start. Debezium's connector takes a single
        host and port: after a failover it is restarted pointed at the new primary, as its
        documentation prescribes."""
        self.debezium[check_sink(sink)].pg_port = port

    def fail_back(self) -> None:
        """Undo a failover: stop the promoted standby, start the primary again (its data up to
        the failover; a later run truncates what it needs), drop every slot it still has (the
        failed-over run's, stale now) and rebuild the standby from it. Debezium points at the
        primary again."""
        assert self.standby is not None
        log.info("failing back: the promoted standby stops, the primary starts, the standby is rebuilt")
        for debezium in self.debezium.values():
            debezium.stop()
            debezium.pg_port = None
        self.standby.stop()
        self.postgres.start()
        dropped = slots.drop_slots(self.settings.pg_primary_dsn, "")
        if dropped:
            log.info("dropped the failed-over run's slots on the primary: %s", ", ".join(dropped))
        configure_primary(self.settings)
        self.standby.start()

    def stop_debezium(self, sink: str) -> None:
        self.debezium[check_sink(sink)].stop()

    def record(self) -> dict[str, Any]:
        """Local processes run no images."""
        return {"images": None}

    def participants(self) -> dict[str, list[psutil.Process]]:
        """Participant name -> roots of its process trees now (empty when not running)."""
        each = {debezium_participant(sink): d.processes() for sink, d in self.debezium.items()}
        out = {"postgres": self.postgres.processes()}
        if self.standby is not None:
            out["postgres-standby"] = self.standby.processes()
        if isinstance(self.kafka, KafkaCluster):
            out |= {node.name: node.processes() for node in self.kafka.nodes}
        else:
            out["kafka"] = self.kafka.processes()
        if isinstance(self.rabbitmq, RabbitMQCluster):
            out |= {node.name: node.processes() for node in self.rabbitmq.nodes}
        else:
            out["rabbitmq"] = self.rabbitmq.processes()
        return out | {"debezium": [p for roots in each.values() for p in roots]} | each

    def processes(self, participant: str) -> list[psutil.Process]:
        return self.participants().get(participant, [])

    def queue_replicas(self, queue: str) -> dict[str, object] | None:
        """The cluster's members of ``queue`` and its leader (``ha``); None on one node."""
        return self.rabbitmq.queue_replicas(queue) if isinstance(self.rabbitmq, RabbitMQCluster) else None

    def erl_call(self) -> ErlCall | None:
        """``erl_call`` on the one RabbitMQ node; None for a cluster (its queue's backlog is then
        read with a passive declare)."""
        return self.rabbitmq.erl_call() if isinstance(self.rabbitmq, RabbitMQService) else None


def _children(root: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return root.children(recursive=True)
    return []
