"""Faults on the real stack: each fault on each pipeline it applies to, at a
low fixed rate, and every message accounted for from the web service's arrivals and the database.

Asserted for every run: the fault happened (its events), the accounting adds up (once + repeated =
distinct, distinct + duplicates = work calls, distinct - foreign + lost = messages; per consumer
first + repeats = calls) and agrees with the counters the run read independently (work calls, and
``messages`` counted here again), and 0 lost, which is the at-least-once Success predicate.
Each run's accounting is printed (``pytest -s``) for docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import time

import psutil
import psycopg
import pytest

from lab.faults import FAULTS as FAULT_CLASSES
from lab.faults.supervision import source_slot
from lab.pipelines import PIPELINES as PIPELINES_BY_NAME
from lab.runner import run_scenario
from lab.runner.accounting import ids_of
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.debezium import DURABLE
from lab.stack.kafka_wire import metadata_brokers
from lab.study.fault_matrix import profile as fault_profile
from lab.study.presentation import fault_line

pytestmark = pytest.mark.integration
M, RATE, N = 2000, 200.0, 2  # 10 s of sends; the fault starts 3 s after the gate
BIG = 20_000  # big-transaction's rows here: the accounting, not the 100,000-row figure (docs), in CI time
FAULTS = {
    "consumer-kill": "consumer-kill:1@3s",
    "consumer-dead": "consumer-dead:1@3s+3s",
    "sink-outage": "sink-outage@3s+3s",
    "walsender-kill": "walsender-kill:1@3s",
    "consumer-slow": "consumer-slow=20ms:1@3s+3s",
    "debezium-kill": "debezium-kill@3s",
    "broker-restart": "broker-restart@3s+2s",
    "big-transaction": f"big-transaction={BIG}@3s",
    "postgres-restart": "postgres-restart@3s+1s",
}
PIPELINES = ("wal", "wal-sharded", "kafka", "rabbitmq", "poll")
BROKERS = ("kafka", "rabbitmq")
NO_SLOT = ("poll",)  # reads no WAL: no walsender to kill, no slot whose WAL is retained
# Every cell claims with takeover (lab.workload.inbox): a broker that hands a dead consumer's
# messages to another one (RabbitMQ's requeue) must not lose them. The reference's claim by name
# does, counted exactly by test_the_reference_claim_loses_what_a_killed_consumer_had_claimed.
CLAIM = "takeover"
CLAIM_M = 6000  # the claim test's messages: 6 s at 1,000 msg/s
FIRST_EVENT = {"consumer-kill": "kill", "consumer-dead": "stop", "sink-outage": "stop",
               "walsender-kill": "walsender terminated", "consumer-slow": "slow",
               "debezium-kill": "debezium killed", "broker-restart": "service stopped",
               "big-transaction": "big transaction begins", "postgres-restart": "service stopped"}


CASES = [(p, k) for p in PIPELINES for k in FAULTS
         if (p in BROKERS or k not in ("debezium-kill", "broker-restart"))
         and not (p in NO_SLOT and k == "walsender-kill")]
# the faults a decode-once relay must survive: its walsender killed, PostgreSQL restarted (the relay
# reconnects by itself; its consumers are replaced)
RELAYED = [("wal-relay", "walsender-kill"), ("wal-relay", "postgres-restart")]
CASES += RELAYED
# The default tier runs each fault family once (a family is one fault code, lab.faults.*.family: two kinds
# may share it); the whole matrix is `make test-full` (and the study's `lab faults`). The stopped consumer
# (consumer_stop: consumer-dead, sink-outage) is the smoke report's, whose fault matrix runs consumer-dead on
# wal and kafka and asserts nothing lost (tests/notebooks); a broker's killed consumer is the takeover
# claim's run below (rabbitmq); a service restart (broker-restart, postgres-restart) is PostgreSQL's under
# the relay, which must reconnect by itself, and Debezium's slot held again after it; a direct reader's
# walsender is killed on wal-sharded.
DEFAULT_CELLS = {("wal", "consumer-kill"), ("wal", "big-transaction"), ("wal-sharded", "walsender-kill"),
                 ("wal-relay", "postgres-restart"), ("kafka", "debezium-kill"), ("rabbitmq", "consumer-slow")}


def family(kind: str) -> str:
    return FAULT_CLASSES[kind].family


_SMOKE = fault_profile("smoke")
IN_SMOKE_REPORT = {(p, k) for p in _SMOKE.pipelines for k in _SMOKE.kinds}
assert len({family(k) for _, k in DEFAULT_CELLS}) == len(DEFAULT_CELLS), "a fault family twice in the default tier"
assert not {family(k) for _, k in DEFAULT_CELLS} & {family(k) for _, k in IN_SMOKE_REPORT}, "a family twice"
assert {family(k) for _, k in DEFAULT_CELLS | IN_SMOKE_REPORT} == {family(k) for k in FAULTS}, \
    "a fault family no make test run covers"


def _cell(pipeline: str, kind: str) -> object:
    marks = () if (pipeline, kind) in DEFAULT_CELLS else (pytest.mark.matrix,)
    return pytest.param(pipeline, kind, marks=marks, id=f"{pipeline}-{kind}")


def run(settings: Settings, **kw: object) -> dict:
    scenario = Scenario(**{"messages": M, "rate": RATE, "consumers": N, "cooldown_s": 0,
                           "drain_timeout_s": 180, **kw})
    return asyncio.run(run_scenario(scenario, settings))


@pytest.mark.parametrize(("pipeline", "kind"), [_cell(p, k) for p, k in CASES])
def test_fault_accounting(stack: object, settings: Settings, pipeline: str, kind: str) -> None:
    t0 = time.monotonic()
    shared = source_slot(PIPELINES_BY_NAME[pipeline].capabilities)  # Debezium's or the relay's slot
    spec = FAULTS[kind] if not (kind == "walsender-kill" and shared) else "walsender-kill@3s"
    r = run(settings, pipeline=pipeline, fault=spec, claim=CLAIM,  # its walsender has no target
            **({"drain_timeout_s": 900} if kind == "big-transaction" else {}))
    f = r["fault"]
    acc = f["accounting"] or {}
    print(f"\nFAULT {pipeline} {f['spec']} ({time.monotonic() - t0:.0f} s): " + json.dumps({
        k: acc.get(k) for k in ("messages", "work_calls", "distinct", "once", "repeated", "extra_calls",
                                "max_burst", "lost", "lost_claimed_by", "time_to_resume_s", "per_consumer",
                                "big_transaction")
    }) + " events " + json.dumps([(e["t_s"], e["what"]) for e in f["events"]])
      + " wal " + json.dumps({k: (v["retained_bytes_max"], v["recovered_after_s"])
                              for k, v in f["wal_summary"].items()}) + " slots " + json.dumps(r.get("slots"))
      + " counters " + json.dumps({k: r["counters"].get(k) for k in ("sent", "send_failed", "skipped")})
      + f" error={r['error']}")
    print("MEASURES " + json.dumps({"recovery_s": f.get("recovery_s"), "backlog_peak": f.get("backlog_peak"),
                                    "backlog_gaps": len(f.get("backlog_gaps") or []),
                                    "backlog": [(b["t_s"], b["messages"]) for b in f.get("backlog") or []],
                                    "phases": fault_line(f)["phases"], "bands": f.get("recovery_bands")}))
    extra = f["extra_rows"]  # a big transaction's rows, beside the M sent
    assert f["events"] and f["events"][0]["what"] == FIRST_EVENT[kind]
    # a fault run's Debezium keeps its slot on stop and its offsets in a file (docs/benchmarks.md)
    assert f["debezium_properties"] == (DURABLE if pipeline in BROKERS else None)
    assert acc["adds_up"], acc
    assert acc["work_calls"] == r["counters"]["work_calls"]
    assert acc["once"] + acc["repeated"] == acc["distinct"]
    assert acc["distinct"] + acc["extra_calls"] == acc["work_calls"]
    assert sum(c["calls"] for c in acc["per_consumer"].values()) == acc["work_calls"]
    assert set(acc["per_consumer"]) <= {str(i) for i in range(N)}
    rows = M + extra  # every message sent and every row of a big transaction
    if kind == "postgres-restart":  # a refused INSERT is a message not sent, never a lost one
        sent, failed = r["counters"]["sent"], r["counters"]["send_failed"]
        assert sent + failed == M and acc["not_sent"] == failed
        rows = sent + acc["rows_without_reply"]
        assert 0 <= acc["rows_without_reply"] <= failed
    with psycopg.connect(settings.pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM outbox_record").fetchone()[0] == rows
    assert acc["messages"] == rows and acc["foreign"] == 0
    assert extra == (BIG if kind == "big-transaction" else 0)
    assert acc["lost"] == 0, f"lost {acc['lost']} (claimed by {acc['lost_claimed_by']})"
    assert acc["distinct"] == rows
    assert r["success"], r["error"]
    assert f["wal"] or pipeline in NO_SLOT, "WAL retained per slot was sampled"
    assert all({"spill_txns", "spill_bytes"} <= set(w) for w in f["wal"])
    _check_measures(f, pipeline, kind)
    if kind in ("consumer-dead", "sink-outage"):
        assert [e["what"] for e in f["events"]] == ["stop", "resume"]
    if kind == "consumer-slow":
        assert [e["what"] for e in f["events"]] == ["slow", "normal"] and acc["extra_calls"] == 0
    if kind == "consumer-kill":
        assert [e["what"] for e in f["events"]] == ["kill", "replacement started", "replacement ready"]
        assert acc["per_consumer"]["1"]["calls"] > 0 and acc["time_to_resume_s"] is not None
    if kind == "walsender-kill":
        assert [e["what"] for e in f["events"]] == ["walsender terminated", "slot held again"]
        assert acc["time_to_resume_s"] is not None
        assert f["slot"] == (shared or "load_test_slot_1")
    if pipeline == "wal-relay":  # the same relay throughout: it reconnected, it was not replaced
        relay = r["helpers"]["relay"]
        assert relay["error"] is None and relay["stream_reconnects"] >= 1 and relay["rows"] >= acc["distinct"]
        assert r["pipeline_settings"]["queue"]["rows_left"] == 0
        if kind == "postgres-restart":  # a fast shutdown waits for a logical walsender until its client
            # confirmed all it was sent: the relay, unable to hand over, let go of its stream at once
            # (holding it, the stop took wal_sender_timeout, 60 s, and ended in a crash)
            assert f["events"][0]["stop_s"] < 30, f["events"][0]
    if kind == "debezium-kill":
        assert [e["what"] for e in f["events"]] == ["debezium killed", "debezium restarted", "slot held again"]
        killed, restarted, _ = f["events"]
        assert restarted["pid"] and killed["pid"] not in restarted["pid"]
        assert not psutil.pid_exists(killed["pid"]) or psutil.Process(killed["pid"]).status() == psutil.STATUS_ZOMBIE
        assert acc["time_to_resume_s"] > 0
        assert (settings.stack_dir / f"debezium-{pipeline}" / "offsets.dat").stat().st_size > 0  # resumed from it
    if kind in ("broker-restart", "postgres-restart"):
        what = [e["what"] for e in f["events"]]
        assert what[:2] == ["service stopped", "service started"]
        # Debezium's or the relay's, after PostgreSQL's start
        assert (what.count("slot held again") == 1) == (shared is not None and kind == "postgres-restart")
        service = pipeline if kind == "broker-restart" else "postgres"
        assert {e.get("service") for e in f["events"][:2]} == {service}
        assert acc["time_to_resume_s"] is not None
        # every consumer that exited (its connection broke) was replaced, and is ready
        exits = what.count("consumer exited")
        assert what.count("replacement ready") == exits, what
    if kind == "big-transaction":
        assert [e["what"] for e in f["events"]] == ["big transaction begins", "big transaction committed"]
        big = acc["big_transaction"]
        assert big["rows"] == big["worked"] == extra and big["lost"] == 0 and big["all_worked_after_s"] > 0
        # decoded by every slot: the direct readers' and Debezium's (spill reported, not asserted)
        assert all(st["total_txns"] >= 1 for st in r["slots"].values()), r["slots"]


def test_a_share_groups_backlog_is_its_lag_on_the_broker(stack: object, settings: Settings) -> None:
    """kafka-share, consumer 1 stopped for 3 s: the fault cell carries the broker's backlog, the share
    group's lag as the group's coordinator reports it (a share group commits no offsets: the lag of a
    consumer group would count every record ever written), and nothing is lost."""
    r = run(settings, pipeline="kafka-share", fault=FAULTS["consumer-dead"], claim=CLAIM)
    f = r["fault"]
    acc = f["accounting"]
    samples = f["backlog"]
    print(f"\nSHARE BACKLOG {f['spec']}: peak {f['backlog_peak']}, gaps {len(f['backlog_gaps'])}, "
          + json.dumps([(s["t_s"], s["messages"], s["start_offset"]) for s in samples]) + f" error={r['error']}")
    assert r["success"] and acc["lost"] == 0 and acc["adds_up"], r["error"]
    assert samples and {s["where"] for s in samples} == {"kafka"}, f["backlog_gaps"]
    assert all(s["messages"] >= 0 for s in samples) and f["backlog_peak"] == max(s["messages"] for s in samples)
    assert f["backlog_peak"] < M / 2  # what waits, not what was ever written
    offsets = [s["start_offset"] for s in samples]
    assert offsets == sorted(offsets) and offsets[-1] > offsets[0]  # the group moves along the log


def _check_measures(f: dict, pipeline: str, kind: str) -> None:
    """What every fault run measures beyond the accounting (lab.measure.recovery, lab.pipelines.backlog)."""
    start, end = min(e["t_s"] for e in f["events"]), max(e["t_s"] for e in f["events"])
    phases = f["phases"]
    assert set(phases) == {"before", "during", "after"}
    assert phases["after"]["delivered"] > 0 and phases["before"]["t1_s"] == phases["during"]["t0_s"] == start
    assert phases["after"]["cpu_ms_per_msg_total"] > 0 and "consumers" in phases["after"]["cpu_ms_per_msg"]
    assert phases["after"]["latency_ms"]["p99"] > 0
    if f["recovery_bands"] is not None and kind == "consumer-dead":  # run on the real stack (h2);
        # the other kinds' recovery is recorded, and asserted once measured
        assert isinstance(f["recovery_s"], float), f["recovery_s"]
    # nothing delivered in [1 s, fault start): no band to return to (a loaded machine, where
    elif f["recovery_bands"] is None:
        # Debezium ran seconds behind the senders, docs/benchmarks.md); then it must say None
        assert f["recovery_s"] is None and phases["before"]["delivered_per_s"] < 1, phases["before"]
    lag = f["consumer_lag"]
    assert lag and {row["consumer"] for row in lag} <= set(range(N))
    if pipeline in BROKERS:
        samples = f["backlog"]
        assert samples and {s["where"] for s in samples} == {pipeline}
        assert f["backlog_peak"] == max(s["messages"] for s in samples)
        if kind == "consumer-dead":  # the backlog rises while a consumer is stopped
            # (means: Kafka's committed-offset lag is a sawtooth of the consumers' 5 s commit timer)
            before = [s["messages"] for s in samples if s["t_s"] < start]
            during = [s["messages"] for s in samples if start <= s["t_s"] <= end + 1]
            assert before and during and sum(during) / len(during) > sum(before) / len(before), (before, during)
    else:
        assert f["backlog"] == [] and f["backlog_peak"] is None
    if kind == "consumer-dead" and pipeline != "wal":  # fan-out: the other readers work its rows
        mine = [row for row in lag if row["consumer"] == 1]
        before = max(row["lag_messages"] for row in mine if row["t_s"] < start)
        during = max(row["lag_messages"] for row in mine if start < row["t_s"] <= end)
        assert during > before + 100, (before, during)  # 100 msg/s are its share, stopped 3 s


# takeover (the claim every fault cell uses) in the default tier; the reference's claim, whose loss
# depends on where in a batch the kill lands, in the matrix
@pytest.mark.parametrize("claim", [pytest.param("owner", marks=pytest.mark.matrix), "takeover"])
def test_the_reference_claim_loses_what_a_killed_consumer_had_claimed(
        stack: object, settings: Settings, claim: str) -> None:
    """rabbitmq, consumer 1 killed at 1,000 msg/s (so that it likely holds a claimed batch; the web
    service's work delay does not combine with a fault run's per-consumer accounting): RabbitMQ
    requeues its unacked deliveries to the survivor. With the reference's claim (by name) the
    survivor loses every claim the dead consumer held and acks those messages unworked: lost,
    counted exactly as the ids ``dbz-quorum-1`` claimed and nobody worked (how many depends on
    where in its batch the kill lands; 0 when it held none), and then the run fails. With takeover
    the survivor claims them once the dead one's session is gone: 0 lost."""
    r = run(settings, pipeline="rabbitmq", fault=FAULTS["consumer-kill"], claim=claim, rate=1000.0,
            messages=CLAIM_M)
    f = r["fault"]
    acc = f["accounting"]
    lost = set(ids_of(acc["lost_ids"]))
    with psycopg.connect(settings.pg_dsn) as conn:
        messages = {i for (i,) in conn.execute("SELECT id FROM messages")}
        claims = dict(conn.execute("SELECT id, consumer FROM inbox").fetchall())
    worked = messages - lost  # every id of messages with a work call (accounting: no foreign id)
    unworked = {i: who for i, who in claims.items() if i not in worked}
    print(f"\nCLAIM {claim} rabbitmq {f['spec']}: lost={acc['lost']} lost_claimed_by={acc['lost_claimed_by']} "
          f"duplicates={acc['extra_calls']} per_consumer={json.dumps(acc['per_consumer'])} "
          f"skipped={r['counters'].get('skipped')} error={r['error']}")
    assert acc["adds_up"] and acc["foreign"] == 0 and acc["messages"] == len(messages) == CLAIM_M
    assert [e["what"] for e in f["events"]] == ["kill", "replacement started", "replacement ready"]
    if claim == "takeover":
        assert acc["lost"] == 0 and not unworked and r["success"], r["error"]
        assert all("#" in who for who in claims.values())  # every claimant held a lease
        return
    # exact: the lost messages are the ones the dead consumer's name claimed and nobody worked
    assert acc["lost"] == len(lost) == len(unworked) and set(unworked) == lost
    assert acc["distinct"] + acc["lost"] == CLAIM_M
    if acc["lost"]:
        assert set(unworked.values()) == {"dbz-quorum-1"} and acc["lost_claimed_by"] == {"dbz-quorum-1": acc["lost"]}
        assert not r["success"] and f"lost={acc['lost']}" in r["error"] and "--claim takeover" in r["error"]
    else:
        assert r["success"], r["error"]


def test_a_failed_fault_run_continues_the_stopped_consumer(stack: object, settings: Settings) -> None:
    """The run fails (drain deadline) while consumer 1 is stopped for 10 min: the cleanup continues
    it before stopping the run's processes, and nothing of the run is left."""
    r = run(settings, pipeline="wal", fault="consumer-dead:1@1s+600s", drain_timeout_s=8)
    assert not r["success"] and "not drained" in r["error"]
    events = {e["what"]: e for e in r["fault"]["events"]}
    assert events["continued by cleanup"]["pids"] == events["stop"]["pids"]
    for pid in events["stop"]["pids"]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# --- Safety: the disk guard, slot invalidation -----------------------------------

def _keep_size(settings: Settings) -> tuple[str, str]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return conn.execute("SELECT setting || coalesce(unit, ''), source FROM pg_settings "
                            "WHERE name = 'max_slot_wal_keep_size'").fetchone()


def test_the_disk_guard_ends_a_long_stop_before_the_retained_wal_limit(stack: object, settings: Settings) -> None:
    """Consumer 1 stopped for 2 min while 6,000 messages arrive at 200/s: the WAL its slot holds
    grows until the guard (a 1 MB limit) ends the stop and fails the run, every slot below the limit.
    The guard watches every slot: the healthy reader's may trip it first (its restart_lsn only moves
    at a running-transactions record, and lags far behind on a loaded machine)."""
    limit = 2**20
    r = run(settings.replace(max_retained_wal=limit), pipeline="wal", messages=6000,
            fault="consumer-dead:1@2s+120s")
    f = r["fault"]
    g = f["guard"]
    print(f"\nGUARD {f['spec']}: {json.dumps({k: v for k, v in g.items() if k != 'error'})} error={r['error']}")
    assert g["slot"] in ("load_test_slot_0", "load_test_slot_1") and g["limit_bytes"] == f["max_retained_wal"] == limit
    assert not r["success"] and r["error"] == "DiskGuardTripped: " + g["error"] and "\n" not in r["error"]
    assert r["error"].startswith(f"DiskGuardTripped: disk guard: slot {g['slot']} retains {g['retained_bytes']} bytes")
    assert r["disk_guard"]["tripped"] == g
    assert f"limit of {limit} bytes" in r["error"]
    whats = [e["what"] for e in f["events"]]
    assert whats[:4] == ["stop", "disk guard", "continued by the disk guard", "senders killed by the disk guard"]
    stop = next(e for e in f["events"] if e["what"] == "stop")
    assert next(e for e in f["events"] if e["what"] == "continued by the disk guard")["pids"] == stop["pids"]
    for pid in stop["pids"]:  # continued, then stopped with the run
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    trip = next(e for e in f["events"] if e["what"] == "disk guard")["t_s"]
    assert trip < 120, "the guard, not the end of the stop, ended the fault"
    assert max(s["retained_bytes"] or 0 for s in f["wal"] if s["t_s"] <= trip) < limit, "tripped before the limit"
    after = [s["retained_bytes"] or 0 for s in f["wal"] if s["t_s"] > trip]  # until the run's cleanup
    print(f"GUARD samples after the trip: {len(after)}, max {max(after, default=None)} bytes")
    assert max(after, default=0) < limit, "the load ended with the fault: no slot passed the limit"
    assert g["retained_bytes"] + 3 * g["growth_bytes_per_sample"] >= limit


def test_slot_invalidation_of_a_lone_reader_loses_every_later_message(stack: object, settings: Settings) -> None:
    """One reader: its slot invalidated under a 32 MB keep size, it cannot read again; every message
    it had not worked is lost, counted exactly and named, and they are the stream's tail."""
    r = run(settings, pipeline="wal", consumers=1, fault="slot-invalidation:0@3s")
    f = r["fault"]
    acc, inv = f["accounting"], f["invalidation"]
    print(f"\nINVALIDATION wal c1: lost={acc['lost']} distinct={acc['distinct']} "
          + json.dumps({k: v for k, v in inv.items() if k != "lost_ids"}) + f" error={r['error']}")
    assert (inv["slot"], inv["consumer"], inv["wal_status"], inv["invalidation_reason"]) == (
        "load_test_slot_0", 0, "lost", "wal_removed")
    assert inv["reader_exit_code"] == 1 and "can no longer access replication slot" in inv["reader_error"]
    assert [e["what"] for e in f["events"]] == ["stop", "keep size set", "slot invalidated", "keep size reset",
                                                "resume", "reader exited"]
    assert _keep_size(settings) == ("4096MB", "configuration file")  # reset after the fault
    lost = set(ids_of(inv["lost_ids"]))
    assert acc["adds_up"] and acc["lost"] == len(lost) == M - acc["distinct"] > 0 and inv["lost"] == acc["lost"]
    assert not r["success"] and r["error"].startswith("slot load_test_slot_0 invalidated (wal_removed")
    assert f"lost={acc['lost']}" in r["error"]
    with psycopg.connect(settings.pg_dsn) as conn:
        rows = conn.execute("SELECT id, extract(epoch FROM created_at)::float8 FROM messages").fetchall()
        claimed = conn.execute("SELECT count(*) FROM inbox_wal WHERE slot = 'load_test_slot_0'").fetchone()[0]
    assert len(rows) == M and lost <= {i for i, _ in rows}
    assert claimed == acc["distinct"], "every row the reader claimed it worked: the rest never reached it"
    after = {i for i, t in rows if t > inv["at"]}
    assert after and after <= lost, "nothing committed after the invalidation was worked"
    worked_last = max(t for i, t in rows if i not in lost)
    # commit order is the stream's; created_at is a transaction's start, a few seconds apart at most
    assert min(t for i, t in rows if i in lost) >= worked_last - 5.0, "the loss is the stream's tail"


@pytest.mark.matrix  # the family's default run is the lone reader's
def test_slot_invalidation_under_fan_out_loses_nothing(stack: object, settings: Settings) -> None:
    """Two fan-out readers: reader 1's slot is invalidated, reader 0 sees every row and claims it:
    0 lost, while reader 1 is gone for good and slot 0 was never at risk of invalidation."""
    r = run(settings, pipeline="wal", fault="slot-invalidation:1@3s")
    f = r["fault"]
    acc, inv = f["accounting"], f["invalidation"]
    print(f"\nINVALIDATION wal c2: lost={acc['lost']} per_consumer={json.dumps(acc['per_consumer'])} "
          + json.dumps({k: v for k, v in inv.items() if k != "lost_ids"}) + f" error={r['error']}")
    assert (inv["slot"], inv["wal_status"], inv["invalidation_reason"]) == ("load_test_slot_1", "lost", "wal_removed")
    assert "can no longer access replication slot" in inv["reader_error"]
    assert acc["adds_up"] and acc["lost"] == 0 and inv["lost_ids"] == [] and acc["distinct"] == M
    assert r["success"], r["error"]
    assert "lost" not in f["wal_summary"]["load_test_slot_0"]["wal_status"]
    assert "lost" in f["wal_summary"]["load_test_slot_1"]["wal_status"]
    exited = next(e for e in f["events"] if e["what"] == "reader exited")
    assert exited["code"] == 1
    assert _keep_size(settings) == ("4096MB", "configuration file")


@pytest.mark.matrix  # the family's default run is the lone reader's
def test_slot_invalidation_of_a_sharded_reader_loses_rows_of_its_shards(stack: object, settings: Settings) -> None:
    """wal-sharded: reader 1, stopped, keeps its shards' locks, so reader 0 filters their rows out
    (and confirms them) until reader 1 is gone and it takes the shards over. Every lost message is
    one of reader 1's shards (id % 64), counted exactly; what came after the takeover was worked."""
    r = run(settings, pipeline="wal-sharded", fault="slot-invalidation:1@3s")
    f = r["fault"]
    acc, inv = f["accounting"], f["invalidation"]
    state = json.loads((settings.stack_dir / "runs" / r["run_id"] / "shards-1.json").read_text())
    lost = set(ids_of(inv["lost_ids"]))
    print(f"\nINVALIDATION wal-sharded c2: lost={acc['lost']} shards of reader 1: {len(state['shards'])} "
          + json.dumps({k: v for k, v in inv.items() if k != "lost_ids"}) + f" error={r['error']}")
    assert (inv["slot"], inv["wal_status"], inv["invalidation_reason"]) == ("load_test_slot_1", "lost", "wal_removed")
    assert 0 < len(state["shards"]) < 64
    assert lost and {i % 64 for i in lost} <= set(state["shards"]), "every lost message was reader 1's to work"
    assert acc["adds_up"] and acc["lost"] == len(lost) == M - acc["distinct"]
    assert not r["success"] and f"lost={acc['lost']}" in r["error"]
    assert r["error"].startswith("slot load_test_slot_1 invalidated (wal_removed")
    with psycopg.connect(settings.pg_dsn) as conn:
        created = dict(conn.execute("SELECT id, extract(epoch FROM created_at)::float8 FROM messages").fetchall())
    exited = next(e for e in f["events"] if e["what"] == "reader exited")["at"]
    late = [i for i, t in created.items() if t > exited + 5 and i % 64 in state["shards"]]
    assert not lost & set(late), "rows of its shards sent after the takeover were worked"
    assert _keep_size(settings) == ("4096MB", "configuration file")


@pytest.mark.matrix  # the family (a failed fault run's cleanup) runs by default on wal, above
def test_a_failed_restart_starts_the_stopped_broker(stack: object, settings: Settings) -> None:
    """The run fails (drain deadline) while Kafka is stopped for 10 min: the cleanup starts it
    again, and the next run uses it. (The wait for the restarted broker once ran librdkafka in the
    test process and aborted it; it is a plain Kafka-protocol probe now, lab.stack.kafka_wire.)"""
    r = run(settings, pipeline="kafka", fault="broker-restart@1s+600s", drain_timeout_s=15)
    assert not r["success"] and "not drained" in r["error"]
    what = [e["what"] for e in r["fault"]["events"]]
    assert what[0] == "service stopped" and "started by cleanup" in what and "service started" not in what
    assert stack.kafka.processes()  # type: ignore[attr-defined]
    assert metadata_brokers(settings.service_host, settings.kafka_port) == 1  # and it serves
