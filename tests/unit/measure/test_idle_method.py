"""The idle baseline reads CPU the way the runs it is netted from do (``LAB_CPU_METHOD``).

A real child process burns a known amount of CPU inside the idle window; the baseline must say
which method measured it, make no cgroup when a tree walk was asked for, and with the exact
methods find the burnt CPU (within 10 % + 20 ms: the window also holds its start-up).
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
BURNER = textwrap.dedent(f"""
    import sys, time
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


@pytest.mark.parametrize("method", ["cgroup", "schedstat", "proc-ticks"])
def test_idle_baseline_uses_the_configured_method(method: str, tmp_path, monkeypatch) -> None:
    if method not in _methods():
        pytest.skip(f"cpu method {method} is not available here")
    settings = Settings(stack_dir=tmp_path / "stack", cpu_method=method)
    proc = psutil.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        # idle.py's own clock: its settle sleep starts the burn, its window sleep lasts until the
        # burner has reported (however slow a loaded machine makes it); the sampler keeps its own
        burnt: list[float] = []

        def sleep(s: float) -> None:
            if not burnt and proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.write("go\n")
                proc.stdin.flush()
                proc.stdin.close()
                return
            if not burnt:
                burnt.append(float(proc.stdout.readline()))
            time.sleep(0.05)

        monkeypatch.setattr(idle_mod, "time", types.SimpleNamespace(sleep=sleep))
        window = sample_idle(settings, {"burner": [proc]}, seconds=1.5, settle=0.0)
        if not burnt:
            burnt.append(float(proc.stdout.readline()))
    finally:
        proc.kill()
        proc.wait()
    assert window["cpu_method"] == method
    group = (cgroup2_mount() or tmp_path) / PREFIX / cgroup_scope(settings) / "idle-burner"
    if method == "cgroup":
        assert group.exists()
        group.rmdir()
        group.parent.rmdir()
    else:
        assert not group.exists(), "a tree-walk method must not move the participant into a cgroup"
    got = window["participants"]["burner"]["cpu_s"]
    if method != "proc-ticks":  # proc-ticks is tick-sampled: only its label is asserted
        assert abs(got - burnt[0]) <= 0.1 * burnt[0] + 0.02, (method, got, burnt[0])


def test_auto_picks_the_most_exact_available() -> None:
    assert choose_cpu_method("auto") == _methods()[0]
