"""The run's measurement windows, opened together before the senders' gate and closed together once
the consumers exited (:class:`Windows`).

The window itself is cut later, between the first send and the last work call, from the sampler's
timeline (:mod:`lab.runner.readings`); what is read at the edges only covers the whole span:

* the sampler (:mod:`lab.measure.sampler`): every participant's CPU and memory, its timeline;
* the host's counters (``/proc/stat``, the load: :class:`lab.measure.provenance.HostWindow`);
* bytes per hop under ``LAB_HOSTS=netns`` (:class:`lab.measure.network.NetWindow`);
* disk bytes per participant (:class:`lab.measure.diskio.DiskWindow`), read once more inside the
  window before the consumers exit;
* the WAL generated (:class:`lab.measure.walstats.WalWindow`).

At the drain's own edges (the gate, drained) the sampler is read, PostgreSQL's processes too
(:mod:`lab.measure.pgbackends`, native backend), and autovacuum is watched in between
(:mod:`lab.measure.vacuum`). A reading that fails is a warning, never the run's failure.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from lab.measure import diskio, pgbackends, vacuum
from lab.measure.network import NetWindow
from lab.measure.provenance import HostWindow
from lab.measure.sampler import Participant, Sampler
from lab.measure.walstats import WalWindow
from lab.runner.environment import RunEnv
from lab.stack.postgres import PostgresService

log = logging.getLogger(__name__)


class EdgeWindow(Protocol):
    """A window read at its two edges."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


class Windows:
    """Every measurement window of one run (module docstring); nothing is read before :meth:`open`."""

    def __init__(self, env: RunEnv) -> None:
        self.env = env
        self.sampler: Sampler | None = None
        self.host = HostWindow()
        self.net = NetWindow(env.settings) if env.settings.netns else None
        self.disk: diskio.DiskWindow | None = None  # over the sampler's participants
        self.wal = WalWindow(env.settings.pg_dsn)
        self.backends: dict[str, dict[int, Any]] = {}  # PostgreSQL's processes at the gate and drained
        self._vacuum: vacuum.AutovacuumWatch | None = None

    async def open(self, participants: list[Participant]) -> None:
        """Read every edge window's start, then start the sampler."""
        method = self.env.cpu_method
        sampler = self.sampler = Sampler(participants, cpu_method=method if method != "cgroup" else "proc-ticks")
        self.disk = diskio.window_for(self.env.settings, sampler.participants)
        for window in self._edges():
            await asyncio.to_thread(window.start)
        sampler.start()

    def _edges(self) -> list[EdgeWindow]:
        return [w for w in (self.host, self.net, self.disk, self.wal) if w is not None]

    async def gate(self) -> None:
        """The senders' gate is about to open: the sampler, PostgreSQL's processes, autovacuum's watch."""
        assert self.sampler is not None  # opened before the drain
        self.sampler.snapshot()
        await self._read_backends("gate")
        native = self.env.settings.backend == "native"
        watch = vacuum.AutovacuumWatch(self.env.settings.pg_dsn, native=native,
                                       log_path=PostgresService(self.env.settings).log_path if native else None)
        try:
            await watch.start()
        except Exception as exc:
            log.warning("run %s: autovacuum not watched: %s", self.env.run_id, exc)
            await watch.end()
            return
        self._vacuum = watch

    async def drained(self) -> None:
        """The drain is seen: the sampler, PostgreSQL's processes; autovacuum's polls stop."""
        assert self.sampler is not None
        self.sampler.snapshot()
        await self._read_backends("drained")
        if self._vacuum is not None:
            await self._vacuum.stop("drained")

    async def _read_backends(self, edge: str) -> None:
        """PostgreSQL's processes and their CPU at a drain edge; native backend only."""
        if self.env.settings.backend != "native":
            return
        try:
            self.backends[edge] = await pgbackends.read(self.env.settings.pg_dsn)
        except Exception as exc:
            log.warning("run %s: PostgreSQL's backends not read at %s: %s", self.env.run_id, edge, exc)

    async def observe(self) -> None:
        """Inside the window, before the consumers exit: what a root read here keeps if it exits
        before the end edge (:mod:`lab.measure.diskio`)."""
        if self.disk is not None:
            await asyncio.to_thread(self.disk.observe)

    async def close(self) -> None:
        """The consumers exited: read the sampler once more (a consumer's last work completes when the
        reply reaches it, after the web service counted it: the window's end lies inside the
        timeline), then every edge window's end; the sampler stops."""
        assert self.sampler is not None
        self.sampler.snapshot()
        for window in self._edges():
            await asyncio.to_thread(window.stop)
        self.sampler.stop()

    async def vacuum_record(self) -> dict[str, Any] | None:
        """run.json's ``vacuum``: the tables once more (the consumers have exited) and what vacuuming
        the outbox costs now (outside the window), then the block."""
        if self._vacuum is None:
            return None
        await self._vacuum.end(debt=True)
        return self._vacuum.record()

    async def end(self) -> None:
        """In the run's cleanup, whatever happened: the sampler stops, a failed run's polls end."""
        if self.sampler is not None:
            self.sampler.stop()
        if self._vacuum is not None:
            await self._vacuum.stop()
            await self._vacuum.end()

    def lost_delay(self) -> str | None:
        """Why a failed run's link delay was not in force (its delayer died), if it was not."""
        return self.net.lost_delay() if self.net is not None else None

    def record(self) -> dict[str, Any]:
        """The edge windows' blocks of the run's record: ``network``, ``disk``, ``wal``."""
        return {"network": self.net.record() if self.net is not None else None,
                "disk": self.disk.record() if self.disk is not None else None,
                "wal": self.wal.record()}
