"""The fault-tolerant topology on its own real native stack.

Three Kafka KRaft nodes, three clustered RabbitMQ nodes and a PostgreSQL streaming standby with
failover slots, started by the lab on ports 400 above the configured ones (the session's
single-topology stack uses 300), so both may exist side by side. The module brings the stack up
once, runs every pipeline at N = 2, kills a broker node, promotes the standby, checks what
Kafka, RabbitMQ and the standby report, and ends with ``lab stack down``. Heavy (three Kafka JVMs and
three Erlang VMs): run it on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lab.pg.replication import ReplicationStream
from lab.pg.slots import drop_slots
from lab.pipelines.relay_stream import Relay
from lab.pipelines.wal import SLOT_PREFIX, WalSource
from lab.pipelines.wal_relay import QUEUE, RELAY_SLOT, RelayPipeline
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import StackError
from lab.stack.native import NativeStack
from lab.stack.proc import tied
from lab.stack.rabbitmq_cluster import RabbitMQCluster
from lab.stack.standby import STANDBY_SLOT
from tests.conftest import lab_env
from tests.conftest import test_settings as moved_settings

pytestmark = pytest.mark.integration
OFFSET = 400
M = 1000
KAFKA_NODES = ("kafka-1", "kafka-2", "kafka-3")
RABBITMQ_NODES = ("rabbitmq-1", "rabbitmq-2", "rabbitmq-3")
NODES = ("postgres-standby", *KAFKA_NODES, *RABBITMQ_NODES)
SYNC_TIMEOUT = 120.0


def ha_settings() -> Settings:
    return moved_settings(OFFSET, "test-ha", topology="ha")


def lab(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab", *args], env=lab_env(settings), capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def ha() -> Iterator[NativeStack]:
    settings = ha_settings()
    with pytest.MonkeyPatch.context() as mp:
        # three more JVMs on two shared cores: starts take longer (Debezium needed 101 s of its
        # 120 s under load); these tests check the topology, not how fast it starts
        mp.setattr("lab.stack.debezium.START_TIMEOUT", 300.0)
        mp.setattr("lab.stack.rabbitmq_broker.START_TIMEOUT", 300.0)  # read by each node's wait
        mp.setattr("lab.stack.kafka_broker.HA_START_TIMEOUT", 300.0)
        yield from _ha_stack(settings)


def _ha_stack(settings: Settings) -> Iterator[NativeStack]:
    stack = NativeStack(settings)
    stack.down(purge=True)
    t0 = time.monotonic()
    stack.up()
    print(f"\nha stack up (cold: initdb, format, base backup) in {time.monotonic() - t0:.1f} s: "
          f"standby {stack.standby.last_start_s if stack.standby else None} s, "
          f"kafka {getattr(stack.kafka, 'last_start_s', None)} s, "
          f"rabbitmq {getattr(stack.rabbitmq, 'last_start_s', None)} s")
    try:
        yield stack
    finally:
        from lab.measure.cgroups import remove_scope

        stack.down(purge=True)
        remove_scope(settings)


def run(settings: Settings, **kw: Any) -> dict[str, Any]:
    return asyncio.run(run_scenario(Scenario(**{"messages": M, "cooldown_s": 0, **kw}), settings))


def standby_slot(stack: NativeStack, name: str) -> dict[str, Any] | None:
    assert stack.standby is not None
    return next((s for s in stack.standby.slots() if s["slot"] == name), None)


def wait_synced(stack: NativeStack, name: str, *, write: bool = False) -> dict[str, Any]:
    """The standby's copy of slot ``name`` once slot sync has persisted it (synced, not temporary).

    ``write``: keep committing outbox rows and logging a running-xacts record meanwhile, so that a
    streaming slot's catalog xmin moves past the standby's (slot sync persists a copy only then).
    """
    deadline = time.monotonic() + SYNC_TIMEOUT
    while True:
        slot = standby_slot(stack, name)
        if slot is not None and slot["synced"] and not slot["temporary"]:
            return slot
        assert time.monotonic() < deadline, f"slot {name} not synchronised to the standby: {slot}"
        if write:
            with psycopg.connect(stack.settings.pg_dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO messages (content) VALUES ('ha slot sync check')")
                conn.execute("SELECT pg_log_standby_snapshot()")
        time.sleep(1)


def test_status_lists_every_node_running(ha: NativeStack) -> None:
    res = lab(ha.settings, "stack", "status", "--json", "--topology", "ha")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    for name in ("postgres", *NODES):
        assert rows[name]["state"] == "running", name
        assert rows[name]["pids"] and rows[name]["rss_mb"] > 10, name
    assert "rabbitmq" not in rows and "kafka" not in rows  # a line per node
    assert len({rows[f"kafka-{i}"]["endpoint"] for i in (1, 2, 3)}) == 3
    assert len({rows[n]["endpoint"] for n in RABBITMQ_NODES}) == 3
    assert rows["postgres-standby"]["detail"]["in_recovery"] is True
    # the three nodes form one cluster: each lists all three brokers
    for _, port, _ in ha.settings.kafka_nodes:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        assert len(admin.list_topics(timeout=10).brokers) == 3
    # the primary streams to the standby through its physical slot, and waits for it
    with psycopg.connect(ha.settings.pg_dsn, autocommit=True) as conn:
        assert conn.execute("SHOW synchronized_standby_slots").fetchone()[0] == STANDBY_SLOT
        row = conn.execute("SELECT slot_type, active FROM pg_replication_slots WHERE slot_name = %s",
                           (STANDBY_SLOT,)).fetchone()
    assert row == ("physical", True)


def test_the_rabbitmq_nodes_form_one_cluster_with_one_private_cookie(ha: NativeStack) -> None:
    assert isinstance(ha.rabbitmq, RabbitMQCluster)
    names = sorted(ha.rabbitmq.node_names)
    assert len(names) == 3
    for node in ha.rabbitmq.nodes:  # every node sees all three running
        status = json.loads(node.ctl("cluster_status", "--formatter", "json"))
        assert sorted(status["running_nodes"]) == names, node.name
    cookies = {(n.home / ".erlang.cookie").read_text() for n in ha.rabbitmq.nodes}
    assert len(cookies) == 1
    assert all((n.home / ".erlang.cookie").stat().st_mode & 0o777 == 0o400 for n in ha.rabbitmq.nodes)
    cookie = cookies.pop()
    for root in ha.rabbitmq.processes():
        for p in [root, *root.children(recursive=True)]:
            assert cookie not in " ".join(p.cmdline()), p  # never on a command line
    # a client reaches the cluster through node 1, as the pipeline and Debezium do
    assert ha.settings.amqp_endpoint_port == ha.rabbitmq.nodes[0].amqp_port


def test_single_topology_is_refused_while_ha_runs(ha: NativeStack) -> None:
    with pytest.raises(StackError, match="runs topology ha"):
        NativeStack(ha.settings.replace(topology="single")).up()


def test_a_readers_failover_slot_is_synchronised_to_the_standby(ha: NativeStack) -> None:
    name = "load_test_slot_ha_check"

    async def create() -> None:
        stream = await ReplicationStream.connect(ha.settings.pg_dsn)
        try:
            await stream.create_slot(name, failover=ha.settings.ha)  # what the wal readers do under ha
        finally:
            await stream.close()

    asyncio.run(create())
    try:
        with psycopg.connect(ha.settings.pg_dsn, autocommit=True) as conn:
            failover = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s",
                                    (name,)).fetchone()
        assert failover == (True,)
        assert wait_synced(ha, name)["failover"] is True
    finally:
        with psycopg.connect(ha.settings.pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))


def test_debeziums_slot_is_a_failover_slot_synchronised_to_the_standby(ha: NativeStack) -> None:
    with tied():
        ha.start_debezium("kafka")
    try:
        assert wait_synced(ha, ha.debezium["kafka"].slot, write=True)["failover"] is True
    finally:
        ha.stop_debezium("kafka")


@pytest.mark.parametrize("pipeline", [pytest.param("wal", marks=pytest.mark.matrix),
                                      pytest.param("wal-sharded", marks=pytest.mark.matrix),
                                      pytest.param("wal-relay", marks=pytest.mark.matrix),
                                      pytest.param("kafka", marks=pytest.mark.matrix), "rabbitmq"])
def test_pipeline_at_n2_succeeds_with_every_node_measured(ha: NativeStack, pipeline: str) -> None:
    r = run(ha.settings, pipeline=pipeline, consumers=2)
    per = {k: round(v * 1000 / M, 3) for k, v in r["cpu_s"].items()}
    print(f"\n{pipeline} c2 m{M} under ha: {r['cpu_ms_per_msg']} ms CPU/msg, window {r['window_s']} s, "
          f"per participant (ms/msg) {per}, slots {r['slots']}")
    assert r["success"], r["error"]
    c = r["counters"]
    assert c["sent"] == c["processed"] == c["work_calls"] == c["work_distinct"] == M
    assert c["distinct_ids"] == M and c.get("ids_match") is not False  # nothing lost, nothing twice
    assert r["topology"] == "ha" and r["backend"] == "native"
    busy = {"wal": (), "wal-sharded": (), "wal-relay": ("relay",), "kafka": KAFKA_NODES,
            "rabbitmq": RABBITMQ_NODES}[pipeline]
    for name in ("postgres", "postgres-standby", *KAFKA_NODES, *busy, "consumers"):
        assert r["cpu_s"][name] > 0, name  # each node its own participant, and it did work
    assert set(NODES) <= set(r["cpu_s"]) and "rabbitmq" not in r["cpu_s"] and "kafka" not in r["cpu_s"]
    # each slot's copy on the standby at the drain's end is recorded (a short run's slot may not
    # be persisted yet: slot sync waits until it passes the standby's catalog xmin)
    assert r["slots"] and all(v["standby"] in ("synced", "temporary", "absent") for v in r["slots"].values())
    if pipeline == "kafka":
        ps = r["pipeline_settings"]
        assert ps["replication_factor"] == 3 and ps["min_insync_replicas"] == 2
        assert ps["replicas_at_start"]["replicas_min"] == 3 and ps["replicas_at_start"]["isr_min"] >= 2
    if pipeline == "rabbitmq":  # the quorum queue has a member on each node, its leader on node 1
        ps = r["pipeline_settings"]
        assert isinstance(ha.rabbitmq, RabbitMQCluster)
        assert ps["queue_arguments"]["x-quorum-initial-group-size"] == 3
        assert ps["replicas_at_start"]["members"] == sorted(ha.rabbitmq.node_names)
        assert ps["replicas_at_start"]["leader"] == ha.rabbitmq.nodes[0].node_name


@pytest.mark.parametrize("pipeline", ["kafka", pytest.param("rabbitmq", marks=pytest.mark.matrix)])
def test_a_killed_broker_node_loses_nothing(ha: NativeStack, pipeline: str) -> None:
    """the failover: SIGKILL node 1 (RabbitMQ's quorum leader, where every client connects;
    a Kafka node leading some of the 4 partitions) 3 s into a fixed-rate run, start it again 5 s
    later: every message is delivered, the accounting adds up, and the node runs again."""
    node = f"{pipeline}-1"
    (before,) = ha.service(node).processes()[:1]
    m = 1600
    r = run(ha.settings, pipeline=pipeline, consumers=2, messages=m, rate=200, claim="takeover",
            fault="broker-node-kill:1@3s+5s", drain_timeout_s=300)
    f = r["fault"]
    acc = f["accounting"] or {}
    print(f"\nNODE-KILL {pipeline}: " + json.dumps({k: acc.get(k) for k in (
        "distinct", "extra_calls", "max_burst", "lost", "lost_claimed_by", "time_to_resume_s")})
          + " events " + json.dumps([(e["t_s"], e["what"]) for e in f["events"]]) + f" error={r['error']}")
    whats = [e["what"] for e in f["events"]]
    assert whats[0] == "node killed" and "node started" in whats
    assert before.pid in f["events"][0]["pids"] and not before.is_running()
    assert r["success"], r["error"]
    assert acc["adds_up"] and acc["lost"] == 0 and acc["distinct"] == m, acc
    assert acc["time_to_resume_s"] is not None and acc["time_to_resume_s"] >= 0
    ps = r["pipeline_settings"]  # (the default tier's kafka run under ha: its replication is asserted here)
    if pipeline == "kafka":
        assert ps["replication_factor"] == 3 and ps["min_insync_replicas"] == 2
        assert ps["replicas_at_start"]["replicas_min"] == 3 and ps["replicas_at_start"]["isr_min"] >= 2
    else:
        assert ps["queue_arguments"]["x-quorum-initial-group-size"] == 3
    with psycopg.connect(ha.settings.pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == m
    (after,) = ha.service(node).processes()[:1]
    assert after.pid != before.pid  # started again by its cluster, which serves with all three
    if pipeline == "rabbitmq":
        assert isinstance(ha.rabbitmq, RabbitMQCluster) and ha.rabbitmq.clustered()


@pytest.fixture
def restored(ha: NativeStack) -> Iterator[NativeStack]:
    """The ha stack; afterwards a primary left stopped or a standby left promoted is failed back,
    so that one failed failover test does not fail the rest of the module."""
    yield ha
    assert ha.standby is not None
    if not ha.postgres.processes() or ha.standby.promoted():
        ha.fail_back()


def test_a_fast_shutdown_does_not_wait_for_an_idle_wal_reader(restored: NativeStack) -> None:
    """A logical walsender exits at a fast shutdown only once its client confirmed everything it
    sent, the shutdown checkpoint included; a reader that confirmed only its last commit holds
    the primary up until the stop's timeout kills it (a CI run's failover did: 60 s, then a
    timeout). The wal reader, idle with every row done, confirms what the keepalive reports:
    the primary stops within seconds."""
    ha = restored
    settings = ha.settings

    async def scenario() -> float:
        source = WalSource(Scenario(pipeline="wal", consumers=1), settings, 0)
        await source.open()
        try:
            with psycopg.connect(settings.pg_primary_dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO messages (content) VALUES ('before the stop')")
            batch: list[Any] = []
            deadline = time.monotonic() + 30
            while not batch and time.monotonic() < deadline:
                batch = await source.claim(await source.fill(10, 1.0, 0.05))
            assert batch, "the reader never saw the row"
            for item in batch:
                source.done(item)
            await source.idle()  # its last commit confirmed: nothing of it is unresolved

            async def keep_reading() -> None:  # a consumer's loop: keepalives are answered in fill
                with contextlib.suppress(psycopg.Error, OSError):
                    while True:
                        await source.fill(10, 0.5, 0.05)

            reading = asyncio.create_task(keep_reading())
            await asyncio.sleep(1.0)
            t0 = time.monotonic()
            await asyncio.to_thread(ha.postgres.stop)  # fast: SIGINT
            took = time.monotonic() - t0
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            return took
        finally:
            with contextlib.suppress(Exception):
                await source.close()

    took = asyncio.run(scenario())
    print(f"\nfast shutdown with an idle wal reader attached: {took:.2f} s")
    ha.postgres.start()
    drop_slots(settings.pg_primary_dsn, SLOT_PREFIX)
    assert took < 20, f"the fast shutdown took {took:.1f} s: a walsender waited for its client"


# the default tier fails over once: the direct readers after a fast shutdown (nothing acknowledged may
# be missing); the relay's part (it confirms only behind the standby) is the test after this one, its
# reconnection the relay's postgres-restart cell in test_faults; a crash and the other pipelines are
# the matrix's
@pytest.mark.parametrize(("pipeline", "m", "at", "mode"),
                         [("wal", 6000, "5s", "fast"),
                          pytest.param("wal-relay", 6000, "5s", "immediate", marks=pytest.mark.matrix),
                          pytest.param("wal-relay", 4000, "5s", "fast", marks=pytest.mark.matrix),
                          pytest.param("kafka", 9000, "20s", "fast", marks=pytest.mark.matrix)])
def test_a_promoted_standby_loses_nothing(restored: NativeStack, pipeline: str, m: int, at: str,
                                          mode: str) -> None:
    """the PostgreSQL failover: once the failover slots are synced, the primary stops (a
    fast shutdown: every commit reached the standby first; immediate: a crash) and the standby
    is promoted; the direct readers, the relay (which confirmed its slot only behind hand-overs
    the standby flushed) and Debezium (moved by the lab) resume from their synchronised slots on
    the new primary. Every row of the new primary's outbox is worked, an insert refused meanwhile
    is counted as not sent, none acknowledged is missing after a fast shutdown (a crash may lose
    acknowledged rows the asynchronous standby never received: counted, not lost); afterwards the
    lab fails back: the primary serves again with a standby in recovery streaming from it, and
    no slot of the run is left. Kafka needs longer: Debezium's slot copy is persisted only after
    it confirmed a few seconds of changes. The default cells send for 30 s: a slot's synced copy
    took up to 20 s to persist on a fresh stack, and the failover must come while rows flow."""
    ha = restored
    assert ha.standby is not None
    primary = ha.postgres.processes()[0].pid
    r = run(ha.settings, pipeline=pipeline, consumers=2, messages=m, rate=200, claim="takeover",
            fault=f"postgres-failover={mode}@{at}", drain_timeout_s=300)
    f = r["fault"]
    acc = f["accounting"] or {}
    print(f"\nFAILOVER {pipeline}: " + json.dumps({k: acc.get(k) for k in (
        "messages", "extra_calls", "max_burst", "lost", "not_sent", "rows_without_reply", "acknowledged_absent",
        "time_to_resume_s")}) + " events " + json.dumps([(e["t_s"], e["what"]) for e in f["events"]])
          + f" error={r['error']}")
    at_ = {e["what"]: e for e in f["events"]}
    synced = at_["slots synced on the standby"]["slots"]
    assert synced and all(c["synced"] and not c["temporary"] for c in synced)  # the precondition held
    assert {c["slot"] for c in at_["standby promoted"]["slots"]} >= {c["slot"] for c in synced}
    if pipeline == "kafka":
        assert "debezium started on the new primary" in at_ and "slot held again" in at_
    if pipeline == "wal-relay":  # the relay streamed its synced slot on the new primary
        assert at_["slot held again"]["slot"] == "load_test_slot_relay"
        relay = r["helpers"]["relay"]
        assert relay["error"] is None and relay["stream_reconnects"] >= 1 and relay["standby_polls"] > 0, relay
    assert r["success"], r["error"]
    assert acc["adds_up"] and acc["lost"] == 0 and acc["foreign"] == 0, acc
    assert acc["messages"] + acc["not_sent"] + acc["acknowledged_absent"] >= m, acc
    if mode == "fast":
        assert acc["acknowledged_absent"] == 0 and acc["messages"] + acc["not_sent"] >= m, acc
    assert acc["time_to_resume_s"] is not None and acc["time_to_resume_s"] > 0
    # failed back: a new primary process on the primary's port, the standby in recovery again
    assert ha.postgres.processes()[0].pid != primary
    assert not ha.standby.promoted() and ha.standby.status().detail.get("in_recovery") is True
    with psycopg.connect(ha.settings.pg_primary_dsn, autocommit=True) as conn:
        assert not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        left = conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'logical'").fetchall()
        assert left == [], left
        assert conn.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'").fetchone()[0] == 1


def test_the_relay_confirms_its_slot_only_behind_the_standby(restored: NativeStack) -> None:
    """The relay hands a row over while the standby's WAL receiver is stopped: the queued row is
    on the primary and not on the standby, and the relay's slot stays before the row (a promotion
    now would stream it again, not lose it); once the receiver runs again, the slot passes it."""
    ha = restored
    settings = ha.settings
    assert ha.standby is not None
    standby_dsn = make_conninfo(settings.pg_primary_dsn, host=settings.pg_standby_host, port=settings.pg_standby_port)

    def confirmed() -> int:
        with psycopg.connect(settings.pg_primary_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots "
                               "WHERE slot_name = %s", (RELAY_SLOT,)).fetchone()
        assert row is not None
        return int(row[0])

    def queued(dsn: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(QUEUE)))
                       .fetchone()[0])  # type: ignore[index]

    async def scenario() -> tuple[int, int, int, int, int]:
        s = Scenario(pipeline="wal-relay", consumers=1)
        await RelayPipeline(s, settings, ha).prepare()
        relay = Relay(s, settings)
        await relay.open()
        try:
            with psycopg.connect(settings.pg_primary_dsn, autocommit=True) as conn:
                before_row = int(conn.execute(  # type: ignore[index]
                    "INSERT INTO messages (content) VALUES ('behind the standby') "
                    "RETURNING (pg_current_wal_insert_lsn() - '0/0')::bigint").fetchone()[0])
            batch: list[Any] = []
            deadline = time.monotonic() + 30
            while not batch and time.monotonic() < deadline:
                batch = await relay.reader.fill(10, 1.0, 0.05)
            assert batch, "the relay never saw the row"
            with psycopg.connect(standby_dsn, autocommit=True) as conn:
                receiver = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
            assert receiver is not None
            os.kill(receiver[0], signal.SIGSTOP)
            try:
                await relay.hand_over(batch)
                t0 = time.monotonic()
                while time.monotonic() - t0 < 2.0:  # the relay's loop: status sent, standby read
                    await relay.step()
                stopped = confirmed(), queued(settings.pg_primary_dsn), queued(standby_dsn)
            finally:
                os.kill(receiver[0], signal.SIGCONT)
            deadline = time.monotonic() + 30
            while confirmed() <= before_row and time.monotonic() < deadline:
                await relay.step()
            return before_row, *stopped, confirmed()
        finally:
            await relay.close()
            drop_slots(settings.pg_primary_dsn, RELAY_SLOT)

    row, held, on_primary, on_standby, after = asyncio.run(scenario())
    print(f"\nrelay slot with the standby stopped: confirmed {held} vs the row at {row}; queued on the primary "
          f"{on_primary}, on the standby {on_standby}; confirmed once it runs again {after}")
    assert on_primary == 1 and on_standby == 0  # handed over, not on the standby
    assert held <= row  # the slot is not past the row the standby lacks
    assert after > row  # ... and passes it once the standby has the hand-over


def test_down_stops_every_node(ha: NativeStack) -> None:
    roots = [p for procs in ha.participants().values() for p in procs]
    tree = roots + [c for p in roots for c in p.children(recursive=True)]
    assert len(roots) >= 9  # primary, standby, 3 Kafka JVMs, 3 RabbitMQ nodes and their epmd
    res = lab(ha.settings, "stack", "down")  # no --topology: down stops either topology's nodes
    assert res.returncode == 0, res.stderr
    _, alive = psutil.wait_procs(tree, timeout=15)
    assert alive == []
    stack_dir = str(ha.settings.stack_dir)
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if any(stack_dir in arg for arg in p.info["cmdline"] or []):
            left.append(p.info)
    assert left == []  # no VM, epmd or JVM of this stack survives (e.g. beam.smp's -mnesia dir)
    rows = json.loads(lab(ha.settings, "stack", "status", "--json", "--topology", "ha").stdout)
    assert {r["name"] for r in rows} >= {"postgres", *NODES} and all(r["state"] == "stopped" for r in rows)
