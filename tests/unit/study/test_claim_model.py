"""``lab bench claims``: its pure parts (batches, the fitted line, the plan's summary)."""

from __future__ import annotations

import pytest

from lab.study.claim_model import (
    BATCH,
    batches,
    fit_line,
    fits,
    plan_summary,
    positions,
    reads_whole_table,
    run_cost,
    shape,
    table_text,
)


def test_claimers_batches_cover_every_position_once_and_do_not_line_up() -> None:
    fresh = positions(0, 1_000)
    n = 4
    cuts = [batches(fresh, BATCH, BATCH - j * BATCH // n) for j in range(n)]
    for cut in cuts:
        assert [x for b in cut for x in b] == fresh
        assert all(1 <= len(b) <= BATCH for b in cut)
    assert [len(c[0]) for c in cuts] == [100, 75, 50, 25]
    ends = [{sum(len(b) for b in c[:i + 1]) for i in range(len(c))} for c in cuts]
    assert not ends[0] & ends[1] - {1_000}  # only the last boundary is shared


def test_batches_of_nothing_and_a_first_batch_out_of_range() -> None:
    assert batches([], 100, 30) == []
    assert batches([1, 2, 3], 2, 0) == [[1], [2, 3]]  # at least one item first
    assert batches([1, 2, 3], 2, 9) == [[1, 2], [3]]  # at most one batch


def test_positions_are_apart_and_above_the_filled_ones() -> None:
    filled, fresh = positions(0, 3), positions(3, 2)
    assert max(filled) < min(fresh) and fresh[1] - fresh[0] == filled[1] - filled[0] > 0


def test_the_line() -> None:
    a, b = fit_line([(0, 10.0), (100_000, 30.0), (500_000, 110.0)]) or (None, None)
    assert a == pytest.approx(10.0) and b == pytest.approx(20.0 / 100_000)
    assert fit_line([(5_000, 1.0), (5_000, 2.0)]) is None


LINE = (10.0, 20.0 / 1_000)  # µs/msg: 10 on an empty table, +20 per 1,000 rows


def test_a_run_below_the_switch_pays_the_line_at_half_its_volume() -> None:
    assert run_cost(LINE, 15.0, 40_000, 20_000) == pytest.approx(10.0 + 20.0 * 10)  # the table holds M/2 on average
    assert run_cost(LINE, 15.0, None, 100_000) == pytest.approx(10.0 + 20.0 * 50)  # it never switches


def test_a_run_beyond_the_switch_pays_the_line_up_to_it_then_the_flat_cost() -> None:
    # 20,000 claims at 10 + 20·K/1000 (mean 210), then 80,000 at 15
    assert run_cost(LINE, 15.0, 20_000, 100_000) == pytest.approx((20_000 * 210.0 + 80_000 * 15.0) / 100_000)
    assert run_cost(None, 15.0, 0, 100_000) == 15.0  # the key from the first claim on
    assert run_cost(LINE, None, 20_000, 100_000) is None  # nothing measured beyond the switch
    assert run_cost(None, 15.0, 20_000, 100_000) is None


def test_fits_per_condition_and_claimers() -> None:
    seq = {"joins": ["Hash Join"], "on_table": [{"node": "Seq Scan", "on": "inbox_wal", "keyed": False,
                                                 "rows": 1, "loops": 1}]}
    key = {"joins": ["Nested Loop"], "on_table": [{"node": "Index Scan", "on": "pk_inbox_wal", "keyed": True,
                                                   "rows": 0, "loops": 100}]}
    cells = [{"condition": c, "claimers": n, "rows_before": k, "claim_us_per_msg": 10.0 + n * k / 1_000,
              "plan": seq if k < 50_000 else key}
             for c in ("reference", "vacuumed") for n in (1, 8) for k in (0, 20_000, 100_000)]
    for c in cells:
        if c["plan"] is key:
            c["claim_us_per_msg"] = 12.0
    out = {(f["condition"], f["claimers"]): f for f in fits(cells, {"reference": 40_000, "vacuumed": None})}
    assert set(out) == {("reference", 1), ("reference", 8), ("vacuumed", 1), ("vacuumed", 8)}
    f = out["reference", 8]
    assert (f["switch_rows"], f["a_us_per_msg"], f["b_us_per_msg_per_100k_rows"], f["flat_us_per_msg"]) == (
        40_000, 10.0, 800.0, 12.0)
    assert f["predicted_ms_per_msg"][20_000] == pytest.approx((10.0 + 8 * 10) / 1000)
    assert f["predicted_ms_per_msg"][100_000] == pytest.approx((40_000 * (10 + 8 * 20) + 60_000 * 12) / 1e5 / 1000)
    assert out["vacuumed", 8]["predicted_ms_per_msg"][100_000] == pytest.approx((10.0 + 8 * 50) / 1000)


EXPLAINED = [{
    "Plan": {
        "Node Type": "Append", "Actual Rows": 100, "Actual Loops": 1, "Shared Hit Blocks": 812,
        "Shared Read Blocks": 3,
        "Plans": [
            {"Node Type": "ModifyTable", "Operation": "Insert", "Relation Name": "inbox_wal", "Actual Rows": 100,
             "Actual Loops": 1, "Plans": [{"Node Type": "Function Scan", "Actual Rows": 100, "Actual Loops": 1}]},
            {"Node Type": "Hash Join", "Actual Rows": 100, "Actual Loops": 1,
             "Plans": [{"Node Type": "CTE Scan", "Actual Rows": 100, "Actual Loops": 1},
                       {"Node Type": "Hash", "Actual Rows": 100, "Actual Loops": 1}]},
            {"Node Type": "Nested Loop", "Actual Rows": 0, "Actual Loops": 1,
             "Plans": [{"Node Type": "Function Scan", "Actual Rows": 100, "Actual Loops": 1},
                       {"Node Type": "Index Scan", "Relation Name": "inbox_wal", "Index Name": "pk_inbox_wal",
                        "Index Cond": "(wal = ((t.txt)::pg_lsn))", "Actual Rows": 1, "Actual Loops": 100}]},
            {"Node Type": "Hash Join", "Actual Rows": 0, "Actual Loops": 1,
             "Plans": [{"Node Type": "Seq Scan", "Relation Name": "inbox_wal", "Actual Rows": 20_000,
                        "Actual Loops": 1}]},
        ],
    },
    "Planning Time": 0.21, "Execution Time": 3.456,
}]


def test_the_plan_says_how_the_claim_table_was_read() -> None:
    s = plan_summary(EXPLAINED)
    assert s["joins"] == ["Hash Join", "Nested Loop", "Hash Join"]
    assert s["on_table"] == [  # the insert itself is not a read
        {"node": "Index Scan", "on": "pk_inbox_wal", "keyed": True, "rows": 100, "loops": 100},
        {"node": "Seq Scan", "on": "inbox_wal", "keyed": False, "rows": 20_000, "loops": 1}]
    assert s["shared_buffers"] == 815 and s["planning_ms"] == 0.21 and s["execution_ms"] == 3.456
    assert shape(s) == ("Hash Join+Nested Loop+Hash Join: Index Scan pk_inbox_wal (100 rows), "
                        "Seq Scan inbox_wal (20000 rows)")
    assert reads_whole_table(s)
    assert not reads_whole_table({**s, "on_table": s["on_table"][:1]})
    whole_index = {"node": "Index Scan", "on": "pk_inbox_wal", "keyed": False, "rows": 500, "loops": 1}
    assert reads_whole_table({**s, "on_table": [whole_index]})  # every key in order, for a hash join


def test_the_printed_table_has_a_line_per_cell_and_per_fit() -> None:
    s = plan_summary(EXPLAINED)
    cell = {"condition": "reference", "rows_before": 20_000, "claimers": 8, "claim_us_per_msg": 199.3,
            "claim_us_per_statement": 2387.0, "speculative_aborts": 3, "plan": s,
            "table": {"index_depth": 2, "index_bytes": 516_096, "dead_tuples": 20}}
    fit = {"condition": "reference", "claimers": 8, "switch_rows": 40_000, "a_us_per_msg": 90.0,
           "b_us_per_msg_per_100k_rows": 550.0, "flat_us_per_msg": None,
           "predicted_ms_per_msg": {5_000: 0.104, 20_000: 0.145, 100_000: None}}
    text = table_text({"cells": [cell], "fits": [fit]})
    lines = text.splitlines()
    assert len(lines) == 5 and lines[1].split()[:4] == ["reference", "20000", "8", "199.3"]
    assert "Seq Scan inbox_wal (20000 rows)" in lines[1]
    assert lines[4].split() == ["reference", "8", "40000", "90.0", "550.0", "-", "0.104,", "0.145,", "-"]
