"""How a run was measured, stored with it (``run.json``): enough to tell later whether two runs
may be compared, and to rebuild the measuring setup.

* ``cpu_method``: ``cgroup`` | ``schedstat`` | ``proc-ticks`` (:func:`lab.measure.cgroups.choose_cpu_method`).
* ``clients``: the versions of the client libraries on the measured path (Python, psycopg and
  the libpq it runs on, aiohttp, uvloop, orjson; the broker clients come from
  :func:`lab.pipelines.versions.broker_client_versions`, the layer allowed to import them).
* ``host``: cores, kernel, load average at the start and end of the run, and what ``/proc/stat``
  says about the sampled span (:class:`HostWindow`): busy, idle and *steal* CPU-seconds (steal =
  time the hypervisor ran another guest while ours wanted the CPU).
* ``git``: the commit and whether the tree had uncommitted changes to tracked files.

Nothing here fails a run: what cannot be read is stored as None.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

CLIENT_DISTRIBUTIONS = ("psycopg", "psycopg-binary", "psycopg-pool", "aiohttp", "uvloop", "orjson", "psutil")
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def client_versions() -> dict[str, str | None]:
    """Python and the non-broker client libraries of the measured path, with libpq's version."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    out |= {name: dist_version(name) for name in CLIENT_DISTRIBUTIONS}
    try:
        import psycopg

        v = psycopg.pq.version()  # e.g. 170005 -> 17.5
        out["libpq"] = f"{v // 10000}.{v % 100}" if v >= 100000 else str(v)
        out["psycopg_impl"] = psycopg.pq.__impl__
    except Exception:
        out["libpq"] = None
    return out


def read_proc_stat() -> dict[str, float]:
    """The aggregate ``cpu`` line of ``/proc/stat`` in CPU-seconds per field."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    tck = os.sysconf("SC_CLK_TCK")
    return {name: int(v) / tck for name, v in zip(_STAT_FIELDS, fields, strict=False)}


class HostWindow:
    """``/proc/stat`` and the load average read at two instants (the run's sampled span)."""

    def __init__(self) -> None:
        self._start: tuple[float, dict[str, float], tuple[float, ...]] | None = None
        self._end: tuple[float, dict[str, float], tuple[float, ...]] | None = None

    @staticmethod
    def _read() -> tuple[float, dict[str, float], tuple[float, ...]]:
        return time.monotonic(), read_proc_stat(), os.getloadavg()

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> None:
        if self._start is not None and self._end is None:
            self._end = self._read()

    def summary(self) -> dict[str, Any]:
        """CPU-seconds per kind over the span, steal as % of all CPU time, load averages."""
        if self._start is None or self._end is None:
            return {}
        (t0, a, la), (t1, b, lb) = self._start, self._end
        d = {k: round(b[k] - a[k], 3) for k in a if k in b}
        total = sum(d.values())
        busy = sum(d.get(k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
        return {
            "span_s": round(t1 - t0, 3), "busy_cpu_s": round(busy, 3), "idle_cpu_s": d.get("idle"),
            "iowait_cpu_s": d.get("iowait"), "steal_cpu_s": d.get("steal"),
            "steal_pct": round(100 * d.get("steal", 0.0) / total, 2) if total > 0 else None,
            "busy_pct": round(100 * busy / total, 1) if total > 0 else None,
            "loadavg_start": [round(x, 2) for x in la], "loadavg_end": [round(x, 2) for x in lb],
        }


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(), "cpus": psutil.cpu_count(),
        "cpus_physical": psutil.cpu_count(logical=False), "kernel": platform.release(),
        "platform": platform.platform(), "python": platform.python_version(),
    }


def machine_facts() -> dict[str, Any]:
    """What a sitting record says of the machine: a hash of its machine id (``/etc/machine-id``; the
    hostname's when there is none), CPU model, logical and physical cores, memory (GiB), kernel,
    Python. Virtual machines cloned from one image share the machine id while their hosts differ,
    so a machine is told apart by ``id`` and ``cpu_model`` together (:func:`lab.study.ledger.machine`)."""
    import hashlib

    ident = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            ident = Path(path).read_text().strip()
        except OSError:
            continue
        if ident:
            break
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "id": hashlib.sha256((ident or socket.gethostname()).encode()).hexdigest()[:12],
        "cpu_model": model or platform.processor() or None, "cpus": psutil.cpu_count(),
        "cpus_physical": psutil.cpu_count(logical=False),
        "mem_gib": round(psutil.virtual_memory().total / 2**30, 1), "kernel": platform.release(),
        "python": platform.python_version(),
    }


def git_state(root: Path) -> dict[str, Any]:
    """``sha`` of HEAD and ``dirty`` (tracked files changed); None each outside a git checkout."""

    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                 check=False, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout if res.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha.strip() if sha else None, "dirty": None if status is None else bool(status.strip())}


def provenance(*, root: Path, cpu_method: str, clients: dict[str, Any], services: dict[str, str],
               window: HostWindow) -> dict[str, Any]:
    """The run.json fields of this module (merged into the run's top level by the runner)."""
    git = git_state(root)
    host = host_info() | window.summary()
    return {
        "cpu_method": cpu_method, "clients": clients, "versions": services, "host": host,
        "git_sha": git["sha"], "git_dirty": git["dirty"],
        "steal_pct": host.get("steal_pct"), "loadavg_1m": (host.get("loadavg_end") or [None])[0],
    }
