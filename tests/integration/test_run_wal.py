"""One measured run end to end with the direct WAL fan-out pipeline, on the real stack."""

from __future__ import annotations

import asyncio
import os
import socket

import psycopg
import pytest

from lab.results import load_runs, read_samples
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import StackError

pytestmark = pytest.mark.integration
M = 2000


def run(settings: Settings, **kw: object) -> dict:
    return asyncio.run(run_scenario(Scenario(**{"messages": M, "cooldown_s": 0, **kw}), settings))


@pytest.mark.parametrize(("n", "layout"),
                         [(1, "auto"), pytest.param(2, "auto", marks=pytest.mark.matrix), (4, "processes")])
def test_wal_fan_out(stack: object, settings: Settings, n: int, layout: str) -> None:
    r = run(settings, pipeline="wal", consumers=n, consumer_layout=layout)
    c = r["counters"]
    assert r["success"], r["error"]
    assert c["sent"] == c["processed"] == c["work_calls"] == c["work_distinct"] == M
    assert c["skipped"] == (n - 1) * M  # every reader sees every row
    assert c["db_ops"] >= n * M // 100  # one claim per batch of at most 100
    assert c["inbox_rows"] == c["distinct_ids"] == M
    assert c["ids_match"] is True and c["messages_not_worked"] == c["worked_not_in_messages"] == 0
    # the reference study's claim table: every claim kept, nothing pruned, no pruner
    table = r["pipeline_settings"]["claim_table"]
    assert (table["rows"], table["rows_max"], table["pruned"], table["prunes"]) == (M, M, 0, 0)
    assert r["postgres_backends"]["processes"]["prune"] == 0
    # how it was measured (lab.measure.provenance)
    assert r["cpu_method"] in ("cgroup", "schedstat", "proc-ticks") and r["git_dirty"] in (True, False)
    assert {"python", "psycopg", "libpq", "aiohttp", "uvloop", "orjson", "confluent-kafka", "librdkafka",
            "aio-pika", "aiormq"} <= {k for k, v in r["clients"].items() if v}
    assert r["host"]["steal_cpu_s"] is not None and r["host"]["loadavg_end"] and r["versions"]["postgres"]
    assert sum(x["processed"] for x in r["consumers"]) == M
    assert c["claims_min"] * n <= M <= c["claims_max"] * n
    # the metric: every participant measured over the window, divided by M
    assert r["window_s"] > 0 and r["cpu_ms_per_msg"] > 0
    for name in ("postgres", "web", "senders", "consumers", "runner", "kafka", "rabbitmq"):
        assert name in r["cpu_s"]
    assert r["cpu_s"]["postgres"] > 0 and r["cpu_s"]["consumers"] > 0 and r["cpu_s"]["web"] > 0
    total = sum(v for k, v in r["cpu_s"].items() if k != "unattributed")
    assert r["cpu_ms_per_msg"] == pytest.approx(total * 1000 / M, rel=1e-3)
    assert len(r["consumers"]) == n
    # the disk guard read every slot throughout, tripped nothing, and its cost is recorded
    g = r["disk_guard"]
    assert g["tripped"] is None and g["db_errors"]["count"] == 0 and g["samples"] >= 1
    assert {f"load_test_slot_{i}" for i in range(n)} <= set(g["slots"])
    assert all(v > 2**20 for v in g["free_bytes_min"].values()) and g["cost"]["runner_cpu_s"] > 0
    # disk bytes per participant and the WAL generated over the window (lab.measure.diskio, walstats)
    disk, wal = r["disk"], r["wal"]
    assert {"postgres", "web", "senders", "consumers", "runner", "kafka", "rabbitmq"} <= set(disk)
    assert all(v["method"] in ("cgroup-io", "proc-io") for v in disk.values())
    assert r["disk_io_controller"] == "enabled" or disk["postgres"]["method"] == "proc-io"
    # every message is one INSERT and one claim, each committed and its WAL flushed by PostgreSQL
    assert disk["postgres"]["write_bytes_per_msg"] >= wal["per_msg"] * 0.5
    assert 100 < wal["per_msg"] < 20_000 and wal["lsn_bytes"] == pytest.approx(wal["per_msg"] * M, rel=0.01)
    assert wal["records"] >= 2 * M and wal["server_changed"] is False
    assert 0 < wal["stats_per_msg"] <= wal["per_msg"] * 1.05
    assert r["disk_host"]["write_bytes"] > 0  # the WAL reached the host's disk
    # the default layout is tasks: one process, its CPU on the first consumer's row; processes: one each
    assert r["consumer_layout"] == ("tasks" if layout == "auto" else layout)
    pids = {x["pid"] for x in r["consumers"]}
    if r["consumer_layout"] == "tasks":
        assert len(pids) == 1 and "cpu_s" in r["consumers"][0]
    else:
        assert len(pids) == n and all("cpu_s" in x for x in r["consumers"])
    # nothing left behind for the next run
    with psycopg.connect(settings.pg_dsn) as conn:
        left = conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0]
    assert left == 0
    # stored, with its timeline
    df = load_runs(settings=settings)
    row = df[df["run_id"] == r["run_id"]].iloc[0]
    assert row["success"] and row["consumers"] == n and row["consumer_layout"] == r["consumer_layout"]
    samples = read_samples(r["run_id"], settings=settings)
    assert {"postgres", "consumers", "host"} <= set(samples["participant"])


def test_the_id_sets_are_compared_not_only_their_sizes(stack: object, settings: Settings) -> None:
    """A worked set of the right size with one foreign id is caught (run's rows still in messages)."""
    from lab.workload.inbox import id_sets, sets_equal

    r = run(settings, pipeline="wal", consumers=1, messages=200)
    assert r["success"], r["error"]

    async def check(ids: list[int]) -> dict:
        async with await psycopg.AsyncConnection.connect(settings.pg_dsn) as conn:
            return await id_sets(conn, ids, "inbox_wal")

    with psycopg.connect(settings.pg_dsn) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM messages ORDER BY id")]
    assert len(ids) == 200 and sets_equal(asyncio.run(check(ids)))
    wrong = asyncio.run(check([*ids[1:], ids[-1] + 10_000]))
    assert (wrong["worked_not_in_messages"], wrong["messages_not_worked"]) == (1, 1)
    assert not sets_equal(wrong)


def test_a_run_whose_web_port_is_taken_does_not_start(stack: object, settings: Settings) -> None:
    """A run starts only on free ports; it fails at once naming the holder's pid,
    stores nothing and leaves no slot (it used to start and be stored as failed)."""
    before = len(load_runs(settings=settings))
    with socket.socket() as blocker:  # the web service could not bind its port
        blocker.bind(("127.0.0.1", 0))
        port = blocker.getsockname()[1]
        other = settings.replace(web_port=port)
        blocker.listen()
        with pytest.raises(StackError, match=f"port {port} for the web service is held by pid {os.getpid()}"):
            run(other, pipeline="wal", consumers=1, messages=100)
    assert len(load_runs(settings=settings)) == before
    with psycopg.connect(settings.pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0


def test_postgres_split_by_process_and_decode_only_slots(stack: object, settings: Settings) -> None:
    """PostgreSQL's CPU by walsender, claim and insert backends, a decode-only slot beside the reader
    (it decodes every change and publishes none), and the run's cost split; nothing left behind."""
    m = 8000
    r = run(settings, pipeline="wal", consumers=1, messages=m, decode_slots=1)
    assert r["success"], r["error"]
    pb = r["postgres_backends"]
    assert set(pb["walsender_cpu_s_per_slot"]) == {"load_test_slot_0", "decode_only_0"}
    assert pb["processes"]["walsenders"] == 2 and pb["processes"]["claims"] == 1 and pb["processes"]["inserts"] > 0
    # /proc counts a process's CPU in 10 ms ticks: the walsenders and the one claim backend work
    # for the whole run, but the web service spreads its inserts over a pool of backends, each of
    # which a fast machine can keep below a tick for the whole window (0.0 s was seen)
    assert pb["cpu_s"]["walsenders"] > 0 and pb["cpu_s"]["claims"] > 0 and pb["cpu_s"]["inserts"] >= 0
    named = sum(v for k, v in pb["cpu_s"].items() if k != "other")
    assert named + pb["cpu_s"]["other"] == pytest.approx(r["cpu_s"]["postgres"], abs=1e-3)
    assert pb["decode_only"]["slots"] == 1 and pb["decode_only"]["cpu_s_per_slot"] > 0
    assert r["counters"]["skipped"] == 0  # the decode-only slot never reaches a consumer
    split = r["cost_split"]
    delivered = [d for _, _, d in split["progress"]]
    assert delivered == sorted(delivered) and 0 < delivered[-1] <= m  # samples inside the window
    if "total" in split:  # a loaded machine may leave too few samples to split: then it says why
        total = sum(v for k, v in r["cpu_s"].items() if k != "unattributed")
        f, c = split["total"]["fixed_cpu_s"], split["total"]["steady_ms_per_msg"]
        assert f + c * m / 1000 == pytest.approx(total, rel=1e-2)
    else:
        assert "too short" in split["error"]
    with psycopg.connect(settings.pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)
