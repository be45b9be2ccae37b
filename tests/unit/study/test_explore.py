"""The committed sittings shown without a run (lab.study.explore), on a hand-made ledger table."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lab.study import explore, plots

NS = (1, 4, 8, 16)


def _cells() -> pd.DataFrame:
    """Three sittings of wal and kafka at 5,000 messages, closed loop (the third 0.1 ms dearer), and the
    first also at 20,000 messages."""
    rows = []
    for i, day in enumerate(("2026-12-05", "2026-12-06", "2026-12-07")):
        for p, a, b in (("wal", 0.8, 0.05), ("kafka", 1.4, 0.0)):
            for n in NS:
                rows.append({"sitting": f"s{i}", "day": day, "machine": "m2", "profile": "quick", "pipeline": p,
                             "consumers": n, "messages": 5000, "condition": "closed loop",
                             "median_ms": a + b * (n - 1) + (0.1 if i == 2 else 0.0), "lo_ms": math.nan,
                             "hi_ms": math.nan, "runs": 2})
    rows += [{**rows[0], "messages": 20_000, "consumers": n, "median_ms": 0.7, "runs": 1} for n in (1, 16)]
    return pd.DataFrame(rows)


def test_the_index_has_a_row_per_sitting() -> None:
    index = explore.index_table(_cells())
    assert list(index["sitting"]) == ["s0", "s1", "s2"]
    first = index.iloc[0]
    assert (first["pipelines"], first["consumers"], first["messages"], first["runs"]) == (
        "wal, kafka", "1, 4, 8, 16", "5,000, 20,000", 16 + 2)
    assert explore.index_table(pd.DataFrame()).empty


def test_each_cell_over_the_sittings_with_its_range() -> None:
    over = explore.over_sittings(_cells())
    wal16 = over[(over["pipeline"] == "wal") & (over["consumers"] == 16) & (over["messages"] == 5000)].iloc[0]
    assert (wal16["median_ms"], wal16["low_ms"], wal16["high_ms"], wal16["sittings"]) == pytest.approx(
        (1.55, 1.55, 1.65, 3))
    assert list(over["pipeline"].drop_duplicates()) == ["wal", "kafka"]  # registry order
    assert explore.main_condition(_cells()) == (5000, "closed loop")


def test_which_pipeline_is_cheapest_where_in_words() -> None:
    table = pd.DataFrame({"pipeline": ["wal"] * 4 + ["kafka"] * 4, "consumers": list(NS) * 2,
                          "median_ms": [0.8, 0.95, 1.15, 1.55, 1.4, 1.4, 1.4, 1.4]})
    assert plots.cheapest_words(table) == "wal is cheapest at N = 1–8, kafka at N = 16"
    assert plots.cheapest_words(table[table["pipeline"] == "wal"]) == "wal is cheapest at N = 1–16"


def test_the_crossings_of_the_sittings_in_one_sentence() -> None:
    rows = explore.crossing_rows({"s0": {"between": (8, 16), "at": 12.0, "beyond": False},
                                  "s1": {"between": (8, 16), "at": 13.0, "beyond": False},
                                  "s2": {"between": None, "at": None, "beyond": True}, "s3": None}, "wal", "kafka")
    assert list(rows["measured"]) == [True, True, True, False]
    assert explore.crossing_words(rows, 16) == (
        "wal and kafka cross between N = 8 and 16 in 2 of 4 sittings; beyond N = 16 in 1")
    assert explore.crossing_words(rows.iloc[2:3], 16) == "wal costs less than kafka up to N = 16 in 1 of 1 sittings"
    assert explore.pairs(_cells()) == [("wal", "kafka")]
