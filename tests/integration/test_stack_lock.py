"""Commands fired at a real run in progress: each is refused in one line naming the run and its pid,
and the run still succeeds; a SIGTERM ends a real run through the run's own cleanup."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.settings import Settings
from tests.conftest import lab_env

pytestmark = pytest.mark.integration
LAB = [sys.executable, "-m", "lab"]


def lab(settings: Settings, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAB, *args], env=lab_env(settings), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _start_run(settings: Settings, *extra: str) -> subprocess.Popen[str]:
    argv = [*LAB, "run", "--pipeline", "wal", "--cooldown-s", "0", "--json", *extra]
    return subprocess.Popen(argv, env=lab_env(settings), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_drain(settings: Settings, runner: subprocess.Popen[str], before: set[Path]) -> Path:
    """The run's directory once its senders' gate opened (the run is measuring)."""
    runs = settings.stack_dir / "runs"
    deadline = time.monotonic() + 240
    while True:
        assert runner.poll() is None, runner.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the run never reached its drain"
        new = sorted(set(runs.glob("*")) - before) if runs.exists() else []
        if new and (new[-1] / "start").exists():
            return new[-1]
        time.sleep(0.2)


def test_commands_at_a_running_run_are_refused(stack: object, settings: Settings) -> None:
    runs = settings.stack_dir / "runs"
    before = set(runs.glob("*")) if runs.exists() else set()
    # about 25 s of sending; the seven commands start together (a `lab` start loads pandas: on 2 cores
    # seven at once take about 10 s) and all end while the run still sends
    runner = _start_run(settings, "--messages", "2500", "--rate", "100")
    _wait_for_drain(settings, runner, before)
    commands = [("stack", "up"), ("stack", "provision"), ("stack", "debezium", "start", "kafka"),
                ("stack", "down"), ("stack", "down", "--purge"),
                ("bench", "harness", "--messages", "100", "--repeats", "1"),
                ("run", "--pipeline", "wal", "--messages", "100", "--cooldown-s", "0")]
    fired = [(cmd, subprocess.Popen([*LAB, *cmd], env=lab_env(settings), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)) for cmd in commands]
    for cmd, proc in fired:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (cmd, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (cmd, err)
        assert f"pid {runner.pid}" in lines[0] and "lab run --pipeline wal" in lines[0], (cmd, lines[0])
    assert runner.poll() is None, "every refusal came while the run was still going"
    out, err = runner.communicate(timeout=600)
    assert runner.returncode == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["success"] is True


def test_sigterm_ends_a_run_through_its_cleanup(stack: object, settings: Settings) -> None:
    runs = settings.stack_dir / "runs"
    before = set(runs.glob("*")) if runs.exists() else set()
    runner = _start_run(settings, "--messages", "400000")  # far more than it sends before the signal
    run_dir = _wait_for_drain(settings, runner, before)
    time.sleep(2.0)
    runner.send_signal(signal.SIGTERM)
    _, err = runner.communicate(timeout=180)
    assert runner.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    assert len(err.strip().splitlines()[-1:]) == 1 and "interrupted by SIGTERM" in err.strip().splitlines()[-1]
    result = json.loads((settings.data_dir / "runs" / run_dir.name / "run.json").read_text())
    assert result["interrupted"] == "SIGTERM" and result["success"] is False
    # the stack is free again and clean: the next run starts and succeeds
    after = lab(settings, "run", "--pipeline", "wal", "--messages", "500", "--cooldown-s", "0", "--json",
                timeout=600)
    assert after.returncode == 0, after.stderr[-2000:]


def test_two_stack_ups_at_once_are_refused_or_serialised(stack: object, settings: Settings) -> None:
    ups = [subprocess.Popen([*LAB, "stack", "up"], env=lab_env(settings), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [(p.pid, p.wait(timeout=300), p.communicate()[1]) for p in ups]
    assert any(code == 0 for _, code, _ in outs), outs
    for pid, code, err in outs:
        if code != 0:
            other = next(q for q, _, _ in outs if q != pid)
            assert code == 2 and err.strip().splitlines() == [err.strip()], outs
            assert f"`lab stack up` (pid {other})" in err, outs
