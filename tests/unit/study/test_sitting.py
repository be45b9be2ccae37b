"""The sitting record: a reference sitting's runs, made up with known costs, read back as the
measured crossing, the quick model's prediction and its error."""

from __future__ import annotations

import functools
import json
from typing import Any

import pandas as pd
import pytest

from lab.study import ledger, sitting

M = 100_000


def _run(i: int, pipeline: str, n: int, messages: int, ms: float, *, label: str = "", warmup: bool = False,
         unit: float = 1.0) -> dict[str, object]:
    return {"run_id": f"r{i}", "series_index": i, "started_at": f"2026-12-06T22:{i // 60:02d}:{i % 60:02d}",
            "pipeline": pipeline, "consumers": n, "messages": messages, "cpu_ms_per_msg": ms, "success": True,
            "warmup": warmup, "label": label, "cpu_ms_per_msg_norm": ms / unit, "speed.unit_ms_median": unit,
            "steady_ms_per_msg": ms * 0.9, "fixed_cpu_s": ms * 0.1 * messages / 1000, "window_s": 10.0,
            "cpu_s.postgres": ms * messages / 2000, "cpu_s.consumers": ms * messages / 4000,
            "pg.walsenders": 0.1 * n * messages / 1000 if pipeline == "wal" else None,
            "pg.claims": 0.05 * messages / 1000 if pipeline == "wal" else None,
            "steal_pct": 0.1, "cpu_s.unattributed": 0.02 * messages / 1000, "loadavg_1m": 1.5,
            "git_sha": "abcdef1234567890", "git_dirty": False, "topology": "single", "backend": "native",
            "senders": 200, "rate": 0.0}


def wal_ms(n: int, messages: int) -> float:
    return 0.8 + 0.05 * (n - 1)  # no start cost


def kafka_ms(n: int, messages: int) -> float:
    return 0.95 + 1000 * 2.0 / messages  # a flat steady cost and F = 2 CPU-s per start


def reference_runs(*, shift: float = 0.0) -> pd.DataFrame:
    """Two blocks of paired 100,000-message cells, a 5,000-message arm at every N, 20,000 at 1 and 16."""
    rows, i = [], 0
    rows.append(_run(i, "kafka", 1, 20_000, 2.0, label="warmup", warmup=True))
    for block in range(2):
        for n in (1, 4, 8, 12, 16):
            for p, f in (("wal", wal_ms), ("kafka", kafka_ms)):
                i += 1
                rows.append(_run(i, p, n, M, f(n, M) + shift + 0.01 * block))
            arm = [5_000] if block == 0 else ([20_000] if n in (1, 16) else [])
            for m in arm:
                for p, f in (("wal", wal_ms), ("kafka", kafka_ms)):
                    i += 1
                    rows.append(_run(i, p, n, m, f(n, m) + shift, label="volume", warmup=True))
    return pd.DataFrame(rows)


@functools.lru_cache(maxsize=4)
def _record(shift: float) -> str:
    return json.dumps(sitting.build(reference_runs(shift=shift), sitting_id="s1", profile="reference",
                                    series_id="reference", machine={"id": "m1", "cpus": 2}, n_boot=50))


def record(shift: float = 0.0) -> dict[str, object]:
    """A reference sitting's record (built once per shift, a fresh copy each call)."""
    return json.loads(_record(shift))


def pruned_ms(n: int, messages: int) -> float:
    return 0.75 + 0.01 * (n - 1)  # the claim table pruned: the claims no longer grow with the run


POLL_MS = 1.2


def conditions_runs(*, drop: tuple[str, ...] = ()) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """A conditions sitting: two blocks of paired cells at N = 1, 4, 16 (wal never pruned, kafka, wal
    pruned, and poll first at N = 4), a warm-up and a drift probe; and the runs' run.json ``vacuum``
    blocks. ``drop``: the cells ("pruned", "poll") left out."""
    rows: list[dict[str, Any]] = []
    raw: dict[str, dict[str, Any]] = {}
    i = 0
    rows.append(_run(i, "kafka", 1, 20_000, 2.0, label="warmup", warmup=True))
    for block in range(2):
        for k, n in enumerate((4, 1, 16)):
            order = [("wal", "never", wal_ms), ("kafka", "never", kafka_ms), ("wal", "behind-slots", pruned_ms)]
            if n == 4:
                order.insert(0, ("poll", "never", lambda n, m: POLL_MS))
            for p, retention, f in order if (block + k) % 2 == 0 else order[::-1]:
                if ("pruned" in drop and retention != "never") or ("poll" in drop and p == "poll"):
                    continue
                i += 1
                run = _run(i, p, n, M, f(n, M) + 0.01 * block) | {"claim_retention": retention}
                if retention != "never":
                    run["pg.prune"] = 0.01 * M / 1000
                rows.append(run)
                end = {"inbox_wal": {"n_live_tup": 1500.0 if retention != "never" else float(M)}} if p == "wal" else {}
                raw[f"r{i}"] = {"vacuum": {"tables": {"end": end}, "autovacuum": {"cpu_s": 0.4 if p == "poll" else 0.0},
                                           "delta": {"messages": {"autovacuum_count": 2 if p == "poll" else 0},
                                                     "inbox_wal": {"autovacuum_count": 0}}}}
                if retention != "never":  # what the readers counted: PostgreSQL's 1,500 is an estimate
                    raw[f"r{i}"]["pipeline_settings"] = {"claim_table": {"rows": 1200, "rows_max": 9000,
                                                                         "pruned": M - 1200, "prunes": 40}}
    # the drift probe repeats the first cell of the profile's own pipelines, 3 % dearer
    first = next(r for r in rows if not r["warmup"] and r["pipeline"] != "poll" and r["claim_retention"] == "never")
    rows.append({**first, **_run(i + 1, first["pipeline"], first["consumers"], M, first["cpu_ms_per_msg"] * 1.03,
                                 label="drift", warmup=True)})
    return pd.DataFrame(rows), raw


def conditions_record(drop: tuple[str, ...] = ()) -> dict[str, Any]:
    runs, raw = conditions_runs(drop=drop)
    rec = sitting.build(runs, sitting_id="c1", profile="conditions", series_id="conditions", machine={"id": "m1"},
                        raw=raw, n_boot=20)
    return json.loads(json.dumps(rec))  # as committed


def test_a_runs_condition_is_read_from_its_recorded_scenario() -> None:
    assert sitting.condition({"claim_retention": "behind-slots"}) == "claims pruned"
    assert sitting.condition({"claim_retention": "never"}) == ""
    assert sitting.condition({}) == "" and sitting.condition({"claim_retention": float("nan")}) == ""  # stored before
    assert sitting.condition(pd.Series({"pipeline": "wal", "claim_retention": "behind-slots"})) == "claims pruned"
    assert sitting.condition({"claim_retention": "weekly"}) == "claims weekly"  # a retention not named yet


def test_a_second_condition_has_its_own_cells_pairs_and_crossing_beside_the_plain_ones() -> None:
    rec = conditions_record()
    assert rec["conditions"]["beside"] == ["claims pruned"] and rec["conditions"]["volumes"] == [M]
    runs = rec["runs"]
    assert {(r["pipeline"], r["condition"]) for r in runs} == {
        ("wal", ""), ("kafka", ""), ("wal", "claims pruned"), ("poll", "")}
    cells = {(c["pipeline"], c["condition"], c["consumers"]): c for c in rec["cells"]}
    assert cells[("wal", "", 4)]["runs"] == cells[("wal", "claims pruned", 4)]["runs"] == 2
    assert cells[("wal", "claims pruned", 4)]["median"] == pytest.approx(pruned_ms(4, M) + 0.005)
    assert cells[("wal", "", 4)]["median"] == pytest.approx(wal_ms(4, M) + 0.005)
    pruned_pairs = [p for p in rec["pairs"] if p["condition"] == "claims pruned"]
    assert len(pruned_pairs) == 6 and {p["broker"] for p in pruned_pairs} == {"kafka"}  # the plain kafka run
    assert all(p["gap"] == 1 for p in rec["pairs"] if p["direct"] == "wal")  # back to back, both conditions
    # kafka - wal: +0.17, +0.02, -0.58 at 1, 4, 16 never pruned; +0.22, +0.19, +0.07 pruned
    plain = ledger.crossing(rec, "wal", "kafka", M)
    assert plain is not None and plain["between"] == [4, 16]
    assert plain["at"] == pytest.approx(4 + 12 * 0.02 / 0.6, abs=0.05)
    pruned = ledger.crossing(rec, "wal", "kafka", M, condition="claims pruned")
    assert pruned is not None and pruned["beyond"] and pruned["between"] is None
    assert {n: len(v) for n, v in pruned["diffs"].items()} == {1: 2, 4: 2, 16: 2}
    assert rec["quiet"]["drift_pct"] == pytest.approx(3.0, abs=0.1)  # read against the plain runs only
    poll = next(r for r in runs if r["pipeline"] == "poll")
    assert poll["autovacuum"] == {"count": 2, "cpu_s": 0.4}
    left = {r["condition"]: r["claim_table"]["rows"] for r in runs if r["pipeline"] == "wal"}
    assert left == {"": M, "claims pruned": 1500}
    pruned_table = next(r["claim_table"] for r in runs if r["condition"] == "claims pruned")
    assert (pruned_table["left"], pruned_table["rows_max"], pruned_table["pruned"]) == (1200, 9000, M - 1200)


def test_the_plain_cells_and_crossing_read_as_they_did_without_the_second_condition() -> None:
    both, alone = conditions_record(), conditions_record(drop=("pruned", "poll"))
    assert ledger.crossing(alone, "wal", "kafka", M, condition="claims pruned") is None
    keep = ("between", "at", "below", "beyond", "clear", "diffs", "ns", "median_diff")
    a, b = ledger.crossing(both, "wal", "kafka", M), ledger.crossing(alone, "wal", "kafka", M)
    assert a is not None and b is not None and {k: a[k] for k in keep} == {k: b[k] for k in keep}
    plain = {(c["pipeline"], c["consumers"]): c["median"] for c in ledger.plain_cells(both)}
    assert {k: v for k, v in plain.items() if k[0] != "poll"} == {
        (c["pipeline"], c["consumers"]): c["median"] for c in ledger.plain_cells(alone)}
    # the readers of plain cells see one `wal` per N: the pruned one is a condition of its own
    assert (ledger.answer([both], 4, M)["pipeline"].value_counts() == 1).all()
    est = ledger.estimate(both, "wal", 4, M)
    assert est is not None and est["ms"] == pytest.approx(wal_ms(4, M) + 0.005)
    assert set(ledger.record_runs(both)["condition"]) == {""}
    table = ledger.cells([both])
    assert set(table.loc[table["pipeline"] == "wal", "condition"]) == {"main", "claims pruned"}


def test_a_record_written_before_conditions_reads_as_plain() -> None:
    rec = record()
    old = {**rec, **{k: [{f: v for f, v in row.items() if f != "condition"} for row in rec[k]]
                     for k in ("runs", "cells", "pairs", "crossings")}}
    new_c, old_c = ledger.crossing(rec, "wal", "kafka", M), ledger.crossing(old, "wal", "kafka", M)
    assert new_c is not None and old_c is not None and new_c["condition"] == "" and "condition" not in old_c
    assert old_c == {k: v for k, v in new_c.items() if k != "condition"}
    assert len(ledger.plain_cells(old)) == len(ledger.plain_cells(rec)) == len(rec["cells"])


def test_crossing_from_reads_the_first_sign_change_between_measured_n() -> None:
    c = sitting.crossing_from({1: [0.2, 0.3], 4: [0.1, 0.05], 8: [-0.1, -0.2], 16: [-0.3]})
    assert c["between"] == [4, 8] and c["at"] == pytest.approx(4 + 4 * 0.075 / 0.225, abs=0.01)
    assert c["clear"] and c["monotone"] and not c["beyond"] and not c["below"]
    straddle = sitting.crossing_from({4: [0.1, -0.02], 8: [-0.1, -0.2]})
    assert straddle["between"] == [4, 8] and straddle["clear"] is False  # a pair at N = 4 already below 0
    assert sitting.crossing_from({1: [0.3], 16: [0.1]})["beyond"]
    assert sitting.crossing_from({1: [-0.1], 16: [-0.3]})["below"]
    assert not sitting.crossing_from({1: [0.1], 4: [-0.1], 8: [0.1]})["monotone"]
    assert sitting.crossing_from({})["between"] is None


def test_a_reference_sitting_records_its_measured_crossing_and_the_models_error() -> None:
    rec = record()
    # kafka - wal = 0.97 - (0.8 + 0.05 (N - 1)): +0.17 at 1, +0.02 at 4, -0.18 at 8: between 4 and 8
    c = ledger.crossing(rec, "wal", "kafka", M)
    assert c is not None and c["between"] == [4, 8] and c["clear"]
    assert c["at"] == pytest.approx(4 + 4 * 0.02 / 0.2, abs=0.05)
    assert {n: len(v) for n, v in c["diffs"].items()} == {1: 2, 4: 2, 8: 2, 12: 2, 16: 2}
    assert all(p["gap"] == 1 for p in rec["pairs"])  # back to back
    # the quick model's F lines: kafka's F = 2 CPU-s, wal's none
    fixed = {f["pipeline"]: f for f in rec["model"]["fixed"]}
    assert fixed["kafka"]["f0"] == pytest.approx(2.0, abs=0.01) and fixed["wal"]["f0"] == pytest.approx(0, abs=0.01)
    pred = {(p["pipeline"], p["consumers"]): p for p in rec["model"]["predictions"]}
    assert set(pred) == {(p, n) for p in ("wal", "kafka") for n in (1, 4, 8, 12, 16)}
    assert pred[("kafka", 4)]["predicted"] == pytest.approx(kafka_ms(4, M), abs=0.005)
    assert abs(pred[("kafka", 4)]["error_pct"]) < 1.5  # the measured cells are 0.005 above on average
    cells = {(c["pipeline"], c["consumers"], c["messages"]): c for c in rec["cells"]}
    assert cells[("wal", 8, M)]["runs"] == 2 and cells[("wal", 8, M)]["coverage"] == 0.5
    assert cells[("wal", 8, 5_000)]["arm"]
    assert rec["counts"] == {"runs": 35, "successful": 35, "failed": 0, "measured": 20}
    assert rec["conditions"]["volumes"] == [M] and rec["day"] == "2026-12-06"
    assert rec["quiet"]["speed_unit_ms"]["max_over_min"] == 1.0
    assert rec["model"]["steady_across_volumes"]  # every cell ran at two volumes or more
    assert len(json.dumps(rec)) < 40_000  # a few kB a sitting: no samples


def test_a_sitting_counts_failed_runs_and_leaves_them_out() -> None:
    runs = reference_runs()
    runs.loc[1, "success"] = False  # wal at N = 1 in the first block
    rec = sitting.build(runs, sitting_id="s", profile="reference", series_id="x", machine={}, n_boot=20)
    assert rec["counts"]["failed"] == 1 and rec["counts"]["measured"] == 19


def test_the_claim_table_comes_from_the_vacuum_block() -> None:
    run = {"vacuum": {"tables": {"end": {"inbox_wal": {"n_live_tup": 100000.0, "n_dead_tup": 12.0}}},
                      "sizes": {"inbox_wal": {"index_bytes": 3_000_000, "heap_bytes": 4_000_000, "index_depth": 2}}}}
    assert sitting._claim_table(run) == {"table": "inbox_wal", "rows": 100000, "dead": 12,
                                         "index_bytes": 3_000_000, "heap_bytes": 4_000_000, "index_depth": 2}
    assert sitting._claim_table({}) == {}


def test_autovacuum_logged_by_the_server_is_kept_beside_what_the_polls_saw() -> None:
    from lab.study import published

    run = {"vacuum": {"delta": {"messages": {"autovacuum_count": 1}, "messages_done": {"autovacuum_count": 1}},
                      "autovacuum": {"cpu_s": 0.0, "from_log": {"actions": 4, "cpu_s": 0.37}}}}
    got = sitting._autovacuum(run)
    assert got == {"count": 2, "cpu_s": 0.0, "log_actions": 4, "log_cpu_s": 0.37}
    assert published._autovacuum_cpu(got) == "4 actions, 0.37"  # the server's figure, not the polls' 0
    assert published._autovacuum_cpu({"count": 2, "cpu_s": 0.0}) == "≥ 0.00"  # the polls': a lower bound
    assert sitting._autovacuum({"vacuum": {"autovacuum": {}}}) == {}


def test_a_run_keeps_the_block_its_series_stored_with_it() -> None:
    """run.json's ``series_block`` (where the series knew it) is in the record's run; a run stored
    before it was kept has none, and its block is read from its place in the series."""
    runs = reference_runs()
    runs["series_block"] = [None] + [0 if i <= len(runs) // 2 else 1 for i in range(1, len(runs))]
    rows = sitting.run_rows(runs)
    assert [r.get("series_block") for r in rows] == [b for b in runs["series_block"][1:]]
    assert all("series_block" not in r for r in sitting.run_rows(reference_runs()))
