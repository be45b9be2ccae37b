"""The broker-native stand on the real native stack: producers write straight
into the topic, the quorum queue or the table; no outbox row for the brokers, no Debezium.

Each arm is one whole run through :func:`lab.runner.run_scenario` at N = 2, M = 2000, so each
run also proves the previous one left no topic, queue or slot behind.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lab.pipelines.kafka import DIRECT_TOPIC
from lab.pipelines.kafka_admin import admin_client, partition_count
from lab.pipelines.rabbitmq import DIRECT_QUEUE
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from tests.integration.checks import queue_exists, scalar

pytestmark = pytest.mark.integration

M = 2000
N = 2


@pytest.mark.parametrize("pipeline", ["kafka", pytest.param("rabbitmq", marks=pytest.mark.matrix),
                                      pytest.param("wal", marks=pytest.mark.matrix)])
def test_direct_producers_feed_the_usual_consumers(
    settings: Settings, stack: Any, pipeline: str
) -> None:
    scenario = Scenario(pipeline=pipeline, producer="direct", consumers=N, messages=M, cooldown_s=0)
    r = asyncio.run(run_scenario(scenario, settings))
    assert r["success"], r["error"]
    c = r["counters"]
    assert c["sent"] == c["processed"] == c["work_calls"] == c["work_distinct"] == M
    assert c["send_failed"] == c["failures"] == 0
    assert c["inbox_rows"] == c["distinct_ids"] == M
    assert r["scenario"]["producer"] == "direct"
    assert r["senders"]["senders"] == 200 and r["senders"]["first_send_mono"] is not None
    target = {"kafka": "kafka://", "rabbitmq": "amqp://", "wal": "postgresql://"}[pipeline]
    assert r["senders"]["url"].startswith(target)
    if pipeline == "wal":
        assert c["skipped"] == (N - 1) * M  # fan-out as usual
        assert scalar(settings, "SELECT count(*) FROM messages") == M  # the producers' inserts
    else:
        assert c["skipped"] == 0
        # ids 1..M straight from the producers, each claimed once; nothing went through the table
        ids = f"SELECT count(DISTINCT id) FROM inbox WHERE id BETWEEN 1 AND {M}"
        assert scalar(settings, ids) == M
        assert scalar(settings, "SELECT count(*) FROM messages") == 0
        assert c["decoded_bytes"] < M * 100  # the plain message, not a Debezium envelope
        s = r["pipeline_settings"]
        assert s["producer"] == "direct" and s["debezium_sink"] is None
        assert s.get("topic", s.get("queue")) == "messages"
    # Debezium never ran: no CPU, no memory in the window, no process, no slot
    assert r["cpu_s"]["debezium"] == 0 and r["mem_mb"]["debezium"] == 0
    assert all(not svc.processes() for svc in stack.debezium.values())
    assert scalar(settings, "SELECT count(*) FROM pg_replication_slots") == 0
    # and the transport is gone
    assert partition_count(admin_client(settings), DIRECT_TOPIC) is None
    assert not asyncio.run(queue_exists(settings, DIRECT_QUEUE))
    assert r["cpu_s"]["senders"] > 0 and r["cpu_s"]["consumers"] > 0 and r["cpu_ms_per_msg"] > 0
