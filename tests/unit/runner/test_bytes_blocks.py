"""run.json's ``disk`` and ``wal`` blocks from a stored run's record (pure), and their columns."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from lab.results import load_runs, write_run
from lab.runner.assembly import assemble
from lab.settings import Settings

FIXTURES = Path(__file__).parent / "fixtures"


def _record() -> dict[str, Any]:
    rec: dict[str, Any] = json.loads((FIXTURES / "wal-clean.json").read_text())["record"]
    rec = copy.deepcopy(rec)
    m = rec["scenario"]["messages"]
    rec["disk"] = {"io_controller": "the io controller is not offered at /sys/fs/cgroup/unified", "participants": {
        "postgres": {"write_bytes": 900 * m, "read_bytes": 0, "method": "proc-io", "group": None, "roots_exited": 0},
        "web": {"write_bytes": 10 * m, "read_bytes": 0, "method": "proc-io", "group": None, "roots_exited": 0},
        "consumer-0": {"write_bytes": 2 * m, "read_bytes": 0, "method": "proc-io", "group": "consumers",
                       "roots_exited": 0},
    }, "host": {"write_bytes": 950 * m, "read_bytes": 0}}
    rec["wal"] = {"lsn_bytes": 800 * m, "wal_bytes": 790 * m, "records": 4 * m, "fpi": 3, "server_changed": False}
    return rec


def test_the_blocks_are_assembled_per_message() -> None:
    rec = _record()
    m = rec["scenario"]["messages"]
    out = assemble(rec)
    assert out["disk"]["postgres"] == {"write_bytes": 900 * m, "read_bytes": 0, "write_bytes_per_msg": 900.0,
                                       "method": "proc-io", "roots_exited": 0}
    assert out["disk"]["consumers"]["write_bytes_per_msg"] == 2.0
    assert out["disk_host"]["write_bytes_per_msg"] == 950.0
    assert out["disk_io_controller"].startswith("the io controller is not offered")
    assert out["consumers"][0]["disk_write_bytes"] == 2 * m
    assert out["wal"]["per_msg"] == 800.0 and out["wal"]["stats_per_msg"] == 790.0
    assert out["wal"]["records_per_msg"] == 4.0 and out["wal"]["fpi"] == 3
    old = json.loads((FIXTURES / "wal-clean.json").read_text())["record"]  # a record from before them
    assert "disk" not in assemble(old) and "wal" not in assemble(old)


def test_load_runs_has_a_column_per_participant_and_the_wal(tmp_path: Path) -> None:
    settings = Settings().replace(data_dir=tmp_path)
    run = assemble(_record())
    run["network"] = {"pairs": {"postgres>consumers": {"bytes": 5, "bytes_per_msg": 640.5}}}
    write_run(run, settings=settings)
    row = load_runs(settings=settings).iloc[0]
    assert row["disk_write_bytes_per_msg_postgres"] == 900.0 and row["disk_write_bytes_per_msg_consumers"] == 2.0
    assert row["disk_write_bytes_per_msg"] == pytest.approx(912.0) and row["disk_method"] == "proc-io"
    assert row["wal_bytes_per_msg"] == 800.0 and row["wal_stats_bytes_per_msg"] == 790.0
    assert row["wal_records_per_msg"] == 4.0 and row["disk_host_write_bytes_per_msg"] == 950.0
    assert row["net_bytes_per_msg_postgres_consumers"] == 640.5
