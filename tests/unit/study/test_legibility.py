"""Every figure a report or the site shows can be read at the size it is saved: no label over
another, none cut off, no legend over the data, a name on every axis that shows numbers, and a
title that says the finding. The checker itself is tested first: it must see each fault."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from lab.study import (
    broker_native,
    capacity,
    crossover,
    explore,
    fault_matrix,
    first_screen,
    legibility,
    plots,
    slow_work,
)
from lab.study import costmodel as cm
from lab.study import topology as topo
from tests.unit.study.test_capacity import RESULTS as STAIRCASES
from tests.unit.study.test_fault_matrix import _new_kafka_dead, _old_wal_dead, _rabbit_kill

PIPES = ("wal", "wal-sharded", "kafka", "rabbitmq")
NS = (1, 4, 8, 16)


# --- the checker ----------------------------------------------------------------------------------

def test_rotated_rectangles_overlap_only_where_they_touch() -> None:
    a = legibility.rectangle((0, 0), 40, 10, 60)
    assert legibility.overlap(a, legibility.rectangle((3, 0), 40, 10, 60))  # side by side, 3 px apart: over
    # the same two labels 14 px apart along x: their upright boxes overlap, the rotated ones do not
    far = legibility.rectangle((14, 0), 40, 10, 60)
    assert not legibility.overlap(a, far)
    xs = a[:, 0]
    assert xs.max() - xs.min() > 14  # (their axis-aligned boxes would have overlapped)
    assert not legibility.overlap(legibility.rectangle((0, 0), 10, 10, 0), legibility.rectangle((10.5, 0), 10, 10, 0))


def test_the_checker_sees_overlapping_ticks_a_legend_over_data_and_an_unnamed_axis() -> None:
    fig = Figure(figsize=(3, 2.5), layout="constrained")
    ax = fig.subplots()
    x = np.arange(8)
    ax.plot(x, x, "o-", label="a line through the middle")
    ax.set_xticks(x, [f"a long label {i}" for i in x])
    ax.legend(loc="center")
    ax.set_xlabel("a category")  # the y axis shows numbers and says nothing of them
    found = legibility.problems(fig)
    assert any(p.startswith("labels over each other: 'a long label") for p in found), found
    assert any(p.startswith("legend over the data") for p in found), found
    assert "no name on the axes: y axis" in found, found


def test_the_checker_sees_a_label_cut_off_and_passes_a_clean_figure() -> None:
    fig = Figure(figsize=(4, 3), layout="constrained")
    ax = fig.subplots()
    ax.plot([1, 2, 3], [1, 4, 9])
    ax.set_xlabel("consumers N")
    ax.set_ylabel("ms")
    assert legibility.problems(fig) == []
    fig.text(0.9, 0.5, "a note that runs off the edge")
    assert legibility.problems(fig) == ["label cut off at the figure's edge: 'a note that runs off the edge'"]


# --- the figures ------------------------------------------------------------------------------------

def legible(fig: Figure) -> Figure:
    assert isinstance(fig, Figure)
    assert legibility.problems(fig) == []
    assert fig.get_suptitle().strip(), "every figure's title says its finding"
    return fig


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    """A quick-like series: the article's four at N = 1, 4, 8, 16, two runs each, with participants,
    claims, memory, slots and an idle baseline, and a drift probe at the end."""
    rng, rows = np.random.default_rng(1), []
    cost = {"wal": (0.8, 0.03), "wal-sharded": (0.75, 0.02), "kafka": (1.4, 0.0), "rabbitmq": (1.6, 0.005)}
    for block in range(2):
        for p in PIPES:
            for n in NS:
                a, b = cost[p]
                y = a + b * (n - 1) + rng.normal(0, 0.02)
                broker = p in ("kafka", "rabbitmq")
                rows.append({
                    "run_id": f"{p}-{n}-{block}", "pipeline": p, "consumers": n, "messages": 5000,
                    "cpu_ms_per_msg": y, "window_s": 6.0, "success": True, "warmup": False, "label": "",
                    "cpu_s.postgres": y * 2.5, "cpu_s.web": y * 1.0, "cpu_s.senders": y * 0.8,
                    "cpu_s.consumers": y * 0.5, "cpu_s.debezium": y * 0.8 if broker else 0.0,
                    "cpu_s.kafka": y * 0.4 if p == "kafka" else 0.0,
                    "cpu_s.rabbitmq": y * 0.5 if p == "rabbitmq" else 0.0,
                    "cpu_s.unattributed": 0.3, "skipped": (n - 1) * 5000 if p == "wal" else 0,
                    "claims_min": 5000 // n - 20, "claims_max": 5000 // n + 20,
                    "mem_mb_max.postgres": 300.0, "mem_mb_max.web": 60.0, "mem_mb_max.consumers": 40.0 * n,
                    "mem_mb_max.debezium": 400.0 if broker else np.nan, "decoded_mb": (n if not broker else 1) * 2.1,
                    "slots": n if not broker else 1, "cpu_ms_per_msg_net": y * 0.85,
                    "idle_cpu_s.postgres": 0.2, "idle_cpu_s.kafka": 0.4,
                })
    rows.append({**rows[0], "run_id": "drift", "label": "drift", "warmup": True, "cpu_ms_per_msg": 0.83})
    return pd.DataFrame(rows)


def test_the_analysis_figures_are_legible(runs: pd.DataFrame) -> None:
    from lab.results import load_reference
    from lab.study import compare

    measured = cm.measured(runs)
    legible(plots.headline_figure(cm.headline(measured, n_boot=50), load_reference("headline")))
    legible(plots.breakdown_figure(measured))
    fits = {p: cm.fit_fanout(measured, p, n_boot=50) for p in ("wal", "wal-sharded")}
    levels = {p: cm.broker_level(measured, p, n_boot=50) for p in ("kafka", "rabbitmq")}
    legible(plots.fanout_figure(fits, levels, {(d, b): cm.crossover(fits[d], levels[b], n_boot=50)
                                               for d in fits for b in levels}))
    legible(plots.claims_figure(measured))
    legible(plots.drift_figure(runs))
    legible(plots.residual_figure(compare.idle_table(runs)))
    legible(plots.memory_figure(compare.memory_table(runs)))
    legible(plots.decode_figure(compare.decode_table(runs)))


def _answers(conditions: list[str]) -> list[crossover.Answer]:
    """Two brokers under each condition, three models each, one of them never crossing."""
    out = []
    for i, cond in enumerate(conditions):
        for broker, shift in (("kafka", 0.0), ("rabbitmq", 4.0)):
            models = (crossover.ModelCrossing(crossover.MODELS[0], 8.0 + i + shift, (6.0 + i, 11.0 + i + shift), True),
                      crossover.ModelCrossing(crossover.MODELS[1], 12.0 + i + shift, (9.0, 18.0 + shift), False),
                      crossover.ModelCrossing(crossover.MODELS[2], None if i == 0 else 10.0 + shift,
                                              (8.0, math.inf), False))
            out.append(crossover.Answer(cond, "wal", broker, models, (1, 16)))
    return out


def test_n_star_against_volume_has_its_four_conditions_apart_and_no_legend_over_the_points() -> None:
    """The figure whose four x labels were printed over each other, under a legend of twelve entries."""
    conds = [f"M = {m}, F fitted across volumes at N = 1, 16" for m in ("5,000", "100,000", "1,000,000")]
    fig = legible(plots.n_star_figure(_answers([*conds, "M = ∞ (steady), F fitted across volumes at N = 1, 16"])))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["M = 5,000: wal vs kafka", "M = 5,000: wal vs rabbitmq"]
    assert len(ax.get_legend().get_texts()) == 4  # three models and the range, not one entry per line
    assert "F fitted across volumes at N = 1, 16" in fig.get_supxlabel()
    assert fig.get_suptitle().startswith("N* of wal against kafka: 8–never at M = 5,000; 9–13 at M = 100,000")
    legible(plots.n_star_figure(_answers(["200 msg/s", "1,000 msg/s"]), about="N* at a fixed rate"))
    assert not legibility.problems(plots.n_star_figure([]))


def test_the_latency_and_capacity_figures_are_legible() -> None:
    from tests.unit.measure.test_latency import _runs as latency_runs

    legible(plots.latency_figure(latency_runs()))
    fig = legible(capacity.capacity_figure(STAIRCASES))
    assert "sustains the highest rate: 500 msg/s at N = 1" in fig.get_suptitle()


def test_the_other_parts_figures_are_legible(runs: pd.DataFrame) -> None:
    native = runs[runs["consumers"] == 8].assign(producer="direct")
    published = pd.DataFrame({"pipeline": ["kafka", "rabbitmq", "wal"], "ms_per_msg": [0.45, 0.58, 2.22]})
    legible(broker_native.figure(native[native["pipeline"].isin(["kafka", "rabbitmq", "wal"])], published))
    control = slow_work.throughput(pd.DataFrame(
        [{"pipeline": p, "consumers": n, "messages": 3000, "window_s": 3000 / (n * 60.0 * f), "success": True,
          "work_delay_ms": 15.0} for p, f in (("kafka", 1.0), ("rabbitmq", 0.97), ("wal", 1.02)) for n in (2, 4, 8)]))
    legible(slow_work.figure(control, None, work_delay_ms=15.0))
    results = [_old_wal_dead(), _new_kafka_dead(), _rabbit_kill()]
    legible(fault_matrix.wal_figure(results))
    legible(fault_matrix.lag_figure(results))
    cells = pd.DataFrame([{"pipeline": p, "consumers": n, "single": 1.0 + n / 20, "single_lo": 0.95, "single_hi": 1.1,
                           "ha": 1.6 + n / 20, "ha_lo": 1.5, "ha_hi": 1.7}
                          for p in ("wal", "kafka") for n in (1, 2, 4)])
    fig = legible(topo.figure(cells))
    assert fig.get_suptitle().startswith("ha costs 1.")


def _answer_runs() -> pd.DataFrame:
    rows = []
    for p, a, b in (("wal", 0.75, 0.06), ("wal-sharded", 0.7, 0.05), ("kafka", 1.4, 0.0), ("rabbitmq", 1.45, 0.01)):
        for n in NS:
            for block, jitter in enumerate((-0.02, 0.02)):
                rows.append({"pipeline": p, "consumers": n, "messages": 5000, "block": block,
                             "ms": a + b * (n - 1) + jitter})
    rows += [{"pipeline": "wal", "consumers": n, "messages": 20_000, "block": 0, "ms": 0.6} for n in (1, 16)]
    return pd.DataFrame(rows)


def test_the_answer_figure_is_legible_with_lines_ending_close_together() -> None:
    runs = _answer_runs()  # kafka and rabbitmq end 0.05 ms apart: their end labels must not collide
    crossing = {"between": (8, 16), "at": 12.4, "beyond": False, "diffs": {}}
    fig = legible(first_screen.answer_figure(runs, messages=5000, pipelines=list(PIPES), crossing=crossing,
                                       conditions=first_screen.conditions(5000, runs)))
    assert fig.get_suptitle().startswith("wal costs less than kafka up to N = 8, kafka less from N = 16")


def test_the_sittings_figures_are_legible() -> None:
    cells = pd.DataFrame([{"sitting": f"s{i}", "day": f"2026-12-0{i + 1}", "machine": "m", "profile": "quick",
                           "pipeline": p, "consumers": n, "messages": 5000, "condition": "closed loop",
                           "median_ms": base + slope * (n - 1) + 0.03 * i, "lo_ms": math.nan, "hi_ms": math.nan,
                           "runs": 2}
                          for i in range(3) for p, base, slope in (("wal", 0.8, 0.05), ("kafka", 1.4, 0.0))
                          for n in NS])
    over = explore.over_sittings(cells)
    legible(explore.cost_figure(over, messages=5000, condition="closed loop"))
    rows = explore.crossing_rows({"20261201T100000Z-quick-1a2b": {"between": (8, 16), "at": 12.0, "beyond": False},
                                  "20261202T100000Z-quick-3c4d": {"between": None, "at": None, "beyond": True},
                                  "20261203T100000Z-quick-5e6f": {"between": (8, 16), "at": 13.1, "beyond": False}},
                                 "wal", "kafka")
    legible(explore.crossing_figure(rows, 16))
