"""single against ha on hand-made stored runs of both topologies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from lab.results import load_runs, write_run
from lab.settings import Settings
from lab.study import groups, topology

M = 1000
NS = (1, 2, 4)


def _run(key: str, i: int, pipeline: str, n: int, topo: str, cpu: dict[str, float],
         messages: int = M) -> dict[str, Any]:
    total = sum(v for k, v in cpu.items() if k != "unattributed")
    return {"run_id": f"{key}-{i}", "started_at": f"2026-12-01T0{int(topo == 'ha')}:{i // 60:02d}:{i % 60:02d}",
            "scenario": {"pipeline": pipeline, "consumers": n, "messages": messages, "senders": 200},
            "topology": topo, "success": True, "cpu_s": cpu, "cpu_ms_per_msg": total * 1000 / messages,
            "steal_pct": 2.0 if topo == "single" else 4.0, "series_id": f"s-{topo}"}


def _cpu(pipeline: str, n: int, topo: str, jitter: float) -> dict[str, float]:
    """CPU seconds per 1,000 messages: a direct reader costs 0.4 s more per extra consumer, a broker
    pipeline is flat; under ha each broker node costs what the single broker did, and the standby
    0.2 s. ``jitter`` spreads the repeats."""
    cpu = {"postgres": 1.0 + (0.4 * (n - 1) if pipeline == "wal" else 0.0) + jitter, "consumers": 0.5 * n,
           "web": 0.5, "senders": 0.5, "unattributed": 0.1 if topo == "single" else 0.3}
    if pipeline == "kafka":
        cpu["debezium"] = 1.0
        if topo == "single":
            cpu["kafka"] = 0.6 + jitter
        else:
            cpu |= {"kafka-1": 0.6 + jitter, "kafka-2": 0.6, "kafka-3": 0.6}
    if topo == "ha":
        cpu["postgres-standby"] = 0.2
    return cpu


def _write(settings: Settings, runs: list[dict[str, Any]]) -> pd.DataFrame:
    for run in runs:
        write_run(run, settings=settings)
    return load_runs(settings=settings)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, stack_dir=tmp_path / "stack")


@pytest.fixture
def both(settings: Settings) -> pd.DataFrame:
    runs, i = [], 0
    for topo in topology.TOPOLOGIES:
        for pipeline in ("wal", "kafka"):
            for n in NS:
                for jitter in (0.0, 0.05, 0.1):
                    runs.append(_run(f"{pipeline}-{n}-{topo}", i, pipeline, n, topo, _cpu(pipeline, n, topo, jitter)))
                    i += 1
    return _write(settings, runs)


def test_every_cell_is_paired_and_ha_costs_more(both: pd.DataFrame) -> None:
    cells = topology.cell_table(both)
    assert sorted(zip(cells["pipeline"], cells["consumers"], strict=True)) == sorted(
        (p, n) for p in ("kafka", "wal") for n in NS)
    assert list(cells["pipeline"]) == ["wal"] * 3 + ["kafka"] * 3  # the report's pipeline order
    assert (cells["ratio"] > 1).all()  # a standby, two more broker nodes: never cheaper
    assert (cells["ratio_lo"] <= cells["ratio"]).all() and (cells["ratio"] <= cells["ratio_hi"]).all()
    # three runs a side: each [min, max] covers 75 %, the ratio's bound at least 0.75 ** 2
    assert cells["ratio_coverage"].tolist() == pytest.approx([0.5625] * 6)
    assert (cells["single_n"] == 3).all() and (cells["ha_n"] == 3).all()


def test_the_standby_is_an_added_participant_and_a_direct_pipeline_has_no_broker(both: pd.DataFrame) -> None:
    parts = topology.participant_table(both)
    standby = parts[parts["participant"] == "postgres-standby"]
    assert len(standby) == 6 and (standby["single"] == 0).all()
    assert standby["added"].tolist() == pytest.approx([0.2] * 6)  # 0.2 s per 1,000 messages = 0.2 ms/msg
    assert parts[(parts["pipeline"] == "wal") & (parts["participant"] == "kafka")].empty
    web = parts[parts["participant"] == "web"]
    assert web["ratio"].tolist() == pytest.approx([1.0] * 6)  # untouched by the topology


def test_three_nodes_that_each_cost_the_single_broker_multiply_it_by_three(both: pd.DataFrame) -> None:
    x = topology.multiplier_table(both)
    assert list(x["pipeline"].unique()) == ["kafka"]  # no rabbitmq runs here
    assert list(x["consumers"]) == [*NS, 0]  # every N, then all N pooled
    assert x["broker_x"].tolist() == pytest.approx([(1.8 + 0.05) / 0.65] * 4, rel=1e-9)
    assert x["x3"].tolist() == pytest.approx((x["broker_x"] / 3).tolist())
    pooled = x[x["consumers"] == 0].iloc[0]
    assert pooled["runs_single"] == pooled["runs_ha"] == 9
    assert pooled["source_x"] == pytest.approx((1.05 + 0.2) / 1.05)  # primary + standby against primary
    assert 1 < pooled["total_x"] < pooled["broker_x"]  # the rest of the pipeline does not triple


def test_crossover_per_topology(both: pd.DataFrame) -> None:
    cross = topology.crossover_table(both, n_boot=200)
    assert list(cross["topology"]) == ["single", "ha"]
    assert (cross["direct"] == "wal").all() and (cross["broker"] == "kafka").all()
    # wal rises 0.4 ms/msg per extra reader (plus its consumers); under ha kafka's level rises by
    # two nodes' worth while wal gains only the standby: the crossing moves out
    single, ha = cross["n_star_all"].tolist()
    assert 1 < single < ha


def test_one_topology_without_runs_gives_empty_comparisons(settings: Settings) -> None:
    only = _write(settings, [_run("w", i, "wal", 1, "single", _cpu("wal", 1, "single", 0.01 * i)) for i in range(3)])
    assert set(topology.split(only)) == {"single"}
    assert topology.cell_table(only).empty and topology.participant_table(only).empty
    assert topology.multiplier_table(only).empty
    assert topology.crossover_table(only).empty


def test_runs_measured_differently_within_a_topology_are_refused(settings: Settings) -> None:
    runs = [_run("a", 0, "wal", 1, "ha", _cpu("wal", 1, "ha", 0.0)),
            _run("b", 1, "wal", 1, "ha", _cpu("wal", 1, "ha", 0.0), messages=5000)]
    with pytest.raises(groups.NotComparable):
        topology.split(_write(settings, runs))


def test_quietness_per_block(both: pd.DataFrame) -> None:
    q = topology.quietness(both).set_index("topology")
    assert q.loc["single", "unattributed_ms_per_msg"] == pytest.approx(0.1)
    assert q.loc["ha", "unattributed_ms_per_msg"] == pytest.approx(0.3)
    assert q.loc["ha", "steal_pct"] == 4.0 and q.loc["single", "runs"] == 18
    assert np.isfinite(q["unattributed_ms_per_msg"]).all()


def test_latency_pairs_fixed_rate_clean_runs_of_the_same_rate(settings: Settings) -> None:
    """Latency at a fixed rate under both topologies: only open-loop runs without a fault, a cell
    per pipeline x N x percentile and rate, the medians' ratio inside its bound."""
    runs, i = [], 0
    for topo, p99 in (("single", (100.0, 120.0, 140.0)), ("ha", (200.0, 260.0, 300.0))):
        for rate in (500.0, 200.0):
            for v in p99:
                run = _run(f"lat-{topo}-{rate}", i, "kafka", 2, topo, _cpu("kafka", 2, topo, 0.0))
                run["scenario"]["rate"] = rate
                run["latency_ms"] = {"p50": v / 2, "p99": v * (2 if rate == 200.0 else 1)}
                runs.append(run)
                i += 1
        closed = _run(f"closed-{topo}", i, "kafka", 2, topo, _cpu("kafka", 2, topo, 0.0))  # rate 0: not latency
        closed["latency_ms"] = {"p50": 1e6, "p99": 1e6}
        faulty = _run(f"fault-{topo}", i + 1, "kafka", 2, topo, _cpu("kafka", 2, topo, 0.0))
        faulty["scenario"] |= {"rate": 500.0, "fault": "consumer-dead:1@3s+2s"}
        faulty["latency_ms"] = {"p50": 1e6, "p99": 1e6}
        runs += [closed, faulty]
        i += 2
    table = topology.latency_table(_write(settings, runs))
    assert sorted(zip(table["rate"], table["percentile"], strict=True)) == [
        (200.0, "p50"), (200.0, "p99"), (500.0, "p50"),
                                                               (500.0, "p99")]
    p99 = table[(table["rate"] == 500.0) & (table["percentile"] == "p99")].iloc[0]
    assert (p99["single"], p99["ha"]) == (120.0, 260.0)  # the fault and closed-loop runs were left out
    assert p99["ratio"] == pytest.approx(260 / 120)
    assert (p99["ratio_lo"], p99["ratio_hi"]) == (pytest.approx(200 / 140), pytest.approx(300 / 100))
    assert table.loc[(table["rate"] == 200.0) & (table["percentile"] == "p99"), "single"].iloc[0] == 240.0
    assert topology.latency_table(pd.DataFrame()).empty
    stored = load_runs(settings=settings)
    assert topology.latency_table(stored[topology.topology_of(stored) == "single"]).empty  # one side only
