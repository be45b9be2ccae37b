"""Kafka for the native stack: one KRaft node (broker + controller in one JVM) on loopback.

The broker's classpath is ``org.apache.kafka:kafka_2.13`` plus its runtime dependencies and the
log4j2 backend the Apache distribution ships, copied by Maven into
``<cache_dir>/kafka-<version>/libs``. State (rendered config, KRaft metadata and topic logs,
``kafka.log``) lives in ``<stack_dir>/kafka``.

JVM flags follow ``kafka-server-start.sh``/``kafka-run-class.sh`` defaults, which the
``apache/kafka`` and confluent-local images also use: ``-Xmx1G -Xms1G`` and G1 with a 20 ms pause
target. The heap is left at 1 GiB so the broker's memory and GC behaviour match the reference.
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
from importlib import resources
from pathlib import Path
from typing import ClassVar

import psutil

from lab.settings import Settings, child_env
from lab.stack import proc
from lab.stack.base import ServiceStatus, StackError
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
STOP_TIMEOUT = 30.0


def _template(name: str) -> str:
    return (resources.files("lab.stack") / "templates" / name).read_text()


def _cluster_id() -> str:
    """A random KRaft cluster id: a UUID in URL-safe base64 without padding, not starting '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class KafkaService:
    """Apache Kafka ``settings.kafka_version``, single KRaft node, PLAINTEXT on 127.0.0.1."""

    name: ClassVar[str] = "kafka"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
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
        server.write_text(string.Template(_template("kafka-server.properties")).substitute(
            port=self.settings.kafka_port,
            controller_port=self.settings.kafka_controller_port,
            data_dir=self.data_dir,
        ))
        (self.config_dir / "log4j2.properties").write_text(_template("kafka-log4j2.properties"))
        return server

    def _format(self, server: Path) -> None:
        """Format the KRaft metadata dir once (static quorum; skipped when already formatted)."""
        if (self.data_dir / "meta.properties").exists():
            return
        cid = _cluster_id()
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
            log.info("kafka already running")
            return
        s = self.settings
        proc.require_free(s.kafka_port, "Kafka", "LAB_KAFKA_PORT")
        proc.require_free(
            s.kafka_controller_port, "the Kafka controller", "LAB_KAFKA_CONTROLLER_PORT"
        )
        self.provision()
        server = self._render_config()
        self._format(server)
        t0 = time.monotonic()
        p = proc.spawn(
            [*self._jvm_args(), "kafka.Kafka", server],
            state_dir=self.state_dir, log_path=self.out_path, env=self._env(), cwd=self.state_dir,
        )
        try:
            self._wait_ready(p)
        except StackError:
            proc.terminate(self.state_dir, timeout=5)
            raise
        self.last_start_s = round(time.monotonic() - t0, 2)
        log.info("kafka up on %s in %.1f s", s.kafka_bootstrap, self.last_start_s)

    def _wait_ready(self, p: psutil.Process) -> None:
        from confluent_kafka.admin import AdminClient

        admin: list[AdminClient] = []

        def ready() -> bool:
            if not proc.port_open(self.settings.kafka_port):
                return False
            if not admin:
                admin.append(AdminClient({
                    "bootstrap.servers": self.settings.kafka_bootstrap, "logger": log,
                }))
            return bool(admin[0].list_topics(timeout=2).brokers)

        try:
            proc.wait_until(
                ready, timeout=START_TIMEOUT, what="Kafka", proc=p, log_path=self.out_path
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
            log.info("kafka stopped")
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
            endpoint=self.settings.kafka_bootstrap,
            version=self.settings.kafka_version,
            rss_mb=proc.tree_rss_mb(procs) if procs else None,
            detail={
                "controller": f"{self.settings.host}:{self.settings.kafka_controller_port}",
                "cluster_id": self._cluster_id_on_disk(),
                "data_dir": str(self.data_dir),
                "log": str(self.log_path),
                "heap": " ".join(HEAP_OPTS),
                "start_s": self.last_start_s,
            },
        )
