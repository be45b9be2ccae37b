"""Debezium Server for the native stack: one JVM per sink, started only for its own run.

The distribution (``io.debezium:debezium-server-dist`` tar.gz from Maven Central) is unpacked
once into ``<cache_dir>/debezium-server-<version>`` (the Cassandra-only ``connectors/`` tree is
left out). The JVM is launched the way the dist's ``run.sh`` does it, without the shell:
``java $JAVA_OPTS -cp <runner jar>:config/lib:lib/* io.debezium.server.Main``, with the working
directory in ``<stack_dir>/debezium-<sink>`` so that Quarkus reads the rendered
``config/application.properties`` there. JAVA_OPTS are the reference's ``-Xms512m -Xmx1g``; the
properties are the reference study's, rendered with our endpoints.

Start is gated on the replication slot streaming; stop is a SIGTERM with a
30 s grace so that ``slot.drop.on.stop`` fires, then the instance's own slot is dropped anyway;
the other sink's instance and slot are left alone. As in the
reference, a run uses one Debezium Server at a time: the runner's reset stops
both and drops every ``dbz_`` slot. The properties file holds both passwords and is written
with mode 0600; a run's instance dies with its runner (:func:`lab.stack.proc.tied`).

Beyond the reference study the properties only add the HTTP bind (127.0.0.1, the sink's port) and a
plain-text console log (the dist logs JSON lines by default); neither touches the data path. Under
the ``ha`` topology ``slot.failover=true`` makes Debezium create its slot as a failover
slot (synchronised to the standby) and the Kafka sink's bootstrap lists the three nodes; the
producer's ``acks=all`` is the reference's in both topologies.

A fault run starts Debezium ``durable`` (:data:`DURABLE`): the slot is kept when its
task stops and the offsets go to a file in the instance's directory, so that a restarted task or
JVM resumes from its own offset instead of a dropped slot (with the reference's
``slot.drop.on.stop=true`` a task restarted after a retriable error finds a new slot and refuses
its offset). :meth:`DebeziumService.start` with ``resume=True`` keeps that slot and those offsets
(``debezium-kill``); every other start drops both. Clean runs keep the reference's properties.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shutil
import string
import subprocess
import time
from importlib import resources
from pathlib import Path
from typing import ClassVar

import psutil
import psycopg

from lab.pg import slots
from lab.settings import Settings, child_env, write_private
from lab.stack import proc
from lab.stack.base import ServiceStatus, StackError, check_sink
from lab.stack.hosts import namespace
from lab.stack.provision import java_home, maven_artifact, require_tool

log = logging.getLogger(__name__)

JAVA_OPTS = ("-Xms512m", "-Xmx1g")
MAIN_CLASS = "io.debezium.server.Main"
PUBLICATION = "load_test_pub"
SLOT_PREFIX = "dbz_"
TOPIC_PREFIX = {"kafka": "dbzk", "rabbitmq": "dbzq"}
SLOT = {"kafka": "dbz_kafka_slot", "rabbitmq": "dbz_quorum_slot"}
RABBITMQ_EXCHANGE = "load-dbz"
RABBITMQ_ROUTING_KEY = "quorum"
START_TIMEOUT = 120.0
STOP_GRACE = 30.0
MARKER = ".unpacked"
OFFSETS_FILE = "offsets.dat"  # durable offsets, relative to the JVM's working directory
# What a fault run changes in the reference study (recorded in its run.json), key -> value.
DURABLE = {
    "debezium.source.slot.drop.on.stop": "false",
    "debezium.source.offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
    "debezium.source.offset.storage.file.filename": OFFSETS_FILE,
}
RELEASE_WAIT_S = 30.0  # a killed JVM's walsender lets go of the slot well within this


def debezium_version(settings: Settings) -> str:
    """The version a run records: Debezium's, with the JVM options added to the reference's when
    there are any (``3.6.1.Final (JVM -XX:TieredStopAtLevel=1)``): the stand table shows them."""
    extra = settings.debezium_java_opts
    return f"{settings.debezium_version} (JVM {extra})" if extra else settings.debezium_version


def dist_dir(settings: Settings) -> Path:
    return settings.cache_dir / f"debezium-server-{settings.debezium_version}"


def provision_dist(settings: Settings) -> Path:
    """Fetch the dist tarball into ~/.m2 and unpack it into the cache once (marker + lock)."""
    home = dist_dir(settings)
    if (home / MARKER).exists():
        return home
    version = settings.debezium_version
    tarball = maven_artifact("io.debezium", "debezium-server-dist", version, packaging="tar.gz")
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / MARKER).exists():
            return home
        tar = require_tool("tar", "install tar to unpack the Debezium Server distribution")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir()
        log.info("unpacking %s into %s", tarball.name, home)
        res = subprocess.run(
            [tar, "-xzf", str(tarball), "-C", str(home), "--strip-components=1",
             "--exclude=debezium-server/connectors"],
            capture_output=True, text=True, check=False,
        )
        if res.returncode != 0:
            raise StackError(f"could not unpack {tarball}: {res.stderr.strip()[:200]}")
        if not list(home.glob("debezium-server-*runner.jar")):
            raise StackError(f"{tarball} has no debezium-server-*runner.jar; delete it and rerun")
        (home / MARKER).write_text(f"{version}\n")
    return home


def _escape(value: object) -> str:
    """A value safe on the right of a .properties ``=`` (backslashes and leading blanks)."""
    text = str(value).replace("\\", "\\\\")
    return "\\" + text if text[:1].isspace() else text


# Inside docker-compose.yml's network the services are reached by name on their own ports. The
# rendered file (secrets included) is copied into the container through the engine, never written
# into the checkout.
COMPOSE_ENDPOINTS = {"pg_host": "postgres", "pg_port": 5432, "kafka_bootstrap": "kafka:19092",
                     "amqp_host": "rabbitmq", "amqp_port": 5672, "http_port": 8080}


def render_properties(settings: Settings, sink: str, *, compose: bool = False, durable: bool = False,
                      pg_port: int | None = None) -> str:
    """``application.properties`` for ``sink``: the reference study with this stack's endpoints.

    ``compose=True`` renders the file docker-compose.yml mounts (container-network endpoints);
    ``durable=True`` overrides the keys of :data:`DURABLE` (fault runs only); ``pg_port``: another
    PostgreSQL than the primary (the promoted standby after ``postgres-failover``).
    """
    s = settings
    values: dict[str, object] = {
        "http_port": http_port(s, sink),
        "http_host": s.debezium_host,
        # the promoted standby on its own host under netns
        "pg_host": s.pg_standby_host if pg_port == s.pg_standby_port else s.pg_host,
        "pg_port": pg_port or s.pg_port, "pg_user": s.pg_user,
        "pg_database": s.pg_database,
        "topic_prefix": TOPIC_PREFIX[sink], "slot_name": SLOT[sink], "publication": PUBLICATION,
        # ha: the slot is synchronised to the standby (PostgreSQL 17+ failover slot)
        "slot_failover": str(s.ha).lower(),
        "kafka_bootstrap": s.kafka_bootstrap,
        "amqp_host": s.rabbitmq_host, "amqp_port": s.amqp_endpoint_port, "amqp_user": s.rabbitmq_user,
        "exchange": RABBITMQ_EXCHANGE, "routing_key": RABBITMQ_ROUTING_KEY,
    }
    values.update(pg_password=s.secret("pg"), amqp_password=s.secret("rabbitmq"))
    if compose:
        values.update(COMPOSE_ENDPOINTS)
    text = (resources.files("lab.stack") / "templates" / f"debezium-{sink}.properties").read_text()
    rendered = string.Template(text).substitute({k: _escape(v) for k, v in values.items()})
    return with_overrides(rendered, DURABLE) if durable else rendered


def with_overrides(text: str, overrides: dict[str, str]) -> str:
    """``text`` (properties) with each key of ``overrides`` set: in place, else appended."""
    lines, todo = [], dict(overrides)
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip()
        if key in todo and not line.lstrip().startswith("#"):
            line = f"{key}={_escape(todo.pop(key))}"
        lines.append(line)
    lines += [f"{k}={_escape(v)}" for k, v in todo.items()]
    return "\n".join(lines) + "\n"


def http_port(settings: Settings, sink: str) -> int:
    return {"kafka": settings.debezium_kafka_http_port,
            "rabbitmq": settings.debezium_rabbitmq_http_port}[sink]


class DebeziumService:
    """Debezium Server ``settings.debezium_version`` streaming ``public.messages`` into ``sink``."""

    name: ClassVar[str] = "debezium"

    def __init__(self, settings: Settings, sink: str) -> None:
        self.settings = settings
        self.sink = check_sink(sink)
        self.slot = SLOT[sink]
        self.http_port = http_port(settings, sink)
        self.state_dir = settings.stack_dir / f"debezium-{sink}"
        self.log_path = self.state_dir / "debezium.log"
        self.last_start_s: float | None = None
        self.pg_port: int | None = None  # None: the primary's; the promoted standby's after a failover

    def provision(self) -> None:
        """Unpack the distribution into the cache (idempotent); starts nothing."""
        provision_dist(self.settings)

    # Start / stop ---------------------------------------------------------------------------
    def start(self, *, durable: bool = False, resume: bool = False) -> None:
        """Start the JVM and return once its slot streams; a no-op when already running.

        ``durable``: the :data:`DURABLE` properties (fault runs). ``resume``: keep the slot and
        the offsets file of the previous JVM (a restart after ``debezium-kill``); otherwise both
        are dropped and the instance starts fresh.
        """
        if proc.running(self.state_dir) is not None:
            return
        setting = f"LAB_DEBEZIUM_{self.sink.upper()}_HTTP_PORT"
        proc.require_free(self.http_port, f"Debezium Server ({self.sink} sink)", setting,
                          self.settings.debezium_host)
        self._require_upstream(resume=resume)
        home = provision_dist(self.settings)
        config = self.state_dir / "config"
        config.mkdir(parents=True, exist_ok=True)
        if not resume:
            (self.state_dir / OFFSETS_FILE).unlink(missing_ok=True)
        write_private(config / "application.properties",
                      render_properties(self.settings, self.sink, durable=durable, pg_port=self.pg_port))
        jhome = java_home(self.settings)
        runner = next(home.glob("debezium-server-*runner.jar"))
        classpath = ":".join([str(runner), str(home / "config" / "lib"), str(home / "lib" / "*")])
        argv = [str(jhome / "bin" / "java"), *JAVA_OPTS, *self.settings.debezium_java_opts.split(), "-cp",
                classpath, MAIN_CLASS]
        self.log_path.unlink(missing_ok=True)
        t0 = time.monotonic()
        jvm = proc.spawn(argv, state_dir=self.state_dir, log_path=self.log_path,
                         env=child_env(JAVA_HOME=str(jhome)), cwd=self.state_dir,
                         netns=namespace(self.settings, "debezium"))
        log.info("debezium-%s: pid %d, waiting for slot %s", self.sink, jvm.pid, self.slot)

        def watch() -> None:
            if not jvm.is_running() or jvm.status() == psutil.STATUS_ZOMBIE:
                raise StackError(f"Debezium Server ({self.sink}) exited during start-up; "
                                 f"last log lines: {proc.tail(self.log_path)}")

        try:
            slots.wait_streaming(
                self.settings.pg_dsn, self.slot, timeout=START_TIMEOUT, watch=watch
            )
        except BaseException as exc:
            proc.terminate(self.state_dir, timeout=STOP_GRACE)
            if isinstance(exc, TimeoutError):
                raise StackError(f"Debezium Server ({self.sink}): {exc}; "
                                 f"last log lines: {proc.tail(self.log_path)}") from None
            raise
        self.last_start_s = round(time.monotonic() - t0, 2)
        started = {"start_to_streaming_s": self.last_start_s}
        (self.state_dir / "started.json").write_text(json.dumps(started))
        log.info("debezium-%s streaming on slot %s after %.1f s",
                 self.sink, self.slot, self.last_start_s)

    def kill(self) -> int | None:
        """SIGKILL the JVM (a fault), wait until it is gone; its pid, or None if none ran.
        Its slot and offsets stay for a :meth:`start` with ``resume=True``."""
        jvm = proc.running(self.state_dir)
        if jvm is None:
            return None
        with contextlib.suppress(psutil.NoSuchProcess):
            jvm.kill()
        if proc.wait_gone([jvm], timeout=10):
            raise StackError(f"Debezium Server ({self.sink}) pid {jvm.pid} survived SIGKILL for 10 s")
        (self.state_dir / "started.json").unlink(missing_ok=True)
        return jvm.pid

    def stop(self, *, purge: bool = False) -> None:
        """SIGTERM with a 30 s grace (so the slot is dropped on stop), then drop this sink's slot."""
        if proc.terminate(self.state_dir, timeout=STOP_GRACE):
            log.info("debezium-%s stopped", self.sink)
        (self.state_dir / "started.json").unlink(missing_ok=True)
        if proc.port_open(self.settings.pg_port, self.settings.pg_host):
            try:
                slots.drop_slots(self.settings.pg_dsn, self.slot)
            except psycopg.Error as exc:
                log.warning("could not drop slot %s: %s", self.slot, exc)
        if purge:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _require_upstream(self, *, resume: bool = False) -> None:
        s = self.settings
        try:
            with psycopg.connect(s.pg_dsn, autocommit=True, connect_timeout=3) as conn:
                has_pub = conn.execute(
                    "SELECT count(*) FROM pg_publication WHERE pubname = %s", (PUBLICATION,)
                ).fetchone()
                holder = slots.active_pid(conn, self.slot)
                deadline = time.monotonic() + (RELEASE_WAIT_S if resume else 0.0)
                while holder is not None and time.monotonic() < deadline:  # a killed JVM's walsender
                    time.sleep(0.1)
                    holder = slots.active_pid(conn, self.slot)
        except psycopg.OperationalError:
            raise StackError(
                f"PostgreSQL is not reachable at {s.pg_host}:{s.pg_port}; start the stack first "
                "(`lab stack up`)"
            ) from None
        if not has_pub or not has_pub[0]:
            raise StackError(f"publication {PUBLICATION} is missing in database {s.pg_database}; "
                             "apply the schema (`lab stack up` creates it)")
        if holder is not None:
            raise StackError(f"replication slot {self.slot} is held by pid {holder}; stop the "
                             f"other Debezium Server (`lab stack debezium stop {self.sink}`)")
        host, port, what = ((s.broker_host, s.kafka_nodes[0][1], "Kafka") if self.sink == "kafka"
                            else (s.rabbitmq_host, s.amqp_endpoint_port, "RabbitMQ"))
        if not proc.port_open(port, host):
            raise StackError(f"{what} is not reachable at {host}:{port}; start the stack first "
                             "(`lab stack up`)")
        # a stale, idle slot from a killed run would replay old rows: start from a fresh one
        if not resume:
            slots.drop_slots(s.pg_dsn, self.slot)

    # Introspection --------------------------------------------------------------------------
    def processes(self) -> list[psutil.Process]:
        p = proc.running(self.state_dir)
        return [p] if p is not None else []

    def status(self) -> ServiceStatus:
        procs = self.processes()
        detail: dict[str, object] = {"sink": self.sink, "slot": self.slot}
        if procs:
            with contextlib.suppress(FileNotFoundError, ValueError):
                detail.update(json.loads((self.state_dir / "started.json").read_text()))
        return ServiceStatus(
            name=f"debezium-{self.sink}",
            state="running" if procs else "stopped",
            pids=[p.pid for p in procs],
            endpoint=f"http://{self.settings.debezium_host}:{self.http_port}",
            version=debezium_version(self.settings),
            rss_mb=proc.tree_rss_mb(procs) if procs else None,
            detail=detail,
        )
