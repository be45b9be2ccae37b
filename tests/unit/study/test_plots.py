from __future__ import annotations

import io

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from lab.results import load_reference
from lab.study import costmodel as cm
from lab.study import plots

PIPES = ("wal", "wal-sharded", "kafka", "rabbitmq")


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    """Two runs per cell, 2 pipelines x N in {1, 2, 4}; a warm-up, a failed run, a drift probe."""
    rng, rows = np.random.default_rng(0), []
    for pipeline, a, b in (("wal", 1.2, 0.1), ("kafka", 2.1, 0.0)):
        for n in (1, 2, 4):
            for _ in range(2):
                y = a + b * (n - 1) + rng.normal(0, 0.02)
                rows.append(
                    dict(
                        pipeline=pipeline,
                        consumers=n,
                        messages=1000,
                        cpu_ms_per_msg=y,
                        window_s=5.0,
                        success=True,
                        warmup=False,
                        label="",
                        **{
                            "cpu_s.postgres": y * 0.6,
                            "cpu_s.web": y * 0.4,
                            "cpu_s.unattributed": 3.0,
                            "cpu_s.debezium": 0.0,
                        },
                        skipped=(n - 1) * 1000 if pipeline == "wal" else 0,
                        claims_min=1000 // n - 10,
                        claims_max=1000 // n + 10,
                    )
                )
    extra = [
        dict(rows[0], warmup=True, label="warm-up"),
        dict(rows[1], success=False),
        dict(rows[6], label="drift", warmup=True, cpu_ms_per_msg=2.3, window_s=5.5),
    ]
    df = pd.DataFrame([extra[0], *rows, *extra[1:]])
    return df.assign(run_id=[f"r{i:02d}" for i in range(len(df))])


@pytest.fixture(scope="module")
def published() -> pd.DataFrame:
    return cm.published_runs()


def labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def builds(fig: Figure) -> Figure:
    assert isinstance(fig, Figure)
    fig.savefig(io.BytesIO(), format="png")  # renders headless
    return fig


def test_no_pyplot_figures_are_left_behind(runs: pd.DataFrame) -> None:
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    builds(plots.headline_figure(runs))
    assert plt.get_fignums() == before and matplotlib.get_backend()


def test_headline_ours_with_intervals_and_published_dashed(runs: pd.DataFrame) -> None:
    ax = builds(plots.headline_figure(runs, load_reference("headline"))).axes[0]
    lines = ax.get_lines()
    assert len(lines) == 2 + 4 and [ln.get_linestyle() for ln in lines] == ["-"] * 2 + ["--"] * 4
    assert labels(ax) == ["wal", "kafka", *(f"{p} (published)" for p in PIPES)]
    bars = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(bars) == 2 and all(
        len(c.get_segments()) == 3 for c in bars
    )  # 2 runs per cell: intervals
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]


def test_headline_from_the_published_table_alone(published: pd.DataFrame) -> None:
    ax = builds(plots.headline_figure(cm.headline(published))).axes[0]
    assert len(ax.get_lines()) == 4 and not ax.collections  # one run per cell: no interval bars
    assert ax.get_lines()[0].get_ydata().tolist() == [1.187, 1.207, 1.482, 1.876]


def test_breakdown_stacks_participants_per_cell(
    runs: pd.DataFrame, published: pd.DataFrame
) -> None:
    ax = builds(plots.breakdown_figure(runs)).axes[0]
    stacks = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert labels(ax) == ["postgres", "web"] and all(
        len(s) == 6 for s in stacks
    )  # debezium all 0: dropped
    top = stacks[0][0].get_height() + stacks[1][0].get_height()
    assert top == pytest.approx(
        runs[(runs.pipeline == "wal") & (runs.consumers == 1) & runs.success & ~runs.warmup][
            "cpu_ms_per_msg"
        ].median()
    )
    assert len(plots.breakdown_figure(runs, per="run").axes[0].containers[0]) == 12
    assert "unattributed" in labels(plots.breakdown_figure(runs, include_unattributed=True).axes[0])
    ref = builds(plots.breakdown_figure(published)).axes[0]
    assert labels(ref) == ["postgres", "debezium", "kafka", "rabbitmq", "web", "test"]
    assert all(len(s) == 16 for s in ref.containers) and len(ref.get_xticklabels()) == 16
    wal8 = sum(
        s[3].get_height() for s in ref.containers
    )  # wal c8: pipelines in the registry's order
    assert wal8 == pytest.approx(1.876)
    with pytest.raises(ValueError, match="per must be"):
        plots.breakdown_figure(runs, per="pipeline")


def test_fanout_lines_bands_levels_and_crossovers(
    published: pd.DataFrame, runs: pd.DataFrame
) -> None:
    fits = [cm.fit_fanout(published, p) for p in ("wal", "wal-sharded")]
    levels = [cm.broker_level(published, "kafka", at=8), cm.broker_level(published, "rabbitmq")]
    crosses = [cm.crossover(f, lv) for f in fits for lv in levels]
    ax = builds(plots.fanout_figure(fits, levels, crosses)).axes[0]
    drawn = [c for c in crosses if c.n_star is not None]
    assert len(ax.get_lines()) == len(fits) + len(levels) + len(drawn)
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 2  # OLS-t bands
    assert sum(isinstance(c, LineCollection) for c in ax.collections) == len(drawn)  # N* intervals
    text = labels(ax)
    assert text[0] == "measured N" and text[1].startswith("wal: 1.15 + 0.10")
    assert "kafka level 2.16" in text and any(
        "N* wal/kafka ≈ 10.7 (extrapolated)" in t for t in text
    )
    assert ax.get_xlim()[1] > max(c.n_star for c in drawn)
    synth = builds(
        plots.fanout_figure(
            {"wal": cm.fit_fanout(runs, "wal")}, {"kafka": cm.broker_level(runs, "kafka")}
        )
    )
    assert (
        len(synth.axes[0].get_lines()) == 2 and len(synth.axes[0].patches) >= 2
    )  # measured span + level ci


def test_claims_per_run(runs: pd.DataFrame, published: pd.DataFrame) -> None:
    top, bottom = builds(plots.claims_figure(runs)).axes
    assert len(top.containers[0]) == 12 and len(bottom.collections[0].get_segments()) == 12
    heights = [p.get_height() for p in top.containers[0]]
    assert heights[:6] == [0, 0, 1, 1, 3, 3]  # wal: (N - 1) skipped per message
    top, bottom = builds(plots.claims_figure(published)).axes
    assert len(top.containers[0]) == 16 and len(bottom.get_xticklabels()) == 16
    segs = bottom.collections[0].get_segments()
    assert segs[3][:, 1] == pytest.approx([9600 / 12500, 15800 / 12500])  # wal c8, the reference study


def test_drift_probe_vs_origin(runs: pd.DataFrame, published: pd.DataFrame) -> None:
    fig = builds(plots.drift_figure(published))
    assert len(fig.axes) == 2 and all(len(ax.containers) == 2 for ax in fig.axes)
    assert [t.get_text() for t in fig.axes[0].texts] == ["+0.04 %"]  # the reference study
    assert [t.get_text() for t in fig.axes[1].texts] == ["-13.8 %"]
    ours = builds(plots.drift_figure(runs)).axes
    assert [t.get_text() for t in ours[1].texts] == [f"{100 * (5.0 / 5.5 - 1):+.1f} %"]
    empty = builds(plots.drift_figure(runs[runs.label != "drift"]))
    assert "no drift probe" in empty.axes[0].texts[0].get_text()
