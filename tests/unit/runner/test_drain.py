"""When a drain is over, as the observers of a run decide it (pure predicates over the web service's
counts and the senders' result), and the run's steps reading as one short method."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace

from lab.pipelines import Capabilities
from lab.runner import Run
from lab.runner.drain import PlainRun
from lab.runner.fault_driver import QUIET_S, FaultInjector
from lab.scenario import Scenario
from lab.settings import Settings

SENT = {"sent": 10, "send_failed": 0}


def test_a_plain_run_is_drained_once_every_sent_message_had_its_work_call() -> None:
    plain = PlainRun()
    assert plain.drained(0.0, {"calls": 10, "distinct": 10}, SENT, True, 0.0)
    assert not plain.drained(0.0, {"calls": 9, "distinct": 9}, SENT, True, 0.0)
    assert not plain.drained(0.0, {"calls": 10, "distinct": 10}, SENT, False, 0.0)  # senders not done
    assert not plain.supervises(0) and plain.blocks({}, None, None, None) == {}


def _fault_run(fault: str, redelivery_s: float = 0.0) -> FaultInjector:
    env = SimpleNamespace(scenario=Scenario(consumers=2, fault=fault), settings=Settings(), stack=None, run_id="r",
                          pipeline=SimpleNamespace(capabilities=Capabilities(redelivery_s=redelivery_s)))
    return FaultInjector(env, None)  # type: ignore[arg-type]


def _over(inj: FaultInjector, at: float) -> None:
    """As if the injection had run and ended at monotonic ``at``."""
    loop = asyncio.new_event_loop()
    done = loop.create_future()
    done.set_result(None)
    inj.injected, inj._inject, inj.over_mono = True, done, at  # type: ignore[assignment]
    loop.close()


def test_a_fault_run_counts_distinct_ids_and_waits_for_the_rows_it_writes() -> None:
    inj = _fault_run("big-transaction=2@1s")
    stats = {"calls": 14, "distinct": 12}  # repeated calls: the distinct ids count
    assert not inj.drained(5.0, stats, SENT, True, 5.0)  # its rows are not known before it ended
    _over(inj, 4.0)
    inj.fault.ids = [101, 102]  # type: ignore[attr-defined]
    assert inj.drained(5.0, stats, SENT, True, 5.0)
    assert not inj.drained(5.0, {"calls": 14, "distinct": 11}, SENT, True, 5.0)


def test_a_fault_run_that_lost_messages_is_drained_after_its_quiet_time() -> None:
    inj = _fault_run("consumer-kill:1@1s")
    short = {"calls": 9, "distinct": 9}
    assert not inj.drained(1000.0, short, SENT, True, 0.0)  # not injected yet: nothing is lost
    _over(inj, 10.0)
    assert not inj.drained(10.0 + QUIET_S - 1, short, SENT, True, 0.0)
    assert inj.drained(10.0 + QUIET_S + 1, short, SENT, True, 0.0)  # quiet since the fault's end
    assert not inj.drained(10.0 + QUIET_S + 1, short, SENT, True, 20.0)  # a work call 20 s in
    assert not inj.drained(10.0 + QUIET_S + 1, short, SENT, False, 0.0)  # the senders still send
    held = _fault_run("consumer-kill:1@1s", redelivery_s=30.0)  # a share group's locked records
    _over(held, 10.0)
    assert not held.drained(10.0 + QUIET_S + 1, short, SENT, True, 0.0)
    assert held.drained(10.0 + QUIET_S + 31, short, SENT, True, 0.0)


def test_the_run_reads_as_its_steps() -> None:
    lines = inspect.getsource(Run.execute).rstrip().splitlines()
    assert len(lines) <= 40, len(lines)
    assert "is None" not in "".join(lines).replace("self.interrupted is None", "")  # no mode branches
