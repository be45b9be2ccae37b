"""The study's roll-up of the ``ha`` topology's nodes on hand-made stored runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from lab.results import load_runs, write_run
from lab.settings import Settings
from lab.study import compare, costmodel, groups, ha_nodes, plots

M = 1000


def _run(i: int, pipeline: str, n: int, topology: str, cpu: dict[str, float]) -> dict[str, Any]:
    total = sum(v for k, v in cpu.items() if k != "unattributed")
    return {"run_id": f"r{i}-{pipeline}-{topology}", "started_at": f"2026-12-01T00:00:{i:02d}",
            "scenario": {"pipeline": pipeline, "consumers": n, "messages": M, "senders": 200},
            "topology": topology, "success": True, "cpu_s": cpu, "cpu_ms_per_msg": total * 1000 / M,
            "mem_mb_max": {k: 100.0 for k in cpu if k != "unattributed"}, "series_id": f"s-{topology}"}


def _ha_cpu(k: float = 0.0) -> dict[str, float]:
    return {"postgres": 1.0, "postgres-standby": 0.25, "kafka-1": 0.5 + k, "kafka-2": 0.25, "kafka-3": 0.25,
            "rabbitmq-1": 2.0, "rabbitmq-2": 0.5, "rabbitmq-3": 0.5, "debezium": 1.0, "web": 0.5,
            "senders": 0.5, "consumers": 1.0, "runner": 0.01, "unattributed": 3.0}


@pytest.fixture
def stored(tmp_path: Path) -> pd.DataFrame:
    settings = Settings(data_dir=tmp_path, stack_dir=tmp_path / "stack")
    runs = [_run(i, "rabbitmq", 2, "ha", _ha_cpu(0.1 * i)) for i in range(3)]
    runs += [_run(10 + i, "kafka", n, "ha", _ha_cpu()) for i, n in enumerate((1, 2))]
    runs.append(_run(20, "rabbitmq", 2, "single", {"postgres": 1.0, "kafka": 0.4, "rabbitmq": 2.2,
                                                     "debezium": 1.0, "consumers": 1.0}))
    for run in runs:
        write_run(run, settings=settings)
    return load_runs(settings=settings)


def test_node_names_are_recognised() -> None:
    assert ha_nodes.broker_of("kafka-2") == "kafka" and ha_nodes.broker_of("rabbitmq-3") == "rabbitmq"
    assert ha_nodes.broker_of("kafka") is None and ha_nodes.broker_of("postgres-standby") is None
    assert not ha_nodes.is_node("consumers") and not ha_nodes.is_node("debezium-kafka")


def test_rollup_sums_the_nodes_under_the_brokers_name_and_keeps_nodes_and_standby(stored: pd.DataFrame) -> None:
    assert "cpu_s.kafka" in stored  # the single run's column
    ha = stored["topology"] == "ha"
    assert stored.loc[ha, "cpu_s.kafka"].isna().all()  # as loaded: an ha run has nodes only
    out = ha_nodes.rollup_nodes(stored)
    first = out[out["run_id"] == "r0-rabbitmq-ha"].iloc[0]
    assert first["cpu_s.rabbitmq"] == pytest.approx(3.0) and first["cpu_s.kafka"] == pytest.approx(1.0)
    assert first["cpu_s.rabbitmq-1"] == 2.0 and first["cpu_s.postgres-standby"] == 0.25  # still there
    assert first["mem_mb_max.rabbitmq"] == pytest.approx(300.0)  # the sum of the nodes' peaks
    r2 = out[out["run_id"] == "r2-rabbitmq-ha"].iloc[0]
    assert r2["cpu_s.kafka"] == pytest.approx(1.2)
    single = out[out["topology"] == "single"].iloc[0]
    assert single["cpu_s.kafka"] == 0.4 and single["cpu_s.rabbitmq"] == 2.2  # its own value kept
    assert ha_nodes.rollup_nodes(out).equals(out)  # idempotent
    assert stored.loc[ha, "cpu_s.kafka"].isna().all()  # the input is left as it was


def test_the_analysis_entry_points_roll_up_and_never_pool_topologies(stored: pd.DataFrame) -> None:
    with pytest.raises(groups.NotComparable, match="ha topology"):
        costmodel.measured(stored)
    ha = stored[stored["topology"] == "ha"]
    runs = costmodel.measured(ha)
    rabbit = costmodel.measured(ha, "rabbitmq")
    assert costmodel.participant_ms(rabbit, "rabbitmq") == pytest.approx([3.0, 3.0, 3.0])  # ms/msg at M=1000
    assert costmodel.participant_ms(rabbit, "kafka") == pytest.approx([1.0, 1.1, 1.2])
    level = costmodel.broker_level(runs, "rabbitmq")
    assert level.level == pytest.approx(float(np.median(rabbit["cpu_ms_per_msg"])))
    picked, name = groups.select(stored, "s-ha")
    assert "ha topology" in name and picked["cpu_s.rabbitmq"].notna().all()


def test_memory_and_breakdown_show_brokers_once_and_the_standby(stored: pd.DataFrame) -> None:
    ha = stored[stored["topology"] == "ha"]
    mem = compare.memory_table(ha).set_index(["pipeline", "consumers"])
    row = mem.loc[("rabbitmq", 2)]
    assert row["rabbitmq_mb"] == 300.0 and row["kafka_mb"] == 300.0 and row["postgres-standby_mb"] == 100.0
    # postgres, standby, debezium, web, senders, consumers, runner at 100 MB and two brokers of 300:
    # each node counted once
    assert row["total_mb"] == pytest.approx(7 * 100.0 + 2 * 300.0)
    fig = plots.breakdown_figure(ha, per="run")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "kafka" in labels and "rabbitmq" in labels and "postgres-standby" in labels
    assert not any(ha_nodes.is_node(x) for x in labels)
    heights = np.zeros(len(ha))
    for bars in ax.containers:
        heights += np.array([b.get_height() for b in bars])
    totals = costmodel.measured(ha)["cpu_ms_per_msg"].to_numpy()
    assert sorted(heights) == pytest.approx(sorted(totals))  # each bar is its run's total: nothing twice


def test_node_table_lists_each_node_and_the_sums(stored: pd.DataFrame) -> None:
    table = ha_nodes.node_table(stored)
    assert len(table) == 5 and set(table["topology"]) == {"ha"}  # the single run has no nodes
    row = table[table["run_id"] == "r0-rabbitmq-ha"].iloc[0]
    assert row["rabbitmq-1"] == 2.0 and row["rabbitmq"] == pytest.approx(3.0)
    assert row["kafka-3"] == 0.25 and row["postgres-standby"] == 0.25
    assert ha_nodes.node_table(stored[stored["topology"] == "single"]).empty


def test_the_reports_tables_read_an_ha_series(tmp_path: Path) -> None:
    from lab.study import fidelity

    settings = Settings(data_dir=tmp_path, stack_dir=tmp_path / "stack")
    i = 0
    for pipeline in ("wal", "kafka", "rabbitmq"):
        for n in (1, 2, 4):
            for _ in range(2):
                cpu = _ha_cpu(0.05 * i)
                if pipeline == "wal":
                    cpu["postgres"] = 0.5 + 0.4 * n
                write_run(_run(i, pipeline, n, "ha", cpu), settings=settings)
                i += 1
    runs, name = groups.select(load_runs(settings=settings), "s-ha")
    assert "ha topology" in name
    cells = fidelity.cells(runs)
    assert cells.loc[cells["pipeline"] == "rabbitmq", "rabbitmq"].iloc[0] == pytest.approx(3.0)
    parts = fidelity.participants_table(runs)
    assert {"kafka", "rabbitmq", "postgres"} <= set(parts["participant"])
    cross = compare.crossover_table(runs, n_boot=50)
    assert set(cross["broker"]) == {"kafka", "rabbitmq"}
    assert {"postgres-standby_mb", "rabbitmq_mb", "kafka_mb"} <= set(compare.memory_table(runs).columns)
    plots.memory_figure(compare.memory_table(runs))
    plots.breakdown_figure(runs)
