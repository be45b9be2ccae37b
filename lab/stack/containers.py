"""Cumulative CPU and memory of the compose backend's containers, read at the window edges.

The counter is the container cgroup's cumulative CPU time, the value the engine reports as
``cpu_stats.cpu_usage.total_usage`` (nanoseconds; never an averaged percentage). Two ways to
read it, the same counter either way:

* **Local engine** (the container's cgroup is visible on this host): straight from the cgroup
  file (``cpuacct.usage``, or ``usage_usec`` in ``cpu.stat`` on cgroup v2). Instant and exact at
  the moment it is read. This includes an engine reached over the network that runs on this
  kernel (the lab's own engine in a network namespace, ``lab stack engine up``): its containers'
  cgroups are found through the container's main pid (``/proc/<pid>/cgroup``, whose path must
  carry the container's id, so a remote engine's pid never names a local process's cgroup) and
  the path learnt there (its ``--cgroup-parent``) serves every other container.
  The engine's stats endpoint is not used here because it answers from a collector that
  ticks once a second: every call blocks up to ~1 s (measured: 0.95 s with ``one-shot``, 2 s
  without, Docker 20.10) and its value is up to 1 s old, which would move a window edge by as
  much.
* **Remote engine** (``LAB_DOCKER_HOST``, Docker Desktop's VM): the engine API
  (``stats?stream=false&one-shot=true``) through the Docker SDK, every container at once in
  parallel, so one reading costs ~1 s of wall time and each value is at most ~1 s old
  (documented as the remote mode's edge uncertainty).

Memory is usage without inactive page cache (what ``docker stats`` shows).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
CGROUP = Path("/sys/fs/cgroup")
MAX_AGE_S = 0.05  # one sampler reading asks every participant in turn: fetch once for all


def container_usage(stats: dict[str, Any]) -> tuple[float, float]:
    """(CPU seconds since the container started, memory MB) from one engine stats reading."""
    cpu = stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage", 0) / 1e9
    mem = stats.get("memory_stats", {})
    inner = mem.get("stats", {})
    cache = inner.get("inactive_file", inner.get("total_inactive_file", 0))
    return cpu, max(0, mem.get("usage", 0) - cache) / 2**20


def _stat_field(path: Path, name: str) -> int:
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


DEFAULT_TEMPLATES = ("docker/{id}", "system.slice/docker-{id}.scope")


def cgroup_template(proc_cgroup: str, container_id: str) -> str | None:
    """Where an engine puts its containers' cgroups, as a relative path with ``{id}``, from the
    ``/proc/<pid>/cgroup`` text of one container's main process (the ``cpuacct`` line of cgroup
    v1, or v2's single line); None unless that path carries the container's id (the pid is not
    that container's on this kernel)."""
    lines = [ln.split(":", 2) for ln in proc_cgroup.splitlines() if ln.count(":") >= 2]
    v1 = [path for _, controllers, path in lines if "cpuacct" in controllers.split(",")]
    v2 = [path for hier, controllers, path in lines if hier == "0" and controllers == ""]
    for path in v1 or v2:
        if container_id in path:
            return path.strip("/").replace(container_id, "{id}")
    return None


class LocalCgroup:
    """The cgroup files of one container on this host (v1 cgroupfs/systemd or v2)."""

    def __init__(self, cpu: Path, mem: Path, v2: bool) -> None:
        self.cpu, self.mem, self.v2 = cpu, mem, v2

    @classmethod
    def find(cls, container_id: str, templates: tuple[str, ...] = ()) -> LocalCgroup | None:
        """The cgroup of ``container_id`` at one of the engines' usual places, or at one of
        ``templates`` (relative paths with ``{id}``, learnt by :func:`cgroup_template`)."""
        for template in (*DEFAULT_TEMPLATES, *templates):
            rel = template.format(id=container_id)
            if (CGROUP / "cpuacct" / rel / "cpuacct.usage").exists():
                return cls(CGROUP / "cpuacct" / rel, CGROUP / "memory" / rel, v2=False)
            if (CGROUP / rel / "cpu.stat").exists():
                return cls(CGROUP / rel, CGROUP / rel, v2=True)
        return None

    def read(self) -> tuple[float, float]:
        if self.v2:
            cpu = _stat_field(self.cpu / "cpu.stat", "usage_usec") / 1e6
            usage = int((self.mem / "memory.current").read_text())
            cache = _stat_field(self.mem / "memory.stat", "inactive_file")
        else:
            cpu = int((self.cpu / "cpuacct.usage").read_text()) / 1e9
            usage = int((self.mem / "memory.usage_in_bytes").read_text())
            cache = _stat_field(self.mem / "memory.stat", "total_inactive_file")
        return cpu, max(0, usage - cache) / 2**20


class StatsBoard:
    """The latest (CPU s, memory MB) of every container of a compose project, fetched together.

    ``find(service)`` returns the service's container (or None); ``client`` is the SDK client.
    """

    def __init__(self, client: Any, find: Any, services: tuple[str, ...]) -> None:
        self.client, self.find, self.services = client, find, services
        self._ids: dict[str, str] = {}
        self._pids: dict[str, int] = {}
        self._local: dict[str, LocalCgroup | None] = {}
        self.templates: tuple[str, ...] = ()  # cgroup places learnt from a container's pid
        self._values: dict[str, tuple[float, float]] = {}
        self._at = float("-inf")
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.modes: dict[str, str] = {}  # service -> "cgroup" | "engine api": how it was read

    def _id(self, service: str) -> str | None:
        cid = self._ids.get(service)
        if cid is None:
            c = self.find(service)
            if c is None:
                return None
            cid = self._ids[service] = c.id
            self._pids[service] = int(c.attrs.get("State", {}).get("Pid") or 0)
            self._local[service] = self._locate(service, cid)
        return cid

    def _locate(self, service: str, cid: str) -> LocalCgroup | None:
        """The container's cgroup on this host: at a known place, else learnt from its main pid."""
        found = LocalCgroup.find(cid, self.templates)
        pid = self._pids.get(service, 0)
        if found is not None or pid <= 0 or "engine api" in self.modes.values():
            return found
        try:
            template = cgroup_template(Path(f"/proc/{pid}/cgroup").read_text(), cid)
        except OSError:
            template = None
        if template is None or template in self.templates:
            return None
        self.templates = (*self.templates, template)
        return LocalCgroup.find(cid, self.templates)

    def _api(self, service: str, cid: str) -> tuple[float, float] | None:
        try:
            return container_usage(self.client.api.stats(cid, stream=False, one_shot=True))
        except Exception:  # removed (and maybe recreated): look it up again next time
            self._ids.pop(service, None)
            return None

    def fetch(self) -> dict[str, tuple[float, float]]:
        with self._lock:
            if time.monotonic() - self._at < MAX_AGE_S:
                return self._values
            values: dict[str, tuple[float, float]] = {}
            remote: dict[str, str] = {}
            for service in self.services:
                cid = self._id(service)
                if cid is None:
                    continue
                local = self._local.get(service) or LocalCgroup.find(cid, self.templates)  # once started
                self._local[service] = local
                if local is None:
                    if "cgroup" in self.modes.values():  # a local engine: not running, reads 0
                        continue  # (an API call would cost ~1 ms of this process per reading)
                    remote[service] = cid
                    continue
                try:
                    values[service] = local.read()
                    self.modes[service] = "cgroup"
                except (OSError, ValueError):  # the container went away
                    self._ids.pop(service, None)
            if remote:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(len(self.services), thread_name_prefix="lab-stats")
                futures = {s: self._pool.submit(self._api, s, cid) for s, cid in remote.items()}
                for s, f in futures.items():
                    if (v := f.result()) is not None:
                        values[s] = v
                        if v[0] > 0:  # a stopped container reads 0 either way
                            self.modes[s] = "engine api"
            self._values, self._at = values, time.monotonic()
            return values


class ContainerCounter:
    """A participant's reader: Σ over its services of (cumulative CPU s, memory MB).

    A container not (yet) created reads 0. A container restarted inside a window would restart
    its counter; the lab never restarts one during a run.
    """

    def __init__(self, board: StatsBoard, services: tuple[str, ...]) -> None:
        self.board, self.services = board, services

    def __call__(self) -> tuple[float, float]:
        values = self.board.fetch()
        cpu = sum(values[s][0] for s in self.services if s in values)
        mem = sum(values[s][1] for s in self.services if s in values)
        return cpu, round(mem, 1)
