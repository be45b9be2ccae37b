"""The claim retention's rule, as a pure function, and where the option applies."""

from __future__ import annotations

import pytest

from lab.pipelines import PIPELINES, check
from lab.pipelines.wal import WalSource
from lab.scenario import CLAIM_RETENTIONS, Scenario
from lab.settings import Settings
from lab.workload.retention import RETENTIONS, prunable_below

SLOTS = ["load_test_slot_0", "load_test_slot_1", "load_test_slot_2"]


def test_claims_go_below_the_slowest_slots_restart_point() -> None:
    restart = {"load_test_slot_0": 9_000, "load_test_slot_1": 4_000, "load_test_slot_2": 7_000}
    assert prunable_below(restart, SLOTS) == 4_000


def test_a_slot_that_is_not_the_runs_does_not_hold_the_claims() -> None:
    # a decode-only slot, Debezium's or another run's: only the readers' slots can meet a claim again
    restart = {"load_test_slot_0": 9_000, "load_test_slot_1": 8_000, "load_test_slot_2": 7_000,
               "decode_only_0": 100, "dbz_kafka": 50}
    assert prunable_below(restart, SLOTS) == 7_000


@pytest.mark.parametrize("restart", [
    {"load_test_slot_0": 9_000, "load_test_slot_1": 8_000},  # a reader's slot not created yet
    {"load_test_slot_0": 9_000, "load_test_slot_1": 8_000, "load_test_slot_2": None},  # invalidated
    {},
])
def test_nothing_goes_while_a_slot_is_missing_or_has_no_restart_point(restart: dict[str, int | None]) -> None:
    assert prunable_below(restart, SLOTS) is None


def test_no_slot_no_bound() -> None:
    assert prunable_below({"load_test_slot_0": 9_000}, []) is None


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
    if PIPELINES[name].inbox_table == "inbox_wal":
        check(pruned)
    else:
        with pytest.raises(ValueError, match=f"{name} claims in inbox: use never"):
            check(pruned)


def test_only_reader_0_prunes_and_only_under_a_retention() -> None:
    never, pruned = Scenario(consumers=3), Scenario(consumers=3, claim_retention="behind-slots")
    assert WalSource(never, Settings(), 0).pruner is None  # the default: nothing beside the readers
    assert WalSource(pruned, Settings(), 1).pruner is None
    pruner = WalSource(pruned, Settings(), 0).pruner
    assert pruner is not None and pruner.slots == SLOTS
