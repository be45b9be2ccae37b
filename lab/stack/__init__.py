"""Native and compose stacks behind one interface (:class:`~lab.stack.base.Stack`); the native one also
controls its services (:class:`~lab.stack.base.ServiceControl`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lab.stack.base import ServiceControl, Stack, StackError

if TYPE_CHECKING:
    from lab.settings import Settings

BACKENDS = ("native", "compose")


def get_stack(settings: Settings) -> Stack:
    """The stack backend named by ``settings.backend`` (``LAB_BACKEND``)."""
    if settings.backend == "native":
        from lab.stack.native import NativeStack

        return NativeStack(settings)
    if settings.backend == "compose":
        from lab.stack.compose import ComposeStack

        return ComposeStack(settings)
    raise StackError(f"unknown LAB_BACKEND {settings.backend!r}: choose one of {', '.join(BACKENDS)}")


def controls_services(settings: Settings) -> bool:
    """Whether the backend ``settings`` name controls its services (its stack's ``control``: the
    native backend, whose services are processes of its own), known before a stack is built."""
    return settings.backend == "native"


__all__ = ["BACKENDS", "ServiceControl", "Stack", "StackError", "controls_services", "get_stack"]
