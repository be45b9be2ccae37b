"""``lab stack down --purge`` (NativeStack.down): state goes only when everything stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.settings import Settings
from lab.stack import children
from lab.stack.base import StackError
from lab.stack.native import NativeStack


def _stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str | None) -> NativeStack:
    settings = Settings().replace(stack_dir=tmp_path / "stack", data_dir=tmp_path / "data")
    settings.stack_dir.mkdir(parents=True)
    (settings.stack_dir / "marker").write_text("pid files live here")
    stack = NativeStack(settings)
    monkeypatch.setattr(children, "stop_all", lambda settings: None)
    monkeypatch.setattr(NativeStack, "_drop_slots", lambda self, errors: None)
    for service in [*stack.debezium.values(), *stack._other_topology(), *stack.services]:
        def stop(*, purge: bool = False, name: str = service.name) -> None:
            if name == failing:
                raise StackError(f"{name} did not exit")
        monkeypatch.setattr(service, "stop", stop)
    return stack


def test_purge_deletes_the_state_when_everything_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = _stack(tmp_path, monkeypatch, failing=None)
    stack.down(purge=True)
    assert not stack.settings.stack_dir.exists()


def test_purge_keeps_the_state_of_a_node_that_did_not_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = _stack(tmp_path, monkeypatch, failing="kafka")
    with pytest.raises(StackError, match=r"kafka did not exit.*state kept in .* \(not purged\)"):
        stack.down(purge=True)
    assert (stack.settings.stack_dir / "marker").exists()  # its pid file is still findable
