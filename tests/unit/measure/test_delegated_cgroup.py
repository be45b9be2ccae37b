"""Without root, CPU is still exact in a delegated cgroup v2 subtree.

As root the test makes what systemd's ``--user --scope`` (or an administrator) gives a user: a
cgroup v2 directory owned by an unprivileged uid. A child process is put there, drops to that
uid, and then, as an ordinary user, must (1) find the delegated subtree as its writable mount,
(2) choose ``cgroup`` as the CPU method, and (3) measure, through a participant group it made
itself, processes that work in sub-tick bursts, within 3 % (+ 5 ms) of their own exact totals.
A non-delegated unprivileged process (same uid, root-owned cgroup) must fall back to a tree walk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from lab.measure.cgroups import cgroup2_mount

UID = 65534  # nobody

CHILD = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from pathlib import Path
    from lab.measure.cgroups import CpuGroup, cgroup2_mount, choose_cpu_method
    mount = cgroup2_mount()
    out = {"uid": os.geteuid(), "mount": str(mount) if mount else None, "method": choose_cpu_method("auto")}
    if mount is not None:
        group = CpuGroup(mount, "burst", scope="deleg-test")
        worker = ("import sys, time\\n"
                  "print('ready', flush=True); sys.stdin.readline(); t0 = time.process_time()\\n"
                  "for _ in range(200):\\n"
                  "    s = time.process_time()\\n"
                  "    while time.process_time() - s < 0.0003: pass\\n"
                  "    time.sleep(0.002)\\n"
                  "print(time.process_time() - t0, flush=True); sys.stdin.readline()\\n")
        procs = [subprocess.Popen([sys.executable, "-c", worker], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for _ in range(8)]
        group.attach(p.pid for p in procs)
        for p in procs:  # started and idle: their start-up is not part of the truth
            p.stdout.readline()
        before = group.usage_s()
        for p in procs:
            p.stdin.write("go\\n"); p.stdin.flush()
        truth = sum(float(p.stdout.readline()) for p in procs)
        measured = group.usage_s() - before  # every worker has reported and waits: nothing else ran
        for p in procs:
            p.stdin.close(); p.wait()
        out |= {"truth": truth, "measured": measured}
        group.path.rmdir(); group.path.parent.rmdir(); group.path.parent.parent.rmdir()
    print(json.dumps(out))
""")


def _as_nobody_in(cgroup: Path | None):
    def pre() -> None:
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        os.setgid(UID)
        os.setgroups([])
        os.setuid(UID)
    return pre


def _reachable(path: str) -> bool:
    """Whether ``nobody`` can execute ``path`` (every directory on the way searchable by others)."""
    p = Path(path).resolve()
    return all(d.stat().st_mode & 0o001 for d in p.parents) and bool(p.stat().st_mode & 0o001)


def _python() -> str:
    """An interpreter an unprivileged user may run: ours, or the system's (the child needs only
    the standard library and ``lab.measure.cgroups``)."""
    for exe in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(exe) and _reachable(exe):
            return exe
    pytest.skip("no Python interpreter an unprivileged user may execute")


def _child(cgroup: Path | None, tmp: Path) -> dict:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp), "PYTHONPATH": str(Path(__file__).parents[3])}
    done = subprocess.run([_python(), "-c", CHILD], preexec_fn=_as_nobody_in(cgroup), env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def delegated(tmp_path):
    if os.geteuid() != 0 or cgroup2_mount() is None:
        pytest.skip("needs root and a cgroup v2 mount to make a delegated subtree")
    tmp_path.chmod(0o777)
    base = cgroup2_mount() / f"fanout-lab-deleg-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    for name in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
        os.chown(base / name if name else base, UID, UID)  # what systemd's Delegate=yes hands over
    yield base
    for p in sorted(base.rglob("*"), reverse=True):
        if p.is_dir():
            p.rmdir()
    base.rmdir()


def test_unprivileged_user_measures_exactly_in_a_delegated_subtree(delegated, tmp_path) -> None:
    got = _child(delegated, tmp_path)
    assert got["uid"] == UID
    assert got["mount"] == str(delegated) and got["method"] == "cgroup"
    assert abs(got["measured"] - got["truth"]) <= 0.03 * got["truth"] + 0.005, got


def test_unprivileged_user_without_delegation_falls_back(delegated, tmp_path) -> None:
    got = _child(None, tmp_path)  # stays in the root-owned cgroup it inherited
    assert got["uid"] == UID and got["mount"] is None
    assert got["method"] in ("schedstat", "proc-ticks")
