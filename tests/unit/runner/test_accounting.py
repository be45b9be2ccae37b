"""The fault accounting (lab.runner.accounting) on call sequences whose answer is known by hand."""

from __future__ import annotations

import pytest

from lab.runner.accounting import account, adds_up, first_call_after, id_ranges, ids_of, longest_stall_after
from lab.runner.fault_driver import wal_summary


def test_clean_run_is_all_once() -> None:
    a = account([1, 2, 3], [1, 2, 3], by=[0, 1, 0])
    assert (a["once"], a["repeated"], a["extra_calls"], a["lost"], a["max_burst"]) == (3, 0, 0, 0, 0)
    assert a["per_consumer"] == {"0": {"calls": 2, "first": 2, "repeats": 0, "once": 2, "max_burst": 0},
                                 "1": {"calls": 1, "first": 1, "repeats": 0, "once": 1, "max_burst": 0}}
    assert a["adds_up"]


def test_a_replay_is_counted_as_duplicates_with_its_burst() -> None:
    # consumer 1 works 4, 5, 6, is killed, its replacement works 4, 5, 6 again, then 7
    ids = [1, 4, 2, 5, 6, 3, 4, 5, 6, 7]
    by = [0, 1, 0, 1, 1, 0, 1, 1, 1, 1]
    a = account(ids, range(1, 8), by)
    assert (a["distinct"], a["once"], a["repeated"], a["extra_calls"]) == (7, 4, 3, 3)
    assert a["max_burst"] == 3 and a["max_calls_per_id"] == 2
    assert a["per_consumer"]["1"] == {"calls": 7, "first": 4, "repeats": 3, "once": 1, "max_burst": 3}
    assert a["per_consumer"]["0"] == {"calls": 3, "first": 3, "repeats": 0, "once": 3, "max_burst": 0}
    assert a["max_burst_per_consumer"] == 3
    assert a["lost"] == 0 and a["adds_up"]


def test_burst_is_the_longest_consecutive_run_of_repeats() -> None:
    a = account([1, 2, 1, 3, 2, 1, 4], [1, 2, 3, 4])
    assert a["extra_calls"] == 3 and a["max_burst"] == 2  # (2, 1) back to back after 3
    assert a["per_consumer"] is None


def test_lost_and_foreign_ids() -> None:
    a = account([1, 2, 99], [1, 2, 3, 4])
    assert (a["lost"], a["foreign"], a["distinct"], a["messages"]) == (2, 1, 3, 4)
    assert a["adds_up"]  # 3 distinct - 1 foreign + 2 lost = 4 messages


def test_adds_up_catches_a_broken_identity() -> None:
    a = account([1, 2, 2], [1, 2], by=[0, 0, 1])
    assert a["adds_up"]
    a["extra_calls"] = 0
    assert not adds_up(a)
    b = account([1, 2, 2], [1, 2], by=[0, 0, 1])
    b["per_consumer"]["1"]["repeats"] = 0
    assert not adds_up(b)


def test_first_call_after() -> None:
    t, by = [10.0, 11.0, 12.5, 13.0], [0, 1, 0, 1]
    assert first_call_after(t, 11.5) == 1.0
    assert first_call_after(t, 11.5, by, who=1) == 1.5
    assert first_call_after(t, 13.5) is None
    assert first_call_after(t, 10.0, by, who=2) is None


def test_longest_stall_after_a_node_kill() -> None:
    t = [10.0, 10.1, 10.2, 13.7, 13.8, 14.0]
    assert longest_stall_after(t, 10.15) == 3.5  # 10.2 -> 13.7: the partitions moved
    assert longest_stall_after(t, 5.0) == 5.0  # nothing for 5 s after the kill
    assert longest_stall_after(t, 13.75) == 0.2
    assert longest_stall_after(t, 14.5) is None


def test_wal_summary_recovery_against_the_pre_fault_band() -> None:
    rows = [(0.0, 100), (1.0, 300), (2.0, 5_000), (3.0, 9_000), (4.0, 2_000), (5.0, 250)]
    samples = [{"t_s": t, "slot": "s", "retained_bytes": u + 10, "unconfirmed_bytes": u,
                "wal_status": "reserved", "safe_wal_size": None, "active": True} for t, u in rows]
    out = wal_summary(samples, fault_start=1.5, fault_end=3.5)["s"]
    assert out["pre_fault_band_bytes"] == 300 and out["unconfirmed_bytes_max"] == 9_000
    assert out["retained_bytes_max"] == 9_010 and out["wal_status"] == ["reserved"]
    assert out["recovered_after_s"] == pytest.approx(1.5)  # at t = 5.0, 250 <= 300


def test_lost_ids_are_named_as_runs() -> None:
    a = account([1, 2, 5, 5, 9], range(1, 11))
    assert a["lost"] == 6 and a["lost_ids"] == [[3, 4], [6, 8], [10, 10]]
    assert ids_of(a["lost_ids"]) == [3, 4, 6, 7, 8, 10]
    assert id_ranges([]) == [] and account([1], [1])["lost_ids"] == []
