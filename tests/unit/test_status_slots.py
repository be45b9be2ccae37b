"""`lab stack status`: one line per replication slot, with the WAL it retains and its status."""

from __future__ import annotations

from lab.study.presentation import slot_line


def test_a_slot_line_names_slot_state_retained_wal_and_status() -> None:
    line = slot_line({"slot": "load_test_slot_1", "active": False, "retained_wal_bytes": 3 * 2**20,
                      "wal_status": "extended", "safe_wal_size": 12345, "invalidation_reason": None})
    assert line == ("slot load_test_slot_1       inactive retains 3145728 bytes (3.0 MB), wal_status extended, "
                    "safe_wal_size 12345")
    lost = slot_line({"slot": "s", "active": False, "retained_wal_bytes": None, "wal_status": "lost",
                      "safe_wal_size": None, "invalidation_reason": "wal_removed"})
    assert lost.endswith("inactive retains no WAL, wal_status lost, safe_wal_size -, INVALIDATED: wal_removed")
