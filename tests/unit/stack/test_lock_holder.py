"""The stack lock's holder as a refused command names it, and the exit status of a signal."""

from __future__ import annotations

from lab.stack.proc import Interrupted, inherited, lock_holder


def test_lock_holder_names_the_command_and_its_pid() -> None:
    assert lock_holder("4242 lab run --pipeline wal") == "`lab run --pipeline wal` (pid 4242)"
    assert lock_holder("4242") == "another lab process (pid 4242)"  # a lock written by an older lab
    assert lock_holder("") == "another lab process (pid ?)"


def test_interrupted_exits_with_the_shell_status_of_its_signal() -> None:
    assert Interrupted("SIGTERM").exit_status == 143
    assert Interrupted("SIGINT").exit_status == 130
    assert str(Interrupted("SIGTERM", "run x stored")) == "interrupted by SIGTERM: run x stored"


def test_a_lock_is_inherited_only_from_an_ancestor_named_as_its_holder() -> None:
    import os

    parent = os.getppid()
    assert inherited(f"{parent} lab report --profile quick", parent)
    assert not inherited(f"{parent} lab report", None)  # not told: refused as before
    assert not inherited(f"{parent + 1} lab report", parent)  # the file names another holder
    assert not inherited(f"{os.getpid()} lab run", os.getpid())  # itself is no ancestor (re-entry is by fd)
    assert not inherited("", parent)
