"""Kafka for the native stack: KRaft nodes (broker + controller in one JVM each) on loopback.

``single`` topology: one node, ``kafka``. ``ha`` topology: :class:`KafkaCluster`, three
nodes ``kafka-1``..``kafka-3`` with their own ports (:attr:`Settings.kafka_nodes`), data dirs and
JVMs, a static controller quorum of all three, internal topics and the default replication factor
3 with ``min.insync.replicas=2``. Each node is its own participant of the CPU metric.

The broker's classpath is ``org.apache.kafka:kafka_2.13`` plus its runtime dependencies and the
log4j2 backend the Apache distribution ships, copied by Maven into
``<cache_dir>/kafka-<version>/libs``. State (rendered config, KRaft metadata and topic logs,
``kafka.log``) lives in ``<stack_dir>/kafka``.

JVM flags follow ``kafka-server-start.sh``/``kafka-run-class.sh`` defaults, which the
``apache/kafka`` and confluent-local images also use: ``-Xmx1G -Xms1G`` and G1 with a 20 ms pause
target. The heap is left at 1 GiB so the broker's memory and GC behaviour match the reference;
under ``ha`` each of the three nodes has the same 1 GiB heap (measured idle RSS 378-422 MB per
node: three nodes plus Debezium's 1 GiB heap fit a 2-core, 24 GB machine with room to spare).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import logging
import shutil
import string
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

import psutil

from lab.settings import Settings, child_env, node_host
from lab.stack import proc
from lab.stack.base import ServiceStatus, StackError
from lab.stack.hosts import namespace
from lab.stack.kafka_wire import metadata_brokers
from lab.stack.provision import java_home, java_version, mvn

log = logging.getLogger(__name__)

LOG4J_VERSION = "2.24.3"  # what the Kafka 4.0/4.1 tarballs ship in libs/
SLF4J_VERSION = "1.7.36"  # Kafka 4.x stays on the SLF4J 1.x API (KIP-1064 defers 2.x to 5.0)
HEAP_OPTS = ("-Xmx1G", "-Xms1G")
JVM_OPTS = (
    "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
)
_java_version = functools.cache(java_version)
START_TIMEOUT = 90.0
HA_START_TIMEOUT = 180.0  # three JVMs starting at once on two cores, and the quorum's election
STOP_TIMEOUT = 30.0
HA_REPLICATION = {"replication_factor": 3, "min_insync_replicas": 2}
SINGLE_REPLICATION = {"replication_factor": 1, "min_insync_replicas": 1}


def replication(settings: Settings) -> dict[str, int]:
    """Replication factor and ``min.insync.replicas`` of the topology's topics."""
    return dict(HA_REPLICATION if settings.ha else SINGLE_REPLICATION)


def _template(name: str) -> str:
    return (resources.files("lab.stack") / "templates" / name).read_text()


def _cluster_id() -> str:
    """A random KRaft cluster id: a UUID in URL-safe base64 without padding, not starting '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def server_properties(settings: Settings, node_id: int, data_dir: Path) -> str:
    """``server.properties`` of node ``node_id`` of the topology's KRaft quorum."""
    s = settings
    _, port, controller_port = next(n for n in s.kafka_nodes if n[0] == node_id)
    rep = replication(s)
    return string.Template(_template("kafka-server.properties")).substitute(
        node_id=node_id,
        voters=",".join(f"{i}@{s.kafka_host(i)}:{c}" for i, _, c in s.kafka_nodes),
        host=s.kafka_host(node_id),
        port=port,
        controller_port=controller_port,
        data_dir=data_dir,
        replication_factor=rep["replication_factor"],
        min_isr=rep["min_insync_replicas"],
    )


class KafkaService:
    """Apache Kafka ``settings.kafka_version``, one KRaft node, PLAINTEXT on 127.0.0.1.

    ``node``: None for the single topology's node ``kafka``; 1-3 for node ``kafka-<node>`` of the
    ``ha`` cluster (start the cluster with :class:`KafkaCluster`).
    """

    name: str = "kafka"

    def __init__(self, settings: Settings, node: int | None = None) -> None:
        self.settings = settings
        self.node_id = node or 1
        self.name = "kafka" if node is None else f"kafka-{node}"
        _, self.port, self.controller_port = next(n for n in settings.kafka_nodes if n[0] == self.node_id)
        #: where this node listens: its host's address under netns (``broker``, ``broker-<node>``)
        self.host = settings.kafka_host(self.node_id)
        self.netns = namespace(settings, node_host("broker", self.node_id))
        self.bootstrap = f"{self.host}:{self.port}"
        self.state_dir = settings.stack_dir / self.name
        self.data_dir = self.state_dir / "data"
        self.config_dir = self.state_dir / "config"
        self.log_path = self.state_dir / "kafka.log"  # log4j2 output
        self.out_path = self.state_dir / "kafka.out"  # JVM stdout/stderr (crashes, JVM warnings)
        self.dist_dir = settings.cache_dir / f"kafka-{settings.kafka_version}"
        self.libs_dir = self.dist_dir / "libs"
        self.last_start_s: float | None = None

    # Provisioning -------------------------------------------------------------------------
    def _pom(self) -> str:
        return string.Template(_template("kafka-pom.xml")).substitute(
            kafka_version=self.settings.kafka_version,
            log4j_version=LOG4J_VERSION,
            slf4j_version=SLF4J_VERSION,
        )

    def _marker(self) -> Path:
        return self.dist_dir / "libs.complete"

    def _libs_complete(self, pom_digest: str) -> bool:
        try:
            digest, *jars = self._marker().read_text().split()
        except FileNotFoundError:
            return False
        complete = all((self.libs_dir / jar).is_file() for jar in jars)
        return digest == pom_digest and bool(jars) and complete

    def provision(self) -> None:
        """Resolve the broker's jars into the cache once; a marker lists them when complete."""
        pom = self._pom()
        digest = hashlib.sha256(pom.encode()).hexdigest()[:16]
        if self._libs_complete(digest):
            return
        self.dist_dir.mkdir(parents=True, exist_ok=True)
        with open(self.dist_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._libs_complete(digest):
                return
            log.info("resolving Kafka %s jars into %s", self.settings.kafka_version, self.libs_dir)
            (self.dist_dir / "pom.xml").write_text(pom)
            shutil.rmtree(self.libs_dir, ignore_errors=True)
            version = self.settings.kafka_version
            mvn(
                "-f", str(self.dist_dir / "pom.xml"), "dependency:copy-dependencies",
                f"-DoutputDirectory={self.libs_dir}", "-DincludeScope=runtime",
                what=f"org.apache.kafka:kafka_2.13:{version} and its dependencies",
            )
            jars = sorted(p.name for p in self.libs_dir.glob("*.jar"))
            main = f"kafka_2.13-{version}.jar"
            if main not in jars:
                raise StackError(f"mvn finished but {self.libs_dir / main} is missing; retry")
            self._marker().write_text("\n".join([digest, *jars]) + "\n")

    # Start / stop ---------------------------------------------------------------------------
    def _java(self) -> Path:
        return java_home(self.settings) / "bin" / "java"

    def _classpath(self) -> str:
        return str(self.libs_dir / "*")

    def _jvm_args(self) -> list[str]:
        # Java 24+ warns on stderr about Kafka's sun.misc.Unsafe use (JEP 498); allow it quietly.
        java = self._java()
        quiet = ["--sun-misc-unsafe-memory-access=allow"] if _java_version(java) >= 23 else []
        return [
            str(java), *HEAP_OPTS, *JVM_OPTS, *quiet,
            f"-Dlog4j2.configurationFile={self.config_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.state_dir}",
            "-cp", self._classpath(),
        ]

    def _render_config(self) -> Path:
        self.config_dir.mkdir(parents=True, exist_ok=True)
        server = self.config_dir / "server.properties"
        server.write_text(server_properties(self.settings, self.node_id, self.data_dir))
        (self.config_dir / "log4j2.properties").write_text(_template("kafka-log4j2.properties"))
        return server

    def _format(self, server: Path, cid: str | None = None) -> None:
        """Format the KRaft metadata dir once (static quorum; skipped when already formatted);
        ``cid``: the cluster's id (every node of a cluster shares it), else a new one."""
        if (self.data_dir / "meta.properties").exists():
            return
        cid = cid or _cluster_id()
        log.info("formatting Kafka storage in %s (cluster id %s)", self.data_dir, cid)
        res = subprocess.run(
            [*self._jvm_args(), "kafka.tools.StorageTool", "format", "-t", cid, "-c", str(server)],
            capture_output=True, text=True, check=False, env=self._env(),
        )
        if res.returncode != 0:
            out = " | ".join((res.stdout + res.stderr).strip().splitlines()[-3:])
            raise StackError(f"formatting Kafka storage in {self.data_dir} failed: {out}")

    def _env(self) -> dict[str, str]:
        return child_env(JAVA_HOME=str(java_home(self.settings)))

    def start(self) -> None:
        """Start the broker (no-op if ours runs) and wait until it answers a metadata request."""
        if proc.running(self.state_dir) is not None:
            log.info("%s already running", self.name)
            return
        t0 = time.monotonic()
        p = self.spawn()
        try:
            self.wait_ready(p)
        except StackError:
            proc.terminate(self.state_dir, timeout=5)
            raise
        self.last_start_s = round(time.monotonic() - t0, 2)
        log.info("%s up on %s in %.1f s", self.name, self.bootstrap, self.last_start_s)

    def spawn(self, cluster_id: str | None = None) -> psutil.Process:
        """Check the ports, render the config, format once and start the JVM; no waiting."""
        what = "Kafka" if self.name == "kafka" else f"Kafka node {self.name}"
        hint = "" if self.name == "kafka" else f" + {self.port - self.settings.kafka_port}"
        host = self.host
        proc.require_free(self.port, what, "LAB_KAFKA_PORT" + hint, host)
        proc.require_free(self.controller_port, f"the controller of {what}", "LAB_KAFKA_CONTROLLER_PORT" + hint,
                          host)
        server = self.prepare(cluster_id)
        return proc.spawn(
            [*self._jvm_args(), "kafka.Kafka", server],
            state_dir=self.state_dir, log_path=self.out_path, env=self._env(), cwd=self.state_dir,
            netns=self.netns,
        )

    def prepare(self, cluster_id: str | None = None) -> Path:
        """Render the config and format the data dir once; returns the config's path."""
        self.provision()
        server = self._render_config()
        self._format(server, cluster_id)
        return server

    def wait_ready(self, p: psutil.Process, *, brokers: int = 1, timeout: float = START_TIMEOUT) -> None:
        """Until this node answers a metadata request listing ``brokers`` brokers.

        Asked with :func:`lab.stack.kafka_wire.metadata_brokers` over a plain socket, not librdkafka: an AdminClient
        polled while a broker (re)starts once aborted the whole process (SIGABRT inside
        ``list_topics``), and this wait runs in the runner's process during faults."""
        host = self.host

        def ready() -> bool:
            return proc.port_open(self.port, host) and metadata_brokers(host, self.port) >= brokers

        try:
            proc.wait_until(
                ready, timeout=timeout, what=self.name, proc=p, log_path=self.out_path
            )
        except StackError as e:
            raise StackError(f"{e} | last error in {self.log_path}: {self._last_error()}") from None

    def _last_error(self) -> str:
        """The last ERROR line of kafka.log (a stack trace's tail says less than its head)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-500:]
        except OSError:
            return "(no log)"
        at = [i for i, ln in enumerate(lines) if "] ERROR " in ln or "] FATAL " in ln]
        if not at:
            return "(none)"
        return " ".join(ln.strip() for ln in lines[at[-1]:at[-1] + 2])[:500]  # + exception line

    def stop(self, *, purge: bool = False) -> None:
        """SIGTERM (controlled shutdown), SIGKILL after 30 s; ``purge`` deletes all state."""
        if proc.terminate(self.state_dir, timeout=STOP_TIMEOUT):
            log.info("%s stopped", self.name)
        if purge:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    # Introspection --------------------------------------------------------------------------
    def processes(self) -> list[psutil.Process]:
        p = proc.running(self.state_dir)
        return [] if p is None else [p]

    def _cluster_id_on_disk(self) -> str:
        with contextlib.suppress(OSError):
            for line in (self.data_dir / "meta.properties").read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.split("=", 1)[1].strip()
        return ""

    def status(self) -> ServiceStatus:
        procs = self.processes()
        return ServiceStatus(
            name=self.name,
            state="running" if procs else "stopped",
            pids=[p.pid for p in procs],
            endpoint=self.bootstrap,
            version=self.settings.kafka_version,
            rss_mb=proc.tree_rss_mb(procs) if procs else None,
            detail={
                "node_id": self.node_id,
                "controller": f"{self.host}:{self.controller_port}",
                "cluster_id": self._cluster_id_on_disk(),
                "data_dir": str(self.data_dir),
                "log": str(self.log_path),
                "heap": " ".join(HEAP_OPTS),
                "start_s": self.last_start_s,
            },
        )


class KafkaCluster:
    """The ``ha`` topology's three KRaft nodes, started and stopped together.

    The nodes are spawned together (none can serve before a majority of the controller quorum is
    up), formatted with one cluster id, and ready when each lists all three brokers. They are
    stopped together too: stopped one after the other, the last node would wait for a quorum
    that is gone before its controlled shutdown gives up.
    """

    name: str = "kafka"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.nodes = [KafkaService(settings, node) for node, _, _ in settings.kafka_nodes]
        self.last_start_s: float | None = None

    def provision(self) -> None:
        self.nodes[0].provision()

    def _cluster_id(self) -> str:
        """The id a formatted node already has, else a new one for all three."""
        for node in self.nodes:
            cid = node._cluster_id_on_disk()
            if cid:
                return cid
        return _cluster_id()

    def start(self) -> None:
        if all(node.processes() for node in self.nodes):
            return
        t0 = time.monotonic()
        cid = self._cluster_id()
        spawned: list[tuple[KafkaService, psutil.Process]] = []
        with ThreadPoolExecutor(len(self.nodes)) as pool:  # one JVM each: format them at once
            for f in [pool.submit(node.prepare, cid) for node in self.nodes if not node.processes()]:
                f.result()
        try:
            for node in self.nodes:
                running = node.processes()
                spawned.append((node, running[0] if running else node.spawn(cid)))
            for node, p in spawned:
                node.wait_ready(p, brokers=len(self.nodes), timeout=HA_START_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        self.last_start_s = round(time.monotonic() - t0, 2)
        log.info("kafka cluster up on %s in %.1f s", self.settings.kafka_bootstrap, self.last_start_s)

    def stop(self, *, purge: bool = False) -> None:
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            for f in [pool.submit(node.stop, purge=purge) for node in self.nodes]:
                f.result()

    def processes(self) -> list[psutil.Process]:
        return [p for node in self.nodes for p in node.processes()]

    def status(self) -> ServiceStatus:
        """The cluster in one line (``statuses`` has one per node)."""
        procs = self.processes()
        return ServiceStatus(
            name=self.name, state="running" if len(procs) == len(self.nodes) else
            "degraded" if procs else "stopped",
            pids=[p.pid for p in procs], endpoint=self.settings.kafka_bootstrap,
            version=self.settings.kafka_version, rss_mb=proc.tree_rss_mb(procs) if procs else None,
            detail={"nodes": [n.name for n in self.nodes], "start_s": self.last_start_s,
                    **replication(self.settings)},
        )

    def statuses(self) -> list[ServiceStatus]:
        return [node.status() for node in self.nodes]
