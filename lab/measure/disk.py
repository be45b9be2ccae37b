"""The disk guard of every run: what the run's slots keep on disk, and how much disk is left.

From the start of a run to its cleanup, a thread of the runner reads once a second
(:data:`INTERVAL_S`), over one connection of its own:

* per replication slot, logical and physical (``pg_replication_slots``): the WAL it retains
  (``pg_current_wal_lsn() - restart_lsn``), ``wal_status`` and ``safe_wal_size``;
* per logical slot, what its decoding spilled to disk and decoded in all
  (``spill_bytes``, ``total_bytes`` of ``pg_stat_replication_slots``: cumulative counters);
* on the native backend, the size of PostgreSQL's ``pg_replslot`` directory (the spill files
  themselves, and each slot's state);
* the free disk (:func:`shutil.disk_usage`) of PostgreSQL's data dir (native backend), of
  ``LAB_STACK_DIR`` (Kafka's and RabbitMQ's logs) and of ``LAB_DATA_DIR`` (stored runs).

Two limits, from :class:`lab.settings.Settings`: ``max_retained_wal`` (``LAB_MAX_RETAINED_WAL``,
``lab run --max-retained-wal``, default 2 GB) and ``min_free_disk`` (``LAB_MIN_FREE_DISK``, default
1 GB). :func:`trip` decides, a pure function of this reading and the one before: a slot whose
retained WAL plus :data:`GROWTH_SAMPLES` times its growth over the last sample reaches the limit,
or a place whose free disk minus as many times its last drop reaches the minimum, trips the guard
(the projection keeps the slots below the limit although the guard reads once a second). Then the
runner ends the run as a failure, through its normal cleanup, with the one line of
:func:`trip` naming the slot (or place), the bytes and the limit.

A reading the database refuses (PostgreSQL restarting, a failover) is recorded (``db_errors``: how
many, the first and last, the longest stretch without a WAL reading) and tried again at the next
sample over a new connection; the free-disk readings go on meanwhile. The guard never switches
itself off. run.json's ``disk_guard`` (:meth:`DiskGuard.record`) holds each slot's peaks, the
spill peak, the smallest free disk per place, whether the guard tripped, and its own cost: the
runner's CPU spent in the guard's thread and, on the native backend, the CPU of its PostgreSQL
backend (both part of the measured CPU of ``runner`` and ``postgres``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import psycopg

log = logging.getLogger(__name__)
INTERVAL_S = 1.0  # one reading a second
GROWTH_SAMPLES = 3.0  # trip when the value plus this many samples of its last change reach the limit
CONNECT_TIMEOUT_S = 5
STOP_TIMEOUT_S = 10.0
SLOT_SQL = (
    "SELECT r.slot_name, r.slot_type, pg_current_wal_lsn() - r.restart_lsn, r.wal_status, r.safe_wal_size, "
    "s.spill_bytes, s.total_bytes "
    "FROM pg_replication_slots r LEFT JOIN pg_stat_replication_slots s USING (slot_name) ORDER BY 1"
)


class DiskGuardTripped(RuntimeError):
    """A run's disk guard tripped; the message is its one line."""


@dataclass(frozen=True)
class SlotReading:
    slot: str
    kind: str  # logical | physical
    retained_bytes: int | None  # None: nothing reserved, or invalidated (it retains nothing)
    wal_status: str | None = None
    safe_wal_size: int | None = None
    spill_bytes: int | None = None  # logical slots: cumulative
    total_bytes: int | None = None


@dataclass(frozen=True)
class Reading:
    """One sample: ``slots`` None when the database was not read this time."""

    t_s: float
    slots: tuple[SlotReading, ...] | None
    free: Mapping[str, int | None] = field(default_factory=dict)  # place -> free bytes (None: unknown)
    replslot_bytes: int | None = None


@dataclass(frozen=True)
class Limits:
    max_retained_wal: int
    min_free_disk: int


def trip(now: Reading, before: Reading | None, limits: Limits,
         paths: Mapping[str, Path] | None = None) -> dict[str, Any] | None:
    """The guard's decision (module docstring): the first slot, then the first place, that trips it,
    as the ``tripped`` record with its one-line ``error``; None when nothing does."""
    limit = limits.max_retained_wal
    earlier = {s.slot: s.retained_bytes for s in ((before.slots or ()) if before is not None else ())}
    for s in now.slots or ():
        value = s.retained_bytes
        if value is None:
            continue
        prior = earlier.get(s.slot)
        growth = max(0, value - (prior if prior is not None else value))
        if value + GROWTH_SAMPLES * growth < limit:
            continue
        return {
            "kind": "retained_wal", "slot": s.slot, "retained_bytes": value, "growth_bytes_per_sample": growth,
            "limit_bytes": limit, "t_s": now.t_s,
            "error": (f"disk guard: slot {s.slot} retains {value} bytes of WAL ({_mb(value)}, +{growth} bytes "
                      f"in the last second), too close to the limit of {limit} bytes ({_mb(limit)}; "
                      "LAB_MAX_RETAINED_WAL, --max-retained-wal): run failed"),
        }
    least = limits.min_free_disk
    for place, free in now.free.items():
        if free is None:
            continue
        prior = before.free.get(place) if before is not None else None
        drop = max(0, (prior if prior is not None else free) - free)
        if free - GROWTH_SAMPLES * drop > least:
            continue
        where = f"{place} ({paths[place]})" if paths and place in paths else place
        return {
            "kind": "free_disk", "place": place, "path": str(paths[place]) if paths and place in paths else None,
            "free_bytes": free, "drop_bytes_per_sample": drop, "limit_bytes": least, "t_s": now.t_s,
            "error": (f"disk guard: {where} has {free} bytes free ({_mb(free)}, -{drop} bytes in the last "
                      f"second), too close to the minimum of {least} bytes ({_mb(least)}; LAB_MIN_FREE_DISK): "
                      "run failed"),
        }
    return None


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def carry(now: Reading, before: Reading | None) -> Reading:
    """The reading the next one is compared with: ``now``, with the slots of ``before`` when the
    database was not read this time (a growth is measured from the last reading that has one)."""
    if now.slots is None and before is not None:
        return replace(now, slots=before.slots)
    return now


class Peaks:
    """What run.json keeps of the readings: per slot its peaks, the spill peak (all slots together),
    the ``pg_replslot`` peak, the smallest free disk per place, and the database errors."""

    def __init__(self) -> None:
        self.samples = 0
        self.slots: dict[str, dict[str, Any]] = {}
        self.spill_bytes_max: int | None = None
        self.replslot_bytes_max: int | None = None
        self.free_bytes_min: dict[str, int | None] = {}
        self.errors = 0
        self.first_error: dict[str, Any] | None = None
        self.last_error: dict[str, Any] | None = None
        self._last_read: float | None = None
        self._blind_since: float | None = None
        self.longest_blind_s = 0.0

    def add(self, r: Reading) -> None:
        self.samples += 1
        for place, free in r.free.items():
            if free is not None:
                old = self.free_bytes_min.get(place)
                self.free_bytes_min[place] = free if old is None else min(old, free)
            else:
                self.free_bytes_min.setdefault(place, None)
        if r.replslot_bytes is not None:
            self.replslot_bytes_max = max(self.replslot_bytes_max or 0, r.replslot_bytes)
        if r.slots is None:
            if self._blind_since is None:
                self._blind_since = self._last_read if self._last_read is not None else r.t_s
            self.longest_blind_s = max(self.longest_blind_s, round(r.t_s - self._blind_since, 3))
            return
        self._last_read, self._blind_since = r.t_s, None
        spill = 0
        for s in r.slots:
            p = self.slots.setdefault(s.slot, {"kind": s.kind, "retained_bytes_max": 0, "wal_status": [],
                                               "min_safe_wal_size": None, "spill_bytes_max": 0,
                                               "total_bytes_max": 0})
            p["retained_bytes_max"] = max(p["retained_bytes_max"], s.retained_bytes or 0)
            if s.wal_status and s.wal_status not in p["wal_status"]:
                p["wal_status"].append(s.wal_status)
            if s.safe_wal_size is not None:
                old = p["min_safe_wal_size"]
                p["min_safe_wal_size"] = s.safe_wal_size if old is None else min(old, s.safe_wal_size)
            p["spill_bytes_max"] = max(p["spill_bytes_max"], s.spill_bytes or 0)
            p["total_bytes_max"] = max(p["total_bytes_max"], s.total_bytes or 0)
            spill += s.spill_bytes or 0
        self.spill_bytes_max = max(self.spill_bytes_max or 0, spill)

    def error(self, t_s: float, text: str) -> None:
        self.errors += 1
        entry = {"t_s": t_s, "error": " ".join(text.split())[:300]}
        if self.first_error is None:
            self.first_error = entry
        self.last_error = entry

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples, "slots": self.slots, "spill_bytes_max": self.spill_bytes_max,
            "replslot_dir_bytes_max": self.replslot_bytes_max, "free_bytes_min": self.free_bytes_min,
            "db_errors": {"count": self.errors, "first": self.first_error, "last": self.last_error,
                          "longest_without_wal_reading_s": self.longest_blind_s},
        }


def dir_bytes(path: Path) -> int | None:
    """The size of the files under ``path`` (one level of subdirectories: ``pg_replslot/<slot>/``);
    None when it cannot be read."""
    total = 0
    try:
        with os.scandir(path) as top:
            for entry in top:
                if entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError), os.scandir(entry.path) as inner:
                        total += sum(f.stat(follow_symlinks=False).st_size for f in inner
                                     if f.is_file(follow_symlinks=False))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        return None
    return total


def free_bytes(path: Path) -> int | None:
    """Free bytes (for an ordinary user) of the file system holding ``path``, or its nearest existing
    ancestor (a data dir not yet made); None when none can be read."""
    for p in (path, *path.parents):
        try:
            return shutil.disk_usage(p).free
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


class DiskGuard:
    """The guard of one run (module docstring): :meth:`start`, :meth:`check` as often as wanted,
    :meth:`stop`, then :meth:`record`. ``on_trip`` is called once, with the ``tripped`` record,
    in the event loop given to :meth:`start` (or in the guard's thread without one)."""

    def __init__(self, dsn: str, limits: Limits, places: Mapping[str, Path], *, pg_local: bool,
                 on_trip: Callable[[dict[str, Any]], None] | None = None, interval_s: float = INTERVAL_S) -> None:
        self.dsn, self.limits, self.places, self.pg_local = dsn, limits, dict(places), pg_local
        self.on_trip, self.interval_s = on_trip, interval_s
        self.peaks = Peaks()
        self.tripped: dict[str, Any] | None = None
        self.pg_data: Path | None = None  # PostgreSQL's data dir, when it is on this machine
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: Any = None
        self._thread_cpu_s = 0.0
        self._backend_cpu_s = 0.0
        self._backend: psutil.Process | None = None
        self._backend_start: float | None = None

    def start(self, loop: Any = None) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._main, name="disk-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("disk guard: its thread did not stop within %.0f s", STOP_TIMEOUT_S)

    def check(self) -> None:
        """Raise :class:`DiskGuardTripped` with the guard's one line once it tripped."""
        if self.tripped is not None:
            raise DiskGuardTripped(self.tripped["error"])

    def record(self) -> dict[str, Any]:
        """run.json's ``disk_guard``."""
        n = self.peaks.samples
        return {
            "interval_s": self.interval_s, "max_retained_wal": self.limits.max_retained_wal,
            "min_free_disk": self.limits.min_free_disk,
            "places": {k: str(v) for k, v in self._places().items()},
            **self.peaks.as_dict(), "tripped": self.tripped,
            "cost": {"runner_cpu_s": round(self._thread_cpu_s, 6),
                     "postgres_cpu_s": round(self._backend_cpu_s, 6) if self.pg_local else None,
                     "runner_cpu_ms_per_sample": round(self._thread_cpu_s * 1000 / n, 4) if n else None},
        }

    # the thread ----------------------------------------------------------------------------
    def _places(self) -> dict[str, Path]:
        return ({"postgres data": self.pg_data} if self.pg_data is not None else {}) | self.places

    def _main(self) -> None:
        t0 = time.monotonic()
        conn: psycopg.Connection[Any] | None = None
        before: Reading | None = None
        try:
            while True:
                t_s = round(time.monotonic() - t0, 3)
                slots = None
                try:
                    if conn is None:
                        conn = self._connect()
                    slots = self._slots(conn)
                except psycopg.Error as exc:  # recorded and tried again next time, never the end of the guard
                    if self.peaks.errors == 0 or (self.peaks.last_error or {}).get("t_s", -1) < t_s - 60:
                        log.warning("disk guard: WAL not read (tried again every %.0f s): %s", self.interval_s,
                                    " ".join(str(exc).split()))
                    self.peaks.error(t_s, str(exc))
                    self._close(conn)
                    conn = None
                places = self._places()
                now = Reading(t_s, slots, {k: free_bytes(v) for k, v in places.items()},
                              dir_bytes(self.pg_data / "pg_replslot") if self.pg_data is not None else None)
                self.peaks.add(now)
                if self.tripped is None:
                    self._decide(now, before, places)
                before = carry(now, before)
                if self._stop.wait(self.interval_s):
                    break
        except Exception:  # a bug must be seen, and the run must not go on unguarded
            log.exception("disk guard failed")
            self._trip({"kind": "error", "t_s": round(time.monotonic() - t0, 3),
                        "error": "disk guard: its thread failed (see the log); run failed"})
        finally:
            self._close(conn)
            self._thread_cpu_s = time.thread_time()

    def _decide(self, now: Reading, before: Reading | None, places: Mapping[str, Path]) -> None:
        hit = trip(now, before, self.limits, places)
        if hit is not None:
            self._trip(hit)

    def _trip(self, hit: dict[str, Any]) -> None:
        self.tripped = hit
        log.info("%s", hit["error"])  # the run's error says it
        if self.on_trip is None:
            return
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed: check() still raises
                self._loop.call_soon_threadsafe(self.on_trip, hit)
        else:
            self.on_trip(hit)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                               application_name="lab-disk-guard",
                               options=f"-c statement_timeout={CONNECT_TIMEOUT_S * 1000}")
        if self.pg_local:
            row = conn.execute("SELECT pg_backend_pid(), current_setting('data_directory')").fetchone()
            if row is not None:
                if self.pg_data is None and Path(row[1]).is_dir():
                    self.pg_data = Path(row[1])
                with contextlib.suppress(psutil.Error):
                    self._backend = psutil.Process(row[0])
                    self._backend_start = _cpu(self._backend)
        return conn

    def _slots(self, conn: psycopg.Connection[Any]) -> tuple[SlotReading, ...]:
        rows = conn.execute(SLOT_SQL).fetchall()
        return tuple(SlotReading(name, kind, _int(retained), status, _int(safe), _int(spill), _int(total))
                     for name, kind, retained, status, safe, spill, total in rows)

    def _close(self, conn: psycopg.Connection[Any] | None) -> None:
        if self._backend is not None and self._backend_start is not None:
            with contextlib.suppress(psutil.Error):
                self._backend_cpu_s += _cpu(self._backend) - self._backend_start
        self._backend = self._backend_start = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
