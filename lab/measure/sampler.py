"""Exact CPU and memory accounting of named process trees.

A :class:`Participant` is a named set of root processes. Its CPU at an instant is, per root,
``user + system + children_user + children_system`` of the root and of every live descendant.
``children_*`` only holds a process's *reaped* children (with what they had reaped), so a process
that starts and exits inside a window is counted once, by the ancestor that reaped it, and a live
descendant is counted by itself together with what *it* reaped: nothing is counted twice.

A participant with a cgroup (:mod:`lab.measure.cgroups`; the runner gives one to every participant where
it can) takes its CPU from the cgroup and its members from ``cgroup.procs``: no tree is walked for
it. The tree walk below is the fallback for participants without one: readings parse
``/proc/<pid>/stat`` (the fields psutil's ``cpu_times()``, ``ppid()`` and ``memory_info().rss``
read, in one file read per process), with a cached parent map so that a background sample reads
only new processes and the trees' members (a full scan costs ≈ 8 ms for 330 processes, ≈ 25 ms
with ``psutil.Process.children``). :meth:`Sampler.snapshot`, used at the window edges, always
rescans the whole table.

Decisions:

* **Zombies** (exited, not reaped) keep their final times readable: counted with them, 0 RSS.
  Once reaped, the same times move into the parent's ``children_*``.
* **Races**: a reap during a reading could count a process twice (read, then its parent) or not at
  all. Every member is read again after the reading; if one vanished or a ``children_*`` changed,
  the reading is repeated (up to 3 times; :attr:`Sampler.retried` counts them).
* **A root that exits** keeps its last observed value (roots are keyed by pid + start time): the
  counter stays monotonic and loses at most the root's activity since the previous sample. A root
  first seen after a snapshot adds its whole lifetime to later deltas (exact if it started inside).
* **Disjoint trees**: another participant's root is never walked into. ``children_*`` cannot be
  split, so a process that spawns other participants (the runner) is declared
  ``recursive=False``: its own user+system only.
* **Known gaps**: an orphan (its parent exited first) is reparented out of the tree; a child of a
  parent that ignores SIGCHLD is auto-reaped and its times are lost. The lab's services reap their
  own children (postmaster) or do not fork (JVMs, consumers).
* **Bursty processes**: on this kernel a live process's ``utime + stime`` is tick-sampled and
  misses a process that works in sub-tick bursts (200 PostgreSQL backends serving 2000 inserts
  read 0.02 s live against 0.42 s of scheduler runtime; the rest shows up only when they exit).
  The runner therefore gives each participant a cgroup (:mod:`lab.measure.cgroups`) and reads its CPU
  there (``usage_usec``: exact, processes born and gone inside the window included).
* **Cgroup participants cost no walk**: their CPU is one ``cpu.stat`` read and their members are
  ``cgroup.procs`` (everything that is in the group, whatever its parent: the set whose CPU is
  counted, also for a ``recursive=False`` participant). When every participant has a cgroup a
  reading never lists ``/proc``. The tree walk cost ≈ 20 ms per reading with PostgreSQL's ~230
  backends (4 % of a core at 2 Hz, against a budget of 1 %).
* **RSS of a cgroup participant** is read (one ``/proc/<pid>/statm`` per member) at every
  snapshot and every ``rss_every``-th background reading (4: every 2 s at the default period);
  the readings in between carry the last value. Memory moves slowly; CPU is read every time.
  A root found outside its participant's cgroup at a snapshot is logged (its CPU is not counted).
* **What a reading reads** (ticks and their resolution, the scheduler's runtime, memory, the
  host's busy time): :mod:`lab.measure.procstat`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from lab.measure import procstat
from lab.measure.cgroups import CpuGroup

log = logging.getLogger(__name__)

TIMELINE_COLUMNS = ("t", "participant", "cpu_s", "rss_mb")
RESERVED = frozenset({"host", "unattributed"})
_RETRIES = 3
WALK_METHODS = ("proc-ticks", "schedstat")

Roots = Sequence[psutil.Process] | Callable[[], Iterable[psutil.Process]]
_Trees = dict[str, list[tuple[tuple[int, int], list[int]]]]  # name -> [((pid, start), members)]


@dataclass(frozen=True)
class Participant:
    """A named process tree; ``roots`` is a list, or a callable asked at every tree walk.

    ``group`` also sums several participants under one name (the N consumers);
    ``recursive=False`` counts the roots' own user+system only (the runner, without a cgroup).
    ``cgroup``: CPU and members come from the participant's cgroup (see :mod:`lab.measure.cgroups`:
    exact for processes that work in short bursts, which tick-sampled ``/proc`` counters miss);
    ``roots`` are then only checked at snapshots (and keep other participants' walks out).
    """

    name: str
    roots: Roots
    group: str | None = None
    recursive: bool = True
    cgroup: CpuGroup | None = None  # exact CPU and the member pids; no tree walk
    #: A reader of (cumulative CPU s, current memory MB) for what has no local process tree:
    #: a container (``lab.stack.compose``, possibly on another host). No walk, no cgroup.
    counter: Callable[[], tuple[float, float]] | None = None

    def current_roots(self) -> list[psutil.Process]:
        return list(self.roots() if callable(self.roots) else self.roots)


@dataclass(frozen=True)
class Snapshot:
    """Every counter at one instant: cumulative CPU-seconds and current RSS per participant."""

    t_mono: float
    t_wall: float
    cpu_s: dict[str, float]
    rss_mb: dict[str, float]
    host_busy_s: float
    sampler_cpu_s: float


class _Round(dict[int, procstat.Stat | None]):
    """The stats read during one reading attempt, each pid at most once."""

    def get_stat(self, pid: int) -> procstat.Stat | None:
        if pid not in self:
            self[pid] = procstat.read_stat(pid)
        return self[pid]


class Sampler:
    """Cumulative CPU and RSS of participants: a background timeline plus exact edge snapshots.

    ``start()``/``stop()`` (or ``with``) run a daemon thread sampling every ``period`` s (≤ 1),
    reading cgroup participants' RSS every ``rss_every``-th time; ``snapshot()`` reads everything
    now; ``window(a, b)`` turns two snapshots into CPU-seconds and RSS statistics;
    ``timeline_rows()`` gives the CSV rows.
    """

    def __init__(self, participants: Sequence[Participant], *, period: float = 0.5,
                 rss_every: int = 4, cpu_method: str = "proc-ticks") -> None:
        if not 0 < period <= 1:
            raise ValueError(f"sampling period must be in (0, 1] s, got {period}")
        if rss_every < 1:
            raise ValueError(f"rss_every must be ≥ 1, got {rss_every}")
        if cpu_method not in WALK_METHODS:
            raise ValueError(f"cpu_method of the tree walk must be one of {WALK_METHODS}, not {cpu_method!r}")
        self.cpu_method = cpu_method
        names = [p.name for p in participants]
        groups = {p.group for p in participants if p.group}
        if len(set(names)) != len(names) or groups & set(names) or RESERVED & (set(names) | groups):
            raise ValueError(f"participant/group names must be distinct, not {sorted(RESERVED)}")
        self.participants = tuple(participants)
        self.groups = {g: [p.name for p in participants if p.group == g] for g in sorted(groups)}
        self.period = period
        self.rss_every = rss_every
        self.retried = 0  # readings repeated because a process was reaped while being read
        self._ppid: dict[int, int] = {}
        self._members: set[int] = set()
        self._last: dict[str, dict[tuple[int, int], float]] = {n: {} for n in names}
        self._walked = [p for p in self.participants if p.cgroup is None and p.counter is None]
        self._rss: dict[str, float] = {}  # cgroup participants: last RSS read
        self._background = 0  # background readings so far
        self._outside: set[tuple[str, int]] = set()  # (participant, root pid) already logged
        self._timeline: list[Snapshot] = []
        self._own_cpu = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="lab-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        due = time.monotonic()
        while True:
            t0 = time.thread_time()
            try:
                self._read(full=False)
            except Exception:
                log.exception("sampler reading failed; sampling goes on")
            with self._lock:
                self._own_cpu += time.thread_time() - t0
            now, due = time.monotonic(), due + self.period
            if due <= now:  # fell behind (slow reading, busy host): skip rather than bunch up
                due = now + self.period
            if self._stop.wait(due - now):
                return

    def snapshot(self) -> Snapshot:
        """Read every counter now (full rescan); the snapshot is also kept in the timeline."""
        t0 = time.thread_time()
        snap = self._read(full=True)
        with self._lock:
            self._own_cpu += time.thread_time() - t0
        return snap

    @property
    def sampler_cpu_s(self) -> float:
        """CPU-seconds the sampler has used: its thread plus every ``snapshot()`` call."""
        return self._own_cpu

    def _read(self, *, full: bool) -> Snapshot:
        with self._lock:
            cpu: dict[str, float] = {}
            rss: dict[str, float] = {}
            if self._walked:
                roots = {p.name: p.current_roots() for p in self.participants}
                rescan = full
                for _ in range(_RETRIES):
                    rnd, trees = self._scan(roots, full=rescan)
                    if self._consistent(rnd):
                        break
                    self.retried += 1
                    rescan = True
                cpu, rss = self._account(rnd, trees)
            rss_due = full or self._background % self.rss_every == 0
            if not full:
                self._background += 1
            for part in self.participants:
                if part.counter is not None:
                    cpu[part.name], rss[part.name] = part.counter()
                elif part.cgroup is not None:
                    cpu[part.name] = part.cgroup.usage_s()
                    if rss_due or part.name not in self._rss:
                        pids = set(part.cgroup.pids())
                        self._rss[part.name] = procstat.group_rss_mb(pids)
                        if full:
                            self._check_roots(part, pids)
                    rss[part.name] = self._rss[part.name]
            order = [p.name for p in self.participants]
            cpu, rss = {n: cpu[n] for n in order}, {n: rss[n] for n in order}
            snap = Snapshot(time.monotonic(), time.time(), cpu, rss, procstat.host_busy_s(), self._own_cpu)
            self._timeline.append(snap)
            return snap

    def _check_roots(self, part: Participant, pids: set[int]) -> None:
        """Log (once) a live root that is not in its participant's cgroup: its CPU is missed."""
        for root in part.current_roots():
            if root.pid in pids or (part.name, root.pid) in self._outside:
                continue
            if (st := procstat.read_stat(root.pid)) is None or st.zombie:
                continue
            self._outside.add((part.name, root.pid))
            log.warning("participant %s: root pid %s is not in its cgroup %s; "
                        "its CPU is not counted", part.name, root.pid,
                        part.cgroup.path if part.cgroup else None)

    def _scan(self, roots: dict[str, list[psutil.Process]], *, full: bool) -> tuple[_Round, _Trees]:
        """Refresh the parent map, then walk each participant's trees, reading every member.

        Participants with a cgroup are not walked; their roots still bound the others' walks.
        """
        rnd = _Round()
        pids = {int(n) for n in os.listdir("/proc") if n.isdigit()} if procstat.PROC else set(psutil.pids())
        self._ppid = {pid: pp for pid, pp in self._ppid.items() if pid in pids}
        for pid in pids if full else (pids - self._ppid.keys()) | (self._members & pids):
            if (st := rnd.get_stat(pid)) is not None:
                self._ppid[pid] = st.ppid
        children: dict[int, list[int]] = {}
        for pid, pp in self._ppid.items():
            children.setdefault(pp, []).append(pid)
        claimed = {r.pid for rs in roots.values() for r in rs}
        seen: set[int] = set()
        trees: _Trees = {}
        for part in self.participants:
            trees[part.name] = []
            for root in roots[part.name]:
                st = rnd.get_stat(root.pid)
                if st is None or root.pid in seen:
                    continue
                if part.cgroup is not None:  # not walked: its root only bounds the other walks
                    seen.add(root.pid)
                    continue
                if (root.pid, st.start) not in self._last[part.name] and not root.is_running():
                    continue  # a stale psutil.Process whose pid now belongs to someone else
                seen.add(root.pid)
                members = [root.pid]
                todo = list(children.get(root.pid, ())) if part.recursive else []
                while todo:
                    pid = todo.pop()
                    if pid not in claimed:
                        members.append(pid)
                        todo.extend(children.get(pid, ()))
                        rnd.get_stat(pid)
                trees[part.name].append(((root.pid, st.start), members))
        self._members = {pid for ts in trees.values() for _, ms in ts for pid in ms}
        return rnd, trees

    def _consistent(self, rnd: _Round) -> bool:
        """True if no member vanished or reaped a child since it was read in this round."""
        for pid in self._members:
            first, now = rnd.get_stat(pid), procstat.read_stat(pid)
            if first is None:
                continue
            if now is None or (now.start, now.reaped) != (first.start, first.reaped):
                return False
        return True

    def _account(self, rnd: _Round, trees: _Trees) -> tuple[dict[str, float], dict[str, float]]:
        cpu: dict[str, float] = {}
        rss: dict[str, float] = {}
        exact = self.cpu_method == "schedstat"
        for part in self._walked:
            last, private, shared = self._last[part.name], 0, 0
            for key, members in trees[part.name]:
                ticks = 0.0
                for pid in members:
                    if (st := rnd.get_stat(pid)) is not None:
                        own = procstat.schedstat_ticks(pid) if exact and not st.zombie else None
                        ticks += (st.own if own is None else own) + (st.reaped if part.recursive else 0.0)
                        if not st.zombie:
                            p, sh = procstat.memory(pid, st.rss)
                            private, shared = private + p, max(shared, sh)
                last[key] = ticks
            cpu[part.name] = sum(last.values()) / procstat.CLK_TCK
            rss[part.name] = round((private + shared) * procstat.PAGE_MB, 1)
        return cpu, rss

    def timeline(self) -> list[Snapshot]:
        """Every reading so far (background samples and snapshots), oldest first."""
        with self._lock:
            return list(self._timeline)

    def window(self, a: Snapshot, b: Snapshot) -> dict[str, Any]:
        """CPU-seconds per participant and group between two snapshots; RSS over samples inside.

        Keys: ``window_s``, ``samples``, ``participants`` and ``groups`` (name → ``cpu_s``,
        ``rss_mb_mean``, ``rss_mb_max``), ``host_busy_cpu_s``, ``unattributed_cpu_s`` (may be
        slightly negative), ``sampler_cpu_s`` and ``sampler_core_pct`` (% of one core).
        """
        if b.t_mono < a.t_mono:
            raise ValueError("the window's end snapshot is older than its start")
        inside = [s for s in self.timeline() if a.t_mono <= s.t_mono <= b.t_mono] or [a, b]
        span = b.t_mono - a.t_mono
        cpu = {n: b.cpu_s[n] - a.cpu_s[n] for n in b.cpu_s}

        def stats(names: list[str]) -> dict[str, float]:
            mem = [sum(s.rss_mb[n] for n in names) for s in inside]
            return {"cpu_s": round(sum(cpu[n] for n in names), 3),
                    "rss_mb_mean": round(sum(mem) / len(mem), 1), "rss_mb_max": round(max(mem), 1)}

        host = b.host_busy_s - a.host_busy_s
        own = b.sampler_cpu_s - a.sampler_cpu_s
        return {
            "window_s": round(span, 3),
            "samples": len(inside),
            "participants": {n: stats([n]) for n in cpu},
            "groups": {g: stats(names) for g, names in self.groups.items()},
            "host_busy_cpu_s": round(host, 3),
            "unattributed_cpu_s": round(host - sum(cpu.values()), 3),
            "sampler_cpu_s": round(own, 4),
            "sampler_core_pct": round(100 * own / span, 3) if span > 0 else None,
        }

    def timeline_rows(self, origin: Snapshot | None = None) -> list[dict[str, Any]]:
        """CSV rows (``TIMELINE_COLUMNS``), CPU and time relative to ``origin`` (default: first).

        ``participant`` is a participant, a group (the sum of its members: do not add both),
        ``unattributed`` or ``host`` (all busy CPU); the last two have no RSS.
        """
        snaps = self.timeline()
        if not snaps:
            return []
        o = origin or snaps[0]
        rows: list[dict[str, Any]] = []
        for s in snaps:
            t = round(s.t_mono - o.t_mono, 3)
            cpu = {n: s.cpu_s[n] - o.cpu_s[n] for n in s.cpu_s}
            host = s.host_busy_s - o.host_busy_s
            mem = dict(s.rss_mb)
            for g, names in self.groups.items():
                cpu[g] = sum(cpu[n] for n in names)
                mem[g] = round(sum(s.rss_mb[n] for n in names), 1)
            unattributed = host - sum(s.cpu_s[n] - o.cpu_s[n] for n in s.cpu_s)
            rows += [{"t": t, "participant": n, "cpu_s": round(c, 3), "rss_mb": mem[n]}
                     for n, c in cpu.items()]
            rows.append({"t": t, "participant": "unattributed", "cpu_s": round(unattributed, 3),
                         "rss_mb": None})
            rows.append({"t": t, "participant": "host", "cpu_s": round(host, 3), "rss_mb": None})
        return rows
