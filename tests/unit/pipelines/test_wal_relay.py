"""wal-relay's pure parts: the hand-over's parameters, a take's items, the queue's counters, the
statements' shapes, and where the relay's process and faults are wired."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime

import psycopg
import pytest

from lab.pg.replication import ReplicationStream
from lab.pipelines import PIPELINES
from lab.pipelines.relay_stream import (
    HAND_OVER,
    STANDBY_FLUSH,
    RelayReader,
    confirmable_behind,
    hand_over_params,
    standby_flushed,
)
from lab.pipelines.wal import WalSource
from lab.pipelines.wal_relay import HELPER, RELAY_SLOT, TAKE, RelayPipeline, queue_stats, taken_items
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
    caps = RelayPipeline.capabilities
    assert caps.helpers == {HELPER: "lab.relay"} and HELPER == "relay" and caps.participants == (HELPER,)
    assert callable(importlib.import_module(caps.helpers[HELPER]).main)
    assert all(p.capabilities.helpers == {} for name, p in PIPELINES.items() if name != "wal-relay")
    assert (caps.fan_out, caps.inbox_table, caps.cdc_sink) == (False, "inbox", None)


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
    assert RelayPipeline.capabilities.helper_slot == RELAY_SLOT
    if f.kind == "walsender-kill":
        assert f.record(RelayPipeline, None)["slot"] == RELAY_SLOT  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ["postgres-failover@3s", "postgres-failover=fast@3s"])
def test_a_failover_applies_under_ha_only(spec: str) -> None:
    from lab.faults import check

    s = Scenario(pipeline="wal-relay", consumers=2, fault=spec)
    check(s, Settings().replace(topology="ha"))
    with pytest.raises(ValueError, match="needs the ha topology"):
        check(s, Settings().replace(topology="single"))


def test_a_position_is_confirmable_once_the_standby_flushed_the_wal_after_its_hand_over() -> None:
    pending = [(1000, 10), (2000, 20), (3000, 30)]
    assert confirmable_behind(pending, 999) == (None, 0)  # not even the first hand-over is there
    assert confirmable_behind(pending, 1000) == (10, 1)
    assert confirmable_behind(pending, 2999) == (20, 2)
    assert confirmable_behind(pending, 10**9) == (30, 3)
    assert confirmable_behind(pending, 0) == (None, 0)  # a standby without a flushed position: wait
    assert confirmable_behind(pending, None) == (30, 3)  # no standby: nothing to wait for
    assert confirmable_behind([], 5000) == (None, 0)


def test_the_standbys_flushed_position_is_the_lowest_of_those_the_server_waits_for() -> None:
    assert standby_flushed(0, 0, None) is None  # synchronized_standby_slots is empty (a promoted standby)
    assert standby_flushed(1, 1, 4242) == 4242
    assert standby_flushed(2, 1, 4242) == 0  # one named slot is missing: wait for it
    assert standby_flushed(1, 0, None) == 0


def _reader(topology: str) -> RelayReader:
    r = RelayReader(Scenario(pipeline="wal-relay"), Settings().replace(topology=topology), 0)
    r._stream = ReplicationStream.__new__(ReplicationStream)  # set_status only: no connection
    r._stream._status_lsn = 0
    return r


def test_under_ha_the_relay_confirms_only_behind_the_standby() -> None:
    r = _reader("ha")
    assert r.behind_standby
    r._report(500)  # a hand-over committed: resolved, not confirmed
    assert r.waiting and r._stream is not None and r._stream.status_lsn == 0
    assert not r._settled()  # a keepalive's position may not pass it either
    r.release(7000, 6999)  # the standby is behind the hand-over's WAL
    assert r._stream.status_lsn == 0 and r.waiting
    r._report(800)
    r.release(9000, 7000)  # the first hand-over is there, the second not yet
    assert r._stream.status_lsn == 500 and r.waiting
    r.release(9100, 9000)
    assert r._stream.status_lsn == 800 and not r.waiting and r._settled()


def test_a_broken_stream_releases_nothing() -> None:
    r = _reader("ha")
    r._report(500)
    r._broken = psycopg.OperationalError("gone")
    r.release(7000, None)
    assert r._stream is not None and r._stream.status_lsn == 0 and r.waiting


def test_under_single_a_resolved_position_is_confirmed_at_once() -> None:
    r = _reader("single")
    assert not r.behind_standby
    r._report(500)
    assert r._stream is not None and r._stream.status_lsn == 500 and not r.waiting


def test_the_standby_query_reads_the_servers_own_standbys() -> None:
    q = STANDBY_FLUSH.lower()
    assert "synchronized_standby_slots" in q and "restart_lsn" in q and "pg_current_wal_insert_lsn()" in q


def test_consumer_faults_apply_to_wal_relay() -> None:
    from lab.faults import check, fault_for

    s = Scenario(pipeline="wal-relay", consumers=2, fault="consumer-kill:1@3s", consumer_layout="processes")
    check(s)
    f = fault_for(s)
    assert f is not None and f.target == 1
