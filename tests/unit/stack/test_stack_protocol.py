"""Every stack backend has every member of the Stack protocol, with the protocol's parameters."""

from __future__ import annotations

import inspect

import pytest

from lab.settings import Settings
from lab.stack import get_stack
from lab.stack.base import Stack, StackError
from lab.stack.compose import ComposeStack
from lab.stack.native import NativeStack


def protocol_members(proto: type) -> dict[str, object]:
    """Name -> the protocol's definition (function or property) of each public member."""
    return {n: v for n, v in vars(proto).items() if not n.startswith("_")}


def parameters(fn: object) -> list[tuple[str, object, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_the_protocol_covers_what_callers_use() -> None:
    members = protocol_members(Stack)
    for name in ("backend", "topology", "standby", "rabbitmq", "service_names", "counters", "participants",
                 "record", "start_debezium", "stop_debezium", "kill_debezium", "fail_over"):
        assert name in members


@pytest.mark.parametrize("cls", [NativeStack, ComposeStack], ids=lambda c: c.__name__)
def test_stack_class_satisfies_the_protocol(cls: type) -> None:
    stack = cls(Settings())
    for name, member in protocol_members(Stack).items():
        assert hasattr(stack, name), f"{cls.__name__} lacks {name}"
        if inspect.isfunction(member):
            assert parameters(getattr(cls, name)) == parameters(member), f"{cls.__name__}.{name}"
    assert stack.backend in ("native", "compose")
    assert stack.topology == "single"
    assert set(stack.service_names) == {"postgres", "kafka", "rabbitmq"}


def test_get_stack_builds_each_backend() -> None:
    assert isinstance(get_stack(Settings(backend="native")), NativeStack)
    assert isinstance(get_stack(Settings(backend="compose")), ComposeStack)


def test_native_reads_process_trees_compose_reads_containers() -> None:
    assert NativeStack(Settings()).counters() is None
    assert NativeStack(Settings()).record() == {"images": None}
    with pytest.raises(StackError, match="container"):
        ComposeStack(Settings()).participants()


@pytest.mark.parametrize("call", [
    lambda s: s.kill_debezium("kafka"), lambda s: s.stop_service("kafka"), lambda s: s.start_service("kafka"),
    lambda s: s.kill_node("kafka-1"), lambda s: s.fail_over(), lambda s: s.move_debezium("kafka", 1),
    lambda s: s.fail_back(), lambda s: s.start_debezium("kafka", resume=True),
])
def test_compose_refuses_native_only_faults_in_one_line(call: object) -> None:
    with pytest.raises(StackError, match="LAB_BACKEND=native") as info:
        call(ComposeStack(Settings()))  # type: ignore[operator]
    assert "\n" not in str(info.value)


def test_only_ha_has_a_standby() -> None:
    assert NativeStack(Settings()).standby is None
    assert NativeStack(Settings(topology="ha")).standby is not None
    assert ComposeStack(Settings()).standby is None
