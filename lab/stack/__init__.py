"""Native and compose stacks behind one interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lab.stack.base import StackError

if TYPE_CHECKING:
    from lab.settings import Settings
    from lab.stack.compose import ComposeStack
    from lab.stack.native import NativeStack

BACKENDS = ("native", "compose")


def get_stack(settings: Settings) -> NativeStack | ComposeStack:
    """The stack backend named by ``settings.backend`` (``LAB_BACKEND``)."""
    if settings.backend == "native":
        from lab.stack.native import NativeStack

        return NativeStack(settings)
    if settings.backend == "compose":
        from lab.stack.compose import ComposeStack

        return ComposeStack(settings)
    raise StackError(f"unknown LAB_BACKEND {settings.backend!r}: choose one of {', '.join(BACKENDS)}")
