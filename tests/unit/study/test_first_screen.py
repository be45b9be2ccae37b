"""The first screen: the findings beside one figure (lab.study.first_screen), on hand-made runs and findings."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd
import pytest
from matplotlib.collections import PathCollection

from lab.study import first_screen, plots
from tests.unit.study.test_legibility import _answer_runs


@dataclass(frozen=True)
class Finding:  # the shape of lab.study.ledger.Finding
    question: str
    sentence: str
    kind: str
    held: str


FINDINGS = [
    Finding("Which option costs least at N = 4?", "`wal`: 0.96 ms CPU per message (0.93–1.01 over 3 sittings).",
            "measured", "3 of 3 sittings"),
    Finding("From which N does Kafka pay off?", "Beyond N = 16 at 5,000 messages per start; N* 9–13 at 100,000 <all>.",
            "modelled", ""),
]


def test_the_volume_is_the_series_own_not_its_volume_arm() -> None:
    runs = _answer_runs()
    assert first_screen.measured_volume(runs) == 5000  # 32 runs at 5,000, 2 at 20,000
    # a reference sitting: its 100,000-message cells, though its 5,000-message arm has more runs
    reference = pd.DataFrame({"messages": [100_000] * 2 + [5000] * 3, "arm": [False] * 2 + [True] * 3})
    assert first_screen.measured_volume(reference) == 100_000


def test_the_figure_draws_the_reference_four_and_the_cheapest_other_option() -> None:
    runs = _answer_runs()
    assert first_screen.main_pipelines(runs, 5000) == ["wal", "wal-sharded", "kafka", "rabbitmq"]
    relay = runs[runs["pipeline"] == "wal"].assign(pipeline="wal-relay", ms=lambda d: d["ms"] - 0.3)
    poll = runs[runs["pipeline"] == "wal"].assign(pipeline="poll", ms=lambda d: d["ms"] + 0.5)
    more = pd.concat([runs, relay, poll])
    assert first_screen.main_pipelines(more, 5000) == ["wal", "wal-sharded", "wal-relay", "kafka", "rabbitmq"]
    only_new = pd.concat([relay, poll])
    assert first_screen.main_pipelines(only_new, 5000) == ["poll", "wal-relay"]  # registry order
    assert first_screen.pair(["wal-sharded", "rabbitmq", "wal", "kafka"]) == ("wal", "kafka")
    assert first_screen.pair(["wal", "wal-sharded"]) is None


@pytest.mark.parametrize(("crossing", "title"), [
    ({"between": (8, 16), "at": 11.6, "beyond": False},
     "wal costs less than kafka up to N = 8, kafka less from N = 16 (the lines meet at N ≈ 12)"),
    ({"between": (4, 8), "at": None, "beyond": False}, "wal costs less than kafka up to N = 4, kafka less from N = 8"),
    ({"between": None, "at": None, "beyond": True},
     "wal costs less than kafka at every N measured, 1 to 16: no crossing up to N = 16"),
    ({"between": None, "at": None, "beyond": False}, "kafka costs less than wal at every N measured, 1 to 16"),
    (None, "wal and kafka: no paired runs to compare at N = 1–16"),
    ({"between": (1, 4), "at": None, "beyond": False, "diffs": {"1": [-0.2, -0.1], "4": [0.1]}},  # read from JSON
     "kafka costs less than wal up to N = 1, wal less from N = 4"),
])
def test_the_crossing_in_words(crossing: dict | None, title: str) -> None:
    assert first_screen.crossing_title("wal", "kafka", crossing, [1, 4, 8, 16]) == title


def test_the_figure_shows_every_run_as_a_point_and_marks_the_crossing() -> None:
    runs = _answer_runs()
    fig = first_screen.answer_figure(runs, messages=5000, pipelines=["wal", "kafka"],
                               crossing={"between": (8, 16), "at": 12.4, "beyond": False},
                               conditions=first_screen.conditions(5000, runs, band=True))
    ax = fig.axes[0]
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert [len(c.get_offsets()) for c in points] == [8, 8]  # 4 N x 2 runs each; the 20,000-message runs left out
    assert list(map(float, ax.get_lines()[0].get_ydata())) == pytest.approx([0.75, 0.93, 1.17, 1.65])
    assert any(p.get_x() == 8 and p.get_width() == 8 for p in ax.patches)  # the band between N = 8 and 16
    assert [t.get_text() for t in ax.texts] == ["wal = kafka\nat N ≈ 12", "wal 1.65", "kafka 1.40"]
    assert ax.get_ylabel().startswith("ms CPU per message") and ax.get_xlabel() == "consumers N"
    caption = " ".join(fig.get_supxlabel().split())  # wrapped to the figure's width
    assert caption.startswith("5,000 messages per start, closed loop; points: runs (2 per pipeline")
    assert "shaded: the two measured N the crossing lies between" in caption
    assert "shaded" not in first_screen.conditions(5000, runs)


def test_end_labels_are_spread_apart_in_order() -> None:
    assert plots.spread([1.0, 1.01, 3.0], 0.1) == pytest.approx([0.955, 1.055, 3.0])
    assert plots.spread([2.0, 1.0], 0.5) == [2.0, 1.0]  # far enough apart: untouched
    ys = plots.spread([1.0, 1.0, 1.0], 0.2)
    assert sorted(ys) == pytest.approx([0.8, 1.0, 1.2]) and len(set(ys)) == 3


def test_the_answer_block_marks_measured_and_modelled_and_escapes() -> None:
    html = first_screen.answer_html(FINDINGS, '<img src="x.png" alt="a figure">')
    assert html.count('class="lab-finding"') == 2 and 'id="answer"' in html
    assert ('<span class="lab-kind measured">measured</span><span class="lab-held">held in 3 of 3 sittings</span>'
            in html)
    assert '<span class="lab-kind modelled">modelled</span></p>' in html  # one sitting: no "held in"
    assert "&lt;all&gt;" in html and "<all>" not in html
    assert '<p class="lab-sentence"><code>wal</code>: 0.96 ms CPU per message' in html  # a code span, as Markdown
    assert re.search(r'<figure><img src="x.png" alt="a figure"></figure></section>$', html)
    assert html.index("Which option costs least") < html.index("<figure>")  # the sentences first, the figure beside
    empty = first_screen.answer_html([], "", empty="No sitting is recorded yet.")
    assert "No sitting is recorded yet." in empty and "<figure>" not in empty


def test_a_page_of_every_sitting_speaks_of_the_newest_study_not_a_smoke_test() -> None:
    quick, smoke, decision = {"id": "q", "profile": "quick"}, {"id": "s", "profile": "smoke"}, {"id": "d",
                                                                                             "profile": "decision"}
    assert first_screen.headline_sitting([quick, decision, smoke]) is decision
    assert first_screen.headline_sitting([smoke]) is smoke
    assert first_screen.headline_sitting([]) is None
    assert first_screen.sitting_of([quick, smoke], "s") is smoke and first_screen.sitting_of([quick], "s") is None
