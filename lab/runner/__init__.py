"""One measured run, phase by phase.

set-up (web service, reset, the pipeline's transport, senders at their gate, consumers, the
pipeline's helpers, readiness gates, CDC source) → the windows open → drain → the consumers stop →
the windows close → what is read before any slot is dropped → verify → cleanup → ``CHECKPOINT`` +
cooldown → the record. Every process that does work is a participant of the CPU metric: the
stack's services, ``web``, ``senders``, each consumer, the pipeline's helpers (``relay``), and this
runner process itself (its own CPU only, never its children's).

The run is a failure, stored with its error, when anything in the Success predicate of
the reference study does not hold: no send failed, sent = processed = distinct claimed ids =
work calls = distinct work ids = messages, and the set of worked (for ``inbox``: claimed) ids equals
the set of ids in ``messages`` (:func:`lab.workload.inbox.id_sets`). With a fault (``Scenario.fault``,
injected during the drain by :mod:`lab.runner.fault_driver`, the kinds in :mod:`lab.faults`) the predicate
becomes at-least-once, proven by :mod:`lab.runner.accounting`. Both are :func:`lab.runner.verdict.judge`,
where they are spelled out.

The shape (docs/architecture.md): :class:`Run` holds the run's immutable environment
(:class:`~lab.runner.environment.RunEnv`), the one owner of its processes
(:class:`~lab.runner.processes.RunProcesses`), the observer of its drain (the fault, the staircase
or the plain run: :mod:`lab.runner.drain`), its measurement windows (:mod:`lab.runner.windows`)
and its disk guard; each phase (:mod:`lab.runner.phases`) returns a frozen value
(:mod:`lab.runner.values`) that :meth:`Run.execute` passes on to the next and to the record
(:mod:`lab.runner.readings`). The verdict (:mod:`lab.runner.verdict`) and run.json's content
(:mod:`lab.runner.assembly`) are pure functions of that record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from lab import pipelines
from lab.faults import check as check_fault
from lab.measure.decoders import DecodeOnly
from lab.measure.disk import DiskGuard, DiskGuardTripped, Limits
from lab.measure.preflight import check_clean
from lab.results import write_run
from lab.runner.assembly import assemble
from lab.runner.drain import Drain, Observer, PlainRun, Staircase
from lab.runner.environment import Progress, RunEnv
from lab.runner.fault_driver import FaultInjector
from lab.runner.phases import check, checkpoint_and_cool, set_up, settle
from lab.runner.processes import RunError, RunProcesses
from lab.runner.readings import interpolate, record
from lab.runner.values import Checked, Drained, Finished, Settled, Stopped
from lab.runner.windows import Windows
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack import get_stack
from lab.stack.hosts import require_routed
from lab.stack.postgres import server_settings
from lab.stack.proc import Interrupted, exclusive

__all__ = ["Progress", "Run", "RunError", "interpolate", "run_scenario"]
log = logging.getLogger(__name__)


def observer_for(env: RunEnv, procs: RunProcesses) -> Observer:
    """The observer of the run's drain: its fault, its staircase, or the plain run."""
    if env.scenario.fault:
        return FaultInjector(env, procs)
    return Staircase(env) if env.scenario.rate_steps else PlainRun()


class Run:
    """One run: its environment, the one owner of its processes, the observer of its drain, its
    windows and its disk guard; :meth:`execute` is the study's steps in order. Use :func:`run_scenario`."""

    def __init__(self, env: RunEnv, idle: dict[str, Any] | None = None) -> None:
        self.env = env
        self.idle = idle  # the series' idle baseline (lab.measure.idle), if one was measured
        self.procs = RunProcesses(env)
        self.observer = observer_for(env, self.procs)
        self.windows = Windows(env)
        self.decode_only = DecodeOnly(env.settings.pg_dsn, env.scenario.decode_slots)
        st = env.settings
        self.guard = DiskGuard(st.pg_dsn, Limits(st.max_retained_wal, st.min_free_disk),
                               {"LAB_STACK_DIR": st.stack_dir, "LAB_DATA_DIR": st.data_dir},
                               pg_local=st.backend == "native", on_trip=self._guard_tripped)
        self.interrupted: str | None = None  # the signal that ended the run early (SIGTERM, SIGINT)

    async def execute(self) -> Finished:
        """Every phase in order, each one's result passed on; a failure is caught, cleaned up after
        and stored as the error."""
        env, procs, windows, observer = self.env, self.procs, self.windows, self.observer
        started_at = datetime.now(UTC).isoformat()
        drained: Drained | None = None
        stopped: Stopped | None = None
        settled: Settled | None = None
        checked: Checked | None = None
        error: str | None = None
        self.guard.start(asyncio.get_running_loop())
        try:
            await set_up(env, procs, observer, self.decode_only)
            self.guard.check()  # tripped during the set-up: no window
            await windows.open(procs.participants())
            drained = await Drain(env, procs, self.guard, observer).run(windows)
            await windows.observe()  # before the consumers exit
            stopped = await procs.stop()
            await windows.close()
            settled = await settle(env, windows)
            checked = await check(env, procs, observer, drained.sent)
            self.guard.check()
        except Exception as exc:
            error = self._failure(exc)
        except asyncio.CancelledError as exc:  # a signal (lab.stack.proc.run_interruptible): clean up, store
            error = self._interrupted(exc)
        finally:
            left = await self._cleanup()
        if self.interrupted is None:
            await checkpoint_and_cool(env)
        return record(env, started_at=started_at, error=error, drained=drained, stopped=stopped or left,
                      settled=settled, checked=checked, windows=windows, guard=self.guard, observer=observer,
                      idle=self.idle, interrupted=self.interrupted)

    def _failure(self, exc: Exception) -> str:
        """The run's error, on one line: the disk guard's if it tripped, with why a link delay was
        lost if it was (a stalled drain because the delayer died, say)."""
        error = f"{type(exc).__name__}: {exc}"
        if self.guard.tripped is not None:  # whichever check saw it first: the guard's line
            error = f"{DiskGuardTripped.__name__}: {self.guard.tripped['error']}"
        lost = self.windows.lost_delay()
        if lost and lost not in error:
            error = f"{error}; {lost}"
        log.error("run %s failed: %s", self.env.run_id, " ".join(error.split()))  # one line; -v: the traceback
        log.info("run %s failed", self.env.run_id, exc_info=True)
        return error

    def _interrupted(self, exc: asyncio.CancelledError) -> str:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        self.interrupted = str(exc.args[0]) if exc.args else "cancelled"
        return f"interrupted by {self.interrupted}"

    async def _cleanup(self) -> Stopped:
        """Whatever happened, never raising: the windows end, the observer restores what it holds
        before anything stops (a stopped consumer would ignore its SIGTERM), every process of the
        run stops, the decode-only slots go, and the observer undoes what it did last (nothing of
        the run may still use a promoted standby). What the helpers left, if they still ran."""
        await self.windows.end()
        self.guard.stop()
        self.procs.go_home()
        self.observer.restore()
        left = await self.procs.cleanup()
        with contextlib.suppress(Exception):
            await self.decode_only.stop()
        await self.observer.undo()
        return left

    def _guard_tripped(self, tripped: dict[str, Any]) -> None:
        """The disk guard tripped (:mod:`lab.measure.disk`): the load ends now (it is what writes the
        WAL), and the fault's too; the run fails at its next check, through the normal cleanup."""
        senders = self.procs.kill_senders()
        if senders is not None:
            log.warning("run %s: senders killed by the disk guard", self.env.run_id)
        self.observer.guard_tripped(tripped, senders)


async def run_scenario(
    scenario: Scenario, settings: Settings, *, progress: Progress | None = None,
    meta: dict[str, Any] | None = None, idle: dict[str, Any] | None = None,
    capture: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Execute one run on the configured stack (``LAB_BACKEND``), store it under data/runs/, return run.json's content.

    ``meta``: extra top-level fields stored with the run (e.g. ``series_id``, ``series_index``).
    ``idle``: an idle baseline (:func:`lab.measure.idle.measure_idle`); the run then stores its cost
    without it (``idle``).
    ``capture``: called with the run's record (:mod:`lab.runner.assembly`), e.g. to store it as a test
    fixture (``tests/unit/runner/fixtures/capture.py``).
    """
    pipelines.check(scenario)  # a pipeline that is not registered, or does not take this scenario
    check_fault(scenario, settings)  # a fault that does not apply here: refused before the stack starts
    # the host layout's addresses lead off the machine while it is not up: refused before anything
    # connects (the CLI checks it too; a notebook or a script calling this does not pass there)
    await asyncio.to_thread(require_routed, settings)
    stack = get_stack(settings)
    with exclusive(settings.run_lock, "the stack", settings.lock_owner):
        await asyncio.to_thread(stack.up)
        await asyncio.to_thread(check_clean, settings, stack)
        server = await asyncio.to_thread(_server_settings, settings)
        env = RunEnv.create(scenario, settings, stack, progress or (lambda phase, info: None))
        finished = await Run(env, idle=idle).execute()
    if capture is not None:
        capture(finished.record)
    result = assemble(finished.record)
    result.update(meta or {})
    result["server_settings"] = server  # as in force at the start (a fault may change one during the run)
    if finished.interrupted is not None:
        result["interrupted"] = finished.interrupted
    path = write_run(result, finished.samples, settings=settings)
    if finished.interrupted is not None:
        raise Interrupted(finished.interrupted, f"run {result['run_id']} stored, marked interrupted ({path})")
    return result


def _server_settings(settings: Settings) -> dict[str, str] | None:
    try:
        return server_settings(settings.pg_primary_dsn)
    except Exception as exc:  # recorded as unknown: a reading never fails a run
        log.warning("could not read the server settings: %s", exc)
        return None
