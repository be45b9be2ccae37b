"""wal-relay's pure parts: the hand-over's parameters, a take's items, the queue's counters, the
statements' shapes, and where the relay's process and faults are wired."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime

import pytest

from lab.pipelines import PIPELINES
from lab.pipelines.wal import WalSource
from lab.pipelines.wal_relay import (
    HAND_OVER,
    HELPER,
    RELAY_SLOT,
    TAKE,
    RelayPipeline,
    RelayReader,
    hand_over_params,
    queue_stats,
    taken_items,
)
from lab.scenario import Scenario
from lab.settings import Settings

T = datetime(2026, 12, 3, 18, 0, 0, 123456, tzinfo=UTC)


def test_hand_over_params_are_one_array_per_column() -> None:
    rows = [(1, "a", T), (2, "b", T)]
    assert hand_over_params(rows) == {"ids": [1, 2], "contents": ["a", "b"], "created": [T, T]}
    assert hand_over_params([]) == {"ids": [], "contents": [], "created": []}


def test_a_take_keeps_the_lost_claims_apart() -> None:
    items, lost = taken_items([(1, "a", T, True), (2, "b", T, False), (3, "c", T, True)])
    assert [(it.id, it.content, it.pos) for it in items] == [(1, "a", True), (2, "b", False), (3, "c", True)]
    assert items[0].created_at == "2026-12-03T18:00:00.123456+00:00"  # as wal's reader sends it
    assert lost == 1
    assert taken_items([]) == ([], 0)


def test_queue_stats_are_the_runs_differences_and_the_end_state() -> None:
    before = (100, 90, 10, 50, 1, 2, 8192)
    end = (1100, 1090, 10, 700, 1, 5, 65536)
    assert queue_stats(end, before) == {"inserted": 1000, "deleted": 1000, "rows_left": 10, "dead_tuples": 700,
                                        "vacuums": 0, "autovacuums": 3, "bytes": 65536}
    assert queue_stats(None, before) is None and queue_stats(end, None) is None


def test_statements_take_skip_locked_and_claim_in_one() -> None:
    take = TAKE.as_string(None).lower()
    assert "for update skip locked" in take and "delete from" in take and "insert into inbox" in take
    assert take.count("on conflict do nothing") == 1 and "order by id limit" in take
    hand = HAND_OVER.as_string(None).lower()
    assert "on conflict do nothing" in hand and "pg_notify('relay_queue'" in hand


def test_the_relay_is_wal_reader_on_its_own_slot() -> None:
    s, st = Scenario(pipeline="wal-relay"), Settings()
    assert RelayReader(s, st, 0).slot == RELAY_SLOT == "load_test_slot_relay"
    assert WalSource(s, st, 3).slot == "load_test_slot_3"
    assert RELAY_SLOT.startswith("load_test_slot")  # the runner's reset and cleanup drop it by this prefix


def test_the_runner_starts_the_relay_as_its_own_participant() -> None:
    assert RelayPipeline.helpers == {HELPER: "lab.relay"} and HELPER == "relay"
    assert callable(importlib.import_module(RelayPipeline.helpers[HELPER]).main)
    assert all(p.helpers == {} for name, p in PIPELINES.items() if name != "wal-relay")
    assert (RelayPipeline.fan_out, RelayPipeline.inbox_table, RelayPipeline.cdc_sink) == (False, "inbox", None)


@pytest.mark.parametrize("spec", ["walsender-kill:1@3s", "slot-invalidation:1@3s", "debezium-kill@3s"])
def test_faults_on_a_slot_or_debezium_it_has_not_are_refused(spec: str) -> None:
    from lab.faults import check

    with pytest.raises(ValueError, match=r"wal-relay|Debezium|direct reader"):
        check(Scenario(pipeline="wal-relay", consumers=2, fault=spec, consumer_layout="processes"))


@pytest.mark.parametrize("spec", ["walsender-kill@3s", "postgres-restart@3s+2s"])
def test_the_relay_takes_its_walsenders_kill_and_a_postgres_restart(spec: str) -> None:
    from lab.faults import check, fault_for

    s = Scenario(pipeline="wal-relay", consumers=2, fault=spec, consumer_layout="processes")
    check(s, Settings())
    f = fault_for(s)
    assert f is not None and f.target is None and f.hit_consumers(s) == []
    assert RelayPipeline.helper_slot == RELAY_SLOT
    if f.kind == "walsender-kill":
        assert f.record(RelayPipeline, None)["slot"] == RELAY_SLOT  # type: ignore[arg-type]


def test_a_failover_is_refused_with_its_reason() -> None:
    from lab.faults import check

    with pytest.raises(ValueError, match=r"its helper \(relay\) confirms its slot behind rows it writes"):
        check(Scenario(pipeline="wal-relay", consumers=2, fault="postgres-failover@3s"),
              Settings().replace(topology="ha"))


def test_consumer_faults_apply_to_wal_relay() -> None:
    from lab.faults import check, fault_for

    s = Scenario(pipeline="wal-relay", consumers=2, fault="consumer-kill:1@3s", consumer_layout="processes")
    check(s)
    f = fault_for(s)
    assert f is not None and f.target == 1
