"""The ledger across sittings: findings with how many sittings they held in, a team's point answered
inside or beyond what was measured, the two-level bootstrap, and the generated pages."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lab.study import answer, intervals, ledger, published
from tests.unit.study.test_sitting import M, conditions_record, record


def two() -> list[dict[str, object]]:
    a = record()
    b = {**record(shift=0.02), "id": "s2", "day": "2026-12-07", "started_at": "2026-12-07T01:00:00"}
    return [a, b]


def test_findings_say_measured_and_how_many_sittings_held() -> None:
    found = {f.question: f for f in ledger.findings(two())}
    kafka = found["From which N does Kafka pay off at 100,000 messages per start?"]
    assert kafka.kind == "measured" and kafka.held == "2 of 2 sittings"
    assert "between N = 4 and 8" in kafka.sentence and "paired" in kafka.sentence
    cheapest = found["Which option costs least at N = 4, 100,000 messages per start?"]
    assert "`wal` costs least" in cheapest.sentence and cheapest.held == "2 of 2 sittings"
    steady = found["And for a Debezium that is never restarted?"]
    assert steady.kind == "modelled"
    one = {f.question: f for f in ledger.findings(two()[:1])}
    assert one["From which N does Kafka pay off at 100,000 messages per start?"].held == ""


def test_one_machine_id_on_two_cpu_models_counts_as_two_machines() -> None:
    a, b = two()
    b = {**b, "day": a["day"]}
    assert published.replication([a, b])["machines"] == 1
    a["machine"] = {"id": "0035969ec53f", "cpu_model": "AMD EPYC"}
    b["machine"] = {"id": "0035969ec53f", "cpu_model": "Intel(R) Xeon(R) Processor"}
    rep = published.replication([a, b])
    assert rep["machines"] == 2 and rep["enough"] is False  # two machines, no quick sitting yet
    assert ledger.label(b).endswith("on 003596 Intel(R) Xeon(R) Processor")
    assert set(ledger.cells([a, b])["machine"]) == {"0035969ec53f AMD EPYC",
                                                     "0035969ec53f Intel(R) Xeon(R) Processor"}


def test_smoke_and_ha_sittings_are_not_read() -> None:
    smoke = {**record(), "id": "x", "profile": "smoke"}
    ha = {**record(), "id": "y", "conditions": {"topology": "ha", "volumes": [M]}}
    assert ledger.comparable([smoke, ha]) == []


def test_answer_is_exact_at_a_measured_cell_and_says_beyond() -> None:
    recs = two()
    at = ledger.answer(recs, 4, M).set_index("pipeline")
    assert at.loc["wal", "ms_per_msg"] == pytest.approx(0.8 + 0.15 + 0.005 + 0.01, abs=0.011)
    assert at.loc["wal", "where"] == "inside what was measured" and at.loc["wal", "sittings"] == 2
    far = ledger.answer(recs, 4, 1_000_000).set_index("pipeline")
    assert far.loc["kafka", "where"] == "beyond what was measured (volume)"
    # F + c·M through 5,000 and 100,000 at N = 4: kafka's F = 2 CPU-s is spread over 10 × more
    assert far.loc["kafka", "ms_per_msg"] == pytest.approx(0.95 + 0.002 + 0.01, abs=0.02)
    between = ledger.answer(recs, 6, M).set_index("pipeline")
    assert between.loc["wal", "n"] == "inside" and between.loc["wal", "ms_per_msg"] == pytest.approx(1.06, abs=0.02)
    assert ledger.answer(recs, 32, M).set_index("pipeline").loc["wal", "where"].endswith("(n)")
    text = answer.text(recs, 16, 5_000)
    assert "cheapest:" in text and "wal" in text


def test_volume_curve_is_the_line_through_two_volumes() -> None:
    f, c = 2.0, 0.5  # ms·msg: y = c + f/M
    pts = {5_000: c + 1000 * f / 5_000, 100_000: c + 1000 * f / 100_000}
    v, how = ledger._volume_curve(pts, 20_000)
    assert how == "inside" and v == pytest.approx(c + 1000 * f / 20_000)
    assert ledger._volume_curve(pts, float("inf")) == (pytest.approx(c), "beyond")


def test_hierarchical_interval_widens_with_the_spread_between_sittings() -> None:
    rng = np.random.default_rng(1)
    same = [list(1.0 + 0.01 * rng.standard_normal(3)) for _ in range(4)]
    apart = [[v + 0.3 * k for v in x] for k, x in enumerate(same)]
    p1, lo1, hi1 = intervals.hierarchical_interval(same, n_boot=500)
    _, lo2, hi2 = intervals.hierarchical_interval(apart, n_boot=500)
    assert lo1 <= p1 <= hi1 and hi1 - lo1 < 0.05
    assert hi2 - lo2 > 10 * (hi1 - lo1)
    assert np.isnan(intervals.hierarchical_interval([])[0])


def test_the_pages_carry_the_findings_and_the_readme_block_is_replaced() -> None:
    recs = two()
    md = published.results_markdown(recs)
    for f in ledger.findings(recs):
        assert f.sentence in md
    assert "The quick model against the measurement" in md and "| `wal` N = 1 |" in md
    block = published.readme_block(recs)
    assert "Provisional" in block and "3 more quick sittings" in block  # no quick sitting yet
    readme = f"# x\n\n{published.README_BEGIN}\nold\n{published.README_END}\n\nrest\n"
    out = published.with_readme_block(readme, block)
    assert "old" not in out and out.endswith("\n\nrest\n") and block in out
    with pytest.raises(ValueError, match="no results markers"):
        published.with_readme_block("# no markers\n", block)


def _section(md: str) -> str:
    start = md.index(published.SECOND_TITLE)
    end = md.find("\n## ", start + 1)
    return md[start:end if end > 0 else None]


def test_the_second_condition_section_says_in_one_line_that_no_sitting_measured_it() -> None:
    section = _section(published.results_markdown(two()))
    lines = [x for x in section.splitlines()[1:] if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("No committed sitting has measured it yet")
    assert not any("pruned" in f.question for f in ledger.findings(two()))  # and no finding for it


def test_the_second_condition_section_sets_the_pruned_crossing_beside_the_never_pruned_one() -> None:
    rec = {**conditions_record(), "day": "2026-12-08"}
    md = published.results_markdown([*two(), rec])
    section = _section(md)
    never = next(x for x in section.splitlines() if "| never pruned |" in x)
    pruned = next(x for x in section.splitlines() if "| pruned behind every slot |" in x)
    assert "between 4 and 16 (≈ 4.4)" in never and "no crossing up to N = 16" in pruned
    assert "+0.22, +0.22" in pruned  # kafka − pruned wal at N = 1 in both blocks
    # the claims' cost per condition and N: claims + prune (0.05 + 0.01) and the rows left
    claims = [x for x in section.splitlines() if x.count("|") > 5 and "| 4 |" in x]
    assert any("| never pruned | 4 | 0.050 [0.050, 0.050] | 0.000 [0.000, 0.000] | 100,000 |" in x for x in claims)
    assert any("| pruned behind every slot | 4 | 0.060 [0.060, 0.060] | 0.010 [0.010, 0.010] | 1,200 |" in x
               for x in claims)
    poll = [x for x in section.splitlines() if "| 2026-12-08 conditions" in x and "| ≥ 0.40 |" in x]
    # autovacuum twice inside each poll run; its CPU as the polls saw it, a lower bound
    assert len(poll) == 2 and all("| 2 |" in x for x in poll)
    assert any("| +0.250 |" in x for x in poll)  # poll 1.2 against wal 0.95 in the first block
    # the plain cells count in the 100,000-message figures as a reference sitting's do
    assert "| `poll` |" in md.split("**100,000 messages per start**")[1].split("\n## ")[0]
    found = {f.question: f for f in ledger.findings([*two(), rec])}
    kafka = found["From which N does Kafka pay off at 100,000 messages per start?"]
    assert kafka.held == "2 of 3 sittings"  # [4, 8] twice, [4, 16] in the conditions sitting
    pruned_finding = next(f for f in found.values() if "claim table pruned" in f.question)
    assert pruned_finding.held == "1 of 1 sitting" and pruned_finding.kind == "measured"
    assert "`wal` (claims pruned)" in pruned_finding.sentence and "no crossing up to N = 16" in pruned_finding.sentence
    assert "never pruned, in the same sitting: between N = 4 and 16, N* ≈ 4.4" in pruned_finding.sentence
    assert pruned_finding.sentence in published.readme_block([*two(), rec])


def test_the_parts_reading_names_each_servers_and_the_clients_ratio_and_the_claims_growth() -> None:
    from lab.study.published import parts_reading

    ours = {("wal", 1): {"PostgreSQL": 0.5, "web service": 0.6, "senders + consumers": 0.3,
                         "PostgreSQL: the claims": 0.05},
            ("wal", 8): {"PostgreSQL": 1.2, "web service": 0.6, "senders + consumers": 0.6,
                         "PostgreSQL: the claims": 0.3},
            ("kafka", 1): {"PostgreSQL": 0.4, "Debezium": 0.3, "Kafka": 0.1, "RabbitMQ": 0.02,
                           "web service": 0.5, "senders + consumers": 0.4}}
    theirs = {("wal", 1): {"postgres": 1.0, "web": 0.4, "test": 0.15},
              ("wal", 8): {"postgres": 1.6, "web": 0.4, "test": 0.2},
              ("kafka", 1): {"postgres": 0.8, "debezium": 0.6, "kafka": 0.2, "rabbitmq": 0.01, "web": 0.5,
                             "test": 0.2}}
    text = "".join(parts_reading(ours, theirs))
    assert "PostgreSQL 0.50–0.75×" in text and "Debezium 0.50×" in text and "Kafka 0.50×" in text
    assert "RabbitMQ" not in text  # an idle broker beside another option is not its cost
    assert "web service 1.00–1.50×" in text and "senders + consumers 2.00–3.00×" in text
    assert "0.050 ms/msg at N = 1 and 0.300 at N = 8" in text
    assert "grows 0.100 ms/msg per extra `wal` reader" in text
    assert parts_reading({}, theirs) == [] and parts_reading(ours, {}) == []


def test_same_sitting_ratios_survive_a_machine_three_times_faster() -> None:
    slow = {"wal": 1.5, "kafka": 1.2, "rabbitmq": 2.4}
    fast = {p: v / 3 for p, v in slow.items()}
    ratios = ledger.same_sitting_ratios([slow, fast, {"wal": 1.0}], "kafka")
    assert ratios["wal"] == pytest.approx([1.25, 1.25]) and ratios["rabbitmq"] == pytest.approx([2.0, 2.0])
    assert "kafka" not in ratios


def _cells_record(i: int, wal: float, kafka: float) -> dict[str, object]:
    cells = [{"pipeline": p, "consumers": 4, "messages": M, "arm": False, "runs": 2, "median": v, "lo": v, "hi": v}
             for p, v in (("wal", wal), ("kafka", kafka))]
    return {"id": f"s{i}", "day": "2026-12-07", "profile": "reference", "cells": cells,
            "conditions": {"volumes": [M]}}


def test_the_option_cheapest_in_most_sittings_leads_though_pooled_medians_favour_another() -> None:
    rec = _cells_record
    # two fast sittings where wal wins narrowly, one slow one where kafka wins: kafka's pooled median is lower
    recs = [rec(0, 0.55, 0.57), rec(1, 2.05, 2.13), rec(2, 1.98, 1.95)]
    sentence, kind, held = ledger._cheapest(recs, 4, M) or ("", "", "")
    assert kind == "measured"
    assert "`wal` costs least in 2 of 3 sittings" in sentence and held == "2 of 3 sittings"
    assert "`kafka` ×1.04" in sentence
    # an option measured in some sittings only, cheapest in each of them: its wins and range are of those
    with_poll = [*recs[:2], {**recs[2], "cells": [*recs[2]["cells"], {**recs[2]["cells"][0], "pipeline": "poll",
                                                                      "median": 1.5, "lo": 1.5, "hi": 1.5}]},
                 {**rec(3, 1.0, 1.1), "cells": [*rec(3, 1.0, 1.1)["cells"], {**rec(3, 1.0, 1.1)["cells"][0],
                                                "pipeline": "poll", "median": 0.9, "lo": 0.9, "hi": 0.9}]}]
    sentence, _, held = ledger._cheapest(with_poll, 4, M) or ("", "", "")
    assert "`poll` costs least in 2 of the 2 sittings that measured it (of 4): 1.20 ms CPU per message " \
           "(range 0.90–1.50 over 2 sittings)" in sentence and held == "2 of 2 sittings"
    # one more sitting without poll, which wal wins: wal is now cheapest in 3 sittings, poll in 2, yet
    # poll cost less than wal in both sittings that ran the two: poll still leads
    sentence, _, held = ledger._cheapest([*with_poll, rec(4, 0.6, 0.7)], 4, M) or ("", "", "")
    assert "`poll` costs least in 2 of the 2 sittings that measured it (of 5)" in sentence and held == "2 of 2 sittings"
    assert ledger.answer([*with_poll, rec(4, 0.6, 0.7)], 4, M)["pipeline"].iloc[0] == "poll"


def test_the_leader_is_the_option_no_other_beats_head_to_head() -> None:
    many = [{"wal": 1.0, "kafka": 1.1}, {"wal": 1.0, "kafka": 1.2}, {"wal": 1.0, "kafka": 1.3}]
    both = [{"wal": 1.0, "kafka": 1.1, "poll": 0.8}, {"wal": 2.0, "kafka": 2.1, "poll": 1.6}]
    assert ledger.leader(many + both, ["wal", "kafka", "poll"]) == "poll"  # wal won 3, poll 2: poll beat wal 2 of 2
    assert ledger.leader(many, ["kafka", "wal"]) == "wal"
    # an even split beats no one: both unbeaten, the most sittings won leads, then the order given
    even = [{"wal": 1.0, "kafka": 1.1}, {"wal": 1.2, "kafka": 1.1}]
    assert ledger.leader(even, ["kafka", "wal"]) == "kafka" and ledger.leader(even, ["wal", "kafka"]) == "wal"
    assert ledger.leader([*even, {"wal": 0.9}], ["kafka", "wal"]) == "wal"  # won one more sitting alone
    # a cycle (a beats b, b beats c, c beats a): no unbeaten option, the most sittings won leads
    cycle = [{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"b": 1, "c": 2}, {"b": 1, "c": 2}, {"c": 1, "a": 2},
             {"c": 1, "a": 2}, {"c": 1, "a": 2}]
    assert ledger.leader(cycle, ["a", "b", "c"]) == "c"


def test_lab_answer_leads_with_the_most_sittings_and_gives_same_sitting_ratios() -> None:
    recs = [_cells_record(0, 0.55, 0.57), _cells_record(1, 2.05, 2.13), _cells_record(2, 1.98, 1.95)]
    table = ledger.answer(recs, 4, M)
    assert list(table["pipeline"]) == ["wal", "kafka"] and list(table["wins"]) == [2, 1]
    kafka = table.set_index("pipeline").loc["kafka"]
    assert kafka["x"] == pytest.approx(0.57 / 0.55) and kafka["x_lo"] == pytest.approx(1.95 / 1.98)
    assert kafka["x_sittings"] == 3
    text = answer.text(recs, 4, M)
    assert "cheapest: wal (cheapest in 2 of 3 sittings; not a clear winner" in text and "kafka (×0.98)" in text
    clear = answer.text([_cells_record(0, 0.55, 0.57), _cells_record(1, 2.05, 2.13)], 4, M)
    assert "cheaper than every other in every sitting that measured both" in clear


def test_lab_answer_reads_a_pipeline_from_the_sittings_that_measured_the_point() -> None:
    quick = {**_cells_record(0, 1.5, 2.5), "conditions": {"volumes": [5_000]}}
    for c in quick["cells"]:
        c["messages"] = 5_000
    one_volume = _cells_record(1, 0.55, 0.57)  # 100,000 messages only, and poll at it
    one_volume["cells"] = [*one_volume["cells"], {**one_volume["cells"][0], "pipeline": "poll", "median": 0.45}]
    table = ledger.answer([quick, one_volume], 4, 5_000).set_index("pipeline")
    assert table.loc["wal", "where"] == "inside what was measured" and table.loc["wal", "sittings"] == 1
    assert table.loc["poll", "where"] == "beyond what was measured (volume)"  # shown, flagged
    assert math.isnan(table.loc["poll", "x"])  # and never set against a measured cost
    far = ledger.answer([quick, one_volume], 16, 1_000_000).set_index("pipeline")
    assert far.loc["poll", "n"] == "beyond" and far["x_sittings"].sum() == 0  # one N measured: no ratio at 16


def test_a_cost_carried_from_another_volume_is_not_set_against_one_measured_there() -> None:
    """A sitting that ran poll at 100,000 messages only and wal at 5,000 and 100,000: at 5,000 poll's
    figure is its 100,000-message one carried over, and no ratio to wal is read from it."""
    M5 = 5_000
    cells = [{"pipeline": p, "consumers": 4, "messages": m, "arm": m == M5, "runs": 2, "median": v, "lo": v, "hi": v}
             for p, m, v in (("wal", M5, 1.0), ("wal", M, 1.2), ("poll", M, 0.7))]
    rec = {"id": "c1", "day": "2026-12-07", "profile": "conditions", "cells": cells, "conditions": {"volumes": [M]}}
    at5k = ledger.answer([rec], 4, M5).set_index("pipeline")
    assert at5k.loc["poll", "volume"] == "beyond" and at5k.loc["wal", "volume"] == "measured"
    assert at5k.loc["wal", "wins"] == 0 and at5k.loc["poll", "x_sittings"] == 0  # nothing contested
    at100k = ledger.answer([rec], 4, M).set_index("pipeline")
    assert at100k.loc["poll", "wins"] == 1 and at100k.loc["wal", "x"] == pytest.approx(1.2 / 0.7)
