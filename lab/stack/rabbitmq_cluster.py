"""The ``ha`` topology's RabbitMQ: three clustered nodes, quorum queues on all three.

Nodes ``rabbitmq-1``..``rabbitmq-3`` are :class:`lab.stack.rabbitmq_broker.RabbitMQService` instances,
each with its own state dir (``<stack_dir>/rabbitmq-<i>``), node name (``<name>-<i>@<host>``
from ``LAB_RABBITMQ_NODE``), AMQP and distribution ports (the configured ones + 10·i), and its
own memory limit; all register with one epmd (node 1's, on ``LAB_RABBITMQ_EPMD_PORT``) and share
one Erlang cookie, generated once into the stack's secrets dir and copied into each node's
``HOME`` with mode 0400 (never on a command line).

Forming the cluster: every node is spawned at once and awaited; then each of nodes 2 and 3 that
node 1 does not list among its running nodes is joined to it (``stop_app``, ``reset``,
``join_cluster``, ``start_app``: the clustering guide's procedure). That happens on the first
start only: a clustered node that restarts rejoins the peers its database names, which is why
they are always started together (a node waits for the last one that stopped).

Clients connect to node 1 (``Settings.amqp_url``): aiormq takes one URL and Debezium Server's
RabbitMQ sink one host and port. The pipeline declares its quorum queue there with
``x-quorum-initial-group-size`` 3 and ``x-queue-leader-locator`` ``client-local``, so the leader is on
node 1 with the clients and nodes 2 and 3 hold followers (:mod:`lab.pipelines.rabbitmq`).
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from lab.settings import Settings
from lab.stack import proc
from lab.stack import rabbitmq_broker as rabbitmq
from lab.stack.base import ServiceStatus, StackError
from lab.stack.rabbitmq_broker import HA_MEMORY_WATERMARK, RabbitMQService

log = logging.getLogger(__name__)


def running_nodes(status_json: str) -> list[str]:
    """The running nodes of ``rabbitmqctl cluster_status --formatter json`` output."""
    return sorted(json.loads(status_json).get("running_nodes", []))


def queue_replicas(list_queues_json: str, queue: str) -> dict[str, object]:
    """``members`` (sorted) and ``leader`` of ``queue`` in ``rabbitmqctl list_queues name members
    leader --formatter json`` output; empty members when the queue is not listed."""
    for row in json.loads(list_queues_json):
        if row.get("name") == queue:
            members = row.get("members") or []
            return {"members": sorted(members) if isinstance(members, list) else [], "leader": row.get("leader")}
    return {"members": [], "leader": None}


class RabbitMQCluster:
    """The three nodes, started, clustered and stopped together (:class:`NativeService`)."""

    name: str = "rabbitmq"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.nodes = [RabbitMQService(settings, i) for i, _, _, _ in settings.rabbitmq_nodes]

        self.last_start_s: float | None = None

    def root_needed(self) -> str | None:
        return self.nodes[0].root_needed()

    @property
    def node_names(self) -> list[str]:
        return [n.node_name for n in self.nodes]

    def provision(self) -> None:
        self.nodes[0].provision()

    def start(self) -> None:
        """Spawn the nodes not running (node 1 first: it starts the epmd), wait for all, cluster
        them; on failure stop all three."""
        if all(proc.running(n.dir) is not None for n in self.nodes) and self.clustered():
            return
        t0 = time.monotonic()
        try:
            spawned = [(n, n.spawn()) for n in self.nodes if proc.running(n.dir) is None]
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                for f in [pool.submit(n.wait_ready, p) for n, p in spawned]:
                    f.result()
            self._join()
        except BaseException:
            self.stop()
            raise
        self.last_start_s = round(time.monotonic() - t0, 2)
        log.info("RabbitMQ cluster %s up in %.1f s", ", ".join(self.node_names), self.last_start_s)

    def _join(self) -> None:
        """Join nodes 2 and 3 to node 1, one after the other. Two joins at once can meet in node 1's
        schema transaction: the loser's mnesia start is killed (``start_app`` exits 69), and its
        database is then left so that not even ``reset`` starts it again (both seen on a loaded
        2-core machine), so the joins never overlap. Each CLI call boots an Erlang VM (tens of
        seconds on a loaded 2-core machine), so each step gets the node's start timeout."""
        running = self.running_nodes()
        for node in self.nodes[1:]:
            if node.node_name not in running:
                self._join_one(node)
        if not self.clustered():
            raise StackError(f"RabbitMQ nodes did not form one cluster: node 1 runs with "
                             f"{self.running_nodes()}, expected {sorted(self.node_names)}")

    def _join_one(self, node: RabbitMQService) -> None:
        first, timeout = self.nodes[0].node_name, rabbitmq.START_TIMEOUT  # read now: tests raise it
        log.info("joining %s to %s", node.node_name, first)
        for step in (("stop_app",), ("reset",), ("join_cluster", first), ("start_app",)):
            node.ctl(*step, timeout=timeout)

    def running_nodes(self) -> list[str]:
        """The running members of node 1's cluster (empty when node 1 does not answer)."""
        try:
            return running_nodes(self.nodes[0].ctl("cluster_status", "--formatter", "json",
                                                   timeout=rabbitmq.START_TIMEOUT))
        except (StackError, ValueError):
            return []

    def clustered(self) -> bool:
        return self.running_nodes() == sorted(self.node_names)

    def queue_replicas(self, queue: str) -> dict[str, object]:
        """The nodes holding a member of quorum queue ``queue`` and its leader (asked on node 1)."""
        out = self.nodes[0].ctl("list_queues", "name", "members", "leader", "--formatter", "json")
        return queue_replicas(out, queue)

    def stop(self, *, purge: bool = False) -> None:
        """Stop nodes 3, 2, then 1 (whose epmd goes last); ``purge`` deletes their state."""
        errors = []
        for node in reversed(self.nodes):
            try:
                node.stop(purge=purge)
            except Exception as exc:  # keep stopping the others
                errors.append(f"{node.name}: {exc}")
        if errors:
            raise StackError("; ".join(errors))

    def processes(self) -> list[psutil.Process]:
        return [p for node in self.nodes for p in node.processes()]

    def status(self) -> ServiceStatus:
        """The cluster in one line (``statuses`` has one per node)."""
        procs = [n.processes() for n in self.nodes]
        up = sum(1 for p in procs if p)
        flat = [p for ps in procs for p in ps]
        return ServiceStatus(
            name=self.name, state="running" if up == len(self.nodes) else "degraded" if up else "stopped",
            pids=[p.pid for p in flat], endpoint=self.settings.amqp_url_public,
            version=self.nodes[0].version(), rss_mb=proc.tree_rss_mb(flat) if flat else None,
            detail={"nodes": [n.name for n in self.nodes], "start_s": self.last_start_s,
                    "memory_high_watermark": HA_MEMORY_WATERMARK},
        )

    def statuses(self) -> list[ServiceStatus]:
        out = [node.status() for node in self.nodes]
        running = self.running_nodes() if all(s.state == "running" for s in out) else []
        for s in out:
            s.detail["cluster_running_nodes"] = running
        return out
