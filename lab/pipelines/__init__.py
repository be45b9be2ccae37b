"""The pipelines, registered by name; the name is the CLI value, result field and label.

A pipeline is two classes with one constructor shape each (:class:`PipelineFactory`,
:class:`SourceFactory`) and one line in :data:`REGISTRY`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lab.pipelines.base import Pipeline, PipelineFactory, SharedResources, Source, SourceFactory
from lab.pipelines.kafka import KafkaPipeline, KafkaSource
from lab.pipelines.kafka_share import KafkaSharePipeline, KafkaShareSource
from lab.pipelines.poll import PollPipeline, PollSource
from lab.pipelines.rabbitmq import RabbitPipeline, RabbitSource
from lab.pipelines.wal import WalPipeline, WalSource
from lab.pipelines.wal_filtered import FilteredWalPipeline, FilteredWalSource
from lab.pipelines.wal_relay import RelayPipeline, RelaySource
from lab.pipelines.wal_sharded import ShardedWalPipeline, ShardedWalSource
from lab.scenario import Scenario
from lab.settings import Settings


@dataclass(frozen=True)
class Registered:
    """A pipeline's two halves: the runner's (built once per run) and the consumers' (one per consumer)."""

    pipeline: PipelineFactory
    source: SourceFactory
    colour: str  # its colour in every figure (a matplotlib colour)


REGISTRY: dict[str, Registered] = {
    "wal": Registered(WalPipeline, WalSource, "C0"),
    "kafka": Registered(KafkaPipeline, KafkaSource, "C3"),
    "wal-sharded": Registered(ShardedWalPipeline, ShardedWalSource, "C2"),
    "rabbitmq": Registered(RabbitPipeline, RabbitSource, "C1"),
    "poll": Registered(PollPipeline, PollSource, "C5"),
    "wal-filtered": Registered(FilteredWalPipeline, FilteredWalSource, "C4"),
    "wal-relay": Registered(RelayPipeline, RelaySource, "C9"),
    "kafka-share": Registered(KafkaSharePipeline, KafkaShareSource, "C8"),
}
PIPELINES: dict[str, PipelineFactory] = {name: r.pipeline for name, r in REGISTRY.items()}
SOURCES: dict[str, SourceFactory] = {name: r.source for name, r in REGISTRY.items()}


def check(scenario: Scenario) -> None:
    """The scenario's options that only some pipelines take, refused elsewhere in one line (by the
    pipeline's capabilities, never its name): ``claim_retention`` prunes ``inbox_wal``."""
    pipeline = PIPELINES[scenario.pipeline]
    if scenario.claim_retention != "never" and pipeline.inbox_table != "inbox_wal":
        raise ValueError(f"claim_retention {scenario.claim_retention!r} prunes the direct readers' claim table "
                         f"inbox_wal; {scenario.pipeline} claims in {pipeline.inbox_table}: use never")


def source_for(
    scenario: Scenario, settings: Settings, index: int, *, run_dir: Path | None = None,
    shared: SharedResources | None = None,
) -> Source:
    """The consumer-side half of ``scenario.pipeline`` for consumer ``index``.

    ``run_dir`` (the run's scratch directory) and ``shared`` (what the consumers of one process
    share, ``tasks`` layout) go to every source; each uses what it needs.
    """
    return SOURCES[scenario.pipeline](scenario, settings, index, run_dir=run_dir, shared=shared)


__all__ = ["PIPELINES", "REGISTRY", "SOURCES", "Pipeline", "PipelineFactory", "Registered", "Source",
           "SourceFactory", "check", "source_for"]
