"""Exact CPU per participant from cgroup v2 ``cpu.stat`` (``usage_usec``).

Why not only ``/proc/<pid>/stat``: on this kernel a live process's ``utime + stime`` is
tick-sampled, so a process that works in short bursts (a PostgreSQL backend serving one
``INSERT`` at a time) is seen to use almost nothing while it lives — measured here: 200
backends doing 2000 inserts showed 0.02 s in ``/proc/<pid>/stat`` against 0.42 s in
``/proc/<pid>/schedstat`` — and its real total appears only when it exits and is reaped into
its parent's ``cutime``. A cgroup counts the scheduler's exact runtime of every thread of every
process in it, including processes that start and exit inside the window, exactly like the
container counters the reference read.

Each participant gets a cgroup ``fanout-lab/<scope>/<name>`` under the cgroup v2 mount; its
processes are moved there (children inherit it). No controller is enabled: the cgroup is only a
counter and limits nothing. Without a writable cgroup v2 mount (not root, no cgroup2), callers
fall back to process-tree counters.

Only processes the lab started go into these groups, with one exception: the process that
runs a run (``lab run``, but also pytest or a Jupyter kernel) is its own participant
``runner``. It is lent to that group for the window and moved back to the cgroup it came from
afterwards (:func:`current`, :func:`move_to`), so the caller never stays in the lab's groups.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from lab.settings import Settings

log = logging.getLogger(__name__)

_MOUNTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
PREFIX = "fanout-lab"


CPU_METHODS = ("cgroup", "schedstat", "proc-ticks")  # most exact first


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path (``0::/user.slice/...``), or None."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip()
    except OSError:
        pass
    return None


def cgroup2_mount() -> Path | None:
    """A writable cgroup v2 directory the lab can make its groups in, or None.

    As root: the cgroup v2 mount itself. Otherwise a delegated subtree (e.g. a systemd
    ``--user --scope``): this process's own cgroup, if we may create groups in it and move
    processes there.
    """
    for path in _MOUNTS:
        if not ((path / "cgroup.procs").exists() and (path / "cgroup.subtree_control").exists()):
            continue
        if os.geteuid() == 0:
            return path if os.access(path, os.W_OK) else None
        own = _own_cgroup()
        if own and own != "/":
            base = path / own.lstrip("/")
            if os.access(base, os.W_OK) and os.access(base / "cgroup.procs", os.W_OK):
                return base
        return None
    return None


def schedstat_available() -> bool:
    """Per-thread scheduler runtimes are readable (``CONFIG_SCHEDSTATS``-independent field 1)."""
    return Path(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat").exists()


def choose_cpu_method(wanted: str = "auto") -> str:
    """The CPU method a run uses: ``wanted`` if possible, else (``auto``) the most exact one.

    ``cgroup`` (exact: scheduler runtime of everything in the group, processes born and gone
    inside the window included), ``schedstat`` (exact for live threads; exited children through
    their parent's reaped totals), ``proc-ticks`` (tick-sampled ``utime + stime``: misses
    processes that work in sub-tick bursts). Raises ValueError when ``wanted`` is not possible.
    """
    possible = [m for m, ok in (("cgroup", cgroup2_mount() is not None),
                                ("schedstat", schedstat_available()), ("proc-ticks", True)) if ok]
    if wanted == "auto":
        return possible[0]
    if wanted not in CPU_METHODS:
        raise ValueError(f"unknown cpu method {wanted!r}: choose auto or one of {', '.join(CPU_METHODS)}")
    if wanted not in possible:
        raise ValueError(f"cpu method {wanted!r} is not available here (possible: {', '.join(possible)})")
    return wanted


class CpuGroup:
    """One participant's cgroup: move processes in, read their exact CPU-seconds."""

    def __init__(self, mount: Path, name: str, *, scope: str = "") -> None:
        self.path = mount / PREFIX / scope / name if scope else mount / PREFIX / name
        self.path.mkdir(parents=True, exist_ok=True)

    def attach(self, pids: Iterable[int]) -> int:
        """Move ``pids`` (whole processes) into this group; gone pids are skipped."""
        moved = 0
        procs = self.path / "cgroup.procs"
        for pid in pids:
            try:
                procs.write_text(str(pid))
                moved += 1
            except (ProcessLookupError, FileNotFoundError):
                continue
            except OSError as exc:  # e.g. a kernel thread
                log.debug("cannot move pid %s into %s: %s", pid, self.path, exc)
        return moved

    def usage_s(self) -> float:
        """Cumulative CPU-seconds of everything that ever ran in this group."""
        with open(self.path / "cpu.stat", "rb") as f:
            first = f.readline()  # b"usage_usec N\n"
        return int(first.split()[1]) / 1e6

    def pids(self) -> list[int]:
        return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]

    def remove(self) -> None:
        """Delete the group if it is empty (a cgroup with processes cannot be removed)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


def attached(settings: Settings, name: str, pids: Iterable[int]) -> CpuGroup | None:
    """This stack's group ``name`` with ``pids`` moved into it, or None without cgroup v2."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    group = CpuGroup(mount, name, scope=cgroup_scope(settings))
    group.attach(pids)
    return group


def current(pid: int | None = None) -> Path | None:
    """The cgroup v2 directory ``pid`` (default: this process) is in, or None."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid or 'self'}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return mount / line[3:].lstrip("/")
    return None


def move_to(group: Path | None, pid: int | None = None) -> None:
    """Move ``pid`` (default: this process) back into ``group`` (from :func:`current`)."""
    if group is None:
        return
    try:
        (group / "cgroup.procs").write_text(str(pid or os.getpid()))
    except OSError as exc:
        log.warning("could not move pid %s back into %s: %s", pid or os.getpid(), group, exc)


def children_map() -> dict[int, list[int]]:
    """ppid -> pids, from one pass over ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def tree_pids(root_pid: int) -> list[int]:
    """``root_pid`` and all its live descendants, from one pass over ``/proc``."""
    children = children_map()
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cgroup_scope(settings: Settings) -> str:
    """One folder of groups per stack, so a test stack and a user's stack never mix."""
    return "stack-" + hashlib.sha1(str(settings.stack_dir).encode()).hexdigest()[:10]


def occupant(settings: Settings, *, services: Iterable[str],
             ignore: Iterable[int] = ()) -> tuple[str, int] | None:
    """(group, pid) of a process in one of this stack's groups other than the services' own
    (``postgres`` …, also as ``idle-postgres``), this process and ``ignore``; None if none."""
    mount = cgroup2_mount()
    base = mount / PREFIX / cgroup_scope(settings) if mount is not None else None
    if base is None or not base.exists():
        return None
    keep, skip = set(services), {os.getpid(), *ignore}
    for path in sorted(p for p in base.iterdir() if p.is_dir()):
        if path.name.removeprefix("idle-") in keep:
            continue
        with contextlib.suppress(OSError, ValueError):
            pids = [int(x) for x in (path / "cgroup.procs").read_text().split() if int(x) not in skip]
            if pids:
                return path.name, pids[0]
    return None


def remove_scope(settings: Settings) -> None:
    """Remove this stack's groups that are empty (all of them once the stack is down)."""
    mount = cgroup2_mount()
    if mount is None:
        return
    base = mount / PREFIX / cgroup_scope(settings)
    if not base.exists():
        return
    for path in sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()
    for path in (base, mount / PREFIX):
        with contextlib.suppress(OSError):
            path.rmdir()
