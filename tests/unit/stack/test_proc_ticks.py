"""A recorded process stays ours when the wall clock is stepped (lab/stack/proc.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lab.stack import proc


def test_running_survives_a_clock_step_and_rejects_another_process(tmp_path: Path) -> None:
    p = proc.spawn([sys.executable, "-c", "import time; time.sleep(60)"], state_dir=tmp_path,
                   log_path=tmp_path / "log")
    try:
        record = json.loads(proc.pidfile(tmp_path).read_text())
        assert record["start_ticks"] == proc.start_ticks(p.pid) is not None
        # a stepped clock moves psutil's create_time (boot time is derived from the wall clock)
        record["create_time"] -= 5.0
        proc.pidfile(tmp_path).write_text(json.dumps(record))
        assert proc.running(tmp_path) is not None and proc.running(tmp_path).pid == p.pid
        # the same pid with another start time is not ours (a recycled pid)
        record["start_ticks"] += 1
        proc.pidfile(tmp_path).write_text(json.dumps(record))
        assert proc.running(tmp_path) is None
    finally:
        p.kill()
        p.wait(10)
