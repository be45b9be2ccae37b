"""What one reading of the sampler (:mod:`lab.measure.sampler`) reads of a process and of the host.

* **Resolution**: the kernel truncates every field to whole ticks (1/``SC_CLK_TCK`` s). A non-zero
  field is read as its midpoint (+½ tick): this cancels for processes alive at both edges and
  removes the undercount (≈ 10 ms per process) for processes that appear inside a window.
* **CPU method of the walk** (``cpu_method``): ``proc-ticks`` reads ``utime + stime`` as above;
  ``schedstat`` reads each live member's scheduler runtime instead (Σ of the first field of
  ``/proc/<pid>/task/*/schedstat``, nanoseconds, exact for bursty processes) and keeps the
  ``children_*`` ticks for what was reaped (the kernel sets those from the exited child's exact
  runtime). The runner picks ``cgroup`` where it can (:func:`lab.measure.cgroups.choose_cpu_method`),
  else ``schedstat``, else ``proc-ticks``, and stores which one it used with the run.
* **Memory** of a participant is Σ private resident pages + the largest shared part, so shared
  buffers mapped by every PostgreSQL backend count once (zombies count 0).
* **Host busy** = user + nice + system + irq + softirq of ``/proc/stat``. Idle and iowait are not
  busy, steal is CPU the hypervisor gave to another guest, guest/guest_nice are already in
  user/nice. ``unattributed = host busy - Σ participants`` (kernel threads, other jobs, tick
  rounding: it may be slightly negative, and the sign is kept).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NamedTuple

import psutil

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


class Stat(NamedTuple):
    ppid: int
    zombie: bool
    start: int  # ticks since boot; with the pid, the process identity
    own: float  # utime + stime, ticks (midpoints)
    reaped: float  # cutime + cstime, ticks (midpoints)
    rss: int  # pages


def ticks(raw: bytes) -> float:
    v = int(raw)
    return v + 0.5 if v else 0.0


#: Linux: readings parse /proc. Elsewhere (macOS, where only the compose backend runs) the same
#: fields come from psutil (no reaped-children times on macOS: a short-lived child's CPU is lost).
PROC = os.path.isdir("/proc/self")


def psutil_stat(pid: int) -> Stat | None:
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            t = p.cpu_times()
            return Stat(p.ppid(), p.status() == psutil.STATUS_ZOMBIE, int(p.create_time() * CLK_TCK),
                         (t.user + t.system) * CLK_TCK, (t.children_user + t.children_system) * CLK_TCK,
                         int(p.memory_info().rss / (PAGE_MB * 2**20)))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def read_stat(pid: int) -> Stat | None:
    """One ``/proc/<pid>/stat`` read; None when the process is gone."""
    if not PROC:
        return psutil_stat(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    r = raw[raw.rindex(b")") + 2 :].split()  # fields 3.. (comm may contain spaces and parens)
    return Stat(int(r[1]), r[0] == b"Z", int(r[19]), ticks(r[11]) + ticks(r[12]),
                 ticks(r[13]) + ticks(r[14]), int(r[21]))


def schedstat_ticks(pid: int) -> float | None:
    """Σ scheduler runtime of the live threads of ``pid``, in ticks (None when unreadable)."""
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    ns = 0
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat", "rb") as f:
                ns += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that exited meanwhile: its runtime is in the process's own total
    return ns * CLK_TCK / 1e9


def memory(pid: int, rss_pages: int) -> tuple[int, int]:
    """(private, shared) resident pages of ``pid`` from ``/proc/<pid>/statm``.

    A participant's memory is Σ private + the largest shared part: PostgreSQL's backends all
    map the same shared buffers, and summing their RSS would count those once per backend
    (4 GB for 220 backends where the server really holds ~0.5 GB).
    """
    if not PROC:
        return rss_pages, 0
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            fields = f.read().split()
        resident, shared = int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return rss_pages, 0
    return resident - shared, shared


def group_rss_mb(pids: Iterable[int]) -> float:
    """Σ private + the largest shared part of ``pids`` (gone and zombie processes count 0)."""
    private = shared = 0
    for pid in pids:
        p, sh = memory(pid, 0)
        private, shared = private + p, max(shared, sh)
    return round((private + shared) * PAGE_MB, 1)


def host_busy_s() -> float:
    """Busy CPU-seconds of the whole host since boot (module docstring)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
