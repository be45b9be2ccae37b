"""The consumer faults, a part of :class:`lab.runner.faults.FaultInjector`:
``consumer-kill`` (and the replacement of a consumer that exited), ``consumer-dead`` and
``sink-outage``, ``consumer-slow``; and ``big-transaction``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from typing import Any

import psutil
import psycopg

from lab.runner.processes import RunError
from lab.stack import children
from lab.workload.web import INSERT_QUERY


class ProcessFaults:
    """Consumer faults and the big transaction: a part of :class:`lab.runner.faults.FaultInjector`."""

    run: Any
    _event: Callable[..., None]  # FaultInjector._event
    fault: Any
    stopped: list[psutil.Process]
    extra_ids: list[int]

    async def _kill_consumer(self, i: int) -> None:
        run = self.run
        old = run.consumers[i]
        run.respawning.add(i)
        old.kill()
        self._event("kill", consumer=i, pid=old.pid)
        await asyncio.to_thread(old.wait, 10)
        await self._replace(i)

    async def _replace(self, i: int) -> None:
        """Start a replacement for consumer ``i``, which has exited, and wait until it is ready."""
        run = self.run
        run.respawning.add(i)
        children.forget(run.settings, [run.consumers[i]])
        (run.scratch / f"consumer-{i}.ready").unlink(missing_ok=True)
        new = run.spawn_consumer([i])  # on the loop's thread: it dies with this one
        run.consumers[i] = new
        run.attach_consumer(i, new)
        self._event("replacement started", consumer=i, pid=new.pid)
        deadline = time.monotonic() + run.scenario.ready_timeout_s
        while not (run.scratch / f"consumer-{i}.ready").exists():
            if new.poll() is not None:
                raise RunError(f"replacement consumer {i} exited with {new.returncode}")
            if time.monotonic() > deadline:
                raise RunError(f"replacement consumer {i} not ready after {run.scenario.ready_timeout_s:.0f} s")
            await asyncio.sleep(0.05)
        run.respawning.discard(i)
        self._event("replacement ready", consumer=i, pid=new.pid)

    async def _stop(self, indexes: list[int], duration: float) -> None:
        procs = [self.run.consumers[i] for i in indexes]
        try:
            for p in procs:
                self.stopped.append(p)
                p.send_signal(signal.SIGSTOP)
            self._event("stop", consumers=indexes, pids=[p.pid for p in procs])
            await asyncio.sleep(duration)
        finally:
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGCONT)
                with contextlib.suppress(ValueError):
                    self.stopped.remove(p)
        self._event("resume", consumers=indexes)

    async def _slow(self, i: int, duration: float) -> None:
        proc = self.run.consumers[i]
        try:
            proc.send_signal(signal.SIGUSR1)
            self._event("slow", consumer=i, extra_s=self.fault.extra_s)
            await asyncio.sleep(duration)
        finally:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGUSR2)
        self._event("normal", consumer=i)

    async def _big_transaction(self, rows: int) -> None:
        """``rows`` executions of the web service's INSERT in one transaction (pipelined)."""
        async with await psycopg.AsyncConnection.connect(self.run.settings.pg_dsn) as conn:
            self._event("big transaction begins", rows=rows)
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(INSERT_QUERY, [("helloworld",)] * rows, returning=True)
                ids = []
                while True:
                    ids += [r[0] for r in await cur.fetchall()]
                    if not cur.nextset():
                        break
        self.extra_ids = ids
        self._event("big transaction committed", rows=len(ids), first_id=min(ids), last_id=max(ids))
