"""What one run is about, fixed before it starts: :class:`RunEnv`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.measure.cgroups import choose_cpu_method
from lab.pipelines import PIPELINES, Pipeline
from lab.results import new_run_id
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.base import Stack

Progress = Callable[[str, dict[str, Any]], None]
"""Told each phase's name as it starts (``setup``, ``ready``, ``drain`` with ``processed``, ``cooldown``)."""


@dataclass(frozen=True)
class RunEnv:
    """The run's immutable environment, shared by every part of it: what it runs (``scenario``), on
    what (``settings``, ``stack``, the ``pipeline``'s runner half), as which run (``run_id``, its
    ``scratch`` dir under the stack dir: logs, result files, gate files), how it reads CPU
    (``cpu_method``, :mod:`lab.measure.provenance`) and where its progress goes."""

    scenario: Scenario
    settings: Settings
    stack: Stack
    pipeline: Pipeline
    run_id: str
    scratch: Path
    cpu_method: str
    progress: Progress

    @classmethod
    def create(cls, scenario: Scenario, settings: Settings, stack: Stack, progress: Progress) -> RunEnv:
        """A new run of ``scenario``: its id, its pipeline built, its scratch dir made."""
        run_id = new_run_id(scenario.pipeline, scenario.consumers)
        scratch = settings.stack_dir / "runs" / run_id
        scratch.mkdir(parents=True, exist_ok=True)
        return cls(scenario, settings, stack, PIPELINES[scenario.pipeline](scenario, settings, stack), run_id,
                   scratch, choose_cpu_method(settings.cpu_method), progress)
