"""N* at a steady rate, measured: a sitting of paired open-loop runs made up with known steady costs,
read back as its steady pairs and crossing, the ledger's finding (measured beside the staircases'
chord, or the chord alone), the published section, `lab answer` at that rate, and old records."""

from __future__ import annotations

import functools
import json
from typing import Any

import pandas as pd
import pytest

from lab.study import answer, ledger, published, sitting
from tests.unit.study.test_sitting import M, _run, record

RATE = 200.0
SM = 10_000  # the steady profile's messages per run
KAFKA_STEADY = 1.2  # kafka − wal steady: +0.40 at N = 1, +0.25 at 4, −0.35 at 16: between 4 and 16, ≈ 9.0
# the staircases' floors of a closed-loop sitting (CPU/s = a + b·rate at N = 1 and 16): at 200 msg/s
# wal costs 1.3 and 3.5 ms/msg, kafka 3.3 and 3.0: the chord crosses near N = 13
RATES = [{"pipeline": "wal", "consumers": 1, "a_cpu_per_s": 0.10, "b_ms_per_msg": 0.8},
         {"pipeline": "wal", "consumers": 16, "a_cpu_per_s": 0.40, "b_ms_per_msg": 1.5},
         {"pipeline": "kafka", "consumers": 1, "a_cpu_per_s": 0.50, "b_ms_per_msg": 0.8},
         {"pipeline": "kafka", "consumers": 16, "a_cpu_per_s": 0.45, "b_ms_per_msg": 0.75}]


def wal_steady(n: int) -> float:
    return 0.8 + 0.05 * (n - 1)


def steady_runs(*, split: bool = True) -> pd.DataFrame:
    """A closed-loop warm-up, wal and kafka paired at 200 msg/s at N = 16, 1, 4 in two blocks (the
    order alternating), a drift probe. Kafka's whole window carries Debezium's start (2 ms/msg more
    than its steady part at 10,000 messages), wal's 0.1: on the whole window kafka never pays off.
    ``split`` False: no run has a steady part."""
    rows = [_run(0, "kafka", 1, 5_000, 3.0, label="warmup", warmup=True)]  # closed loop: rate 0
    i = 0
    for block in range(2):
        for k, n in enumerate((16, 1, 4)):
            order = ("wal", "kafka") if (block + k) % 2 == 0 else ("kafka", "wal")
            for p in order:
                i += 1
                steady = (KAFKA_STEADY if p == "kafka" else wal_steady(n)) + 0.01 * block
                whole = steady + (2.0 if p == "kafka" else 0.1)
                rows.append(_run(i, p, n, SM, whole) | {"rate": RATE,
                                                         "steady_ms_per_msg": steady if split else None})
    rows.append(_run(i + 1, "wal", 16, SM, wal_steady(16) + 0.1, label="drift", warmup=True) | {"rate": RATE})
    return pd.DataFrame(rows)


@functools.lru_cache(maxsize=2)
def _steady_record(split: bool) -> str:
    rec = sitting.build(steady_runs(split=split), sitting_id="st1", profile="steady", series_id="steady",
                        machine={"id": "m1", "cpus": 2}, n_boot=20)
    return json.dumps(rec)


def steady_record(split: bool = True) -> dict[str, Any]:
    return json.loads(_steady_record(split))


def staircase_record() -> dict[str, Any]:
    """A closed-loop sitting that ran the load staircases."""
    return {**record(), "id": "q1", "rates": RATES}


def old(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` as a record written before the steady basis existed."""
    return {**rec, "pairs": [{k: v for k, v in p.items() if k != "diff_steady"} for p in rec["pairs"]],
            "crossings": [c for c in rec["crossings"] if c["basis"] != "diff_steady"]}


def test_a_sitting_at_a_rate_pairs_the_runs_steady_parts_and_crosses_on_them() -> None:
    rec = steady_record()
    assert rec["conditions"]["rate"] == RATE  # the measured runs', not the closed-loop warm-up's
    assert rec["conditions"]["volumes"] == [SM]
    assert [p["diff_steady"] for p in rec["pairs"] if p["consumers"] == 1] == [pytest.approx(0.4)] * 2
    assert all(p["gap"] == 1 for p in rec["pairs"])  # back to back
    steady = ledger.crossing(rec, "wal", "kafka", SM, basis="diff_steady")
    assert steady is not None and steady["between"] == [4, 16] and steady["clear"]
    assert steady["at"] == pytest.approx(4 + 12 * 0.25 / 0.6, abs=0.01)
    whole = ledger.crossing(rec, "wal", "kafka", SM)  # the start cost in every kafka run: no crossing
    assert whole is not None and whole["beyond"] and whole["between"] is None
    assert [c["basis"] for c in rec["crossings"]] == ["diff", "diff_norm", "diff_steady"]


def test_runs_without_a_steady_part_give_no_steady_crossing() -> None:
    rec = steady_record(split=False)
    assert {p["diff_steady"] for p in rec["pairs"]} == {None}
    assert ledger.rate_crossings(rec, "wal", "kafka") == []
    assert sitting.crossings([{"direct": "wal", "broker": "kafka", "consumers": 1, "messages": SM, "diff": 0.1}],
                             key="diff_steady") == []  # pairs of a record written before the basis


def test_a_sitting_at_a_rate_is_read_at_that_rate_only() -> None:
    rec = steady_record()
    assert ledger.comparable([rec]) == []  # never in the closed-loop answer
    assert ledger.at_rate([rec], RATE) == [rec]
    assert ledger.at_rate([rec], 500.0) == [] and ledger.at_rate([rec], 0.0) == []
    assert ledger.at_rate([{**rec, "profile": "smoke"}], RATE) == []
    assert ledger.estimate(rec, "wal", 4, M) is None  # its cells are open loop: no closed-loop cost


def test_the_finding_is_measured_with_the_staircases_chord_beside_it() -> None:
    found = {f.question: f for f in ledger.findings([staircase_record(), steady_record()])}
    f = found["And for a slow steady stream (200 msg/s)?"]
    assert f.kind == "measured" and f.held == ""
    assert "measured: `wal` meets Kafka between N = 4 and 16 (≈ 9.0)" in f.sentence
    assert "paired runs at 200 msg/s at N = 1, 4, 16, start excluded" in f.sentence
    assert "chord through N = 1, 16 (the model this checks) put N* at 1" in f.sentence
    assert f.sentence.endswith("inside the measured bracket: they agree.")
    two = [staircase_record(), steady_record(), {**steady_record(), "id": "st2", "day": "2026-12-08"}]
    assert {g.question: g for g in ledger.findings(two)}[f.question].held == "2 of 2 sittings"
    # the model is checked on the machine the rate was measured on; another machine's chord is named apart
    other = {**staircase_record(), "id": "q-other", "machine": {"id": "m1", "cpu_model": "Intel(R) Xeon(R) Processor"}}
    apart = {g.question: g for g in ledger.findings([other, steady_record()])}[f.question].sentence
    assert "on the same machine" not in apart and "on other machines the chord put N* at 1" in apart
    both = {g.question: g for g in ledger.findings([staircase_record(), other, steady_record()])}[f.question].sentence
    assert "on the same machine the load staircases' chord" in both and "on other machines" in both
    # the closed-loop findings do not change with a sitting at a rate beside them
    closed = [g for g in ledger.findings([staircase_record()]) if g.question != f.question]
    assert [g for g in ledger.findings([staircase_record(), steady_record()]) if g.question != f.question] == closed


def test_without_a_sitting_at_the_rate_or_with_an_old_one_the_finding_stays_modelled() -> None:
    for recs in ([staircase_record()], [staircase_record(), old(steady_record())],
                 [staircase_record(), steady_record(split=False)]):
        f = {g.question: g for g in ledger.findings(recs)}["And for a slow steady stream (200 msg/s)?"]
        assert f.kind == "modelled" and f.sentence.startswith("At a steady 200 msg/s, from the load staircases at "
                                                              "N = 1, 16: `wal` meets Kafka at N* 1")
    only = {g.question: g for g in ledger.findings([steady_record()])}  # no staircase: the measurement alone
    assert only["And for a slow steady stream (200 msg/s)?"].sentence.endswith("(each run's steady part).")


def test_chord_check_says_where_the_model_and_the_measurement_disagree() -> None:
    ends = [{"max_n": 16, "min_n": 1}]
    crossed = {"common": (4, 16), "per_sitting": ends}
    chord = {"ns": [1, 16]}
    assert ledger.chord_check(crossed, chord | {"vals": [11.0, 15.3]}).endswith("they agree")
    assert "below the measured bracket: they disagree" in ledger.chord_check(crossed, chord | {"vals": [2.0, 3.0]})
    assert "above the measured bracket: they disagree" in ledger.chord_check(crossed, chord | {"vals": [17.0, 20.0]})
    assert ledger.chord_check(crossed, chord | {"vals": [3.0, 6.0]}).endswith("they agree only in part")
    assert ledger.chord_check(crossed, chord | {"vals": []}).endswith("they disagree")
    beyond = {"common": "beyond", "per_sitting": ends}
    assert ledger.chord_check(beyond, chord | {"vals": []}).endswith("they agree")
    assert ledger.chord_check(beyond, chord | {"vals": [20.0]}).endswith("they agree")
    assert ledger.chord_check(beyond, chord | {"vals": [12.0]}).endswith("they disagree")
    below = {"common": "below", "per_sitting": ends}
    assert ledger.chord_check(below, chord | {"vals": [0.5]}).endswith("they agree")
    assert ledger.chord_check(below, chord | {"vals": [3.0]}).endswith("they disagree")


def test_results_list_each_sitting_at_the_rate_and_the_closed_loop_pages_do_not_change() -> None:
    closed = [staircase_record()]
    both = [*closed, steady_record()]
    md = published.results_markdown(both)
    assert "## N\\* at a steady 200 msg/s, measured" in md
    assert "+0.40, +0.40" in md and "between 4 and 16 (≈ 9.0)" in md
    assert "the load staircases' chord (modelled)" in md
    assert "steady 200 msg/s, measured" not in published.results_markdown(closed)
    assert published.results_markdown([*closed, old(steady_record())]) == published.results_markdown(closed)
    block = published.readme_block(both)
    assert "measured: `wal` meets Kafka between N = 4 and 16" in block
    assert "from 1 committed sitting" in block  # the replication counts the closed-loop sittings


def test_answer_at_the_rate_reads_the_measured_cells() -> None:
    recs = [staircase_record(), steady_record()]
    at = ledger.answer(recs, 4, M, RATE).set_index("pipeline")
    assert at.loc["wal", "ms_per_msg"] == pytest.approx((0.95 + 0.96) / 2)  # the steady parts' median
    assert at.loc["wal", "rate"] == "measured" and at.loc["wal", "sittings"] == 1
    assert at.loc["wal", "where"] == "inside what was measured"
    between = ledger.answer(recs, 8, M, RATE).set_index("pipeline")
    assert between.loc["kafka", "n"] == "inside" and between.loc["kafka", "rate"] == "measured"
    modelled = ledger.answer([staircase_record()], 4, M, RATE).set_index("pipeline")
    assert modelled.loc["wal", "rate"] == "inside"  # the staircases' floors where nothing was measured at the rate
    assert "rate: measured" in answer.text(recs, 4, M, RATE)
    assert "rate: measured" not in answer.text(recs, 4, M)


def test_machines_that_disagree_at_the_rate_are_each_given_with_their_own_chord() -> None:
    """One machine crosses between 4 and 16, another (its steady kafka dearer by 1 ms/msg) never:
    neither result is the finding's; each comes with its own machine's staircases."""
    intel = {"id": "m1", "cpu_model": "Intel(R) Xeon(R) Processor"}
    dear = steady_runs()
    dear.loc[dear["pipeline"] == "kafka", "steady_ms_per_msg"] += 1.0
    other = sitting.build(dear, sitting_id="st-intel", profile="steady", series_id="steady", machine=intel, n_boot=20)
    stairs_other = {**staircase_record(), "id": "q-intel", "machine": intel}
    found = {f.question: f for f in ledger.findings([staircase_record(), stairs_other, steady_record(), other])}
    f = found["And for a slow steady stream (200 msg/s)?"]
    assert f.sentence.startswith("At a steady 200 msg/s the machines disagree, each measured. ")
    assert f.held == "1 of 2 sittings"
    mine, theirs = f.sentence.split(" On ")[1:]
    assert "`wal` meets Kafka between N = 4 and 16 (≈ 9.0)" in mine and mine.endswith("they agree.")
    assert theirs.startswith("m1 Intel(R) Xeon(R) Processor: Kafka costs more than `wal` at every N up to 16")
    assert theirs.endswith("inside the measured N where the runs found none: they disagree.")


def test_a_tie_between_brackets_goes_to_the_one_most_results_overlap_and_is_said() -> None:
    # 4-16 (a sitting without N = 8) overlaps 4-8, not 1-4: 4-8 leads, and the tie is reported
    assert ledger.common_bracket([(4, 8), (1, 4), (4, 8), (4, 16), (1, 4)]) == ((4, 8), True)
    assert ledger.common_bracket([(4, 8), (4, 8), (1, 4)]) == ((4, 8), False)
    assert ledger.common_bracket(["beyond", (4, 16)]) == ((4, 16), True)  # then the fewest readers
    assert ledger.common_bracket(["beyond", "beyond", "below"]) == ("beyond", False)
    per = [{"between": [4, 16], "at": 7.57, "below": False, "beyond": False, "min_n": 1, "max_n": 16,
            "machine": "m AMD EPYC", "day": "2026-12-07"},
           {"between": None, "at": None, "below": False, "beyond": True, "min_n": 1, "max_n": 16,
            "machine": "m Intel", "day": "2026-12-07"}]
    assert ledger.outcome_words(per[0]) == "between N = 4 and 16 (≈ 7.6)"
    assert ledger.outcome_words(per[1]) == "no crossing up to N = 16"
    assert ledger.split_words({"split": False, "per_sitting": per}) == ""
    assert ledger.split_words({"split": True, "per_sitting": per}) == (
        " No bracket was found more often than another: between N = 4 and 16 (≈ 7.6) on m AMD EPYC (12-07); "
        "no crossing up to N = 16 on m Intel (12-07).")
