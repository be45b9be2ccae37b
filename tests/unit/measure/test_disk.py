"""The disk guard's decisions (pure functions), what it keeps of its readings, and its thread
against a database that refuses every connection (a closed port: the guard must go on)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from lab.measure.disk import (
    DiskGuard,
    DiskGuardTripped,
    Limits,
    Peaks,
    Reading,
    SlotReading,
    carry,
    dir_bytes,
    free_bytes,
    trip,
)

LIMITS = Limits(max_retained_wal=1000, min_free_disk=100)


def slots(**retained: int | None) -> tuple[SlotReading, ...]:
    return tuple(SlotReading(name, "logical", value) for name, value in retained.items())


def test_a_slot_below_the_limit_with_no_growth_known_does_not_trip() -> None:
    assert trip(Reading(0.0, slots(a=10, b=999)), None, LIMITS) is None


def test_retained_plus_three_samples_of_growth_reaching_the_limit_trips() -> None:
    before = Reading(1.0, slots(a=10, b=900))
    assert trip(Reading(2.0, slots(a=10, b=920)), before, LIMITS) is None  # 920 + 3 x 20 < 1000
    hit = trip(Reading(2.0, slots(a=10, b=940)), before, LIMITS)
    assert hit is not None
    assert (hit["kind"], hit["slot"], hit["retained_bytes"], hit["growth_bytes_per_sample"], hit["limit_bytes"]) == (
        "retained_wal", "b", 940, 40, 1000)
    assert hit["error"].startswith("disk guard: slot b retains 940 bytes of WAL")
    assert "limit of 1000 bytes" in hit["error"] and "LAB_MAX_RETAINED_WAL" in hit["error"]
    assert "\n" not in hit["error"]


def test_a_shrinking_or_invalidated_slot_does_not_trip() -> None:
    before = Reading(1.0, slots(a=990))
    assert trip(Reading(2.0, slots(a=None)), before, LIMITS) is None  # invalidated: retains nothing
    assert trip(Reading(2.0, slots(a=500)), before, LIMITS) is None  # growth is never negative


def test_a_physical_slot_is_guarded_too() -> None:
    standby = (SlotReading("standby", "physical", 1000),)
    hit = trip(Reading(1.0, standby), None, LIMITS)
    assert hit is not None and hit["slot"] == "standby"


def test_the_growth_spans_a_reading_the_database_refused() -> None:
    first = Reading(1.0, slots(a=900))
    refused = carry(Reading(2.0, None), first)
    assert refused.slots == first.slots  # compared with the last reading that had slots
    hit = trip(Reading(3.0, slots(a=950)), refused, LIMITS)
    assert hit is not None and hit["growth_bytes_per_sample"] == 50


def test_free_disk_at_the_minimum_or_falling_towards_it_trips() -> None:
    paths = {"LAB_DATA_DIR": Path("/srv/lab/data")}
    assert trip(Reading(1.0, (), {"LAB_DATA_DIR": 101}), None, LIMITS, paths) is None
    hit = trip(Reading(1.0, (), {"LAB_DATA_DIR": 100}), None, LIMITS, paths)
    assert hit is not None and hit["kind"] == "free_disk" and hit["free_bytes"] == 100
    assert hit["error"].startswith("disk guard: LAB_DATA_DIR (/srv/lab/data) has 100 bytes free")
    assert "minimum of 100 bytes" in hit["error"] and "LAB_MIN_FREE_DISK" in hit["error"]
    falling = trip(Reading(2.0, (), {"LAB_DATA_DIR": 400}), Reading(1.0, (), {"LAB_DATA_DIR": 500}), LIMITS, paths)
    assert falling is not None and falling["drop_bytes_per_sample"] == 100  # 400 - 3 x 100 <= 100
    assert trip(Reading(2.0, (), {"LAB_DATA_DIR": 500}), Reading(1.0, (), {"LAB_DATA_DIR": 400}), LIMITS) is None
    assert trip(Reading(2.0, (), {"LAB_DATA_DIR": None}), None, LIMITS) is None  # unknown: no decision


def test_slots_are_judged_before_places() -> None:
    hit = trip(Reading(1.0, slots(a=5000), {"LAB_DATA_DIR": 0}), None, LIMITS)
    assert hit is not None and hit["kind"] == "retained_wal"


def test_peaks_keep_maxima_minima_and_the_longest_stretch_without_wal() -> None:
    p = Peaks()
    p.add(Reading(0.0, (SlotReading("a", "logical", 10, "reserved", 500, 0, 100),), {"d": 900}, 8))
    p.add(Reading(1.0, (SlotReading("a", "logical", 70, "extended", 300, 64, 200),
                        SlotReading("b", "logical", 5, "reserved", None, 32, 50)), {"d": 700}, 4))
    p.add(Reading(2.0, None, {"d": 800}))
    p.error(2.0, "connection\nrefused")
    p.add(Reading(3.0, None, {"d": None}))
    p.error(3.0, "still refused")
    p.add(Reading(4.0, (SlotReading("a", "logical", 20, "reserved", 400, 64, 250),), {"d": 750}))
    out = p.as_dict()
    assert out["samples"] == 5
    assert out["slots"]["a"] == {"kind": "logical", "retained_bytes_max": 70, "wal_status": ["reserved", "extended"],
                                 "min_safe_wal_size": 300, "spill_bytes_max": 64, "total_bytes_max": 250}
    assert out["spill_bytes_max"] == 96 and out["replslot_dir_bytes_max"] == 8
    assert out["free_bytes_min"] == {"d": 700}
    errors = out["db_errors"]
    assert errors["count"] == 2 and errors["first"] == {"t_s": 2.0, "error": "connection refused"}
    assert errors["last"]["t_s"] == 3.0 and errors["longest_without_wal_reading_s"] == 2.0


def test_dir_bytes_counts_one_level_of_slot_directories(tmp_path: Path) -> None:
    (tmp_path / "slot_a").mkdir()
    (tmp_path / "slot_a" / "state").write_bytes(b"x" * 200)
    (tmp_path / "slot_a" / "xid-1-lsn-0-1000000.spill").write_bytes(b"x" * 3000)
    (tmp_path / "slot_b").mkdir()
    assert dir_bytes(tmp_path) == 3200
    assert dir_bytes(tmp_path / "missing") is None


def test_free_bytes_of_a_dir_not_yet_made_is_its_file_systems(tmp_path: Path) -> None:
    free = free_bytes(tmp_path / "not" / "yet")
    assert free is not None and free > 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_refusing_database_is_recorded_and_the_guard_goes_on(tmp_path: Path) -> None:
    dsn = f"host=127.0.0.1 port={_closed_port()} dbname=lab user=lab connect_timeout=2"
    guard = DiskGuard(dsn, Limits(max_retained_wal=1, min_free_disk=1), {"LAB_DATA_DIR": tmp_path},
                      pg_local=True, interval_s=0.02)
    guard.start()
    try:
        _wait(lambda: guard.peaks.errors >= 3)  # tried again and again, never switched off
        guard.check()  # nothing tripped: free disk above 1 byte, no WAL read
    finally:
        guard.stop()
    rec = guard.record()
    assert rec["tripped"] is None and rec["samples"] >= 3 and rec["db_errors"]["count"] >= 3
    assert rec["free_bytes_min"]["LAB_DATA_DIR"] > 0 and rec["slots"] == {}
    assert rec["cost"]["runner_cpu_s"] > 0 and rec["cost"]["postgres_cpu_s"] == 0


def test_free_disk_still_trips_the_guard_while_the_database_refuses(tmp_path: Path) -> None:
    dsn = f"host=127.0.0.1 port={_closed_port()} dbname=lab user=lab connect_timeout=2"
    seen: list[dict[str, Any]] = []
    guard = DiskGuard(dsn, Limits(max_retained_wal=2**40, min_free_disk=2**62), {"LAB_DATA_DIR": tmp_path},
                      pg_local=False, on_trip=seen.append, interval_s=0.02)
    guard.start()
    try:
        _wait(lambda: guard.peaks.samples >= 3)
    finally:
        guard.stop()
    assert len(seen) == 1 and seen[0] is guard.tripped  # once, however many readings follow
    assert seen[0]["kind"] == "free_disk" and seen[0]["path"] == str(tmp_path)
    with pytest.raises(DiskGuardTripped, match=r"^disk guard: LAB_DATA_DIR \(.*\) has \d+ bytes free"):
        guard.check()
    assert guard.record()["cost"]["postgres_cpu_s"] is None
