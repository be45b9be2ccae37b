"""lab.study.presentation: what the CLI prints, from stored runs (no services)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.study import presentation

FIXTURES = Path(__file__).resolve().parents[1] / "runner" / "fixtures"


@dataclass
class _Status:
    name: str
    state: str
    pids: list[int]
    endpoint: str
    version: str
    rss_mb: float | None
    detail: dict[str, Any] = field(default_factory=dict)


def _run(name: str) -> dict[str, Any]:
    run: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())["run"]
    return run


def test_a_real_run_reads_as_its_verdict_counters_and_cpu() -> None:
    run = _run("wal-clean")
    text = presentation.run_text(run)
    assert text.startswith(f"{run['run_id']}  wal c2 m5000  OK\n")
    assert f"sent {run['counters']['sent']} failed 0 processed" in text
    assert all(f"  {name:<16}" in text for name in run["cpu_s"])
    failed = presentation.run_text(_run("failed-not-drained"))
    assert "FAILED: RunError: not drained after 5 s" in failed.splitlines()[0]


def test_a_fault_run_shows_its_accounting_and_phases() -> None:
    text = presentation.run_text(_run("fault-slot-invalidation-loss"))
    assert "fault slot-invalidation:0@3s: lost 1400" in text and "recovered after" in text
    assert "SLOT INVALIDATED: load_test_slot_0" in text


def test_a_series_is_one_row_per_run_without_the_error_text() -> None:
    text = presentation.series_text([_run("wal-clean"), _run("failed-not-drained")])
    lines = text.splitlines()
    assert len(lines) == 3 and "error" not in lines[0] and "RunError" not in text
    assert "True" in lines[1] and "False" in lines[2]


def test_status_lists_each_service_and_warns_of_an_inactive_slot() -> None:
    slot = {"slot": "s1", "active": False, "retained_wal_bytes": 2**20, "wal_status": "reserved"}
    rows = [_Status("postgres", "running", [1], "127.0.0.1:5432", "18", 80.0,
                    {"slots": [slot], "inactive_slots": [{"slot": "s1", "retained_wal_bytes": 2**20}]})]
    text = presentation.status_text(rows, as_json=False)
    assert text.startswith("postgres           running  pid 1 ")
    assert "slot s1" in text and "retains 1048576 bytes (1.0 MB)" in text
    assert "warning: replication slot s1 is inactive and retains 1048576 bytes of WAL" in text
    assert json.loads(presentation.status_text(rows, as_json=True))[0]["name"] == "postgres"
