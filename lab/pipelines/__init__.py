"""The four pipelines, registered by name; the name is the CLI value, result field and label."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from lab.pipelines.base import Pipeline, Source
from lab.scenario import Scenario
from lab.settings import Settings
from lab.pipelines.wal import WalPipeline, WalSource
from lab.pipelines.kafka import KafkaPipeline, KafkaSource
from lab.pipelines.wal_sharded import ShardedWalPipeline, ShardedWalSource
from lab.pipelines.rabbitmq import RabbitPipeline, RabbitSource

PIPELINES: dict[str, type[Any]] = {
    "wal": WalPipeline,
    "kafka": KafkaPipeline,
    "wal-sharded": ShardedWalPipeline,
    "rabbitmq": RabbitPipeline,
}
SOURCES: dict[str, type[Any]] = {
    "wal": WalSource,
    "kafka": KafkaSource,
    "wal-sharded": ShardedWalSource,
    "rabbitmq": RabbitSource,
}


def source_for(
    scenario: Scenario, settings: Settings, index: int, *, run_dir: Path | None = None
) -> Source:
    """The consumer-side half of ``scenario.pipeline`` for consumer ``index``.

    ``run_dir`` (the run's scratch directory) goes to sources that take a ``run_dir`` keyword.
    """
    cls = SOURCES[scenario.pipeline]
    if run_dir is not None and "run_dir" in inspect.signature(cls).parameters:
        return cls(scenario, settings, index, run_dir=run_dir)
    return cls(scenario, settings, index)


__all__ = ["PIPELINES", "SOURCES", "Pipeline", "Source", "source_for"]
