"""A stopped process is always continued: when the stop ends, when its task is cancelled, and by
``restore`` (the runner's cleanup). Real processes (``sleep``), real signals."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from lab.faults.supervision import supervise
from lab.measure.disk import Limits, Reading, SlotReading, trip
from lab.pipelines import Capabilities
from lab.runner.fault_driver import FaultInjector
from lab.runner.processes import RunProcesses
from lab.scenario import Scenario


def _sleepers(n: int) -> list[psutil.Popen]:
    return [psutil.Popen(["sleep", "60"], stdout=subprocess.DEVNULL) for _ in range(n)]


def _status(p: psutil.Process) -> str:
    deadline = time.monotonic() + 2
    while True:  # the kernel applies a signal asynchronously
        st = p.status()
        if st != psutil.STATUS_STOPPED or time.monotonic() > deadline:
            return st
        time.sleep(0.01)


@pytest.fixture
def procs() -> list[psutil.Popen]:
    ps = _sleepers(2)
    yield ps
    for p in ps:
        p.kill()
        p.wait()


def _run(consumers: list[psutil.Popen], scenario: Scenario, scratch: Path | None = None,
         spawn: Callable[[list[int]], psutil.Popen] | None = None) -> tuple[FaultInjector, RunProcesses]:
    """A fault injector over the run's processes, with ``consumers`` as its consumers (no stack)."""
    settings = SimpleNamespace(max_retained_wal=1000, stack_dir=(scratch or Path("/nonexistent")) / "stack")
    env = SimpleNamespace(scenario=scenario, settings=settings, stack=None, scratch=scratch,
                          pipeline=SimpleNamespace(capabilities=Capabilities()))
    procs = RunProcesses(env)  # type: ignore[arg-type]
    procs._consumers = list(consumers)
    if spawn is not None:
        procs.spawn_consumer = spawn  # type: ignore[method-assign]
    inj = FaultInjector(env, procs)  # type: ignore[arg-type]
    inj.state.start(time.monotonic())
    return inj, procs


def _injector(procs: list[psutil.Popen], fault: str) -> FaultInjector:
    return _run(procs, Scenario(consumers=len(procs), fault=fault))[0]


def test_stop_then_continue(procs: list[psutil.Popen]) -> None:
    inj = _injector(procs, "sink-outage@0s+200ms")

    async def go() -> None:
        task = asyncio.create_task(inj.fault.inject(inj.ctx))
        await asyncio.sleep(0.05)
        assert all(p.status() == psutil.STATUS_STOPPED for p in procs)
        assert len(inj.state.stopped) == 2
        await task

    asyncio.run(go())
    assert all(_status(p) != psutil.STATUS_STOPPED for p in procs)
    assert not inj.state.stopped and [e["what"] for e in inj.events] == ["stop", "resume"]


def test_cancelled_stop_continues(procs: list[psutil.Popen]) -> None:
    inj = _injector(procs, "consumer-dead:1@0s+60s")

    async def go() -> None:
        task = asyncio.create_task(inj.fault.inject(inj.ctx))
        await asyncio.sleep(0.05)
        assert procs[1].status() == psutil.STATUS_STOPPED
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert _status(procs[1]) != psutil.STATUS_STOPPED and not inj.state.stopped


def test_restore_continues_what_is_still_stopped(procs: list[psutil.Popen]) -> None:
    inj = _injector(procs, "sink-outage@0s+60s")
    for p in procs:  # as if the loop died before the injection's own finally could run
        p.send_signal(signal.SIGSTOP)
        inj.state.stopped.append(p)
    inj.restore()
    assert all(_status(p) != psutil.STATUS_STOPPED for p in procs) and not inj.state.stopped
    assert inj.events[-1]["what"] == "continued by cleanup"
    assert inj.events[-1]["pids"] == [p.pid for p in procs]


def test_the_disk_guard_ends_the_fault_and_continues_the_stopped(procs: list[psutil.Popen]) -> None:
    """A disk guard trip during a fault (lab.measure.disk decides it) cancels the injection, continues
    the stopped consumer, and the run's next check fails with the guard's line."""
    inj = _injector(procs, "consumer-dead:1@0s+600s")
    hit = trip(Reading(4.0, (SlotReading("s1", "logical", 940),)), Reading(3.0, (SlotReading("s1", "logical", 900),)),
               Limits(max_retained_wal=1000, min_free_disk=1))
    assert hit is not None

    async def go() -> None:
        task = asyncio.create_task(inj.fault.inject(inj.ctx))
        inj._inject = task
        await asyncio.sleep(0.05)
        assert procs[1].status() == psutil.STATUS_STOPPED
        inj.check()  # nothing tripped yet
        inj.guard_tripped(hit, 4242)  # the runner killed the senders, pid 4242
        inj.guard_tripped({**hit, "error": "a second trip is ignored"}, None)
        assert inj._guard_task is not None
        await inj._guard_task
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert _status(procs[1]) != psutil.STATUS_STOPPED and not inj.state.stopped
    assert inj.samplers.guard is hit
    with pytest.raises(Exception, match="disk guard: slot s1 retains 940 bytes"):
        inj.check()
    events = [e["what"] for e in inj.events]
    assert events[0] == "stop" and "disk guard" in events and "continued by the disk guard" in events
    assert events.index("disk guard") < events.index("senders killed by the disk guard")
    assert next(e for e in inj.events if e["what"] == "senders killed by the disk guard")["pid"] == 4242
    assert next(e for e in inj.events if e["what"] == "disk guard")["slot"] == "s1"


def test_a_restart_replaces_every_exited_consumer_side_by_side(tmp_path: object) -> None:
    """After a PostgreSQL restart every consumer exits; a wal-sharded replacement is only ready once
    all N have joined again, so the supervision must not wait for one before starting the next."""
    scratch = Path(str(tmp_path))
    n = 3
    exited = [psutil.Popen(["true"]) for _ in range(n)]
    for p in exited:
        p.wait()
    spawned: list[psutil.Popen] = []

    def spawn_consumer(indexes: list[int]) -> psutil.Popen:
        p = psutil.Popen(["sleep", "60"], stdout=subprocess.DEVNULL)
        spawned.append(p)
        if len(spawned) == n:  # ready only once all N are up, as a wal-sharded reader
            for i in range(n):
                (scratch / f"consumer-{i}.ready").write_text("{}")
        return p

    inj, procs = _run(exited, Scenario(consumers=n, fault="postgres-restart@0s", ready_timeout_s=5), scratch,
                      spawn_consumer)

    async def go() -> None:
        supervise(inj.ctx)
        task = inj.state.helpers[0]
        deadline = time.monotonic() + 4
        while sum(e["what"] == "replacement ready" for e in inj.events) < n:
            assert time.monotonic() < deadline, [e["what"] for e in inj.events]
            assert not task.done(), task.exception()
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(go())
        whats = [e["what"] for e in inj.events]
        assert whats.count("consumer exited") == whats.count("replacement started") == n
        assert [procs.consumer(i) for i in range(n)] == spawned and not any(procs.replacing(i) for i in range(n))
    finally:
        for p in spawned:
            p.kill()
            p.wait()


def test_consumers_a_supervised_stop_ended_after_the_drain_are_ended_not_failed(tmp_path: object) -> None:
    """A broker's stop that outlasts the messages: the drain is complete before the supervision saw
    the consumers whose connection broke. They are recorded and ended by the fault, once."""
    from lab.runner.verdict import consumer_errors

    scratch = Path(str(tmp_path))
    alive = psutil.Popen(["sleep", "60"], stdout=subprocess.DEVNULL)
    dead = psutil.Popen(["true"])
    dead.wait()
    error = "ConnectionError: AMQP channel to load-dbz-quorum closed"
    (scratch / "consumer-1.json").write_text(f'{{"error": "{error}"}}')
    try:
        inj, procs = _run([alive, dead], Scenario(consumers=2, pipeline="rabbitmq", fault="broker-restart@3s+2s"),
                          scratch)
        assert inj.exited_unreplaced() == []  # no supervision: an exit stays the run's failure
        inj.state.supervising = True
        assert inj.exited_unreplaced() == [1]
        assert procs.exited() == []  # ended by the fault: no failure of the run's
        exits = [e for e in inj.state.events if e["what"] == "consumer exited"]
        assert len(exits) == 1 and exits[0]["consumer"] == 1 and exits[0]["error"] == error
        assert exits[0]["replaced"] is False
        assert inj.exited_unreplaced() == []  # recorded once
        results = [{"index": 0, "error": None}, {"index": 1, "error": error}]
        procs.check_alive()  # the ended one is no failure
        assert consumer_errors(results, [1]) == []
        assert consumer_errors(results) == [f"consumer 1: {error}"]
    finally:
        alive.kill()
        alive.wait()
