"""The sampler measures a synthetic process tree whose CPU burns are known, within ±2 %.

Every process of the tree reports ``time.process_time()`` (its whole CPU time, interpreter start-up
included) right before it exits or blocks (the churn test takes each child's exact total from its
parent's ``wait4`` rusage), so the expected total depends neither on wall time nor on other load.
The cgroup tests move the processes they start into cgroups under ``fanout-lab/test-sampler``
(removed afterwards); they are skipped without a writable cgroup v2 mount.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psutil
import pytest

import lab.measure.procstat
import lab.measure.sampler
from lab.measure.cgroups import PREFIX, CpuGroup, cgroup2_mount
from lab.measure.sampler import TIMELINE_COLUMNS, Participant, Sampler

log = logging.getLogger(__name__)

BURNER = textwrap.dedent(
    """
    import os, subprocess, sys, time

    role, report, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])

    def burn(s):
        t = time.process_time()
        while time.process_time() - t < s:
            pass

    def tell(name):
        with open(report, "a") as f:
            f.write(f"{name} {time.process_time()!r}\\n")

    def spawn(role, s, **kw):
        return subprocess.Popen([sys.executable, __file__, role, report, str(s)], **kw)

    if role == "short":          # starts and exits inside the window
        burn(seconds)
        tell(f"short-{os.getpid()}")
        os._exit(0)
    if role == "leaf":           # a live grandchild at the window end
        burn(seconds)
        tell("leaf")
        print("done", flush=True)
        sys.stdin.buffer.read()
        os._exit(0)
    if role == "mid":            # a live child that reaped one grandchild and keeps another
        spawn("short", seconds, stdin=subprocess.DEVNULL).wait()
        burn(seconds)
        leaf = spawn("leaf", seconds, stdout=subprocess.PIPE)
        leaf.stdout.readline()
        tell("mid")
        print("done", flush=True)
        sys.stdin.buffer.read()
        leaf.wait()
        os._exit(0)
    tell("root-start")
    print("ready", flush=True)
    os.read(0, 1)
    if role == "churn":          # many children, each started and reaped while being sampled
        for _ in range(15):      # wait4's rusage: a child's exact total CPU, exit included
            pid = spawn("short", seconds, stdin=subprocess.DEVNULL).pid
            ru = os.wait4(pid, 0)[2]
            with open(report, "a") as f:
                f.write(f"reaped-{pid} {ru.ru_utime + ru.ru_stime!r}\\n")
        tell("root-end")
        print("done", flush=True)
        sys.stdin.buffer.read()
        os._exit(0)
    # role == "root"
    burn(seconds)
    shorts = [spawn("short", seconds, stdin=subprocess.DEVNULL) for _ in range(2)]
    mid = spawn("mid", seconds, stdout=subprocess.PIPE)
    for p in shorts:
        p.wait()
    mid.stdout.readline()
    tell("root-end")
    print("done", flush=True)
    sys.stdin.buffer.read()
    mid.wait()
    """
)


def _reports(path: Path) -> dict[str, float]:
    return {name: float(v) for name, v in (line.split() for line in path.read_text().splitlines())}


@pytest.fixture
def burner(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "burner.py"
    script.write_text(BURNER)
    return script, tmp_path / "report.txt"


def _start(script: Path, report: Path, role: str, seconds: float, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script), role, str(report), str(seconds)], **kw)


@pytest.mark.parametrize("source", ["proc", "psutil"])
def test_tree_with_short_lived_children_and_grandchildren_is_measured_within_2_percent(
        burner, source, monkeypatch):
    """``psutil``: the readings a host without /proc (macOS, compose backend) takes, forced here."""
    monkeypatch.setattr(lab.measure.procstat, "PROC", source == "proc")
    script, report = burner
    root = _start(script, report, "root", 0.5, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    outside_report = report.with_name("outside.txt")
    other: subprocess.Popen | None = None
    try:
        assert root.stdout.readline() == b"ready\n"
        tree = Participant("tree", [psutil.Process(root.pid)])
        outsider_roots: list[psutil.Process] = []
        outside = Participant("outside", lambda: outsider_roots)
        with Sampler([tree, outside], period=0.2) as sampler:
            a = sampler.snapshot()
            root.stdin.write(b"g")
            root.stdin.flush()
            # a process outside the tree (a sibling of the root) burns at the same time
            other = _start(script, outside_report, "leaf", 0.4,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            outsider_roots.append(psutil.Process(other.pid))
            assert other.stdout.readline() == b"done\n"
            assert root.stdout.readline() == b"done\n"
            b = sampler.snapshot()
        w = sampler.window(a, b)
    finally:
        root.stdin.close()
        root.wait(10)
        if other is not None:
            other.stdin.close()
            other.wait(10)

    got = _reports(report)
    shorts = [v for k, v in got.items() if k.startswith("short-")]
    assert len(shorts) == 3  # two children and one grandchild started and exited in the window
    expected = got["root-end"] - got["root-start"] + sum(shorts) + got["mid"] + got["leaf"]
    measured = w["participants"]["tree"]["cpu_s"]
    log.info(f"tree: measured {measured:.3f} s, expected {expected:.3f} s, "
          f"error {100 * (measured / expected - 1):+.2f} %")
    assert measured == pytest.approx(expected, rel=0.02), (measured, expected, got)

    outside_expected = _reports(outside_report)["leaf"]
    assert w["participants"]["outside"]["cpu_s"] == pytest.approx(outside_expected, abs=0.03)

    total = measured + w["participants"]["outside"]["cpu_s"]
    assert w["unattributed_cpu_s"] == pytest.approx(w["host_busy_cpu_s"] - total, abs=0.002)
    assert w["host_busy_cpu_s"] > total - 0.1  # the host saw at least the participants' CPU
    assert w["participants"]["tree"]["rss_mb_max"] > 5  # live root, mid and leaf at the end
    assert w["samples"] >= 2
    assert w["sampler_cpu_s"] >= 0


def test_snapshots_racing_with_reaps_neither_lose_nor_double_count(burner):
    script, report = burner
    root = _start(script, report, "churn", 0.05, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert root.stdout.readline() == b"ready\n"
        sampler = Sampler([Participant("churn", [psutil.Process(root.pid)])], period=0.05)
        with sampler:
            a = sampler.snapshot()
            root.stdin.write(b"g")
            root.stdin.flush()
            snaps = [a]
            while not select.select([root.stdout], [], [], 0.01)[0]:
                snaps.append(sampler.snapshot())
            assert root.stdout.readline() == b"done\n"
            b = sampler.snapshot()
        series = [s.cpu_s["churn"] for s in [*sampler.timeline(), b]]
    finally:
        root.stdin.close()
        root.wait(10)
    got = _reports(report)
    reaped = [v for k, v in got.items() if k.startswith("reaped-")]
    assert len(reaped) == 15 and len(snaps) > 15
    expected = got["root-end"] - got["root-start"] + sum(reaped)
    measured = sampler.window(a, b)["participants"]["churn"]["cpu_s"]
    log.info(f"churn: {len(snaps)} snapshots, {len(series)} readings, {sampler.retried} retried, "
          f"min step {min(b - a for a, b in itertools.pairwise(series)):+.3f} s, "
          f"measured {measured:.3f} s, expected {expected:.3f} s")
    # a lost or doubled child would be off by its whole CPU (≥ 80 ms): beyond tick rounding
    assert measured == pytest.approx(expected, abs=0.04)
    # a child counted twice (read, then reaped into its parent) would show as a rise and a fall of
    # its whole CPU (≥ 50 ms); only tick rounding (≤ 10 ms per reap) may step back
    assert min(b - a for a, b in itertools.pairwise(series)) > -0.02


def test_zombie_and_vanished_roots_keep_their_last_value(burner):
    script, report = burner
    child = _start(script, report, "short", 0.3, stdin=subprocess.DEVNULL)
    proc = psutil.Process(child.pid)
    sampler = Sampler([Participant("p", [proc]), Participant("gone", lambda: [proc])])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped: a zombie
    assert proc.status() == psutil.STATUS_ZOMBIE
    zombie = sampler.snapshot()
    expected = _reports(report)[f"short-{child.pid}"]
    assert zombie.cpu_s["p"] == pytest.approx(expected, abs=0.03)
    assert zombie.rss_mb["p"] == 0
    child.wait()  # reaped: the pid vanishes from /proc
    assert not psutil.pid_exists(child.pid)
    after = sampler.snapshot()
    assert after.cpu_s == zombie.cpu_s
    assert after.rss_mb == {"p": 0, "gone": 0}
    assert sampler.window(zombie, after)["participants"]["p"]["cpu_s"] == 0


def test_runner_style_participant_counts_only_its_own_cpu(burner):
    script, report = burner
    me = Participant("runner", [psutil.Process()], recursive=False)
    whole = Participant("whole", [psutil.Process()])  # deliberately overlapping, to compare
    sampler = Sampler([me])
    a = sampler.snapshot()
    child = _start(script, report, "short", 0.3, stdin=subprocess.DEVNULL)
    child.wait()
    b = sampler.snapshot()
    assert sampler.window(a, b)["participants"]["runner"]["cpu_s"] < 0.1
    wide = Sampler([whole])
    assert wide.snapshot().cpu_s["whole"] - b.cpu_s["runner"] >= 0.3


def test_background_sampling_costs_under_one_percent_of_a_core():
    sampler = Sampler([Participant("me", [psutil.Process(os.getppid())]),
                       Participant("self", [psutil.Process()], recursive=False)], period=0.1)
    pause = threading.Event()
    with sampler:
        while len(sampler.timeline()) < 15:
            pause.wait(0.05)
    samples = len(sampler.timeline())
    per_sample = sampler.sampler_cpu_s / samples
    log.info(f"sampler: {per_sample * 1000:.2f} ms CPU per background sample")
    assert per_sample < 0.01 * 0.5  # ≤ 1 % of a core at the default 0.5 s period
    rows = sampler.timeline_rows()
    assert set(rows[0]) == set(TIMELINE_COLUMNS)
    assert {r["participant"] for r in rows} == {"me", "self", "unattributed", "host"}
    assert rows[0]["cpu_s"] == 0 and all(r["t"] >= 0 for r in rows)


def test_groups_sum_their_members_and_names_are_checked():
    me = psutil.Process()
    s = Sampler([Participant("c0", [me], group="consumers", recursive=False),
                 Participant("c1", [], group="consumers")])
    a, b = s.snapshot(), s.snapshot()
    w = s.window(a, b)
    assert w["groups"]["consumers"]["cpu_s"] == w["participants"]["c0"]["cpu_s"]
    with pytest.raises(ValueError):
        Sampler([Participant("x", []), Participant("x", [])])
    with pytest.raises(ValueError):
        Sampler([Participant("x", [])], period=2)


@pytest.fixture
def cgroups():
    """Make test cgroups; afterwards kill what is left in them (our own children), remove them."""
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no writable cgroup v2 mount (needs root)")
    made: list[CpuGroup] = []

    def make(name: str) -> CpuGroup:
        made.append(CpuGroup(mount, name, scope="test-sampler"))
        return made[-1]

    yield make
    for g in made:
        for pid in g.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not g.pids():
                break
            threading.Event().wait(0.05)
        g.remove()
    for path in (mount / PREFIX / "test-sampler", mount / PREFIX):
        with contextlib.suppress(OSError):
            path.rmdir()


def test_cgroup_participant_counts_children_born_and_gone_inside_the_window_within_2_percent(
        burner, cgroups):
    script, report = burner
    root = _start(script, report, "root", 0.5, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    outside_report = report.with_name("outside.txt")
    other: subprocess.Popen | None = None
    try:
        assert root.stdout.readline() == b"ready\n"
        group = cgroups("tree")
        assert group.attach([root.pid]) == 1  # idle until told to go; its children inherit it
        tree = Participant("tree", [psutil.Process(root.pid)], cgroup=group)
        outsider_roots: list[psutil.Process] = []
        outside = Participant("outside", lambda: outsider_roots)  # no cgroup: the tree walk
        with Sampler([tree, outside], period=0.2) as sampler:
            a = sampler.snapshot()
            root.stdin.write(b"g")
            root.stdin.flush()
            other = _start(script, outside_report, "leaf", 0.4,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            outsider_roots.append(psutil.Process(other.pid))
            assert other.stdout.readline() == b"done\n"
            assert root.stdout.readline() == b"done\n"
            b = sampler.snapshot()
            members = sorted(group.pids())
        w = sampler.window(a, b)
        walked = Sampler([Participant("tree", [psutil.Process(root.pid)])]).snapshot()
    finally:
        root.stdin.close()
        root.wait(10)
        if other is not None:
            other.stdin.close()
            other.wait(10)

    got = _reports(report)
    shorts = [v for k, v in got.items() if k.startswith("short-")]
    assert len(shorts) == 3  # two children and one grandchild started and exited in the window
    expected = got["root-end"] - got["root-start"] + sum(shorts) + got["mid"] + got["leaf"]
    measured = w["participants"]["tree"]["cpu_s"]
    log.info(f"cgroup tree: measured {measured:.3f} s, expected {expected:.3f} s, "
             f"error {100 * (measured / expected - 1):+.2f} %")
    assert measured == pytest.approx(expected, rel=0.02), (measured, expected, got)
    outside_expected = _reports(outside_report)["leaf"]
    assert w["participants"]["outside"]["cpu_s"] == pytest.approx(outside_expected, abs=0.03)
    assert len(members) == 3  # root, mid and leaf: live at the end, taken from cgroup.procs
    # the same processes' memory, whether their pids come from the cgroup or from the tree walk
    assert b.rss_mb["tree"] > 5
    assert b.rss_mb["tree"] == pytest.approx(walked.rss_mb["tree"], abs=1.0)


def test_readings_with_only_cgroup_participants_never_list_proc_and_keep_rss(
        burner, cgroups, monkeypatch, caplog):
    script, report = burner
    procs = [_start(script, report, "leaf", 0, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for _ in range(2)]
    try:
        parts = []
        for i, p in enumerate(procs):
            assert p.stdout.readline() == b"done\n"
            g = cgroups(f"idle-{i}")
            g.attach([p.pid])
            parts.append(Participant(f"idle-{i}", [psutil.Process(p.pid)], cgroup=g))
        sampler = Sampler(parts, period=0.05, rss_every=4)
        rss_reads = []
        group_rss = lab.measure.procstat.group_rss_mb

        def counted(pids):
            rss_reads.append(sorted(pids))
            return group_rss(pids)

        def no_listing(*args, **kwargs):
            raise AssertionError("a reading listed a directory")

        monkeypatch.setattr(lab.measure.procstat, "group_rss_mb", counted)
        with monkeypatch.context() as m, caplog.at_level(logging.WARNING, logger="lab.measure.sampler"):
            m.setattr(os, "listdir", no_listing)
            m.setattr(os, "scandir", no_listing)
            a = sampler.snapshot()
            with sampler:
                for _ in range(400):  # a failed reading adds nothing to the timeline
                    if len(sampler.timeline()) >= 11:
                        break
                    threading.Event().wait(0.05)
            b = sampler.snapshot()
        walked = Sampler([Participant(p.name, p.current_roots()) for p in parts]).snapshot()
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(10)

    assert not caplog.records, [r.getMessage() for r in caplog.records]
    background = len(sampler.timeline()) - 2
    assert background >= 9
    # RSS is read at both snapshots and at every 4th background reading, for each participant
    assert len(rss_reads) == 2 * (2 + (background + 3) // 4)
    assert all(pids in ([p.pid] for p in procs) for pids in rss_reads)
    for snap in sampler.timeline():
        for p in parts:  # reported at every reading, carried in between
            assert snap.rss_mb[p.name] > 5
            assert snap.rss_mb[p.name] == pytest.approx(walked.rss_mb[p.name], abs=1.0)
    assert sampler.window(a, b)["participants"]["idle-0"]["cpu_s"] < 0.05  # idle processes


def test_a_root_outside_its_cgroup_is_logged_at_snapshots(cgroups, caplog):
    group = cgroups("empty")
    me = psutil.Process()
    sampler = Sampler([Participant("lost", [me], cgroup=group)])
    with caplog.at_level(logging.WARNING, logger="lab.measure.sampler"):
        s1, s2 = sampler.snapshot(), sampler.snapshot()
    assert [r.getMessage() for r in caplog.records] == [
        f"participant lost: root pid {me.pid} is not in its cgroup {group.path}; "
        "its CPU is not counted"]  # once, not at every snapshot
    assert s1.cpu_s["lost"] == s2.cpu_s["lost"] == 0 and s1.rss_mb["lost"] == 0
