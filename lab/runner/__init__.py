"""One measured run, phase by phase.

reset → web service → consumers → the pipeline's helpers → readiness gates → CDC source → senders (gate) → window →
drain → verify → teardown → ``CHECKPOINT`` + cooldown → result. Every process that does
work is a participant of the CPU metric: the stack's services, ``web``, ``senders``, each
consumer, the pipeline's helpers (``relay``), and this runner process itself (its own CPU only, never its children's).

The run is a failure, stored with its error, when anything in the Success predicate of
the reference study does not hold: no send failed, sent = processed = distinct claimed ids =
work calls = distinct work ids = messages, and the set of worked (for ``inbox``: claimed) ids equals
the set of ids in ``messages`` (:func:`lab.workload.inbox.id_sets`). With a fault (``Scenario.fault``,
injected during the drain by :mod:`lab.runner.fault_driver`, the kinds in :mod:`lab.faults`) the predicate
becomes at-least-once, proven by :mod:`lab.runner.accounting`. Both are :func:`lab.runner.verdict.judge`,
where they are spelled out.

The phases live beside this module: :mod:`lab.runner.processes` (the run's own processes),
:mod:`lab.runner.phases` (reset, drain, verify, readings), :mod:`lab.runner.readings` (what the run
read at its end, as one record). The verdict (:mod:`lab.runner.verdict`) and run.json's content
(:mod:`lab.runner.assembly`) are pure functions of that record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import psutil

from lab.faults import check as check_fault
from lab.measure import cgroups, decoders, diskio
from lab.measure.cgroups import choose_cpu_method
from lab.measure.disk import DiskGuard, DiskGuardTripped, Limits
from lab.measure.network import NetWindow
from lab.measure.preflight import check_clean
from lab.measure.provenance import HostWindow
from lab.measure.sampler import Sampler, Snapshot
from lab.measure.vacuum import AutovacuumWatch
from lab.measure.walstats import WalWindow
from lab.pipelines import PIPELINES
from lab.pipelines import check as check_pipeline
from lab.results import new_run_id, write_run
from lab.runner.assembly import assemble
from lab.runner.context import Progress, RunContext
from lab.runner.fault_driver import FaultInjector
from lab.runner.phases import RunPhases
from lab.runner.processes import RunError, RunProcesses
from lab.runner.readings import RunReadings, interpolate
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack import get_stack
from lab.stack.base import Stack
from lab.stack.hosts import require_routed
from lab.stack.postgres import server_settings
from lab.stack.proc import Interrupted, exclusive, tied

__all__ = ["Progress", "Run", "RunError", "interpolate", "run_scenario"]
log = logging.getLogger(__name__)


class Run(RunContext):
    """One run: its state (:class:`~lab.runner.context.RunContext`) and its phases in order
    (:meth:`execute`), each done by one of its parts over that state: :attr:`processes`,
    :attr:`phases`, :attr:`readings`. Use :func:`run_scenario`."""

    def __init__(self, scenario: Scenario, settings: Settings, stack: Stack, progress: Progress,
                 idle: dict[str, Any] | None = None) -> None:
        self.scenario = scenario
        self.idle = idle  # the series' idle baseline (lab.measure.idle), if one was measured
        self.slot_stats: dict[str, dict[str, Any]] = {}
        self.settings = settings
        self.stack = stack
        self.progress = progress
        self.run_id = new_run_id(scenario.pipeline, scenario.consumers)
        self.scratch = settings.stack_dir / "runs" / self.run_id
        self.pipeline = PIPELINES[scenario.pipeline](scenario, settings, stack)
        self.procs: dict[str, psutil.Popen] = {}
        self.consumers: list[psutil.Popen] = []
        self.edges: dict[str, Snapshot] = {}
        self._http: aiohttp.ClientSession | None = None
        self.samples: list[dict[str, Any]] = []
        self.latency_ms: dict[str, Any] | None = None  # lab.measure.latency.summarize of this run
        self.latency_from_due_ms: dict[str, Any] | None = None  # open loop only
        self.home_cgroup = cgroups.current()  # the runner is lent to its group, then moved back
        self.cpu_method = choose_cpu_method(settings.cpu_method)  # lab.measure.provenance
        self.host_window = HostWindow()
        self.net_window = NetWindow(settings) if settings.netns else None  # bytes per hop (lab.measure.network)
        self.disk_window: diskio.DiskWindow | None = None  # disk bytes per participant (lab.measure.diskio)
        self.wal_window = WalWindow(settings.pg_dsn)  # WAL generated (lab.measure.walstats)
        self.respawning: set[int] = set()  # consumers being replaced (consumer-kill)
        self.ended: set[int] = set()  # consumers a fault ended for good (slot-invalidation)
        self.injector = FaultInjector(self) if scenario.fault else None
        self.accounting: dict[str, Any] | None = None  # fault runs: lab.runner.accounting
        self.stair_data: dict[str, Any] | None = None  # staircase: created_at and arrivals (measure_latency)
        self.stair_stop: dict[str, Any] | None = None  # staircase: why the runner stopped it early
        self.pg_edges: dict[str, dict[int, Any]] = {}
        self.vacuum_watch: AutovacuumWatch | None = None
        self.vacuum: dict[str, Any] | None = None
        self.decoders = decoders.DecodeOnly(settings.pg_dsn, scenario.decode_slots)
        self.flow: tuple[list[float], list[float]] | None = None  # inserts and work calls (measure_latency)
        self.interrupted: str | None = None  # the signal that ended the run early (SIGTERM, SIGINT)
        self.service_cgroups: dict[str, Any] = {}
        self.disk_guard = DiskGuard(
            settings.pg_dsn, Limits(settings.max_retained_wal, settings.min_free_disk),
            {"LAB_STACK_DIR": settings.stack_dir, "LAB_DATA_DIR": settings.data_dir},
            pg_local=settings.backend == "native", on_trip=self._disk_guard_tripped)
        self.helper_results: dict[str, Any] = {}  # each pipeline helper's result file (the relay's)
        self.record: dict[str, Any] | None = None  # what run.json is assembled from (lab.runner.assembly)
        self.processes = RunProcesses(self)
        self.phases = RunPhases(self)
        self.readings = RunReadings(self)

    # what the phases and the fault injector call on the run, done by its processes
    async def _web(self, path: str, method: str = "GET") -> dict[str, Any]:
        return await self.processes._web(path, method)

    def _check_consumers_alive(self) -> None:
        self.processes._check_consumers_alive()

    def spawn_consumer(self, group: list[int]) -> psutil.Popen:
        return self.processes.spawn_consumer(group)

    def attach_consumer(self, i: int, proc: psutil.Popen) -> None:
        self.processes.attach_consumer(i, proc)

    def _disk_guard_tripped(self, tripped: dict[str, Any]) -> None:
        """The disk guard tripped (:mod:`lab.measure.disk`): end the fault and the load now (the
        load is what writes the WAL); the run fails at its next check, through the normal cleanup."""
        if self.injector is not None:
            self.injector.disk_guard_tripped(tripped)
        senders = self.procs.get("senders")
        if senders is not None and senders.poll() is None:
            with contextlib.suppress(psutil.Error):
                senders.kill()
            log.warning("run %s: senders killed by the disk guard", self.run_id)
            if self.injector is not None:
                self.injector.state.event("senders killed by the disk guard", pid=senders.pid)

    async def execute(self) -> dict[str, Any]:
        """Every phase in order; a failure is caught, cleaned up after and stored as the error."""
        proc, phases = self.processes, self.phases
        self.scratch.mkdir(parents=True, exist_ok=True)
        started_at = datetime.now(UTC).isoformat()
        sampler: Sampler | None = None
        error: str | None = None
        sent: dict[str, Any] = {}
        consumer_results: list[dict[str, Any]] = []
        checks: dict[str, Any] = {}
        self.disk_guard.start(asyncio.get_running_loop())
        try:
            self.progress("setup", {})
            await proc.start_web()
            await phases.reset()
            await self.pipeline.prepare()
            if self.injector is not None:  # its backlog sampler's child, started before the gate
                self.injector.prepare()
            proc.start_senders()
            await proc.start_consumers()
            await proc.start_helpers()
            self.progress("ready", {})
            await self.pipeline.wait_ready()
            await self.decoders.start()  # decode-only slots (Scenario.decode_slots), streaming before the gate
            with tied():  # the run's Debezium dies with this runner, like its other processes
                await self.pipeline.start_source()
            self.disk_guard.check()  # tripped during the setup: no window
            walk = self.cpu_method if self.cpu_method != "cgroup" else "proc-ticks"
            sampler = Sampler(proc.participants(), cpu_method=walk)
            self.host_window.start()
            if self.net_window is not None:
                self.net_window.start()
            # disk and WAL bytes: read at the edges only, like the network's counters
            disk = self.disk_window = diskio.window_for(self.settings, sampler.participants)
            await asyncio.to_thread(disk.start)
            await asyncio.to_thread(self.wal_window.start)
            sampler.start()
            sent = await phases.drain(sampler)
            await asyncio.to_thread(disk.observe)  # before the consumers exit (lab.measure.diskio)
            consumer_results = await proc.stop_consumers()
            if self.pipeline.helpers:
                self.helper_results = await proc.stop_helpers()
            # The drain is seen when the web service has counted every call, but a consumer's
            # last work completes when the reply reaches it (later still with a work delay or
            # a loaded machine): read once more after the consumers exited, so the window's
            # end always lies inside the sampled timeline.
            self.edges["stopped"] = sampler.snapshot()
            self.host_window.stop()
            if self.net_window is not None:
                self.net_window.stop()
            await asyncio.to_thread(disk.stop)
            await asyncio.to_thread(self.wal_window.stop)
            sampler.stop()
            self.slot_stats = await phases.read_slot_stats()
            self.vacuum = await phases.vacuum_record()
            checks = await phases.verify()
            await phases.measure_latency(sent)
            self.disk_guard.check()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if self.disk_guard.tripped is not None:  # whichever check saw it first: the guard's line
                error = f"{DiskGuardTripped.__name__}: {self.disk_guard.tripped['error']}"
            lost = self.net_window.lost_delay() if self.net_window is not None else None
            if lost and lost not in error:  # a stalled drain, say, because the delayer died: say so
                error = f"{error}; {lost}"
            log.error("run %s failed: %s", self.run_id, " ".join(error.split()))  # one line; -v: the traceback
            log.info("run %s failed", self.run_id, exc_info=True)
        except asyncio.CancelledError as exc:  # a signal (lab.stack.proc.run_interruptible): clean up, store
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self.interrupted = str(exc.args[0]) if exc.args else "cancelled"
            error = f"interrupted by {self.interrupted}"
        finally:
            if sampler is not None:
                sampler.stop()
            if self.vacuum_watch is not None:  # a failed run's polls end here
                await self.vacuum_watch.stop()
                await self.vacuum_watch.end()
            self.disk_guard.stop()
            await proc.cleanup()
        if self.interrupted is None:
            await phases._checkpoint_and_cool()
        self.record = self.readings.record(started_at, sampler, sent, consumer_results, checks, error)
        return assemble(self.record)


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
    check_fault(scenario, settings)  # a fault that does not apply here: refused before the stack starts
    check_pipeline(scenario)  # an option the pipeline does not take (claim_retention), likewise
    # the host layout's addresses lead off the machine while it is not up: refused before anything
    # connects (the CLI checks it too; a notebook or a script calling this does not pass there)
    await asyncio.to_thread(require_routed, settings)
    stack = get_stack(settings)
    with exclusive(settings.run_lock, "the stack", settings.lock_owner):
        await asyncio.to_thread(stack.up)
        await asyncio.to_thread(check_clean, settings, stack)
        server = await asyncio.to_thread(_server_settings, settings)
        run = Run(scenario, settings, stack, progress or (lambda phase, info: None), idle=idle)
        result = await run.execute()
    if capture is not None and run.record is not None:
        capture(run.record)
    result.update(meta or {})
    result["server_settings"] = server  # as in force at the start (a fault may change one during the run)
    if run.interrupted is not None:
        result["interrupted"] = run.interrupted
    path = write_run(result, run.samples, settings=settings)
    if run.interrupted is not None:
        raise Interrupted(run.interrupted, f"run {result['run_id']} stored, marked interrupted ({path})")
    return result


def _server_settings(settings: Settings) -> dict[str, str] | None:
    try:
        return server_settings(settings.pg_primary_dsn)
    except Exception as exc:  # recorded as unknown: a reading never fails a run
        log.warning("could not read the server settings: %s", exc)
        return None
