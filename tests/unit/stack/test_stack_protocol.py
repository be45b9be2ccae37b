"""Every stack backend has every member of the Stack protocol, with the protocol's parameters; the
service control is a protocol of its own that only the native backend provides."""

from __future__ import annotations

import inspect

import pytest

from lab.settings import Settings
from lab.stack import controls_services, get_stack
from lab.stack.base import ServiceControl, Stack, services
from lab.stack.compose import ComposeStack
from lab.stack.native import NativeStack


def protocol_members(proto: type) -> dict[str, object]:
    """Name -> the protocol's definition (function or property) of each public member."""
    members = {n: v for n, v in vars(proto).items() if not n.startswith("_")}
    return members | {n: None for n in getattr(proto, "__annotations__", {}) if not n.startswith("_")}


def parameters(fn: object) -> list[tuple[str, object, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_the_common_protocol_is_small_and_the_service_control_apart() -> None:
    common = protocol_members(Stack)
    assert len(common) <= 13, sorted(common)
    assert {"backend", "topology", "settings", "control", "endpoints", "provision", "up", "down", "status",
            "start_debezium", "stop_debezium", "participants", "record"} == set(common)
    control = protocol_members(ServiceControl)
    assert {"kill_debezium", "stop_service", "start_service", "kill_node", "fail_over", "move_debezium",
            "fail_back", "standby"} <= set(control)
    assert not set(common) & set(control)


def _conforms(obj: object, cls: type, proto: type) -> None:
    for name, member in protocol_members(proto).items():
        assert hasattr(obj, name), f"{cls.__name__} lacks {name}"
        if inspect.isfunction(member):
            assert parameters(getattr(cls, name)) == parameters(member), f"{cls.__name__}.{name}"


@pytest.mark.parametrize("cls", [NativeStack, ComposeStack], ids=lambda c: c.__name__)
def test_stack_class_satisfies_the_protocol(cls: type) -> None:
    stack = cls(Settings())
    _conforms(stack, cls, Stack)
    assert stack.backend in ("native", "compose")
    assert stack.topology == "single"


def test_only_the_native_backend_controls_its_services() -> None:
    native, compose = NativeStack(Settings()), ComposeStack(Settings())
    assert native.control is native and compose.control is None
    _conforms(native, NativeStack, ServiceControl)
    assert controls_services(Settings(backend="native")) and not controls_services(Settings(backend="compose"))


def test_get_stack_builds_each_backend() -> None:
    assert isinstance(get_stack(Settings(backend="native")), NativeStack)
    assert isinstance(get_stack(Settings(backend="compose")), ComposeStack)


def test_native_reads_process_trees_compose_reads_containers() -> None:
    native = NativeStack(Settings()).participants()
    assert services(native) == ("postgres", "kafka", "rabbitmq")
    assert {"debezium", "debezium-kafka", "debezium-rabbitmq"} <= set(native)
    assert all(isinstance(roots, list) for roots in native.values())
    assert NativeStack(Settings()).record() == {"images": None}
    compose = ComposeStack(Settings())
    compose._client = object()  # no engine: the counters read nothing until asked
    containers = compose.participants()
    assert services(containers) == ("postgres", "kafka", "rabbitmq")
    assert set(containers) == set(native) and all(callable(c) for c in containers.values())


def test_only_ha_has_a_standby() -> None:
    assert NativeStack(Settings()).standby is None
    assert NativeStack(Settings(topology="ha")).standby is not None
    assert NativeStack(Settings()).queue_replicas("q") is None  # one node: no replicas to ask for
