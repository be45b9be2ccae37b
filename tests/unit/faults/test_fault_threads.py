"""A cancelled injection's thread (a service still stopping, a Debezium still starting) ends before
the cleanup restores what the fault holds: never a start racing the fault's own stop."""

from __future__ import annotations

import asyncio
import time

from lab.faults.base import FaultState


class Control:
    """The two members of the stack's service control that the cleanup calls."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def stop_service(self, name: str) -> None:
        self.log.append(f"cleanup stop {name}")

    def start_service(self, name: str) -> None:
        self.log.append(f"cleanup start {name}")


def test_the_cleanup_waits_for_the_thread_of_a_cancelled_injection() -> None:
    log: list[str] = []
    state = FaultState()
    state.down.append("kafka")

    def slow_stop(name: str) -> None:  # what the injection runs off the loop
        time.sleep(0.3)
        log.append(f"injection stopped {name}")

    async def run() -> None:
        task = asyncio.ensure_future(state.off_loop(slow_stop, "kafka"))
        await asyncio.sleep(0.05)
        task.cancel()  # the run ends early: the task is cancelled, its thread is not
        await asyncio.gather(task, return_exceptions=True)
        assert log == []  # still stopping
        state.start_down(Control(log))  # blocks until the thread is over

    asyncio.run(run())
    assert log == ["injection stopped kafka", "cleanup stop kafka", "cleanup start kafka"]
    assert state.down == [] and state.join_threads(0) == 0


def test_a_thread_that_never_ends_is_waited_for_a_bounded_time() -> None:
    import threading

    state = FaultState()
    never = threading.Event()
    state.threads.append(never)
    t0 = time.monotonic()
    assert state.join_threads(0.2) == 1
    assert time.monotonic() - t0 < 2
