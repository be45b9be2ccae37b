"""The four pipelines, registered by name; the name is the CLI value, result field and label."""

from __future__ import annotations

from typing import Any

from lab.pipelines.base import Pipeline, Source
from lab.scenario import Scenario
from lab.settings import Settings
from lab.pipelines.wal import WalPipeline, WalSource

PIPELINES: dict[str, type[Any]] = {
    "wal": WalPipeline,
}
SOURCES: dict[str, type[Any]] = {
    "wal": WalSource,
}


def source_for(scenario: Scenario, settings: Settings, index: int) -> Source:
    """The consumer-side half of ``scenario.pipeline`` for consumer ``index``."""
    return SOURCES[scenario.pipeline](scenario, settings, index)


__all__ = ["PIPELINES", "SOURCES", "Pipeline", "Source", "source_for"]
