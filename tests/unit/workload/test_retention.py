"""The claim retention's rule, as a pure function, and where the option applies."""

from __future__ import annotations

import pytest

from lab.pipelines import PIPELINES, check
from lab.pipelines.wal import WalSource
from lab.scenario import CLAIM_RETENTIONS, Scenario
from lab.settings import Settings
from lab.workload.retention import RETENTIONS, Reading, Retention, advance

SLOTS = ["load_test_slot_0", "load_test_slot_1"]


def reading(mark: int, xmin: int, xmax: int, after: int, *confirmed: int | None) -> Reading:
    return Reading(mark, xmin, xmax, after, dict(zip(SLOTS, confirmed, strict=True)))


def test_an_insert_below_every_confirmed_position_may_still_be_sent_again() -> None:
    # T10 inserts at 100 and is still running; T11 inserts at 110 and commits at 120; both slots
    # confirmed 130 (T11's commit). A bound at the confirmed position would delete T10's claim,
    # which the slots send when T10 commits (after 130). The rule waits for T10.
    state = advance(Retention(), reading(140, 10, 12, 141, 130, 130), SLOTS)
    assert state.upto == 0 and state.open == ((140, 12),)
    # T10 commits at 150; the next snapshot has nothing older than 12 running: the mark 140 is
    # sealed with the insert position read after that snapshot (161), which no slot has confirmed
    state = advance(state, reading(160, 12, 13, 161, 130, 130), SLOTS)
    assert state.upto == 0 and state.sealed == ((140, 161),) and state.open == ((160, 13),)
    # both slots confirm past 161: every transaction that wrote below 140 is behind them, T10 too
    state = advance(state, reading(170, 13, 14, 171, 165, 180), SLOTS)
    assert state.upto == 140 and state.sealed == ((160, 171),) and state.open == ((170, 14),)
    state = advance(state, reading(180, 14, 14, 181, 185, 190), SLOTS)
    assert state.upto == 180 and state.sealed == () and state.open == ()


def test_the_slowest_slot_holds_the_bound() -> None:
    state = advance(Retention(), reading(100, 5, 5, 101, 500, 500), SLOTS)  # nothing running: sealed at once
    assert state.upto == 100
    state = advance(state, reading(200, 6, 6, 201, 900, 150), SLOTS)  # slot 1 has not passed 201
    assert state.upto == 100 and state.sealed == ((200, 201),)
    state = advance(state, reading(300, 7, 7, 301, 900, 250), SLOTS)
    assert state.upto == 200


@pytest.mark.parametrize("confirmed", [
    {"load_test_slot_0": 900},  # a reader's slot not created yet
    {"load_test_slot_0": 900, "load_test_slot_1": None},  # no confirmed position (invalidated)
    {},
])
def test_nothing_goes_while_a_slot_is_missing_or_has_no_position(confirmed: dict[str, int | None]) -> None:
    state = advance(Retention(upto=50), Reading(100, 5, 5, 101, confirmed), SLOTS)
    assert state.upto == 50 and state.sealed == ((100, 101),)  # kept for when the slot is back


def test_a_slot_that_is_not_the_runs_does_not_hold_the_claims() -> None:
    confirmed = {"load_test_slot_0": 900, "load_test_slot_1": 900, "decode_only_0": 10, "dbz_kafka": 5}
    assert advance(Retention(), Reading(100, 5, 5, 101, confirmed), SLOTS).upto == 100


def test_the_bound_never_moves_back() -> None:
    assert advance(Retention(upto=500), reading(100, 5, 5, 101, 900, 900), SLOTS).upto == 500
    assert advance(Retention(), reading(100, 5, 5, 101, 900, 900), []).upto == 0  # no slot, no bound


def test_the_scenario_knows_the_retentions_the_pruner_implements() -> None:
    assert CLAIM_RETENTIONS == RETENTIONS
    assert Scenario().claim_retention == "never"  # the reference study's table
    with pytest.raises(ValueError, match="unknown claim_retention 'always'"):
        Scenario(claim_retention="always")
    assert Scenario(claim_retention="behind-slots").slug.endswith("-behind-slots")


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_the_retention_applies_where_claims_go_to_inbox_wal_only(name: str) -> None:
    check(Scenario(pipeline=name))  # never: every pipeline
    pruned = Scenario(pipeline=name, claim_retention="behind-slots")
    if PIPELINES[name].capabilities.inbox_table == "inbox_wal":
        check(pruned)
    else:
        with pytest.raises(ValueError, match=f"{name} claims in inbox: use never"):
            check(pruned)


def test_only_reader_0_prunes_and_only_under_a_retention() -> None:
    never, pruned = Scenario(consumers=3), Scenario(consumers=3, claim_retention="behind-slots")
    assert WalSource(never, Settings(), 0).pruner is None  # the default: nothing beside the readers
    assert WalSource(pruned, Settings(), 1).pruner is None
    pruner = WalSource(pruned, Settings(), 0).pruner
    assert pruner is not None and pruner.slots == ["load_test_slot_0", "load_test_slot_1", "load_test_slot_2"]
