"""SIGTERM (and SIGINT) never land between a start and its record, nor cut a rollback short: they
are delivered when the block is over (lab.stack.proc.deferred_signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.stack import proc
from lab.stack.proc import Interrupted, deferred_signals, raise_interrupted


@pytest.fixture
def sigterm_raises() -> Iterator[None]:
    """The lab's own SIGTERM handler, as `lab` installs it."""
    old = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_signal_inside_is_raised_once_the_block_is_over(sigterm_raises: None) -> None:
    done: list[str] = []
    with pytest.raises(Interrupted), deferred_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler would have run here
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: not raised twice
        done.append("finished")
    assert done == ["finished"]
    assert signal.getsignal(signal.SIGTERM) is raise_interrupted


def test_a_sigterm_right_after_a_start_still_leaves_the_process_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigterm_raises: None) -> None:
    """The signal arrives once the child runs and before its pid file is written: the service must
    still be found (and stopped) by `lab stack down`."""
    real = subprocess.Popen
    started: list[subprocess.Popen[bytes]] = []

    def popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        child = real(*args, **kwargs)  # type: ignore[call-overload]
        started.append(child)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        return child  # type: ignore[no-any-return]

    monkeypatch.setattr(subprocess, "Popen", popen)
    try:
        with pytest.raises(Interrupted):
            proc.spawn(["sleep", "60"], state_dir=tmp_path / "svc", log_path=tmp_path / "svc.log")
        monkeypatch.setattr(subprocess, "Popen", real)
        assert len(started) == 1
        recorded = proc.running(tmp_path / "svc")
        assert recorded is not None and recorded.pid == started[0].pid
    finally:
        for child in started:
            child.kill()
            child.wait()


def test_outside_the_main_thread_the_block_just_runs() -> None:
    import threading

    ran: list[bool] = []

    def work() -> None:
        with deferred_signals():
            ran.append(True)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert ran == [True]
