"""``lab bench claims``: its pure parts (batches, the fitted line, the plan's summary)."""

from __future__ import annotations

import pytest

from lab.study.claim_table import BATCH, batches, fit_line, fits, plan_summary, positions, run_cost, shape


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


def test_the_line_and_what_a_run_pays_on_average() -> None:
    a, b = fit_line([(0, 10.0), (100_000, 30.0), (500_000, 110.0)]) or (None, None)
    assert a == pytest.approx(10.0) and b == pytest.approx(20.0 / 100_000)
    assert run_cost(10.0, 20.0 / 100_000, 100_000) == pytest.approx(20.0)  # the table holds M/2 on average
    assert fit_line([(5_000, 1.0), (5_000, 2.0)]) is None


def test_fits_per_condition_and_claimers() -> None:
    cells = [{"condition": c, "claimers": n, "rows_before": k, "claim_us_per_msg": 10.0 + n * k / 100_000}
             for c in ("reference", "vacuumed") for n in (1, 8) for k in (0, 100_000)]
    out = {(f["condition"], f["claimers"]): f for f in fits(cells)}
    assert set(out) == {("reference", 1), ("reference", 8), ("vacuumed", 1), ("vacuumed", 8)}
    f = out["reference", 8]
    assert f["a_us_per_msg"] == 10.0 and f["b_us_per_msg_per_100k_rows"] == 8.0
    assert f["predicted_ms_per_msg"][100_000] == pytest.approx((10.0 + 4.0) / 1000)


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
                        "Actual Rows": 1, "Actual Loops": 100}]},
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
        {"node": "Index Scan", "on": "pk_inbox_wal", "rows": 100, "loops": 100},
        {"node": "Seq Scan", "on": "inbox_wal", "rows": 20_000, "loops": 1}]
    assert s["shared_buffers"] == 815 and s["planning_ms"] == 0.21 and s["execution_ms"] == 3.456
    assert shape(s) == ("Hash Join+Nested Loop+Hash Join: Index Scan pk_inbox_wal (100 rows), "
                        "Seq Scan inbox_wal (20000 rows)")
