"""Every registered pipeline builds from the one constructor shape, has the protocol's members and
declares what it is; the pipelines' check refuses what a scenario asks of a pipeline that does not take it."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from lab.pipelines import NAMES, PIPELINES, REGISTRY, SOURCES, Capabilities, check, source_for
from lab.pipelines.base import Pipeline, SharedResources, Source
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.native import NativeStack


def members(proto: type) -> set[str]:
    """The protocol's public methods and annotated attributes."""
    names = {n for n in vars(proto) if not n.startswith("_")}
    return names | {n for n in getattr(proto, "__annotations__", {}) if not n.startswith("_")}


def test_the_registry_is_the_cli_names() -> None:
    assert list(REGISTRY) == ["wal", "wal-sharded", "kafka", "rabbitmq", "poll", "wal-filtered", "wal-relay",
                              "kafka-share"]
    assert set(PIPELINES) == set(SOURCES) == set(REGISTRY) and tuple(REGISTRY) == NAMES


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


@pytest.mark.parametrize("name", list(REGISTRY))
def test_a_pipeline_gives_its_brokers_backlog_reader(name: str, tmp_path: Path) -> None:
    """Each pipeline declares its capabilities on its class, and gives the reader of the backlog in
    its broker (one that says where it reads), or none without a broker."""
    settings = Settings()
    factory = PIPELINES[name]
    assert isinstance(factory.capabilities, Capabilities)
    reader = factory(Scenario(pipeline=name), settings, NativeStack(settings)).backlog(tmp_path)
    broker = factory.capabilities.broker
    assert (reader is None) == (broker is None) and (reader is None or reader.where == broker)
    assert factory.capabilities.stand_target == (broker or "pg")


def test_the_check_refuses_an_unregistered_pipeline_and_what_one_does_not_take() -> None:
    with pytest.raises(ValueError, match="unknown pipeline 'nats': choose one of wal, wal-sharded, kafka"):
        check(Scenario(pipeline="nats"))
    with pytest.raises(ValueError, match="kafka-share has no broker-native stand"):
        check(Scenario(pipeline="kafka-share", producer="direct"))
    for name in REGISTRY:
        check(Scenario(pipeline=name))


def test_colours_cover_the_registry() -> None:
    from lab.study.plots import pipeline_color

    colours = [pipeline_color(name) for name in REGISTRY]
    assert len(set(colours)) == len(colours) and "C7" not in colours  # each its own, none the unknown grey
