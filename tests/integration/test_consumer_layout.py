"""The ``tasks`` consumer layout end to end: N consumers as asyncio tasks of one process.

The same success predicate and counters as the ``processes`` runs of the other integration tests
(test_run_wal.py, pipelines/), on every pipeline, plus what makes it the reference's layout: one
process for all consumers, and for RabbitMQ one AMQP connection carrying one channel per consumer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings

pytestmark = pytest.mark.integration
M = 2000
N = 3


def _amqp_consumer_connections(stack: Any) -> list[int]:
    """Channels per AMQP connection whose client is aiormq (the consumers, not Debezium)."""
    rows = json.loads(stack.rabbitmq.ctl("list_connections", "client_properties", "channels",
                                         "--formatter", "json"))
    return [r["channels"] for r in rows if "aiormq" in json.dumps(r["client_properties"])]


@pytest.mark.parametrize("pipeline", [pytest.param("wal", marks=pytest.mark.matrix),
                                      pytest.param("wal-sharded", marks=pytest.mark.matrix),
                                      pytest.param("kafka", marks=pytest.mark.matrix), "rabbitmq"])
def test_tasks_layout_passes_the_same_checks(stack: Any, settings: Settings, pipeline: str) -> None:
    seen: list[list[int]] = []

    def progress(phase: str, info: dict[str, Any]) -> None:
        if pipeline == "rabbitmq" and phase == "drain" and not seen:
            seen.append(_amqp_consumer_connections(stack))

    scenario = Scenario(pipeline=pipeline, consumers=N, messages=M, cooldown_s=0,
                        consumer_layout="tasks")
    r = asyncio.run(run_scenario(scenario, settings, progress=progress))
    c = r["counters"]
    logs = {p.name: p.read_text()[-2000:] for p in (settings.stack_dir / "runs" / r["run_id"]).glob("consumer-*.log")}
    assert r["success"], (r["error"], logs)
    assert r["scenario"]["consumer_layout"] == "tasks"
    assert c["sent"] == c["processed"] == c["work_calls"] == c["work_distinct"] == M
    assert c["inbox_rows"] == c["distinct_ids"] == M
    assert c["failures"] == 0
    if pipeline == "wal":
        assert c["skipped"] == (N - 1) * M  # every reader sees every row
    assert sorted(x["index"] for x in r["consumers"]) == list(range(N))
    assert sum(x["processed"] for x in r["consumers"]) == M
    assert len({x["pid"] for x in r["consumers"]}) == 1  # one process ran them all
    assert r["cpu_s"]["consumers"] > 0
    if pipeline == "rabbitmq":
        assert seen == [[N]]  # one connection, a channel per consumer
