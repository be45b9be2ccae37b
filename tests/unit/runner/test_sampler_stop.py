"""A fault run's samplers end even when one swallowed its cancel (Python 3.11's wait_for can)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from lab.runner import fault_sampling as faults
from lab.runner.fault_sampling import FaultSampling


def _injector() -> FaultSampling:
    inj = FaultSampling.__new__(FaultSampling)  # the samplers' stop needs no run
    inj.sampling = True
    return inj


async def _swallows_cancels(inj: FaultSampling, hold: list[bool]) -> None:
    while inj.sampling or hold[0]:
        with contextlib.suppress(asyncio.CancelledError):  # a wait_for completing as the cancel arrives (3.11)
            await asyncio.sleep(0.02)


def test_a_sampler_that_swallowed_its_cancel_stops_on_the_flag() -> None:
    async def main() -> float:
        inj = _injector()
        inj._tasks = [asyncio.create_task(_swallows_cancels(inj, [False]))]
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await inj.stop()
        assert inj._tasks[0].done() and not inj.sampling
        return time.monotonic() - t0

    assert asyncio.run(main()) < faults.SAMPLER_STOP_S / 2


def test_one_that_ignores_everything_is_left_behind_after_the_bound(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(faults, "SAMPLER_STOP_S", 0.3)

    async def main() -> None:
        inj = _injector()
        hold = [True]  # ignores the flag and every cancel until the test lets it go
        stuck = asyncio.create_task(_swallows_cancels(inj, hold), name="fault-stuck")
        inj._tasks = [stuck]
        await asyncio.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="lab.runner.fault_sampling"):
            await asyncio.wait_for(inj.stop(), 5)  # returns: the run goes on
        assert not stuck.done()
        hold[0] = False
        await stuck

    asyncio.run(main())
    assert "sampler fault-stuck did not stop within 0 s" in caplog.text
