"""``lab stack down --purge`` (NativeStack.down): state goes only when everything stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.settings import Settings
from lab.stack import children, proc, stackdir
from lab.stack.base import StackError
from lab.stack.native import NativeStack


def _stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str | None) -> NativeStack:
    settings = Settings().replace(stack_dir=tmp_path / "stack", data_dir=tmp_path / "data")
    settings.stack_dir.mkdir(parents=True)
    stackdir.mark(settings.stack_dir)
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


def test_purge_refuses_a_directory_the_lab_did_not_mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = _stack(tmp_path, monkeypatch, failing=None)
    (stack.settings.stack_dir / stackdir.MARKER).unlink()  # e.g. LAB_STACK_DIR set to a home directory
    with pytest.raises(StackError, match=r"not purged: .* carries no \.fanout-lab-stack marker"):
        stack.down(purge=True)
    assert (stack.settings.stack_dir / "marker").exists()


def test_purge_stops_a_nested_stack_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = _stack(tmp_path, monkeypatch, failing=None)
    nested = stack.settings.stack_dir / "test"
    assert stackdir.mark(nested)
    service = proc.spawn(["sleep", "300"], state_dir=nested / "postgres", log_path=nested / "postgres.log")
    assert stackdir.nested_stacks(stack.settings.stack_dir) == [nested]
    stack.down(purge=True)
    assert not service.is_running() or service.status() == "zombie"
    assert not stack.settings.stack_dir.exists()


def test_only_a_stack_dir_the_lab_made_is_marked(tmp_path: Path) -> None:
    assert stackdir.mark(tmp_path / "new") and stackdir.is_marked(tmp_path / "new")
    older = tmp_path / "older"  # made by a lab before the marker: its generated secrets
    (older / "secrets").mkdir(parents=True)
    (older / "secrets" / "secrets.json").write_text("{}")
    (older / "postgres").mkdir()
    assert stackdir.mark(older)
    home = tmp_path / "home"  # someone's files
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    assert not stackdir.mark(home) and not stackdir.is_marked(home)


def test_a_stack_dir_holding_only_the_lock_of_this_command_is_purged(tmp_path: Path) -> None:
    """`lab stack down --purge` on a stack never started: its lock made the dir, the purge removes it."""
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "run.lock").write_text("")
    stackdir.check_purgeable(fresh)  # no error
    (fresh / "notes.txt").write_text("mine")
    with pytest.raises(StackError, match="not purged"):
        stackdir.check_purgeable(fresh)


def test_a_refused_purge_leaves_no_lock_file_behind(tmp_path: Path) -> None:
    """Through the console entry point: a directory without the marker is refused in one line
    (exit status 2) and keeps exactly what it held; no ``run.lock`` is created in it."""
    import os
    import subprocess
    import sys

    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    env = {**os.environ, "LAB_STACK_DIR": str(foreign), "LAB_DATA_DIR": str(tmp_path / "data"), "LAB_BACKEND": "native"}
    res = subprocess.run([sys.executable, "-m", "lab", "stack", "down", "--purge"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"lab: error: not purged: {foreign} carries no .fanout-lab-stack marker, so the lab did not create it "
        "as a stack dir; check LAB_STACK_DIR, and delete it yourself if it is one"]
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_a_database_never_created_is_recognised_in_the_login_error() -> None:
    """`lab stack down` after an `up` killed before it created the lab's database: no slot can exist."""
    from lab.stack.native import missing_database
    error = ('connection failed: connection to server at "10.231.7.2", port 5432 failed: '
             'FATAL:  database "lab" does not exist')
    assert missing_database(error, "lab")
    assert not missing_database(error, "other")
    assert not missing_database('connection to server at "10.231.7.2", port 5432 failed: Connection refused', "lab")
