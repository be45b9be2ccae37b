"""The pipelines, registered by name; the name is the CLI value, result field and label.

A pipeline is two classes with one constructor shape each (:class:`PipelineFactory`,
:class:`SourceFactory`) and one line in :data:`REGISTRY`; what it is (its
:class:`~lab.pipelines.base.Capabilities`) is declared on its class, and only its own module
decides anything by its name. :func:`check` says in one line why a scenario does not fit its
pipeline (the twin of :func:`lab.faults.check`); the CLI and :func:`lab.runner.run_scenario` call it
before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lab.pipelines.base import (
    BacklogReader,
    Capabilities,
    Pipeline,
    PipelineFactory,
    SharedResources,
    Source,
    SourceFactory,
)
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
    "wal-sharded": Registered(ShardedWalPipeline, ShardedWalSource, "C2"),
    "kafka": Registered(KafkaPipeline, KafkaSource, "C3"),
    "rabbitmq": Registered(RabbitPipeline, RabbitSource, "C1"),
    "poll": Registered(PollPipeline, PollSource, "C5"),
    "wal-filtered": Registered(FilteredWalPipeline, FilteredWalSource, "C4"),
    "wal-relay": Registered(RelayPipeline, RelaySource, "C9"),
    "kafka-share": Registered(KafkaSharePipeline, KafkaShareSource, "C8"),
}
PIPELINES: dict[str, PipelineFactory] = {name: r.pipeline for name, r in REGISTRY.items()}
SOURCES: dict[str, SourceFactory] = {name: r.source for name, r in REGISTRY.items()}
NAMES = tuple(REGISTRY)  # the order of every table, series and legend


def check(scenario: Scenario) -> None:
    """ValueError (one line) when ``scenario``'s pipeline is not registered, or does not take what
    the scenario asks of it (a broker-native stand, ``producer="direct"``; ``claim_retention``, which
    prunes ``inbox_wal``)."""
    registered = REGISTRY.get(scenario.pipeline)
    if registered is None:
        raise ValueError(f"unknown pipeline {scenario.pipeline!r}: choose one of {', '.join(NAMES)}")
    capabilities = registered.pipeline.capabilities
    why = capabilities.stand_refusal
    if scenario.producer == "direct" and why is not None:
        raise ValueError(f"{scenario.pipeline} has no broker-native stand: {why}")
    if scenario.claim_retention != "never" and capabilities.inbox_table != "inbox_wal":
        raise ValueError(f"claim_retention {scenario.claim_retention!r} prunes the direct readers' claim table "
                         f"inbox_wal; {scenario.pipeline} claims in {capabilities.inbox_table}: use never")


def source_for(
    scenario: Scenario, settings: Settings, index: int, *, run_dir: Path | None = None,
    shared: SharedResources | None = None,
) -> Source:
    """The consumer-side half of ``scenario.pipeline`` for consumer ``index``.

    ``run_dir`` (the run's scratch directory) and ``shared`` (what the consumers of one process
    share, ``tasks`` layout) go to every source; each uses what it needs.
    """
    return SOURCES[scenario.pipeline](scenario, settings, index, run_dir=run_dir, shared=shared)


__all__ = ["NAMES", "PIPELINES", "REGISTRY", "SOURCES", "BacklogReader", "Capabilities", "Pipeline",
           "PipelineFactory", "Registered", "Source", "SourceFactory", "check", "source_for"]
