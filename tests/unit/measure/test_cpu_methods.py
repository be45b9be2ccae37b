"""Each CPU method against a known total, on processes that work in short bursts.

The workload is shaped like PostgreSQL backends serving one INSERT at a time: 40 live
processes, each doing 6 bursts of 0.25 ms of CPU with sleeps between (≈ 1.5 ms each, well under
one 10 ms clock tick). Each worker reports ``time.process_time()`` (the kernel's exact runtime of
the process) before and after its bursts, so the true total does not depend on wall time or on
other load. The same processes are measured over the same window by

* ``cgroup``: one cgroup holding every worker (skipped without a writable cgroup v2 mount),
* ``schedstat``: the tree walk reading ``/proc/<pid>/task/*/schedstat``,
* ``proc-ticks``: the tree walk reading ``utime + stime`` in whole ticks.

The two exact methods must land within 3 % (+ 3 ms) of the truth in every round; proc-ticks counts
each process to ±1 tick, so its error over three rounds must be larger than theirs (it is the
method a run is marked with when nothing better exists, and the analysis never pools it with
the others).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from lab.measure.cgroups import PREFIX, CpuGroup, cgroup2_mount, choose_cpu_method
from lab.measure.sampler import Participant, Sampler

log = logging.getLogger(__name__)
WORKERS, BURSTS, BURST_S, GAP_S = 40, 6, 0.00025, 0.003

WORKER = textwrap.dedent(
    f"""
    import sys, time

    def burn(s):
        t = time.thread_time()
        while time.thread_time() - t < s:
            pass

    while True:
        print(time.process_time(), flush=True)
        if sys.stdin.readline() != "go\\n":
            break
        for _ in range({BURSTS}):
            burn({BURST_S})
            time.sleep({GAP_S})
    """
)


@pytest.fixture
def workers():
    procs = [subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(WORKERS)]
    try:
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGKILL)
            p.wait()


def _blocked(procs: list[subprocess.Popen]) -> None:
    """Wait until every worker sleeps in its read (on a loaded host it may not have got there yet)."""
    deadline = time.monotonic() + 30
    while any(psutil.Process(p.pid).status() != psutil.STATUS_SLEEPING for p in procs):
        assert time.monotonic() < deadline, "workers did not block in their read"
        time.sleep(0.01)
    time.sleep(0.05)


def _round(procs: list[subprocess.Popen], samplers: dict[str, Sampler], before: list[float]) -> tuple:
    _blocked(procs)
    starts = {m: s.snapshot() for m, s in samplers.items()}
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    after = [float(p.stdout.readline()) for p in procs]
    _blocked(procs)
    ends = {m: s.snapshot() for m, s in samplers.items()}
    truth = sum(b - a for a, b in zip(before, after, strict=True))
    got = {m: ends[m].cpu_s["w"] - starts[m].cpu_s["w"] for m in samplers}
    return truth, got, after


def test_exact_methods_match_the_truth_and_proc_ticks_does_not(workers) -> None:
    roots = [psutil.Process(p.pid) for p in workers]
    samplers = {m: Sampler([Participant("w", roots)], cpu_method=m) for m in ("schedstat", "proc-ticks")}
    mount, group = cgroup2_mount(), None
    if mount is not None:
        group = CpuGroup(mount, "workers", scope="test-cpu-methods")
        assert group.attach(p.pid for p in workers) == WORKERS
        samplers["cgroup"] = Sampler([Participant("w", roots, cgroup=group)])
    try:
        before = [float(p.stdout.readline()) for p in workers]  # all started and idle
        before = _round(workers, samplers, before)[2]  # warm-up: the first read sets up stdin
        errors: dict[str, float] = dict.fromkeys(samplers, 0.0)
        for i in range(3):
            truth, got, before = _round(workers, samplers, before)
            log.info("round %d: truth %.4f s, %s", i, truth,
                     ", ".join(f"{m} {v:.4f} s ({100 * (v / truth - 1):+.1f} %)" for m, v in got.items()))
            for m, v in got.items():
                errors[m] += abs(v - truth)
            for m in ("schedstat", "cgroup"):
                if m in got:
                    assert got[m] == pytest.approx(truth, rel=0.03, abs=0.003), (m, got[m], truth)
        exact = max(v for m, v in errors.items() if m != "proc-ticks")
        assert errors["proc-ticks"] > exact, errors
    finally:
        for p in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        for p in workers:
            p.wait()
        if group is not None:
            group.remove()
            for path in (mount / PREFIX / "test-cpu-methods", mount / PREFIX):
                with contextlib.suppress(OSError):
                    path.rmdir()


def test_cpu_method_choice_says_what_is_possible() -> None:
    assert choose_cpu_method("auto") in ("cgroup", "schedstat", "proc-ticks")
    assert choose_cpu_method("proc-ticks") == "proc-ticks"
    with pytest.raises(ValueError, match="unknown cpu method 'exact'"):
        choose_cpu_method("exact")
    if cgroup2_mount() is None:
        with pytest.raises(ValueError, match="not available here"):
            choose_cpu_method("cgroup")
    with pytest.raises(ValueError, match="cpu_method of the tree walk"):
        Sampler([], cpu_method="cgroup")
