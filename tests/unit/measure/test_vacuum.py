"""The vacuum block's arithmetic: table counter deltas and the autovacuum processes' CPU."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lab.measure import vacuum
from lab.measure.vacuum import LAUNCHER, AutovacuumWatch, WorkerCpu, charged_cpu, table_deltas


def test_cumulative_counters_are_differences_and_gauges_end_values() -> None:
    start = {"messages": {"n_live_tup": 0, "n_dead_tup": 10, "n_tup_ins": 5, "n_tup_del": 0,
                          "autovacuum_count": 1, "total_autovacuum_time": 2.5},
             "inbox": {"n_tup_ins": 0}}
    end = {"messages": {"n_live_tup": 3, "n_dead_tup": 40, "n_tup_ins": 105, "n_tup_del": 100,
                        "autovacuum_count": 4, "total_autovacuum_time": 10.0},
           "messages_done": {"n_tup_ins": 100}}
    assert table_deltas(start, end) == {"messages": {"n_live_tup": 3, "n_dead_tup": 40, "n_tup_ins": 100,
                                                     "n_tup_del": 100, "autovacuum_count": 3,
                                                     "total_autovacuum_time": 7.5}}


def test_a_counter_missing_on_either_side_is_left_out() -> None:  # PostgreSQL < 18: no total_autovacuum_time
    got = table_deltas({"t": {"n_tup_del": 1}}, {"t": {"n_tup_del": 4, "total_autovacuum_time": 9.0}})
    assert got == {"t": {"n_tup_del": 3}}


def test_a_worker_alive_at_the_gate_is_charged_only_what_it_used_after_it() -> None:
    workers = {
        1: WorkerCpu("autovacuum worker", first=2.0, last=2.5, at_start=True),  # 0.5
        2: WorkerCpu("autovacuum worker", first=0.1, last=0.3, at_start=False),  # all of it: 0.3
        3: WorkerCpu(LAUNCHER, first=7.0, last=7.02, at_start=True),
    }
    assert charged_cpu(workers) == {"workers": 0.8, "launcher": 0.02}


def test_the_block_says_it_is_a_lower_bound_and_what_was_seen() -> None:
    watch = AutovacuumWatch("postgresql://unused", native=True)
    watch.tables = {"gate": {"messages": {"n_tup_del": 0, "n_dead_tup": 0}},
                    "end": {"messages": {"n_tup_del": 50, "n_dead_tup": 50}}}
    watch.workers = {9: WorkerCpu("autovacuum worker", 0.0, 0.04, at_start=False)}
    block = watch.record()
    assert block["delta"] == {"messages": {"n_dead_tup": 50, "n_tup_del": 50}}
    assert block["autovacuum"]["cpu_s"] == 0.04 and block["autovacuum"]["workers_seen"] == 1
    assert block["autovacuum"]["lower_bound"] is True
    assert AutovacuumWatch("postgresql://unused", native=False).record()["autovacuum"]["cpu_s"] is None


def test_a_process_cpu_is_read_to_the_nanosecond_and_none_once_gone() -> None:
    import os
    import subprocess
    import sys

    from lab.measure.vacuum import cpu_s

    mine = cpu_s(os.getpid())
    assert mine is not None and mine > 0 and mine != round(mine, 2)  # not whole clock ticks
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert cpu_s(child.pid) is None


LOG = """\
2026-12-07 11:40:00.001 UTC [4242] LOG:  checkpoint starting: time
2026-12-07 11:40:01.123 UTC [5151] LOG:  automatic vacuum of table "lab.public.messages": index scans: 1
\tpages: 0 removed, 910 remain, 910 scanned (100.00% of total)
\ttuples: 100000 removed, 12 remain, 0 are dead but not yet removable
\tbuffer usage: 3012 hits, 0 reads, 905 dirtied
\tsystem usage: CPU: user: 0.05 s, system: 0.01 s, elapsed: 0.31 s
2026-12-07 11:40:01.200 UTC [5151] LOG:  automatic analyze of table "lab.public.messages"
\tavg read rate: 0.000 MB/s, avg write rate: 0.000 MB/s
\tsystem usage: CPU: user: 0.02 s, system: 0.00 s, elapsed: 0.04 s
2026-12-07 11:40:02.000 UTC [5152] LOG:  automatic vacuum of table "lab.public.messages_done": index scans: 0
2026-12-07 11:40:02.500 UTC [5153] LOG:  automatic analyze of table "lab.public.messages_done"
\tsystem usage: CPU: user: 1.10 s, system: 0.20 s, elapsed: 2.00 s
"""


def test_every_logged_autovacuum_action_gives_the_cpu_postgres_measured_for_it() -> None:
    actions = vacuum.autovacuum_actions(LOG)
    # the vacuum of messages_done never printed its usage (a cut log): it is not given the analyze's
    assert actions == [
        {"kind": "vacuum", "table": "lab.public.messages", "cpu_s": 0.06, "elapsed_s": 0.31},
        {"kind": "analyze", "table": "lab.public.messages", "cpu_s": 0.02, "elapsed_s": 0.04},
        {"kind": "analyze", "table": "lab.public.messages_done", "cpu_s": 1.3, "elapsed_s": 2.0},
    ]
    assert vacuum.summed(actions) == {"actions": 3, "vacuums": 1, "analyzes": 2, "cpu_s": 1.38,
                                      "elapsed_s": 2.35, "tables": ["messages", "messages_done"]}
    assert vacuum.autovacuum_actions("2026-12-07 LOG:  database system is ready\n") == []


def test_the_log_read_inside_the_window_is_in_the_block(tmp_path: Path) -> None:
    log = tmp_path / "postgres.log"
    log.write_text("2026-12-07 LOG:  automatic vacuum of table \"lab.public.messages\": index scans: 0\n"
                   "\tsystem usage: CPU: user: 9.00 s, system: 0.00 s, elapsed: 9.00 s\n")
    watch = vacuum.AutovacuumWatch("postgresql://nowhere", native=True, log_path=log)
    watch._log_at = vacuum._log_size(log)  # what was there at the gate is not the run's
    with log.open("a") as f:
        f.write(LOG)
    asyncio.run(watch.stop())
    block = watch.record()["autovacuum"]
    assert block["from_log"]["actions"] == 3 and block["from_log"]["cpu_s"] == 1.38
    assert "from_log" not in vacuum.AutovacuumWatch("postgresql://nowhere", native=False).record()["autovacuum"]
