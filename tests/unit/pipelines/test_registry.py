"""Every registered pipeline builds from the one constructor shape and has the protocol's members."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from lab.pipelines import PIPELINES, REGISTRY, SOURCES, source_for
from lab.pipelines.base import Pipeline, SharedResources, Source
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.native import NativeStack


def members(proto: type) -> set[str]:
    """The protocol's public methods and annotated attributes."""
    names = {n for n in vars(proto) if not n.startswith("_")}
    return names | {n for n in getattr(proto, "__annotations__", {}) if not n.startswith("_")}


def test_the_registry_is_the_cli_names() -> None:
    assert list(REGISTRY) == ["wal", "kafka", "wal-sharded", "rabbitmq", "poll", "wal-filtered", "wal-relay",
                            "kafka-share"]
    assert set(PIPELINES) == set(SOURCES) == set(REGISTRY)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_pipeline_builds_from_scenario_settings_stack(name: str) -> None:
    settings = Settings()
    pipeline = PIPELINES[name](Scenario(pipeline=name), settings, NativeStack(settings))
    for member in members(Pipeline):
        assert hasattr(pipeline, member), f"{name} pipeline lacks {member}"
        if inspect.iscoroutinefunction(getattr(Pipeline, member, None)):
            assert inspect.iscoroutinefunction(getattr(pipeline, member)), f"{name}.{member} is not async"
    assert pipeline.name == name  # the CLI value, the result field and the legend label


@pytest.mark.parametrize("name", list(REGISTRY))
def test_source_builds_from_the_one_shape(name: str, tmp_path: Path) -> None:
    scenario = Scenario(pipeline=name)
    source = source_for(scenario, Settings(), 0, run_dir=tmp_path, shared=SharedResources())
    assert isinstance(source, REGISTRY[name].source)  # type: ignore[arg-type]
    for member in members(Source):
        assert hasattr(source, member), f"{name} source lacks {member}"


def test_names_and_colours_cover_the_registry() -> None:
    from lab.scenario import PIPELINE_NAMES
    from lab.study.plots import pipeline_color

    assert set(PIPELINE_NAMES) == set(REGISTRY)
    colours = [pipeline_color(name) for name in REGISTRY]
    assert len(set(colours)) == len(colours) and "C7" not in colours  # each its own, none the unknown grey
