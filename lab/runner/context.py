"""What the parts of one run share: the attributes :class:`lab.runner.Run` sets up and its phases
read and write, declared once so that each part is typed against the same state."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import psutil

from lab.measure.decoders import DecodeOnly
from lab.measure.disk import DiskGuard
from lab.measure.diskio import DiskWindow
from lab.measure.network import NetWindow
from lab.measure.provenance import HostWindow
from lab.measure.sampler import Snapshot
from lab.measure.vacuum import AutovacuumWatch
from lab.measure.walstats import WalWindow
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import Stack

if TYPE_CHECKING:
    from lab.runner.fault_driver import FaultInjector

Progress = Callable[[str, dict[str, Any]], None]


class RunContext:
    """The state of one run; :class:`lab.runner.Run` is it and fills it in ``__init__``; each part of the
    run (processes, phases, readings) and the fault injector hold the run and read and write this state."""

    scenario: Scenario
    settings: Settings
    stack: Stack
    progress: Progress
    idle: dict[str, Any] | None  # the series' idle baseline (lab.measure.idle), if one was measured
    run_id: str
    scratch: Path  # the run's scratch dir under the stack dir: logs, captures
    pipeline: Any
    procs: dict[str, psutil.Popen]  # web, senders, probe
    consumers: list[psutil.Popen]
    edges: dict[str, Snapshot]  # the sampler's readings at the window's edges
    samples: list[dict[str, Any]]  # the timeline written to samples.csv
    slot_stats: dict[str, dict[str, Any]]
    latency_ms: dict[str, Any] | None
    latency_from_due_ms: dict[str, Any] | None
    home_cgroup: Path | None
    cpu_method: str
    host_window: HostWindow
    net_window: NetWindow | None  # LAB_HOSTS=netns: bytes per hop
    disk_window: DiskWindow | None  # disk bytes per participant, once the sampler has its participants
    wal_window: WalWindow  # WAL generated over the window
    respawning: set[int]  # consumers being replaced (consumer-kill)
    ended: set[int]  # consumers a fault ended for good (slot-invalidation)
    injector: FaultInjector | None
    accounting: dict[str, Any] | None  # fault runs: lab.runner.accounting
    stair_data: dict[str, Any] | None  # staircase: created_at and arrivals
    stair_stop: dict[str, Any] | None  # staircase: why the runner stopped it early
    decoders: DecodeOnly  # the run's decode-only slots (lab.measure.decoders)
    pg_edges: dict[str, dict[int, Any]]  # PostgreSQL's processes at the window edges (lab.measure.pgbackends)
    vacuum_watch: AutovacuumWatch | None  # autovacuum and the tables' counters over the window (lab.measure.vacuum)
    vacuum: dict[str, Any] | None  # run.json's vacuum block
    flow: tuple[list[float], list[float]] | None  # sorted wall times of every insert and every work call
    disk_guard: DiskGuard  # retained WAL, spill and free disk, throughout the run (lab.measure.disk)
    helper_results: dict[str, Any]  # the pipeline's helpers' result files, read when they stopped
    service_cgroups: dict[str, Any]  # each service's cgroup: a restarted service moves back in (faults)
    _http: aiohttp.ClientSession | None

    async def _web(self, path: str, method: str = "GET") -> dict[str, Any]:
        """One call to the web service's control listener (:meth:`lab.runner.processes.RunProcesses._web`)."""
        raise NotImplementedError

    def spawn_consumer(self, group: list[int]) -> psutil.Popen:
        """Start one consumer process for ``group`` (:meth:`lab.runner.processes.RunProcesses.spawn_consumer`)."""
        raise NotImplementedError

    def attach_consumer(self, i: int, proc: psutil.Popen) -> None:
        """Move consumer ``i``'s process into its cgroup (:meth:`lab.runner.processes.RunProcesses.attach_consumer`)."""
        raise NotImplementedError

    def _check_consumers_alive(self) -> None:
        """Raise when a consumer exited early (:meth:`lab.runner.processes.RunProcesses._check_consumers_alive`)."""
        raise NotImplementedError
