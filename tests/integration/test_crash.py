"""A crash leaves nothing that can bill or break the next run.

SIGKILL of a `lab run` in the middle of its drain (kafka, then wal): the run's processes die
with it; `lab stack down` then leaves no process of this stack, and after `lab stack up` there
is no replication slot and no advisory lock; the next run succeeds and none of its participant
cgroups ever holds a process of the killed run. Also: a run refuses to start next to a process
holding its port, and an in-process run gives the calling process back its own cgroup.

The test stops and restarts the session's stack (`lab stack down` / `up`), which leaves it
usable for the tests after it: every service is found again by its pid file.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lab.measure import cgroups
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.proc import same_process, start_ticks
from tests.conftest import lab_env
from tests.integration.checks import scalar

pytestmark = pytest.mark.integration
LAB = [sys.executable, "-m", "lab"]
Ident = tuple[int, int]  # pid, start ticks: a process, even after its pid is reused


def lab(settings: Settings, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAB, *args], env=lab_env(settings), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _ident(p: psutil.Process) -> Ident | None:
    ticks = start_ticks(p.pid)
    return None if ticks is None else (p.pid, ticks)


def _alive(idents: set[Ident]) -> set[Ident]:
    return {i for i in idents if same_process({"pid": i[0], "start_ticks": i[1]}) is not None}


def _stack_processes(settings: Settings) -> list[str]:
    """Live processes of this stack: those naming its stack dir or run with it as LAB_STACK_DIR."""
    here, out = str(settings.stack_dir), []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if p.pid != psutil.Process().pid and (
                f"{here}/" in cmd or cmd.endswith(here) or p.environ().get("LAB_STACK_DIR") == here
            ):
                out.append(f"{p.pid} {cmd[:120]}")
        except psutil.Error:
            continue
    return out


def _group_members(settings: Settings) -> set[Ident]:
    mount = cgroups.cgroup2_mount()
    base = mount / cgroups.PREFIX / cgroups.cgroup_scope(settings) if mount else None
    members: set[Ident] = set()
    for procs in base.glob("*/cgroup.procs") if base is not None and base.exists() else []:
        try:
            pids = [int(x) for x in procs.read_text().split()]
        except OSError:
            continue
        for pid in pids:
            ticks = start_ticks(pid)
            if ticks is not None:  # else it exited meanwhile
                members.add((pid, ticks))
    return members


def _latest_run_dir(settings: Settings, before: set[Path]) -> Path | None:
    runs = settings.stack_dir / "runs"
    new = sorted(set(runs.glob("*")) - before) if runs.exists() else []
    return new[-1] if new else None


def _start_run(settings: Settings, pipeline: str, messages: int) -> subprocess.Popen[str]:
    argv = [*LAB, "run", "--pipeline", pipeline, "--consumers", "2", "--messages", str(messages),
            "--cooldown-s", "0", "--json"]
    return subprocess.Popen(argv, env=lab_env(settings), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("pipeline", [pytest.param("kafka", marks=pytest.mark.matrix), "wal"])
def test_sigkill_of_the_runner_leaves_nothing(stack: object, settings: Settings, pipeline: str) -> None:
    runs = settings.stack_dir / "runs"
    before = set(runs.glob("*")) if runs.exists() else set()
    runner = _start_run(settings, pipeline, 400_000)  # far more than it can send before the kill
    deadline = time.monotonic() + 240
    run_dir = None
    while run_dir is None or not (run_dir / "start").exists():  # the senders' gate: the drain
        assert runner.poll() is None, runner.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the run never reached its drain"
        time.sleep(0.2)
        run_dir = _latest_run_dir(settings, before)
    time.sleep(2.0)  # in the middle of the drain
    me = psutil.Process(runner.pid)
    killed = {i for i in map(_ident, [me, *me.children(recursive=True)]) if i is not None}
    dbz = [p for d in stack.debezium.values() for p in d.processes()]  # type: ignore[attr-defined]
    killed |= {i for i in map(_ident, dbz) if i is not None}
    assert len(killed) >= 5 + (pipeline == "kafka")  # runner, web, senders, 2 consumers (+ Debezium)
    runner.send_signal(signal.SIGKILL)
    runner.communicate(timeout=30)

    t0 = time.monotonic()
    while _alive(killed) and time.monotonic() - t0 < 15:  # parent-death signal: at once
        time.sleep(0.1)
    died_in = time.monotonic() - t0
    assert not _alive(killed), "a process of the killed run outlived it"

    t0 = time.monotonic()
    down = lab(settings, "stack", "down")
    down_s = time.monotonic() - t0
    assert down.returncode == 0, down.stderr
    assert _stack_processes(settings) == []
    assert cgroups.occupant(settings, services=()) is None

    up = lab(settings, "stack", "up")
    assert up.returncode == 0, up.stderr
    assert scalar(settings, "SELECT count(*) FROM pg_replication_slots") == 0
    assert scalar(settings, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0

    nxt = _start_run(settings, pipeline, 2000)
    seen: set[Ident] = set()
    while nxt.poll() is None:
        seen |= _group_members(settings)
        time.sleep(0.2)
    out, err = nxt.communicate()
    assert nxt.returncode == 0, err[-2000:]
    result = json.loads(out)
    assert result["success"], result["error"]
    assert seen and not (seen & killed)
    sys.stderr.write(f"\n[crash {pipeline}] killed {len(killed)} processes; all gone after "
                     f"{died_in:.1f} s; `lab stack down` {down_s:.1f} s; next run ok, "
                     f"{len(seen)} participant processes, none of the killed run\n")


def test_a_run_refuses_a_taken_port(stack: object, settings: Settings) -> None:
    squatter = subprocess.Popen([sys.executable, "-c", (
        "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('127.0.0.1', {settings.web_port})); s.listen(); time.sleep(120)")])
    try:
        deadline = time.monotonic() + 10
        while not any(c.laddr.port == settings.web_port for c in psutil.net_connections("tcp")
                      if c.status == psutil.CONN_LISTEN):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        t0 = time.monotonic()
        res = lab(settings, "run", "--pipeline", "wal", "--messages", "100", "--cooldown-s", "0", "--json")
        assert res.returncode == 2
        assert f"pid {squatter.pid}" in res.stderr and len(res.stderr.strip().splitlines()) == 1
        assert time.monotonic() - t0 < 60
    finally:
        squatter.kill()
        squatter.wait()


def test_the_caller_keeps_its_cgroup(stack: object, settings: Settings) -> None:
    home = cgroups.current()
    r = asyncio.run(run_scenario(Scenario(pipeline="wal", consumers=1, messages=500, cooldown_s=0),
                                 settings))
    assert r["success"], r["error"]
    assert r["cpu_s"]["runner"] > 0  # measured in its group during the window
    assert cgroups.current() == home
