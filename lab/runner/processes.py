"""The run's own processes: the web service, the speed probe, the senders, the consumers and the
pipeline's helpers (:attr:`lab.pipelines.base.Pipeline.helpers`, e.g. wal-relay's relay).

Each is spawned through :mod:`lab.stack.children` (recorded under the stack dir, dying with the
runner), measured as a participant of its own, and stopped by pid in :meth:`RunProcesses.cleanup`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import psutil

from lab.measure import cgroups
from lab.measure.cgroups import attached, tree_pids
from lab.measure.sampler import Participant
from lab.measure.services import service_names, service_participants
from lab.pg.slots import drop_slots
from lab.runner.context import RunContext
from lab.settings import child_env
from lab.stack import children
from lab.stack.hosts import namespace
from lab.stack.proc import tail

# The web opens its 220 connections (its own limit: 120 s), then starts its control listener,
# which answering means ready: on a loaded machine that took over 30 s.
WEB_READY_S = 150.0


class RunError(RuntimeError):
    """A run that could not complete; the message is stored as the run's error."""


class RunProcesses:
    """Start, measure, watch and stop the processes of one run (a part of :class:`lab.runner.Run`, over its state)."""

    def __init__(self, run: RunContext) -> None:
        self.run = run  # the run's state, shared with its other parts and the fault injector
        self.consumer_cgroups: list[cgroups.CpuGroup | None] = []  # set by participants()

    def _spawn(self, name: str, argv: list[str], host: str | None = None) -> psutil.Popen:
        """``host``: the participant group it runs on under ``LAB_HOSTS=netns`` (None: the runner's)."""
        st = self.run.settings
        return children.spawn(st, name, [sys.executable, *argv], log_path=self.run.scratch / f"{name}.log",
                              env=child_env(st), cwd=st.root,
                              netns=namespace(st, host) if host is not None else None)

    async def start_web(self) -> None:
        """The web service (and the speed probe beside it); returns once the service answers
        on its control listener, which it starts after its insert listener."""
        s, st = self.run.scenario, self.run.settings
        web_args = ["-m", "lab.workload.web", "--host", st.web_host, "--port", str(st.web_port),
                    "--control-port", str(st.control_port), "--dsn", st.pg_dsn, "--reset", s.reset]
        if s.work_delay_ms:
            web_args += ["--work-delay-ms", str(s.work_delay_ms)]
        if s.fault:  # per-consumer accounting of the work calls (lab.runner.accounting)
            web_args += ["--by-consumer"]
        self.run.procs["web"] = self._spawn("web", web_args, "web")
        self.run.procs["probe"] = self._spawn("probe", ["-m", "lab.measure.probe",
                                                    "--out", str(self.run.scratch / "probe.json")])
        await self._wait_web()

    def start_senders(self) -> None:
        """The senders (or a broker-native stand's producers), waiting at their gate file."""
        s, st = self.run.scenario, self.run.settings
        gate_out = ["--start-file", str(self.run.scratch / "start"), "--out", str(self.run.scratch / "senders.json")]
        if s.producer == "direct":  # broker-native stand: write straight into the transport
            target = {"kafka": "kafka", "rabbitmq": "rabbitmq"}.get(s.pipeline, "pg")
            sender_args = ["-m", "lab.pipelines.producers", "--target", target, "--messages", str(s.messages),
                           "--producers", str(s.senders), "--reset", s.reset, *gate_out]
        else:
            sender_args = ["-m", "lab.workload.senders", "--url", st.web_url, "--messages", str(s.messages),
                           "--senders", str(s.senders), *gate_out]
            if s.rate:
                sender_args += ["--rate", str(s.rate)]
            if s.rate_steps:  # the staircase; the runner may end it early (lab.measure.staircase)
                sender_args += ["--rate-steps", s.rate_steps, "--step-s", str(s.step_s),
                                "--stop-file", str(self.run.scratch / "stop")]
        self.run.procs["senders"] = self._spawn("senders", sender_args, "web")

    def participants(self) -> list[Participant]:
        """Everything that does work in a run, each in its own cgroup where one can be made.

        The runner counts its own CPU only (its children are other participants).
        """
        def group(name: str, roots: list[psutil.Process], *, tree: bool = True) -> cgroups.CpuGroup | None:
            if self.run.cpu_method != "cgroup":
                return None
            pids = (pid for r in roots for pid in (tree_pids(r.pid) if tree else [r.pid]))
            return attached(self.run.settings, name, pids)

        parts = service_participants(self.run.stack, (*service_names(self.run.stack), "debezium"), group)
        self.run.service_cgroups = {p.name: p.cgroup for p in parts}  # a restarted service moves in (faults)
        # the speed probe: measured, outside the totals; a pipeline's helpers (wal-relay's relay)
        for name in ("web", "senders", "probe", *self.run.pipeline.helpers):
            parts.append(Participant(name, [self.run.procs[name]], cgroup=group(name, [self.run.procs[name]])))
        self.consumer_cgroups = [group(f"consumer-{i}", [c]) for i, c in enumerate(self.run.consumers)]
        parts += [  # roots asked at every walk: a replaced consumer (consumer-kill) is the same participant
            Participant(f"consumer-{i}", self._consumer_roots(i), group="consumers", cgroup=cg)
            for i, cg in enumerate(self.consumer_cgroups)
        ]
        me = psutil.Process()
        parts.append(Participant("runner", [me], recursive=False, cgroup=group("runner", [me], tree=False)))
        return parts

    def _consumer_roots(self, i: int) -> Callable[[], list[psutil.Popen]]:
        return lambda: [self.run.consumers[i]]

    async def _web(self, path: str, method: str = "GET") -> dict[str, Any]:
        """One call to the web service's control listener on a kept-alive connection (the drain
        loop polls it); never queued behind the senders' inserts, which the other listener serves."""
        if self.run._http is None or self.run._http.closed:
            self.run._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        async with self.run._http.request(method, self.run.settings.control_url + path) as r:
            if r.status >= 300:
                raise RunError(f"web service answered {r.status} to {method} {path}")
            return await r.json() if r.status == 200 else {}

    async def _wait_web(self) -> None:
        deadline = time.monotonic() + WEB_READY_S
        while True:
            if self.run.procs["web"].poll() is not None:
                raise RunError(
                    f"web service exited with {self.run.procs['web'].returncode}: "
                    f"{tail(self.run.scratch / 'web.log', 2)}"
                )
            try:
                await self._web("/load/stats")
                return
            except (aiohttp.ClientError, OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RunError(f"web service did not answer within {WEB_READY_S:.0f} s") from None
                await asyncio.sleep(0.1)

    def spawn_consumer(self, group: list[int]) -> psutil.Popen:
        """One consumer process running the consumers ``group`` (a replacement too: same index)."""
        s = self.run.scenario
        return self._spawn(f"consumer-{group[0]}", [
            "-m", "lab.consumer", "--pipeline", s.pipeline, "--index", ",".join(map(str, group)),
            "--run-dir", str(self.run.scratch), "--scenario", json.dumps(s.as_parameters()),
        ], "consumers")

    def attach_consumer(self, i: int, proc: psutil.Popen) -> None:
        """Move a replacement into consumer ``i``'s cgroup, which keeps the killed one's CPU."""
        group = self.consumer_cgroups[i] if i < len(self.consumer_cgroups) else None
        if group is not None:
            group.attach([proc.pid])

    async def start_consumers(self) -> None:
        s = self.run.scenario
        # processes: one process per consumer; tasks: one process runs them all (lab.consumer)
        layout = [[i] for i in range(s.consumers)] if s.layout == "processes" else [list(range(s.consumers))]
        for group in layout:
            self.run.consumers.append(self.spawn_consumer(group))
        deadline = time.monotonic() + s.ready_timeout_s
        while not all((self.run.scratch / f"consumer-{i}.ready").exists() for i in range(s.consumers)):
            self._check_consumers_alive()
            if time.monotonic() > deadline:
                raise RunError(f"consumers not ready after {s.ready_timeout_s:.0f} s")
            await asyncio.sleep(0.05)

    async def start_helpers(self) -> None:
        """The pipeline's own processes (:attr:`lab.pipelines.base.Pipeline.helpers`), each
        waited for until it wrote ``<name>.ready``."""
        s = self.run.scenario
        for name, module in self.run.pipeline.helpers.items():
            self.run.procs[name] = self._spawn(name, [
                "-m", module, "--run-dir", str(self.run.scratch), "--scenario", json.dumps(s.as_parameters())])
        deadline = time.monotonic() + s.ready_timeout_s
        while not all((self.run.scratch / f"{name}.ready").exists() for name in self.run.pipeline.helpers):
            self._check_consumers_alive()
            if time.monotonic() > deadline:
                raise RunError(f"{', '.join(self.run.pipeline.helpers)} not ready after {s.ready_timeout_s:.0f} s")
            await asyncio.sleep(0.05)

    async def stop_helpers(self) -> dict[str, Any]:
        """Stop the pipeline's helpers (SIGTERM, bounded) and read each one's ``<name>.json``."""
        procs = [self.run.procs[n] for n in self.run.pipeline.helpers if n in self.run.procs]
        with contextlib.suppress(psutil.Error):
            await asyncio.to_thread(children.stop, [p for p in procs if p.poll() is None], timeout=10)
        out: dict[str, Any] = {}
        for name in self.run.pipeline.helpers:
            path = self.run.scratch / f"{name}.json"
            with contextlib.suppress(OSError, ValueError):
                out[name] = json.loads(path.read_text())
        return out

    def _check_consumers_alive(self) -> None:
        for name in self.run.pipeline.helpers:  # a dead helper (the relay) stalls every consumer
            p = self.run.procs.get(name)
            if p is not None and p.poll() is not None:
                raise RunError(f"{name} exited with {p.returncode}; see {self.run.scratch / f'{name}.log'}")
        for i, c in enumerate(self.run.consumers):
            if i not in self.run.respawning and i not in self.run.ended and c.poll() is not None and not (
                    self.run.injector is not None and self.run.injector.supervises(i)):
                raise RunError(f"consumer {i} exited with {c.returncode}; see {self.run.scratch / f'consumer-{i}.log'}")

    async def stop_consumers(self) -> list[dict[str, Any]]:
        for c in self.run.consumers:
            with contextlib.suppress(psutil.NoSuchProcess):
                c.send_signal(signal.SIGTERM)
        results = []
        for c in self.run.consumers:
            try:
                await asyncio.to_thread(c.wait, 30)
            except psutil.TimeoutExpired:
                c.kill()
        for i in range(self.run.scenario.consumers):  # one result file per consumer in either layout
            path = self.run.scratch / f"consumer-{i}.json"
            results.append(json.loads(path.read_text()) if path.exists() else {"index": i, "error": "no result"})
        return results

    async def cleanup(self) -> None:
        """Stop our processes and the pipeline's source, drop slots; never raises."""
        cgroups.move_to(self.run.home_cgroup)  # the caller (pytest, a kernel) leaves the lab's group
        if self.run.injector is not None:  # before any stop: a stopped consumer would ignore its SIGTERM
            self.run.injector.restore()  # (and a service the fault stopped starts outside our groups)
        with contextlib.suppress(psutil.Error):
            await asyncio.to_thread(children.stop, [c for c in self.run.consumers if c.poll() is None], timeout=0)
        if self.run.pipeline.helpers and not self.run.helper_results:  # stopped before the teardown
            self.run.helper_results = await self.stop_helpers()
        with contextlib.suppress(Exception):
            await self.run.pipeline.teardown()
        ours = [*self.run.consumers, *self.run.procs.values()]
        with contextlib.suppress(Exception):
            await asyncio.to_thread(children.stop, [p for p in ours if p.poll() is None], timeout=10)
            children.forget(self.run.settings, ours)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(drop_slots, self.run.settings.pg_dsn, "load_test_slot")
        with contextlib.suppress(Exception):
            await self.run.decoders.stop()
        if self.run._http is not None:
            await self.run._http.close()
        if self.run.injector is not None:  # last: nothing of the run may still use the promoted standby
            await self.run.injector.undo()
