"""A run's processes: recorded, killed with their parent, stopped by pid in bounded time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lab.settings import Settings
from lab.stack import children
from lab.stack.base import StackError

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
DEAF = [sys.executable, "-c",  # ignores SIGTERM: only the escalation to SIGKILL stops it
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"]


def _settings(tmp_path: Path) -> Settings:
    return Settings(stack_dir=tmp_path / "stack")


def test_recorded_then_stopped_by_stop_all(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    p = children.spawn(s, "web", SLEEP, log_path=tmp_path / "web.log")
    assert [(n, q.pid) for n, q in children.leftovers(s)] == [("web", p.pid)]
    with pytest.raises(StackError, match=f"web pid {p.pid} of an earlier run"):
        children.require_clean(s, {}, ours=set())
    assert children.stop_all(s) == [f"web {p.pid}"]
    assert not p.is_running() and children.leftovers(s) == []
    assert list(children.registry(s).iterdir()) == []


def test_escalates_to_sigkill_within_the_bound(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    log = tmp_path / "deaf.log"
    p = children.spawn(s, "consumer-0", DEAF, log_path=log)
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t0 = time.monotonic()
    assert children.stop([p], timeout=1.0) == []
    assert time.monotonic() - t0 < 1.0 + children.KILL_WAIT
    assert not p.is_running()


def test_dies_with_its_parent(tmp_path: Path) -> None:
    """A parent that spawned a child through the registry is SIGKILLed: the child dies too."""
    s = _settings(tmp_path)
    code = ("import sys; from pathlib import Path; from lab.settings import Settings; "
            "from lab.stack import children; "
            f"p = children.spawn(Settings(stack_dir=Path({str(s.stack_dir)!r})), 'web', {SLEEP!r}, "
            f"log_path=Path({str(tmp_path / 'c.log')!r})); print(p.pid, flush=True); "
            "import time; time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))  # type: ignore[union-attr]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    gone, alive = psutil.wait_procs([child], timeout=10)
    assert alive == [] and gone
    assert children.leftovers(s) == []  # the dead child's record is dropped when read


def test_a_taken_port_names_its_pid(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert children.port_holder(port) == psutil.Process().pid
        with pytest.raises(StackError, match=f"port {port} for the web service is held by pid"):
            children.require_clean(_settings(tmp_path), {"the web service": port}, ours=set())
        children.require_clean(_settings(tmp_path), {"the web service": port},
                               ours={psutil.Process().pid})
