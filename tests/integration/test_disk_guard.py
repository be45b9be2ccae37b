"""Failures on the real stack end in one line: a run past the disk guard's limits (its cleanup done,
its trip recorded), a `lab bench` command whose run fails, a `LAB_PG_PASSWORD` changed while
PostgreSQL runs. Through the console entry point, in subprocesses; one short run each."""

from __future__ import annotations

import subprocess
import sys

import psutil
import psycopg
import pytest

from lab.results import iter_runs
from lab.settings import Settings
from tests.conftest import lab_env

pytestmark = pytest.mark.integration


def lab(settings: Settings, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab", *args], env={**lab_env(settings), **env},
                          capture_output=True, text=True, timeout=timeout, check=False)


def _stored(settings: Settings, run_id: str) -> dict:
    return next(r for r in iter_runs(settings=settings) if r["run_id"] == run_id)


def _nothing_left(settings: Settings, run: dict) -> None:
    """The run's cleanup ran: its slots dropped, its consumers and senders gone."""
    with psycopg.connect(settings.pg_dsn) as conn:
        slots = conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'logical'").fetchall()
    assert slots == []
    pids = [c["pid"] for c in run["consumers"] if c.get("pid")] + [run["senders"].get("pid")]
    for pid in filter(None, pids):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_run_past_the_retained_wal_limit_fails_in_one_line_and_cleans_up(stack: object, settings: Settings) -> None:
    """A 64 kB limit: the reader's slot retains more than that within a second of load (its
    restart_lsn moves only at a running-transactions record), so the guard trips during the run."""
    res = lab(settings, "run", "--pipeline", "wal", "--consumers", "1", "--messages", "3000", "--rate", "1000",
              "--cooldown-s", "0", "--max-retained-wal", "64kB")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    lines = [line for line in res.stdout.splitlines() if "disk guard" in line]
    assert len(lines) == 1 and "FAILED: DiskGuardTripped: disk guard: slot load_test_slot_0 retains" in lines[0]
    assert "too close to the limit of 65536 bytes" in lines[0]
    run = _stored(settings, lines[0].split()[0])
    g = run["disk_guard"]
    assert not run["success"] and g["tripped"]["kind"] == "retained_wal" and g["tripped"]["limit_bytes"] == 65536
    assert g["max_retained_wal"] == 65536 and g["samples"] >= 1 and g["db_errors"]["count"] == 0
    assert g["slots"]["load_test_slot_0"]["retained_bytes_max"] >= g["tripped"]["retained_bytes"]
    assert set(g["free_bytes_min"]) == {"postgres data", "LAB_STACK_DIR", "LAB_DATA_DIR"}
    assert g["replslot_dir_bytes_max"] is not None and g["cost"]["postgres_cpu_s"] is not None
    print(f"\nDISK GUARD trip: {g['tripped']['error']}\n  cost {g['cost']} over {g['samples']} samples")
    _nothing_left(settings, run)


def test_a_bench_command_whose_run_fails_ends_in_one_line(stack: object, settings: Settings) -> None:
    """`lab bench run` with a free-disk minimum no disk meets: the run fails at once, the command
    says so in one line with its exit status, no traceback."""
    res = lab(settings, "bench", "run", "--pipeline", "wal", "--consumers", "1", "--messages", "200",
              "--cooldown-s", "0", "--repeats", "1", LAB_MIN_FREE_DISK="1000000GB")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("lab: error: RuntimeError: run ") and " failed: DiskGuardTripped: disk guard: " in last
    assert "too close to the minimum of 1073741824000000 bytes" in last and "LAB_MIN_FREE_DISK" in last
    assert res.stdout == ""
    run = _stored(settings, last.split("run ", 1)[1].split()[0])
    assert run["disk_guard"]["tripped"]["kind"] == "free_disk"
    _nothing_left(settings, run)


def test_a_pg_password_changed_while_postgres_runs_is_named_in_one_line(stack: object, settings: Settings) -> None:
    res = lab(settings, "stack", "up", timeout=300, LAB_PG_PASSWORD="not-the-stacks-password")
    assert res.returncode != 0
    assert "Traceback" not in res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lab: error: ")
    assert "password authentication failed" in lines[0] and "LAB_PG_PASSWORD" in lines[0]
    # the stack's own password still works (the libpq password file is kept current)
    with psycopg.connect(settings.pg_dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
