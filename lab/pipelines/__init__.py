"""The four pipelines, registered by name; the name is the CLI value, result field and label."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from lab.pipelines.base import Pipeline, SharedResources, Source
from lab.pipelines.kafka import KafkaPipeline, KafkaSource
from lab.pipelines.rabbitmq import RabbitPipeline, RabbitSource
from lab.pipelines.wal import WalPipeline, WalSource
from lab.pipelines.wal_sharded import ShardedWalPipeline, ShardedWalSource
from lab.scenario import Scenario
from lab.settings import Settings

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
    scenario: Scenario, settings: Settings, index: int, *, run_dir: Path | None = None,
    shared: SharedResources | None = None,
) -> Source:
    """The consumer-side half of ``scenario.pipeline`` for consumer ``index``.

    ``run_dir`` (the run's scratch directory) and ``shared`` (what the consumers of one process
    share, ``tasks`` layout) go to sources that take that keyword.
    """
    cls = SOURCES[scenario.pipeline]
    params = inspect.signature(cls).parameters
    kwargs: dict[str, Any] = {}
    if run_dir is not None and "run_dir" in params:
        kwargs["run_dir"] = run_dir
    if shared is not None and "shared" in params:
        kwargs["shared"] = shared
    return cls(scenario, settings, index, **kwargs)


__all__ = ["PIPELINES", "SOURCES", "Pipeline", "Source", "source_for"]
