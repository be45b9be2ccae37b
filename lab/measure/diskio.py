"""Bytes each participant wrote to (and read from) the storage layer over a run's window.

Read at the two edges of the window only (the runner calls :meth:`DiskWindow.start` where it
starts the network window and :meth:`DiskWindow.stop` where it stops it), by one of two methods
per participant, recorded with its figure:

* ``cgroup-io``: the participant's cgroup (:mod:`lab.measure.cgroups`) with the io controller,
  ``io.stat``'s ``wbytes`` and ``rbytes`` summed over devices. Exact for everything that ever ran
  in the group, processes born and gone inside the window included; writeback of a dirty page is
  charged to the cgroup that dirtied it. The runner enables ``+io`` in ``cgroup.subtree_control``
  of the lab's cgroups' parents (:func:`enable_io`); where the kernel does not offer the
  controller at the cgroup v2 mount (a hybrid hierarchy, where io belongs to v1's blkio), the
  reason is recorded (``io_controller``) and the fallback is used.
* ``proc-io``: ``/proc/<pid>/io``'s ``write_bytes - cancelled_write_bytes`` and ``read_bytes``,
  summed over the participant's process trees. Like the CPU tree walk (:mod:`lab.measure.sampler`)
  a process's counters include the children it reaped, so a tree's sum counts a child that exited
  inside the window exactly once. A root that exits before the end edge (a consumer, the
  senders; they are reaped by the runner, outside their tree) keeps its last reading: the runner
  reads once more right after the drain (:meth:`DiskWindow.observe`), before it stops the
  consumers, and what a root writes after that (its log's last lines, its result file) is not
  counted. The runner itself counts its own threads only (``/proc/<pid>/task/*/io``), never what
  it reaped.
* the host's disks (``/proc/diskstats``, sectors written and read by every whole disk): what
  reached the devices over the window from everything on the host, the filesystem's journal and
  other work included, as run.json's ``disk_host``: the bound the participants' figures are read
  against.
* ``not measured``: a container of the compose backend (its block I/O is the engine's
  ``blkio_stats``, which its stats endpoint serves from a once-a-second collector; not read).

``write_bytes`` is what a process sent towards the storage layer: a buffered write counts when the
page is dirtied, not when it reaches the device, and a page dirtied, written back and dirtied again
counts twice. The kernel counts whole folios: where a filesystem caches a file in large folios
(ext4 on Linux 6.18 here), a 200-byte write followed by ``fdatasync`` counted 2 MiB, so a WAL
flushed at every commit reads far above the bytes it holds (``disk_host`` is the bound).
PostgreSQL writes its data pages at checkpoints, so a window holds its WAL and whatever was
evicted, not the data pages the next checkpoint writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lab.measure.cgroups import PREFIX, cgroup2_mount, cgroup_scope, children_map
from lab.measure.sampler import Participant
from lab.settings import Settings

log = logging.getLogger(__name__)

Bytes = tuple[int, int]  # (written, read)
#: a participant's reading: source key -> (written, read); the key is ``cgroup`` or a root's
#: ``<pid>:<start ticks>``, so a pid the kernel reuses is another root
Reading = dict[str, Bytes]
METHODS = ("cgroup-io", "proc-io", "not measured")
EXCLUDED = frozenset({"probe"})  # the speed probe: measured for CPU, never in the totals


def parse_io_stat(text: str) -> Bytes:
    """(wbytes, rbytes) summed over the devices of a cgroup v2 ``io.stat``
    (``MAJ:MIN rbytes=N wbytes=N rios=N wios=N dbytes=N dios=N`` per line)."""
    w = r = 0
    for line in text.splitlines():
        for field in line.split()[1:]:
            key, _, value = field.partition("=")
            if key == "wbytes":
                w += int(value)
            elif key == "rbytes":
                r += int(value)
    return w, r


def parse_proc_io(text: str) -> Bytes:
    """(write_bytes - cancelled_write_bytes, read_bytes) of one ``/proc/<pid>/io``."""
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        with contextlib.suppress(ValueError):
            fields[key.strip()] = int(value)
    return fields.get("write_bytes", 0) - fields.get("cancelled_write_bytes", 0), fields.get("read_bytes", 0)


def parse_diskstats(text: str, disks: Iterable[str]) -> Bytes:
    """(bytes written, bytes read) summed over the whole disks ``disks`` of one ``/proc/diskstats``
    (sectors of 512 bytes, whatever the device's own sector size)."""
    wanted, w, r = set(disks), 0, 0
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 10 and f[2] in wanted:
            r, w = r + int(f[5]) * 512, w + int(f[9]) * 512
    return w, r


def whole_disks(names: Iterable[str]) -> list[str]:
    """The block devices of ``/sys/block`` that are disks, not loop, RAM or compressed-RAM devices."""
    return sorted(n for n in names if not n.startswith(("loop", "ram", "zram")))


def host_reading() -> Bytes | None:
    """The host's disks' (bytes written, bytes read) since boot, or None without ``/proc/diskstats``."""
    try:
        disks = whole_disks(os.listdir("/sys/block"))
        with open("/proc/diskstats") as f:
            return parse_diskstats(f.read(), disks)
    except OSError:
        return None


def add(a: Bytes, b: Bytes) -> Bytes:
    return a[0] + b[0], a[1] + b[1]


def seen(last: Mapping[str, Reading], new: Mapping[str, Reading]) -> dict[str, Reading]:
    """Every source's latest reading: ``new`` over ``last``; a source gone from ``new`` (a root
    that exited) keeps its last value."""
    out = {name: dict(r) for name, r in last.items()}
    for name, reading in new.items():
        out.setdefault(name, {}).update(reading)
    return out


def delta(first: Reading, last: Reading) -> Bytes:
    """A participant's bytes over the window: per source its last reading minus its first (a
    source first seen after the start edge, a replacement consumer, counts from 0)."""
    w = r = 0
    for key, (lw, lr) in last.items():
        fw, fr = first.get(key, (0, 0))
        w, r = w + lw - fw, r + lr - fr
    return w, r


def cgroup_parents(mount: Path, scope: str) -> list[Path]:
    """The directories whose ``cgroup.subtree_control`` must hold ``io`` for the lab's groups
    (``<mount>/fanout-lab/<scope>/<name>``) to have an ``io.stat``, top first."""
    return [mount, mount / PREFIX, mount / PREFIX / scope]


def enable_io(parents: Sequence[Path]) -> str | None:
    """Enable the io controller down to the lab's groups; None when enabled, else why not (one
    line: the controller not offered by the kernel, or the write refused)."""
    for path in parents:
        try:
            offered = (path / "cgroup.controllers").read_text().split()
            if "io" not in offered:
                return f"the io controller is not offered at {path} (cgroup.controllers: {' '.join(offered) or '-'})"
            if "io" not in (path / "cgroup.subtree_control").read_text().split():
                (path / "cgroup.subtree_control").write_text("+io")
        except OSError as exc:
            return f"could not enable io at {path}: {exc.strerror or exc}"
    return None


def tree(root: int, children: Mapping[int, list[int]], stop: Iterable[int] = ()) -> list[int]:
    """``root`` and its descendants, not walking into ``stop`` (other participants' roots)."""
    skip, out, todo = set(stop) - {root}, [], [root]
    while todo:
        pid = todo.pop()
        if pid in skip:
            continue
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _read(path: str) -> Bytes | None:
    try:
        with open(path) as f:
            return parse_proc_io(f.read())
    except (OSError, ValueError):
        return None


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        return int(raw[raw.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def own_threads(pid: int) -> Bytes | None:
    """Σ of ``pid``'s live threads' own counters (without what the process reaped)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total: Bytes = (0, 0)
    for tid in tids:
        v = _read(f"/proc/{pid}/task/{tid}/io")
        if v is not None:
            total = add(total, v)
    return total


class DiskWindow:
    """Disk bytes per participant between the window's edges (module docstring).

    ``io_refused``: why the io controller is not used (None: it is, for the participants that
    have a cgroup); pass :func:`enable_io`'s answer, or a reason when no cgroup exists.
    """

    def __init__(self, participants: Sequence[Participant], io_refused: str | None) -> None:
        self.participants = [p for p in participants if p.name not in EXCLUDED]
        self.io_refused = io_refused
        self.methods = {p.name: self._method(p) for p in self.participants}
        self.first: dict[str, Reading] | None = None
        self.last: dict[str, Reading] = {}
        self.end: dict[str, Reading] = {}
        self.host_first: Bytes | None = None
        self.host_last: Bytes | None = None
        self.closed = False

    def _method(self, p: Participant) -> str:
        if p.counter is not None:
            return "not measured"
        if p.cgroup is not None and self.io_refused is None and (p.cgroup.path / "io.stat").exists():
            return "cgroup-io"
        return "proc-io"

    def read(self) -> dict[str, Reading]:
        """Every measured participant's reading now."""
        out: dict[str, Reading] = {}
        roots = {name: p.current_roots() if self.methods[name] == "proc-io" else []
                 for name, p in ((p.name, p) for p in self.participants)}
        all_roots = {r.pid for rs in roots.values() for r in rs}
        children = children_map() if any(roots.values()) else {}
        for p in self.participants:
            method = self.methods[p.name]
            if method == "cgroup-io":
                assert p.cgroup is not None
                with contextlib.suppress(OSError, ValueError):
                    out[p.name] = {"cgroup": parse_io_stat((p.cgroup.path / "io.stat").read_text())}
            elif method == "proc-io":
                reading: Reading = {}
                for root in roots[p.name]:
                    start = _start_ticks(root.pid)
                    if start is None:
                        continue  # gone: its last reading stands
                    if p.recursive:
                        total: Bytes = (0, 0)
                        for pid in tree(root.pid, children, all_roots):
                            total = add(total, _read(f"/proc/{pid}/io") or (0, 0))
                        reading[f"{root.pid}:{start}"] = total
                    elif (own := own_threads(root.pid)) is not None:
                        reading[f"{root.pid}:{start}"] = own
                out[p.name] = reading
        return out

    def _read_safely(self, edge: str) -> dict[str, Reading] | None:
        """A reading, or None with a warning: a measurement never fails a run."""
        try:
            return self.read()
        except Exception as exc:
            log.warning("disk bytes not read at %s: %s: %s", edge, type(exc).__name__, exc)
            return None

    def start(self) -> None:
        self.host_first = host_reading()
        self.first = self._read_safely("the window's start")
        self.last = seen({}, self.first or {})

    def observe(self) -> None:
        """A reading inside the window (after the drain, before the consumers stop): what a root
        read here keeps if it exits before the end edge."""
        if self.first is not None and not self.closed and (now := self._read_safely("the drain")) is not None:
            self.last = seen(self.last, now)

    def stop(self) -> None:
        if self.first is None or self.closed:
            return
        end = self._read_safely("the window's end")
        if end is None:
            self.first = None  # no block rather than a half-read one
            return
        self.end = end
        self.last = seen(self.last, end)
        self.host_last = host_reading()
        self.closed = True

    def record(self) -> dict[str, Any] | None:
        """Per participant ``write_bytes``, ``read_bytes``, ``method``, ``group`` and, for
        ``proc-io``, ``roots_exited`` (roots gone at the end edge: counted up to their last
        reading); ``io_controller``: ``enabled`` or why not. None: the edges were not both read."""
        if self.first is None or not self.closed:
            return None
        parts: dict[str, Any] = {}
        for p in self.participants:
            method = self.methods[p.name]
            if method == "not measured" or p.name not in self.first:
                parts[p.name] = {"write_bytes": None, "read_bytes": None, "method": "not measured",
                                 "group": p.group}
                continue
            last = self.last.get(p.name, {})
            w, r = delta(self.first[p.name], last)
            gone = len(set(last) - set(self.end.get(p.name, {})))
            parts[p.name] = {"write_bytes": w, "read_bytes": r, "method": method, "group": p.group,
                             **({"roots_exited": gone} if method == "proc-io" else {})}
        host = None
        if self.host_first is not None and self.host_last is not None:
            host = {"write_bytes": self.host_last[0] - self.host_first[0],
                    "read_bytes": self.host_last[1] - self.host_first[1]}
        return {"io_controller": self.io_refused or "enabled", "participants": parts, "host": host}


def window_for(settings: Settings, participants: Sequence[Participant]) -> DiskWindow:
    """The run's disk window over the sampler's participants: the io controller enabled for the
    lab's cgroups where the kernel offers it (else why not, recorded), ``/proc`` otherwise."""
    mount = cgroup2_mount()
    refused: str | None
    if not any(p.cgroup is not None for p in participants) or mount is None:
        refused = "no cgroups for the participants (the run's CPU method is not cgroup)"
    else:
        refused = enable_io(cgroup_parents(mount, cgroup_scope(settings)))
    if refused:
        log.debug("disk bytes from /proc: %s", refused)
    return DiskWindow(participants, refused)


def disk_block(counted: Mapping[str, Any] | None, messages: int) -> dict[str, Any] | None:
    """run.json's ``disk``: per participant (the consumers as their group ``consumers``, as in
    ``cpu_s``) ``write_bytes``, ``read_bytes``, ``write_bytes_per_msg`` and ``method``
    (``cgroup-io``, ``proc-io``, ``not measured``; a group whose members were read by two methods
    names both, ``+``-joined). None when not read."""
    if not counted or messages <= 0:
        return None
    out: dict[str, Any] = {}
    groups: dict[str, list[Mapping[str, Any]]] = {}

    def entry(w: int | None, r: int | None, method: str, exited: int | None) -> dict[str, Any]:
        return {"write_bytes": w, "read_bytes": r,
                "write_bytes_per_msg": round(w / messages, 1) if w is not None else None,
                "method": method, **({"roots_exited": exited} if exited is not None else {})}

    for name, v in sorted(counted["participants"].items()):
        if v.get("group"):
            groups.setdefault(v["group"], []).append(v)
        else:
            out[name] = entry(v["write_bytes"], v["read_bytes"], v["method"], v.get("roots_exited"))
    for g, members in sorted(groups.items()):
        ws, rs = [m["write_bytes"] for m in members], [m["read_bytes"] for m in members]
        exited = [m["roots_exited"] for m in members if "roots_exited" in m]
        measured = None not in ws and None not in rs
        out[g] = entry(sum(ws) if measured else None, sum(rs) if measured else None,
                       "+".join(sorted({m["method"] for m in members})), sum(exited) if exited else None)
    return out


def host_block(counted: Mapping[str, Any] | None, messages: int) -> dict[str, Any] | None:
    """run.json's ``disk_host``: what the host's disks wrote and read over the window
    (``/proc/diskstats``: every process of the host, the lab's and any other, and the filesystem's
    own journal), with ``write_bytes_per_msg``; None when not read."""
    host = (counted or {}).get("host")
    if not host or messages <= 0:
        return None
    return {**host, "write_bytes_per_msg": round(host["write_bytes"] / messages, 1)}


def consumer_bytes(counted: Mapping[str, Any] | None, index: int) -> int | None:
    """Consumer ``index``'s own write_bytes (None when not read)."""
    v = ((counted or {}).get("participants") or {}).get(f"consumer-{index}")
    return v.get("write_bytes") if v else None
