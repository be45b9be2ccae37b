"""The idle baseline reads CPU the way the runs it is netted from do (``LAB_CPU_METHOD``).

A real child process burns a known amount of CPU inside the idle window; the baseline must say
which method measured it, make no cgroup when a tree walk was asked for, and find the burnt CPU:
the exact methods within 2 % + 10 ms, tick-sampled ``proc-ticks`` within a third (enough to
catch a wrong process or a wrong unit).

The burner starts its interpreter, says ``ready`` and blocks in a read before the window opens,
and is told to burn only once the window's first snapshot is taken: so the window holds the burn
and nothing of the interpreter's start-up (20-50 ms of CPU, more on a loaded machine: counted in
the window, it once read 0.353 s against a 0.300 s burn), and the burn cannot begin before the
first snapshot either. Its end is the burner's own report, read before the last snapshot.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import types

import psutil
import pytest

import lab.measure.idle as idle_mod
from lab.measure.cgroups import PREFIX, cgroup2_mount, cgroup_scope, choose_cpu_method, schedstat_available
from lab.measure.idle import sample_idle
from lab.settings import Settings

BURN_S = 0.3
WINDOW_S = 1.5  # sample_idle's window; the fake clock below ends it when the burner has reported
BURNER = textwrap.dedent(f"""
    import sys, time
    print("ready", flush=True)      # started: the rest of its life is the burn and a sleep
    sys.stdin.readline()            # wait until the idle window has begun
    t0 = time.process_time()
    while time.process_time() - t0 < {BURN_S}:
        pass
    print(time.process_time() - t0, flush=True)
    time.sleep(60)                  # idle again: nothing more to count
""")


def _methods() -> list[str]:
    return [m for m, ok in (("cgroup", cgroup2_mount() is not None), ("schedstat", schedstat_available()),
                            ("proc-ticks", True)) if ok]


def _blocked(proc: psutil.Popen) -> None:
    """Wait until the burner sleeps in its read (its ``ready`` may come just before)."""
    deadline = time.monotonic() + 30
    while proc.status() != psutil.STATUS_SLEEPING:
        assert time.monotonic() < deadline, "the burner did not block in its read"
        time.sleep(0.01)


@pytest.mark.parametrize("method", ["cgroup", "schedstat", "proc-ticks"])
def test_idle_baseline_uses_the_configured_method(method: str, tmp_path, monkeypatch) -> None:
    if method not in _methods():
        pytest.skip(f"cpu method {method} is not available here")
    settings = Settings(stack_dir=tmp_path / "stack", cpu_method=method)
    proc = psutil.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        _blocked(proc)
        # idle.py's own clock: the settle sleep (before the first snapshot) waits for nothing, the
        # window's sleep (after it) starts the burn and lasts until the burner has reported
        # (however slow a loaded machine makes it); the sampler keeps its own
        burnt: list[float] = []

        def sleep(s: float) -> None:
            if s != WINDOW_S:
                return
            assert not burnt, "one window"
            proc.stdin.write("go\n")
            proc.stdin.flush()
            burnt.append(float(proc.stdout.readline()))

        monkeypatch.setattr(idle_mod, "time", types.SimpleNamespace(sleep=sleep))
        window = sample_idle(settings, {"burner": [proc]}, seconds=WINDOW_S, settle=0.0)
    finally:
        proc.kill()
        proc.wait()
    assert burnt, "the window's sleep never started the burn"
    assert window["cpu_method"] == method
    group = (cgroup2_mount() or tmp_path) / PREFIX / cgroup_scope(settings) / "idle-burner"
    if method == "cgroup":
        assert group.exists()
        group.rmdir()
        group.parent.rmdir()
    else:
        assert not group.exists(), "a tree-walk method must not move the participant into a cgroup"
    got = window["participants"]["burner"]["cpu_s"]
    if method == "proc-ticks":  # whole ticks, sampled: a third either way, still no other process or unit
        assert abs(got - burnt[0]) <= burnt[0] / 3, (method, got, burnt[0])
    else:  # the window holds the burn, its wake-up and its report: nothing else of the burner's
        assert -0.005 <= got - burnt[0] <= 0.02 * burnt[0] + 0.01, (method, got, burnt[0])


def test_auto_picks_the_most_exact_available() -> None:
    assert choose_cpu_method("auto") == _methods()[0]
