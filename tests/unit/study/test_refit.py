"""N*(M) with F refitted in every draw: exact on exact data, wider than F held fixed when the arm is noisy."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lab.study import crossover, refit, sitting
from lab.study.costmodel import METRIC

NS = (1, 4, 16)


def _runs(noise_arm: float = 0.0, noise_main: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """wal: 0.8 + 0.1·(N − 1) ms/msg at every volume (no start to spread); kafka: c = 1.0 ms/msg and
    F = 2 CPU-s per start. Two runs per cell at 5,000 messages, and at 20,000 at N = 1 and 16 (the arm),
    the two runs of a cell ``noise`` apart."""
    main, arm = [], []
    for n in NS:
        for sign in (-1, 1):
            main.append({"pipeline": "wal", "consumers": n, "messages": 5000,
                         METRIC: 0.8 + 0.1 * (n - 1) + sign * noise_main})
            main.append({"pipeline": "kafka", "consumers": n, "messages": 5000,
                         METRIC: 1.0 + 2000 / 5000 + sign * noise_main})
            if n in (1, 16):
                arm.append({"pipeline": "wal", "consumers": n, "messages": 20_000,
                            METRIC: 0.8 + 0.1 * (n - 1) + sign * noise_arm})
                arm.append({"pipeline": "kafka", "consumers": n, "messages": 20_000,
                            METRIC: 1.0 + 2000 / 20_000 + sign * noise_arm})
    return pd.DataFrame(main), pd.DataFrame(arm)


def test_exact_runs_give_the_exact_crossing_at_every_volume() -> None:
    main, arm = _runs()
    got = refit.intervals(main, arm, "wal", "kafka", [5000, 100_000, math.inf], n_boot=50)
    # kafka at M: 1 + 2000/M; wal's line meets it at N = 1 + (1 + 2000/M − 0.8) / 0.1
    for m, n_star in ((5000, 7.0), (100_000, 3.2), (math.inf, 3.0)):
        assert got[m] == pytest.approx((n_star, n_star)), m


def test_a_noisy_arm_widens_the_interval_that_f_held_fixed_leaves_narrow() -> None:
    main, arm = _runs(noise_arm=0.05)
    got = refit.intervals(main, arm, "wal", "kafka", [100_000], n_boot=400)[100_000]
    lines = crossover.fixed_lines(main.assign(success=True, warmup=False), arm.assign(success=True, warmup=False))
    held = crossover.crossings(crossover.at_volume_lines(main.assign(success=True, warmup=False), lines, 100_000),
                               "wal", "kafka", n_boot=400)
    flat = held.models[0]
    assert flat.ci[1] - flat.ci[0] < 1e-6  # the main runs are exact: F held fixed, nothing moves
    assert got[1] - got[0] > 0.5 and got[0] <= flat.n_star <= got[1]


def test_nothing_to_refit_is_said_by_an_empty_answer() -> None:
    main, arm = _runs()
    assert refit.intervals(main, arm.iloc[0:0], "wal", "kafka", [100_000]) == {}
    assert refit.intervals(main, arm[arm["pipeline"] == "wal"], "wal", "kafka", [100_000]) == {}
    one = main.groupby(["pipeline", "consumers"]).head(1)  # one run per cell: nothing says how runs scatter
    assert refit.intervals(one, arm.groupby(["pipeline", "consumers"]).head(1), "wal", "kafka", [100_000]) == {}


def test_a_lone_arm_run_scatters_as_its_pipelines_other_runs() -> None:
    """The quick profile's arm: one run per cell. Exact main runs leave it exact; scattered main runs
    (kafka's ±2 %) scatter it too, and the interval widens."""
    main, arm = _runs()
    lone = arm.groupby(["pipeline", "consumers"]).head(1)
    assert refit.intervals(main, lone, "wal", "kafka", [100_000], n_boot=50)[100_000] == pytest.approx((3.2, 3.2))
    noisy, _ = _runs(noise_main=0.03)
    lo, hi = refit.intervals(noisy, lone, "wal", "kafka", [100_000], n_boot=400)[100_000]
    assert lo < 3.2 < hi and hi - lo > 0.3


def test_a_record_gives_its_refit_from_its_own_runs() -> None:
    main, arm = _runs(noise_arm=0.05, noise_main=0.02)
    rows = [{**r, "ms": r[METRIC], "arm": False} for r in main.to_dict("records")]
    rows += [{**r, "ms": r[METRIC], "arm": True} for r in arm.to_dict("records")]
    record = {"runs": [{k: v for k, v in r.items() if k != METRIC} for r in rows]}
    got = sitting.refitted(record, "wal", "kafka")
    assert set(got) == set(crossover.VOLUMES) and got[100_000][0] < 3.2 < got[100_000][1]
    everywhere = {"runs": record["runs"] + [{**r, "consumers": 4} for r in record["runs"] if r["arm"]]}
    # an arm at every N (the quick profile's): the model is still F's line, through every N, and refitted
    assert set(sitting.refitted(everywhere, "wal", "kafka")) == set(crossover.VOLUMES)
    no_kafka_arm = {"runs": [r for r in record["runs"] if not (r["arm"] and r["pipeline"] == "kafka")]}
    assert sitting.refitted(no_kafka_arm, "wal", "kafka") == {}  # no arm for one of the pair: nothing to refit


def test_the_published_table_reads_the_volume_of_each_condition() -> None:
    from lab.study.published import _volume

    assert _volume("M = 100,000, F fitted across volumes at N = 1, 16") == 100_000
    assert _volume("M = 5,000, F fitted across volumes at N = 1, 16") == 5_000
    assert _volume("M = ∞ (steady), F fitted across volumes at N = 1, 16") == math.inf
    assert _volume("M = ∞, each run's own timeline") == math.inf and _volume("at 200 msg/s") is None


def _blocked(f_by_block: tuple[float, ...]) -> list[dict[str, object]]:
    """A conditions-like sitting's record runs: wal (0.8 + 0.1·(N − 1) ms/msg at any volume) and kafka
    (c = 1.0 ms/msg, F per start as given, block by block) at 100,000 messages, and the arm at 5,000
    messages right after each N's cells, in the series order (``index``) of a paired profile."""
    rows: list[dict[str, object]] = []
    for b, f in enumerate(f_by_block):
        for n in NS:
            for pipeline, arm, m in (("wal", False, 100_000), ("kafka", False, 100_000),
                                     ("wal", True, 5_000), ("kafka", True, 5_000)):
                ms = 0.8 + 0.1 * (n - 1) if pipeline == "wal" else 1.0 + 1000 * f / m
                # an arm run's block counts its own cell's runs: the same as its series block here
                rows.append({"index": len(rows) + 1, "pipeline": pipeline, "consumers": n, "messages": m,
                             "arm": arm, "block": b, "ms": ms})
    return rows


def test_f_refitted_block_by_block_gives_each_blocks_crossing_and_a_bootstrap_over_blocks() -> None:
    # kafka's F: 2 CPU-s in block 1, 4 in block 2; wal meets kafka at N = 1 + (1 + F/M·1000 − 0.8)/0.1
    got = sitting.refitted_by_block({"runs": _blocked((2.0, 4.0))}, "wal", "kafka")
    assert [b["f"]["kafka"][0] for b in got["blocks"]] == pytest.approx([2.0, 4.0])
    assert [b["fitted_at"] for b in got["blocks"]] == [[1, 4, 16], [1, 4, 16]]
    assert [b["n_star"][1_000_000] for b in got["blocks"]] == pytest.approx([3.02, 3.04])
    assert [b["n_star"][5_000] for b in got["blocks"]] == pytest.approx([7.0, 11.0])
    assert got["intervals"][5_000] == pytest.approx((7.0, 11.0))  # two blocks: their own range
    assert got["intervals"][math.inf] == pytest.approx((3.0, 3.0))  # F does not reach a Debezium never restarted
    assert got["coverage"] == 0.5


def test_no_block_refit_without_an_arm_in_two_blocks() -> None:
    one_block = [r for r in _blocked((2.0, 4.0)) if not (r["arm"] and r["block"] == 1)]
    assert sitting.refitted_by_block({"runs": one_block}, "wal", "kafka") == {}
    assert sitting.refitted_by_block({"runs": []}, "wal", "kafka") == {}


def test_an_arm_run_belongs_to_the_block_its_series_index_falls_in() -> None:
    """The reference profile's arm: 5,000 messages in the first block, 20,000 in the second; each arm
    run is the first of its cell (block 0), yet ran in the block its index falls in."""
    rows = [{"index": 1, "arm": False, "block": 0}, {"index": 2, "arm": True, "block": 0},
            {"index": 3, "arm": False, "block": 1}, {"index": 4, "arm": True, "block": 0},
            {"index": None, "arm": True, "block": 0}]
    assert sitting.series_blocks(rows) == [0, 0, 1, 1, None]


def test_the_block_the_series_stored_with_a_run_is_its_block() -> None:
    """A shuffled block (the quick profile's) can begin with an arm run: by its index alone it would
    fall in the block before; the block the series stored with it (``series_block``) says otherwise."""
    rows = [{"index": 1, "arm": False, "block": 0, "series_block": 0},
            {"index": 2, "arm": True, "block": 0, "series_block": 0},
            {"index": 3, "arm": True, "block": 1, "series_block": 1},  # first of block 1, before its cells
            {"index": 4, "arm": False, "block": 1, "series_block": 1}]
    assert sitting.series_blocks(rows) == [0, 0, 1, 1]
    assert sitting.series_blocks([{k: v for k, v in r.items() if k != "series_block"} for r in rows]) == [0, 0, 0, 1]


def test_the_published_block_table_gives_each_blocks_crossing_and_the_real_coverage() -> None:
    from lab.study import published

    rec = {"id": "s1", "day": "2026-12-07", "profile": "conditions", "machine": {"cpu_model": "AMD EPYC"},
           "runs": _blocked((2.0, 4.0))}
    text = "\n".join(published._block_section([rec]))
    row = next(x for x in text.splitlines() if "`wal` vs kafka" in x)
    assert "block 1: 5,000, 100,000 messages at N = 1, 4, 16" in row
    assert "| 7.0, 11.0 | 7.0–11.0 |" in row  # at 5,000: each block's N*, then the block bootstrap's
    assert row.endswith("| about 50 % |")
    assert published._block_section([{**rec, "runs": []}]) == []


def test_the_model_table_leaves_out_a_pair_read_from_the_runs_own_splits() -> None:
    """A quick sitting whose arm is wal and kafka only has no volume fit for RabbitMQ: its N*(M) would
    come from each run's own split, biased at 5,000 messages, and the published table leaves it out."""
    from lab.study import published

    answer = {"direct": "wal", "range": [20.0, 30.0], "inside": False}
    fitted = "M = 100,000, F fitted across volumes at N = 1, 16"
    model = {"by_volume": [{**answer, "broker": "kafka", "condition": fitted},
                           {**answer, "broker": "rabbitmq", "condition": "M = 100,000" + crossover.SPLIT_ONLY}]}
    rec = {"id": "q1", "day": "2026-12-07", "profile": "quick", "machine": {"cpu_model": "AMD EPYC"},
           "model": model, "runs": []}
    text = "\n".join(published._modelled_section([rec]))
    assert "`wal` vs kafka" in text and "`wal` vs rabbitmq" not in text
