"""The report's first table on small synthetic frames with known answers: the rank order at a
point, the interval and its coverage, the not-measured rule, the floor at a fixed rate, the dead
consumer's summary, and the edges (a pipeline without runs, NaN)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lab.study import ranking
from lab.study.ranking import Point


def _runs(pipeline: str, fixed_s: float, steady: float, ns: tuple[int, ...] = (1, 2, 4), *, slope: float = 0.0,
          messages: int = 5000, jitter: tuple[float, ...] = (-0.1, 0.0, 0.1), rate: float = 1000.0,
          label: str = "") -> pd.DataFrame:
    """Runs whose CPU is exactly F + c(N)·M (c = steady + slope·(N − 1) + jitter), each with its own
    split, closed loop at ``rate`` msg/s (window = M / rate)."""
    rows = []
    for n in ns:
        for j in jitter:
            c = steady + slope * (n - 1) + j
            rows.append({"pipeline": pipeline, "consumers": n, "messages": messages, "success": True,
                         "warmup": bool(label), "label": label, "cpu_ms_per_msg": c + 1000 * fixed_s / messages,
                         "steady_ms_per_msg": c, "fixed_cpu_s": fixed_s, "window_s": messages / rate})
    return pd.DataFrame(rows)


def _study() -> pd.DataFrame:
    # wal: F 1 CPU-s, c 1.0 + 0.1 per extra reader; kafka: F 4.5 CPU-s, c 1.2 flat
    return pd.concat([_runs("wal", 1.0, 1.0, slope=0.1), _runs("kafka", 4.5, 1.2)], ignore_index=True)


def test_the_point_decides_the_order() -> None:
    short = ranking.cost_ranking(_study(), Point(4, 5000))  # the start weighs 0.9 ms on kafka
    assert list(short["pipeline"]) == ["wal", "kafka"] and list(short["rank"]) == [1, 2]
    assert short["ms_per_msg"].tolist() == pytest.approx([1.3 + 0.2, 1.2 + 0.9])
    assert short["x_cheapest"].tolist() == pytest.approx([1.0, 2.1 / 1.5])
    never = ranking.cost_ranking(_study(), Point(4, math.inf))  # steady costs alone
    assert list(never["pipeline"]) == ["kafka", "wal"]
    assert never["ms_per_msg"].tolist() == pytest.approx([1.2, 1.3])
    assert never["basis"].iloc[0] == "measured at N = 4; F from each run's own split"


def test_the_interval_is_the_medians_order_statistics_with_their_coverage() -> None:
    t = ranking.cost_ranking(_study(), Point(2, 100_000)).set_index("pipeline")
    assert (t.loc["wal", "lo"], t.loc["wal", "hi"]) == pytest.approx((1.0 + 0.01, 1.2 + 0.01))  # min, max
    assert t.loc["wal", "coverage"] == 0.75 and t.loc["wal", "runs"] == 3
    one = ranking.cost_ranking(_runs("wal", 1.0, 1.0, jitter=(0.0,)), Point(2)).iloc[0]
    assert one["coverage"] == 0.0 and math.isnan(one["lo"]) and one["ms_per_msg"] == pytest.approx(1.01)
    assert "no interval (1 run)" in ranking.shown(ranking.for_study(_runs("wal", 1.0, 1.0, jitter=(0.0,)),
                                                                    Point(2))).to_string()


def test_between_measured_n_interpolated_outside_not_measured() -> None:
    t = ranking.cost_ranking(_study(), Point(3, math.inf)).set_index("pipeline")
    assert t.loc["wal", "ms_per_msg"] == pytest.approx(1.2)  # halfway between N = 2 (1.1) and 4 (1.3)
    assert t.loc["wal", "coverage"] == pytest.approx(0.75 * 0.75)  # at least both ends' coverage
    assert (t.loc["wal", "lo"], t.loc["wal", "hi"]) == pytest.approx((1.1, 1.3))
    assert t.loc["wal", "basis"].startswith("interpolated between N = 2 and 4") and t.loc["wal", "runs"] == 6
    assert "[1.100, 1.300] (≥ 56.2 %)" in ranking.shown(ranking.for_study(_study(), Point(3, math.inf))).to_string()
    far = ranking.cost_ranking(_study(), Point(8, math.inf))
    assert far["rank"].isna().all() and far["ms_per_msg"].isna().all()
    assert far["note"].tolist() == ["not measured at N = 8 (measured at N = 1, 2, 4)"] * 2
    wide = ranking.cost_ranking(_runs("wal", 1.0, 1.0, ns=(1, 16)), Point(4))  # 16 times apart: no figure
    assert wide.loc[0, "note"] == "not measured at N = 4 (measured at N = 1, 16)"
    assert ranking.cost_ranking(_runs("wal", 1.0, 1.0, ns=(1, 4)), Point(2))["rank"].tolist() == [1]


def test_the_volume_arm_gives_f_across_volumes() -> None:
    # each run's own split says F = 0 (a warm-up charged to the messages); the arm at 20,000 shows F = 2
    main = _runs("kafka", 2.0, 1.0, ns=(1, 4), jitter=(0.0,))
    arm = _runs("kafka", 2.0, 1.0, ns=(1, 4), jitter=(0.0,), messages=20_000, label="volume")
    main = main.assign(steady_ms_per_msg=main["cpu_ms_per_msg"], fixed_cpu_s=0.0)
    own = ranking.cost_ranking(main, Point(2, 100_000)).iloc[0]
    assert own["ms_per_msg"] == pytest.approx(1.4)  # the 5,000-message figure, F not moved
    fitted = ranking.cost_ranking(main, Point(2, 100_000), arm=arm).iloc[0]
    assert fitted["ms_per_msg"] == pytest.approx(1.0 + 1000 * 2.0 / 100_000)
    assert fitted["basis"] == "interpolated between N = 1 and 4; F fitted across volumes at N = 1, 4"
    both = pd.concat([main, arm.assign(warmup=False)], ignore_index=True)  # every cell at two volumes
    assert ranking.cost_ranking(both, Point(4, 100_000)).iloc[0]["basis"] == (
        "measured at N = 4; F fitted across volumes at every N")


def test_at_a_fixed_rate_the_floor_is_spread_over_the_rate() -> None:
    runs = _runs("kafka", 4.5, 1.2, ns=(1, 4), jitter=(0.0,), rate=1000.0)  # windows of 5 s
    floors = pd.DataFrame({"pipeline": ["kafka", "kafka"], "consumers": [1, 4], "a_cpu_per_s": [0.3, 0.5],
                           "b_ms_per_msg": [0.9, 0.9], "steps": [4, 4], "rates": [[250, 500], [250, 500, 1000]]})
    at = ranking.cost_ranking(runs, Point(4, 100_000, rate=200.0), floors=floors).iloc[0]
    # the closed-loop window's floor (0.5 CPU-s/s x 5 s over 5,000 messages) out, 0.5/200 per message in
    assert at["ms_per_msg"] == pytest.approx(1.2 - 0.5 + 1000 * 4.5 / 100_000 + 2.5)
    assert at["basis"].endswith("floor from the staircases")
    mid = ranking.cost_ranking(runs, Point(2, math.inf, rate=200.0), floors=floors).iloc[0]
    # a third of the way from N = 1 (1.2 - 0.3 + 1.5) to N = 4 (1.2 - 0.5 + 2.5), each at its own floor
    assert mid["ms_per_msg"] == pytest.approx(2.4 + (3.2 - 2.4) / 3)
    fast = ranking.cost_ranking(runs, Point(1, rate=600.0), floors=floors).iloc[0]
    assert fast["note"] == "not measured at 600 msg/s: the fastest step sustained at N = 1 is 500 msg/s"
    held = floors.assign(rates=[[240, 480], [240, 480]])  # achieved rates: 480 held a 500 msg/s step
    assert ranking.cost_ranking(runs, Point(1, rate=500.0), floors=held)["rank"].tolist() == [1]
    none = ranking.cost_ranking(runs, Point(4, rate=200.0)).iloc[0]
    assert none["note"] == "not measured at N = 4 at 200 msg/s: no floor at N = 4 (no staircase)"
    only1 = ranking.cost_ranking(runs, Point(4, rate=200.0), floors=floors.iloc[:1]).iloc[0]
    assert only1["note"].endswith("no floor at N = 4 (staircases at N = 1)")


def test_edges_no_runs_nan_and_no_split() -> None:
    runs = _study()
    runs.loc[(runs["pipeline"] == "kafka") & (runs["consumers"] == 4), "cpu_ms_per_msg"] = np.nan
    runs.loc[(runs["pipeline"] == "kafka") & (runs["consumers"] == 4), "steady_ms_per_msg"] = np.nan
    runs.loc[runs.index[0], "cpu_ms_per_msg"] = np.nan  # one wal run at N = 1 lost its figure
    t = ranking.cost_ranking(runs, Point(4, 5000), pipelines=["poll"])
    assert list(t["pipeline"]) == ["wal", "kafka", "poll"] and t["rank"].tolist()[0] == 1
    assert t["rank"].isna().tolist() == [False, True, True]
    assert t.loc[1, "note"] == "not measured at N = 4 (measured at N = 1, 2)"  # its runs there have no figure
    assert t.loc[2, "note"] == "no measured runs"
    assert ranking.cost_ranking(runs, Point(1, 5000)).set_index("pipeline").loc["wal", "runs"] == 2
    no_split = runs.assign(steady_ms_per_msg=np.nan)  # a figure, but no split to move it to another M
    assert ranking.cost_ranking(no_split, Point(1, 100_000)).loc[0, "note"] == (
        "not measured at N = 1: no cost split to move its runs to this M")
    bare = runs.drop(columns=["steady_ms_per_msg", "fixed_cpu_s"])  # runs stored before the split
    at_own = ranking.cost_ranking(bare, Point(2, 5000)).set_index("pipeline")
    assert at_own.loc["wal", "ms_per_msg"] == pytest.approx(1.1 + 0.2)  # at their own M: as measured
    assert at_own.loc["wal", "basis"] == "measured at N = 2; as measured (no cost split)"
    moved = ranking.cost_ranking(bare, Point(2, 100_000))
    assert moved["note"].str.endswith("no cost split to move its runs to this M").all()
    unsplit = runs.copy()  # a run too short to split: NaN split, its figure stands at its own M
    unsplit.loc[unsplit["pipeline"] == "wal", ["steady_ms_per_msg", "fixed_cpu_s"]] = np.nan
    unsplit.loc[unsplit.index[1], ["steady_ms_per_msg", "fixed_cpu_s"]] = (1.0, 1.0)  # one of them could
    at_m = ranking.cost_ranking(unsplit, Point(2, 5000)).set_index("pipeline")
    assert at_m.loc["wal", "runs"] == 3 and at_m.loc["wal", "ms_per_msg"] == pytest.approx(1.3)
    assert ranking.cost_ranking(unsplit, Point(1, 100_000)).set_index("pipeline").loc["wal", "runs"] == 1
    empty = ranking.for_study(runs.iloc[0:0], Point(4), pipelines=["wal"])
    assert empty.loc[0, "note"] == "no measured runs" and math.isnan(empty.loc[0, "x_cheapest"])
    assert ranking.shown(empty).columns[0] == "pipeline"


def _matrix() -> pd.DataFrame:
    """The fault matrix's table (lab.study.fault_matrix.matrix_table), the columns the summary reads."""
    rows = [("wal", "consumer_stop", "one", "source", "its messages", 0, 0, 99.0),
            ("wal", "consumer_kill", "one", "source", "nobody", 0, 14, 100.0),
            ("kafka", "consumer_stop", "one", "broker", "its messages", 0, 0, 51.0),
            ("poll", "consumer_stop", "one", "none", "its messages", 0, 0, 97.0),
            ("wal-sharded", "consumer_stop", "one", "none", "its messages", 0, 0, 50.0),
            ("rabbitmq", "consumer_stop", "all", "broker", "every consumer", 0, 0, 0.0),
            ("rabbitmq", "consumer_kill", "one", "broker", "nobody", 24, 0, 100.0)]
    cols = ["pipeline", "family", "hit", "backlog_where", "waits", "lost", "duplicates", "delivered_during_pct"]
    return pd.DataFrame(rows, columns=cols).astype({"lost": "Int64", "duplicates": "Int64"})


def test_what_a_dead_consumer_costs_each_pipeline() -> None:
    dead = ranking.dead_consumer(_matrix()).set_index("pipeline")
    assert list(dead.index) == ["wal", "kafka", "poll", "wal-sharded"]  # a sink outage and a kill are not it
    assert dead.loc["wal", "dead_backlog"] == "slot" and dead.loc["kafka", "dead_backlog"] == "broker"
    assert dead.loc["poll", "dead_backlog"] == "table"  # its consumers read the outbox: the rows wait there
    assert dead.loc["wal-sharded", "dead_backlog"] == "none"  # slots of its own: nothing grew in them
    assert dead.loc["kafka", "dead_waits"] == "its messages" and dead.loc["kafka", "dead_delivered_pct"] == 51.0
    assert dead.loc["wal", "dead_lost"] == 0 and dead.loc["wal", "dead_duplicates"] == 0
    assert ranking.dead_consumer(pd.DataFrame()).empty
    older = _matrix().assign(backlog_where="none (broker not sampled)")
    older_kafka = ranking.dead_consumer(older).set_index("pipeline").loc["kafka"]
    assert older_kafka["dead_backlog"] == "none (broker not sampled)"
    assert ranking.reads_a_table("wal-relay") and ranking.reads_a_table("poll")
    assert not ranking.reads_a_table("wal") and not ranking.reads_a_table("kafka")


def test_for_study_puts_the_dead_consumer_beside_the_cost() -> None:
    t = ranking.for_study(_study(), Point(4, 5000), faults=_matrix())
    assert list(t.columns) == [*ranking.COLUMNS, *ranking.DEAD_COLUMNS]
    assert list(t["pipeline"]) == ["wal", "kafka", "wal-sharded", "poll"]  # no runs: unranked, in registry order
    row = t.set_index("pipeline")
    assert row.loc["kafka", "dead_backlog"] == "broker" and row.loc["poll", "note"] == "no measured runs"
    alone = ranking.for_study(_runs("rabbitmq", 4.0, 1.5), Point(4, 5000), faults=_matrix())
    assert alone.set_index("pipeline").loc["rabbitmq", "dead_backlog"] == "—"  # no dead-consumer cell of its own
    text = ranking.shown(t).to_string()
    assert "not measured" not in text and "no measured runs" in text and "(75 %)" in text
    assert ranking.shown(t).loc[1, "pipeline"] == "wal" and ranking.shown(t).loc[1, "× the cheapest"] == "1.00"


def test_the_point() -> None:
    assert Point(4).words() == "N = 4, 100,000 messages per start, closed loop"
    assert Point(1, math.inf, 500.0).words() == "N = 1, a start never repeated, 500 msg/s"
    assert Point.chosen(4, 0, 0.0) == Point(4, math.inf) and Point.chosen(2, 5000, 100.0) == Point(2, 5000.0, 100.0)
    for bad in ({"consumers": 0}, {"consumers": 1, "messages": 0}, {"consumers": 1, "rate": -1.0}):
        with pytest.raises(ValueError):
            Point(**bad)  # type: ignore[arg-type]


def test_every_pipeline_ranked_at_every_measured_n_at_the_series_own_volume() -> None:
    rows = [{"pipeline": p, "consumers": n, "messages": 5000, "cpu_ms_per_msg": a + b * (n - 1) + d, "success": True,
             "warmup": False} for p, a, b in (("wal", 0.8, 0.05), ("kafka", 1.4, 0.0)) for n in (1, 4, 16)
            for d in (-0.01, 0.01)]
    rows += [{"pipeline": "wal", "consumers": 1, "messages": 20_000, "cpu_ms_per_msg": 0.6, "success": True,
              "warmup": False}]
    measured = pd.DataFrame(rows)
    assert ranking.volume(measured) == 5000
    table = ranking.at_measured(measured)
    assert list(table["consumers"].drop_duplicates()) == [1, 4, 16]
    at16 = table[table["consumers"] == 16].set_index("pipeline")
    assert (at16.loc["kafka", "rank"], at16.loc["wal", "rank"]) == (1, 2)
    assert at16.loc["wal", "basis"].startswith("measured at N = 16")
    grid = ranking.grid(table)
    assert list(grid.columns) == ["N = 1", "N = 4", "N = 16"] and list(grid.index) == ["wal", "kafka"]
    assert grid.loc["wal", "N = 1"] == "0.800 (1)" and grid.loc["kafka", "N = 16"] == "1.400 (1)"
    assert ranking.grid(ranking.at_measured(measured.iloc[0:0])).empty
