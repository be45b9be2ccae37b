"""The run's own processes, and the one object that owns them (:class:`RunProcesses`): the web
service, the speed probe, the senders, the consumers and the pipeline's helpers (its
capabilities' ``helpers``, e.g. wal-relay's relay).

Each is spawned through :mod:`lab.stack.children` (recorded under the stack dir, dying with the
runner), measured as a participant of its own, and stopped by pid in :meth:`RunProcesses.cleanup`.
Whatever else touches one of them (a fault that kills, stops or replaces a consumer, the disk
guard that kills the senders) asks this object.
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
from lab.measure.services import service_participants
from lab.pg.slots import drop_slots
from lab.runner.environment import RunEnv
from lab.runner.values import Stopped
from lab.settings import child_env
from lab.stack import children
from lab.stack.hosts import namespace
from lab.stack.proc import tail

# The web opens its 220 connections (its own limit: 120 s), then starts its control listener,
# which answering means ready: on a loaded machine that took over 30 s.
WEB_READY_S = 150.0
Event = Callable[..., None]  # lab.faults.FaultState.event


class RunError(RuntimeError):
    """A run that could not complete; the message is stored as the run's error."""


class RunProcesses:
    """Start, measure, watch, replace and stop the processes of one run; nothing else holds them."""

    def __init__(self, env: RunEnv) -> None:
        self.env = env
        self._procs: dict[str, psutil.Popen] = {}  # web, probe, senders, the pipeline's helpers
        self._consumers: list[psutil.Popen] = []  # by index: a replacement takes its place
        self._respawning: set[int] = set()  # consumers being replaced (consumer-kill)
        self._ended: set[int] = set()  # consumers a fault ended for good (slot-invalidation)
        self._consumer_groups: list[cgroups.CpuGroup | None] = []  # set by participants()
        self._service_groups: dict[str, cgroups.CpuGroup | None] = {}  # a restarted service moves back in
        self.helpers = dict(env.pipeline.capabilities.helpers)  # participant name -> module
        self._helpers_stopped = False
        self._http: aiohttp.ClientSession | None = None
        self._home = cgroups.current()  # the runner is lent to its group, then moved back

    def _spawn(self, name: str, argv: list[str], host: str | None = None) -> psutil.Popen:
        """``host``: the participant group it runs on under ``LAB_HOSTS=netns`` (None: the runner's)."""
        st = self.env.settings
        return children.spawn(st, name, [sys.executable, *argv], log_path=self.env.scratch / f"{name}.log",
                              env=child_env(st), cwd=st.root,
                              netns=namespace(st, host) if host is not None else None)

    # starting ------------------------------------------------------------------------------
    async def start_web(self) -> None:
        """The web service (and the speed probe beside it); returns once the service answers
        on its control listener, which it starts after its insert listener."""
        s, st = self.env.scenario, self.env.settings
        web_args = ["-m", "lab.workload.web", "--host", st.web_host, "--port", str(st.web_port),
                    "--control-port", str(st.control_port), "--dsn", st.pg_dsn, "--reset", s.reset]
        if s.work_delay_ms:
            web_args += ["--work-delay-ms", str(s.work_delay_ms)]
        if s.fault:  # per-consumer accounting of the work calls (lab.runner.accounting)
            web_args += ["--by-consumer"]
        self._procs["web"] = self._spawn("web", web_args, "web")
        self._procs["probe"] = self._spawn("probe", ["-m", "lab.measure.probe",
                                                     "--out", str(self.env.scratch / "probe.json")])
        await self._wait_web()

    def start_senders(self) -> None:
        """The senders (or a broker-native stand's producers), waiting at their gate file."""
        s, st, scratch = self.env.scenario, self.env.settings, self.env.scratch
        gate_out = ["--start-file", str(scratch / "start"), "--out", str(scratch / "senders.json")]
        if s.producer == "direct":  # broker-native stand: write straight into the transport
            target = self.env.pipeline.capabilities.stand_target
            sender_args = ["-m", "lab.pipelines.producers", "--target", target, "--messages", str(s.messages),
                           "--producers", str(s.senders), "--reset", s.reset, *gate_out]
        else:
            sender_args = ["-m", "lab.workload.senders", "--url", st.web_url, "--messages", str(s.messages),
                           "--senders", str(s.senders), *gate_out]
            if s.rate:
                sender_args += ["--rate", str(s.rate)]
            if s.rate_steps:  # the staircase; the runner may end it early (lab.measure.staircase)
                sender_args += ["--rate-steps", s.rate_steps, "--step-s", str(s.step_s),
                                "--stop-file", str(scratch / "stop")]
                if s.warm_s:  # the warm phase at the top rate, then its rest (lab.scenario.warm_plan)
                    sender_args += ["--warm-s", str(s.warm_s)]
        self._procs["senders"] = self._spawn("senders", sender_args, "web")

    def spawn_consumer(self, group: list[int]) -> psutil.Popen:
        """One consumer process running the consumers ``group`` (a replacement too: same index)."""
        s = self.env.scenario
        return self._spawn(f"consumer-{group[0]}", [
            "-m", "lab.consumer", "--pipeline", s.pipeline, "--index", ",".join(map(str, group)),
            "--run-dir", str(self.env.scratch), "--scenario", json.dumps(s.as_parameters()),
        ], "consumers")

    async def start_consumers(self) -> None:
        s = self.env.scenario
        # processes: one process per consumer; tasks: one process runs them all (lab.consumer)
        layout = [[i] for i in range(s.consumers)] if s.layout == "processes" else [list(range(s.consumers))]
        for group in layout:
            self._consumers.append(self.spawn_consumer(group))
        await self._ready([f"consumer-{i}" for i in range(s.consumers)], "consumers")

    async def start_helpers(self) -> None:
        """The pipeline's own processes, each waited for until it wrote ``<name>.ready``."""
        s = self.env.scenario
        for name, module in self.helpers.items():
            self._procs[name] = self._spawn(name, [
                "-m", module, "--run-dir", str(self.env.scratch), "--scenario", json.dumps(s.as_parameters())])
        await self._ready(list(self.helpers), ", ".join(self.helpers))

    async def _ready(self, names: list[str], what: str) -> None:
        timeout = self.env.scenario.ready_timeout_s
        deadline = time.monotonic() + timeout
        while not all((self.env.scratch / f"{name}.ready").exists() for name in names):
            self.check_alive()
            if time.monotonic() > deadline:
                raise RunError(f"{what} not ready after {timeout:.0f} s")
            await asyncio.sleep(0.05)

    # measuring -----------------------------------------------------------------------------
    def participants(self) -> list[Participant]:
        """Everything that does work in a run, each in its own cgroup where one can be made.

        The runner counts its own CPU only (its children are other participants).
        """
        def group(name: str, roots: list[psutil.Process], *, tree: bool = True) -> cgroups.CpuGroup | None:
            if self.env.cpu_method != "cgroup":
                return None
            pids = (pid for r in roots for pid in (tree_pids(r.pid) if tree else [r.pid]))
            return attached(self.env.settings, name, pids)

        parts = service_participants(self.env.stack, group)
        self._service_groups = {p.name: p.cgroup for p in parts}
        # the speed probe: measured, outside the totals; a pipeline's helpers (wal-relay's relay)
        for name in ("web", "senders", "probe", *self.env.pipeline.capabilities.participants):
            parts.append(Participant(name, [self._procs[name]], cgroup=group(name, [self._procs[name]])))
        self._consumer_groups = [group(f"consumer-{i}", [c]) for i, c in enumerate(self._consumers)]
        parts += [  # roots asked at every walk: a replaced consumer (consumer-kill) is the same participant
            Participant(f"consumer-{i}", self._consumer_roots(i), group="consumers", cgroup=cg)
            for i, cg in enumerate(self._consumer_groups)
        ]
        me = psutil.Process()
        parts.append(Participant("runner", [me], recursive=False, cgroup=group("runner", [me], tree=False)))
        return parts

    def _consumer_roots(self, i: int) -> Callable[[], list[psutil.Popen]]:
        return lambda: [self._consumers[i]]

    def attach(self, participant: str) -> None:
        """Move a restarted service's processes into its participant's cgroup, if it has one."""
        group = self._service_groups.get(participant)
        control = self.env.stack.control
        if group is None or control is None:
            return
        group.attach(pid for r in control.processes(participant) for pid in tree_pids(r.pid))

    # the web service's control listener ------------------------------------------------------
    async def web(self, path: str, method: str = "GET") -> dict[str, Any]:
        """One call to the web service's control listener on a kept-alive connection (the drain
        loop polls it); never queued behind the senders' inserts, which the other listener serves."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        async with self._http.request(method, self.env.settings.control_url + path) as r:
            if r.status >= 300:
                raise RunError(f"web service answered {r.status} to {method} {path}")
            return await r.json() if r.status == 200 else {}

    async def _wait_web(self) -> None:
        deadline = time.monotonic() + WEB_READY_S
        web = self._procs["web"]
        while True:
            if web.poll() is not None:
                raise RunError(f"web service exited with {web.returncode}: {tail(self.env.scratch / 'web.log', 2)}")
            try:
                await self.web("/load/stats")
                return
            except (aiohttp.ClientError, OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RunError(f"web service did not answer within {WEB_READY_S:.0f} s") from None
                await asyncio.sleep(0.1)

    # watching --------------------------------------------------------------------------------
    def check_alive(self, excused: Callable[[int], bool] = lambda i: False) -> None:
        """Raise when a helper or a consumer exited early; a consumer being replaced, one a fault
        ended, and one whose exit is ``excused`` (a fault's supervision replaces it) are not."""
        for name in self.helpers:  # a dead helper (the relay) stalls every consumer
            p = self._procs.get(name)
            if p is not None and p.poll() is not None:
                raise RunError(f"{name} exited with {p.returncode}; see {self.env.scratch / f'{name}.log'}")
        for i, c in enumerate(self._consumers):
            if i not in self._respawning and i not in self._ended and c.poll() is not None and not excused(i):
                raise RunError(f"consumer {i} exited with {c.returncode}; "
                               f"see {self.env.scratch / f'consumer-{i}.log'}")

    def senders_failed(self) -> int | None:
        """The senders' exit status when they exited with an error (they write no result then)."""
        code = self._procs["senders"].poll()
        return code if code not in (None, 0) else None

    def kill_senders(self) -> int | None:
        """SIGKILL the senders if they still run (the disk guard: the load writes the WAL); their pid."""
        senders = self._procs.get("senders")
        if senders is None or senders.poll() is not None:
            return None
        with contextlib.suppress(psutil.Error):
            senders.kill()
        return senders.pid

    # the consumers, for a fault (lab.faults.FaultContext) ------------------------------------
    def consumer(self, i: int) -> psutil.Popen:
        return self._consumers[i]

    def consumer_count(self) -> int:
        return len(self._consumers)

    def replacing(self, i: int) -> bool:
        return i in self._respawning

    def expect_exit(self, i: int) -> None:
        self._ended.add(i)

    def consumer_error(self, i: int) -> str | None:
        try:
            error = json.loads((self.env.scratch / f"consumer-{i}.json").read_text()).get("error")
        except (OSError, ValueError):
            return None
        return None if error is None else str(error)

    def exited(self) -> list[int]:
        """Consumers that exited, not being replaced and not ended by a fault."""
        return [i for i, c in enumerate(self._consumers)
                if i not in self._respawning and i not in self._ended and c.poll() is not None]

    def begin_replacing(self, i: int) -> None:
        """Consumer ``i``'s exit is no failure from here on: it is being replaced."""
        self._respawning.add(i)

    async def replace(self, i: int, event: Event) -> None:
        """Start a replacement for consumer ``i`` (same index, same cgroup, which keeps the killed
        one's CPU) and wait until it is ready; ``event`` records its start and readiness."""
        self._respawning.add(i)
        children.forget(self.env.settings, [self._consumers[i]])
        ready = self.env.scratch / f"consumer-{i}.ready"
        ready.unlink(missing_ok=True)
        new = self._consumers[i] = self.spawn_consumer([i])  # on the loop's thread: it dies with this one
        group = self._consumer_groups[i] if i < len(self._consumer_groups) else None
        if group is not None:
            group.attach([new.pid])
        event("replacement started", consumer=i, pid=new.pid)
        timeout = self.env.scenario.ready_timeout_s
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if new.poll() is not None:
                raise RunError(f"replacement consumer {i} exited with {new.returncode}")
            if time.monotonic() > deadline:
                raise RunError(f"replacement consumer {i} not ready after {timeout:.0f} s")
            await asyncio.sleep(0.05)
        self._respawning.discard(i)
        event("replacement ready", consumer=i, pid=new.pid)

    # stopping --------------------------------------------------------------------------------
    async def stop(self) -> Stopped:
        """Stop the consumers (SIGTERM, bounded) and then the pipeline's helpers; their result files."""
        for c in self._consumers:
            with contextlib.suppress(psutil.NoSuchProcess):
                c.send_signal(signal.SIGTERM)
        for c in self._consumers:
            try:
                await asyncio.to_thread(c.wait, 30)
            except psutil.TimeoutExpired:
                c.kill()
        consumers = []
        for i in range(self.env.scenario.consumers):  # one result file per consumer in either layout
            path = self.env.scratch / f"consumer-{i}.json"
            consumers.append(json.loads(path.read_text()) if path.exists() else {"index": i, "error": "no result"})
        return Stopped(consumers, await self._stop_helpers(), sorted(self._ended))

    async def _stop_helpers(self) -> dict[str, Any]:
        """Stop the pipeline's helpers (SIGTERM, bounded) and read each one's ``<name>.json``, once."""
        if self._helpers_stopped or not self.helpers:
            return {}
        self._helpers_stopped = True
        procs = [self._procs[n] for n in self.helpers if n in self._procs]
        with contextlib.suppress(psutil.Error):
            await asyncio.to_thread(children.stop, [p for p in procs if p.poll() is None], timeout=10)
        out: dict[str, Any] = {}
        for name in self.helpers:
            with contextlib.suppress(OSError, ValueError):
                out[name] = json.loads((self.env.scratch / f"{name}.json").read_text())
        return out

    def go_home(self) -> None:
        """The runner leaves the lab's groups (the caller, pytest or a kernel, is not measured after
        the run, and a service a fault started again meanwhile starts outside them)."""
        cgroups.move_to(self._home)

    async def cleanup(self) -> Stopped:
        """Stop every process of the run, the pipeline's source and transport, drop the readers'
        slots; what the helpers left if they were still running; never raises."""
        with contextlib.suppress(psutil.Error):
            await asyncio.to_thread(children.stop, [c for c in self._consumers if c.poll() is None], timeout=0)
        left = Stopped(helpers=await self._stop_helpers(), ended=sorted(self._ended))  # before the teardown
        with contextlib.suppress(Exception):
            await self.env.pipeline.teardown()
        ours = [*self._consumers, *self._procs.values()]
        with contextlib.suppress(Exception):
            await asyncio.to_thread(children.stop, [p for p in ours if p.poll() is None], timeout=10)
            children.forget(self.env.settings, ours)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(drop_slots, self.env.settings.pg_dsn, "load_test_slot")
        if self._http is not None:
            await self._http.close()
        return left
