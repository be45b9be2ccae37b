"""The verdict and run.json's assembly on records of real runs (``fixtures/``, stored by
``fixtures/capture.py``), and on those records changed by one count, one duplicate, one failure."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from lab.runner.assembly import assemble, verdict_of
from lab.runner.verdict import FaultFacts, consumer_errors, counters_of, judge, planned_messages

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# fixture → (success, what its error starts with or contains, None: no error)
EXPECTED: dict[str, tuple[bool, str | None]] = {
    "wal-clean": (True, None),
    "kafka-clean": (True, None),
    "wal-sharded-skipped": (True, None),
    "fault-consumer-kill": (True, None),
    "fault-slot-invalidation-loss": (False, "slot load_test_slot_0 invalidated (wal_removed"),
    "failed-not-drained": (False, "not drained"),
}
CLEAN = ("wal-clean", "kafka-clean", "wal-sharded-skipped")


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def as_json(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def test_every_expected_fixture_is_stored() -> None:
    stored = {p.stem for p in FIXTURES.glob("*.json")}
    assert stored == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_stored_run_gets_its_verdict_back(name: str) -> None:
    data = load(name)
    success, error = EXPECTED[name]
    v = verdict_of(data["record"])
    assert (v.success, data["run"]["success"]) == (success, success)
    assert v.error == data["run"]["error"]
    if error is None:
        assert v.error is None and v.reasons == ()
    else:
        assert error in v.error and v.reasons


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_assembly_reproduces_the_stored_run_json(name: str) -> None:
    data = load(name)
    before = copy.deepcopy(data["record"])
    got = as_json(assemble(data["record"]))
    assert data["record"] == before  # the record is not changed
    assert list(got) == list(data["run"])  # the same fields, in the same order
    for key, value in data["run"].items():
        assert got[key] == value, key


def test_the_clean_runs_are_what_their_names_say() -> None:
    sharded = load("wal-sharded-skipped")["run"]
    assert sharded["scenario"]["pipeline"] == "wal-sharded" and sharded["counters"]["skipped"] > 0
    assert load("kafka-clean")["run"]["scenario"]["pipeline"] == "kafka"
    kill = load("fault-consumer-kill")["run"]
    assert kill["fault"]["accounting"]["lost"] == 0 and kill["fault"]["accounting"]["adds_up"]
    loss = load("fault-slot-invalidation-loss")["run"]["fault"]["accounting"]
    assert loss["lost"] > 0


@pytest.mark.parametrize("name", CLEAN)
def test_one_processed_message_short_fails_with_that_reason(name: str) -> None:
    rec = load(name)["record"]
    rec["consumers"][0]["processed"] -= 1
    m = planned_messages(rec["scenario"], rec["sent"])
    v = verdict_of(rec)
    assert not v.success and v.reasons == (f"processed={m - 1} != messages={m}",)
    assert v.error is not None and v.error.startswith("counters do not match: ") and f"processed={m - 1}" in v.error
    assert assemble(rec)["success"] is False


@pytest.mark.parametrize("name", CLEAN)
def test_a_duplicate_work_call_fails_the_reference_predicate(name: str) -> None:
    rec = load(name)["record"]
    m = planned_messages(rec["scenario"], rec["sent"])
    rec["checks"]["work_calls"] += 1  # one id worked twice: calls > distinct
    v = verdict_of(rec)
    assert not v.success and v.reasons == (f"work_calls={m + 1} != messages={m}",)


@pytest.mark.parametrize("name", CLEAN)
def test_a_send_failure_fails_the_run(name: str) -> None:
    rec = load(name)["record"]
    m = planned_messages(rec["scenario"], rec["sent"])
    rec["sent"]["send_failed"], rec["sent"]["sent"] = 1, m - 1
    v = verdict_of(rec)
    assert not v.success and v.reasons == ("send_failed=1", f"sent={m - 1} != messages={m}")
    assert "send_failed=1" in (v.error or "")


def test_another_id_set_of_the_same_size_fails_the_run() -> None:
    rec = load("wal-clean")["record"]
    assert rec["checks"]["ids_match"] is True
    rec["checks"]["ids_match"] = False
    v = verdict_of(rec)
    assert not v.success and v.reasons == ("ids_match=False",)


@pytest.mark.parametrize(("left", "success"), [(None, True), (0, True), (3, False)])
def test_rows_left_in_the_outbox_of_a_deleting_pipeline_fail_the_run(left: int | None, success: bool) -> None:
    rec = load("kafka-clean")["record"]
    rec["checks"]["outbox_left"] = left
    v = verdict_of(rec)
    assert v.success is success
    if not success:
        assert v.reasons == (f"outbox_left={left}",)
        assert v.error is not None and v.error.endswith(f"outbox_left={left}")


def test_the_vacuum_block_is_stored_when_the_run_read_it() -> None:
    rec = load("kafka-clean")["record"]
    assert "vacuum" not in assemble(rec)  # a record from before the block keeps its shape
    rec["vacuum"] = {"autovacuum": {"cpu_s": 0.01}}
    assert assemble(rec)["vacuum"] == {"autovacuum": {"cpu_s": 0.01}}


def test_a_consumer_error_is_the_run_error_unless_a_fault_ended_it() -> None:
    rec = load("wal-clean")["record"]
    rec["consumers"][0]["error"] = "boom"
    index = rec["consumers"][0]["index"]
    v = verdict_of(rec)
    assert not v.success and v.error == f"consumer {index}: boom"
    rec["ended"] = [index]
    assert verdict_of(rec).success


def test_claims_lost_to_another_reader_are_counted_not_judged() -> None:
    rec = load("wal-sharded-skipped")["record"]
    rec["consumers"][0]["skipped"] += 1000
    assert verdict_of(rec).success
    assert assemble(rec)["counters"]["skipped"] == load("wal-sharded-skipped")["run"]["counters"]["skipped"] + 1000


def test_a_fault_run_allows_duplicates_but_not_a_loss() -> None:
    rec = load("fault-consumer-kill")["record"]
    acc = rec["accounting"]
    acc["extra_calls"] += 5
    acc["work_calls"] += 5  # five replayed calls: still adds up
    assert verdict_of(rec).success
    acc["lost"], acc["distinct"] = 1, acc["distinct"] - 1
    acc["once"] -= 1
    v = verdict_of(rec)
    assert not v.success and "lost=1" in v.reasons and v.error is not None
    assert v.error.startswith("fault accounting: messages=") and "lost=1" in v.error


def test_a_loss_under_the_reference_claim_points_at_takeover() -> None:
    counters = {"sent": 10, "send_failed": 0}
    acc = {"messages": 10, "lost": 2, "foreign": 0, "adds_up": True, "lost_claimed_by": {"c-1": 2}}
    v = judge(counters, 10, fault=FaultFacts("consumer-kill", claim="owner"), accounting=acc)
    assert not v.success and "--claim takeover" in (v.error or "")
    v = judge(counters, 10, fault=FaultFacts("consumer-kill", claim="takeover"), accounting=acc)
    assert "--claim takeover" not in (v.error or "")


def test_a_postgres_restart_counts_refused_inserts_as_not_sent() -> None:
    counters = {"sent": 95, "send_failed": 5}
    acc = {"messages": 96, "lost": 0, "foreign": 0, "adds_up": True}
    v = judge(counters, 100, fault=FaultFacts("postgres-restart", stops_source=True), accounting=acc)
    assert v.success and v.accounting is not None
    got = v.accounting
    assert (got["not_sent"], got["rows_without_reply"], got["acknowledged_absent"]) == (5, 1, 0)
    assert "not_sent" not in acc  # the input is not changed
    v = judge({"sent": 95, "send_failed": 4}, 100, fault=FaultFacts("postgres-restart", stops_source=True),
              accounting=acc)
    assert not v.success and v.reasons == ("sent+send_failed=99 != messages=100",)
    # elsewhere a refused insert is a failure
    v = judge(counters, 100, fault=FaultFacts("consumer-kill"), accounting={**acc, "messages": 100})
    assert not v.success and v.reasons[:2] == ("send_failed=5", "sent=95 != messages=100")


def test_a_fault_run_without_its_accounting_fails() -> None:
    v = judge({"sent": 10, "send_failed": 0}, 10, fault=FaultFacts("consumer-kill"))
    assert not v.success and v.reasons == ("accounting not measured",)
    assert v.error == "fault accounting: not measured, sent=10, send_failed=0"


def test_a_big_transactions_rows_are_expected_in_messages() -> None:
    acc = {"messages": 110, "lost": 0, "foreign": 0, "adds_up": True}
    counters = {"sent": 100, "send_failed": 0}
    assert judge(counters, 100, fault=FaultFacts("big-transaction", extra_rows=10), accounting=acc).success
    assert not judge(counters, 100, fault=FaultFacts("big-transaction", extra_rows=0), accounting=acc).success


def test_a_staircase_stopped_early_is_judged_on_the_messages_it_planned() -> None:
    assert planned_messages({"messages": 900, "rate_steps": "100,200"}, {"planned": 300}) == 300
    assert planned_messages({"messages": 900, "rate_steps": ""}, {"planned": 300}) == 900


def test_counters_sum_the_consumers_and_keep_the_checks() -> None:
    c = counters_of({"sent": 3}, [{"processed": 1, "skipped": 2}, {"processed": 2}], {"work_calls": 3})
    assert (c["sent"], c["send_failed"], c["processed"], c["skipped"], c["work_calls"]) == (3, 0, 3, 2, 3)
    assert consumer_errors([{"index": 0, "error": "x"}, {"index": 1, "error": "y"}], [1]) == ["consumer 0: x"]


def test_a_derived_figure_is_one_more_block_beside_cpu_s_and_none_without_a_window() -> None:
    rec = load("wal-clean")["record"]
    before = list(rec["derived"])
    rec["derived"]["steady_cost"] = {"web": 0.1}
    keys = list(assemble(rec))
    assert keys[keys.index("cpu_s") + 1:keys.index("mem_mb")] == [*before, "steady_cost"]
    assert assemble(rec)["steady_cost"] == {"web": 0.1}
    rec["window"] = None
    out = assemble(rec)
    assert out["steady_cost"] is None and out["cpu_ms_per_msg"] is None and out["cpu_s"] == {}
