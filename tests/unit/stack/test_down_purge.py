"""``lab stack down --purge`` (NativeStack.down): state goes only when everything stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.settings import NotAStackDir, Settings
from lab.stack import children, leftover_slots, proc, stackdir
from lab.stack.base import StackError
from lab.stack.native import NativeStack


def _stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str | None) -> NativeStack:
    settings = Settings().replace(stack_dir=tmp_path / "stack", data_dir=tmp_path / "data")
    settings.stack_dir.mkdir(parents=True)
    (settings.stack_dir / stackdir.MARKER).write_text("")
    (settings.stack_dir / "marker").write_text("pid files live here")
    stack = NativeStack(settings)
    monkeypatch.setattr(children, "stop_all", lambda settings: None)
    monkeypatch.setattr(leftover_slots, "drop_all", lambda settings, errors: None)
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
    stackdir.claim(nested)
    service = proc.spawn(["sleep", "300"], state_dir=nested / "postgres", log_path=nested / "postgres.log")
    assert stackdir.nested_stacks(stack.settings.stack_dir) == [nested]
    stack.down(purge=True)
    assert not service.is_running() or service.status() == "zombie"
    assert not stack.settings.stack_dir.exists()


def test_a_purge_refuses_while_a_nested_stack_is_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command holding a nested stack's lock (the tests' run on `<stack_dir>/test`) refuses the
    purge in one line naming it; nothing is stopped or deleted."""
    import subprocess
    import sys

    stack = _stack(tmp_path, monkeypatch, failing=None)
    nested = stack.settings.stack_dir / "test"
    nested.mkdir()
    (nested / stackdir.MARKER).write_text("")
    service = proc.spawn(["sleep", "300"], state_dir=nested / "postgres", log_path=nested / "postgres.log")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, f'{os.getpid()} lab run --pipeline wal'.encode())\nprint('held', flush=True)\ntime.sleep(60)",
         str(nested / "run.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StackError, match=rf"in use by `lab run --pipeline wal` \(pid {holder.pid}\)"):
            stack.down(purge=True)
        assert service.is_running() and service.status() != "zombie"
        assert (nested / "postgres" / "pid.json").exists() and stack.settings.stack_dir.exists()
    finally:
        holder.kill()
        holder.wait()
        proc.terminate(nested / "postgres", timeout=5)


def test_a_nested_stack_is_purged_with_its_own_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its host layout (and with it its link delay) is removed too, not only its processes stopped."""
    from lab.stack import hosts

    stack = _stack(tmp_path, monkeypatch, failing=None)
    nested = stack.settings.stack_dir / "test"
    nested.mkdir()
    (nested / stackdir.MARKER).write_text("")
    removed: list[Path] = []
    monkeypatch.setattr(hosts, "remove", lambda settings: removed.append(settings.stack_dir) or [])
    stack.down(purge=True)
    assert removed == [nested, stack.settings.stack_dir]
    assert not stack.settings.stack_dir.exists()


def test_only_a_stack_dir_the_lab_made_is_marked(tmp_path: Path) -> None:
    stackdir.claim(tmp_path / "new")
    assert stackdir.is_marked(tmp_path / "new")
    older = tmp_path / "older"  # made by a lab before the marker: nothing but the lab's own names
    (older / "secrets").mkdir(parents=True)
    (older / "secrets" / "secrets.json").write_text("{}")
    (older / "postgres").mkdir()
    (older / "run.lock").write_text("")
    stackdir.claim(older)
    assert stackdir.is_marked(older)
    home = tmp_path / "home"  # someone's files
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    with pytest.raises(NotAStackDir, match=r"home is not a stack dir of the lab's \(it holds notes.txt"):
        stackdir.claim(home)
    assert not stackdir.is_marked(home)


def test_generated_secrets_do_not_make_a_users_directory_the_labs(tmp_path: Path) -> None:
    """A directory holding the lab's secrets beside someone's files (written there by an older
    `lab stack env`) is not taken for a stack dir: every entry must be one the lab makes."""
    mixed = tmp_path / "mixed"
    (mixed / "secrets").mkdir(parents=True)
    (mixed / "secrets" / "secrets.json").write_text("{}")
    (mixed / "notes.txt").write_text("mine")
    with pytest.raises(NotAStackDir):
        stackdir.claim(mixed)
    with pytest.raises(StackError, match="not purged"):
        stackdir.check_purgeable(mixed)
    assert not stackdir.is_marked(mixed)


def test_no_secret_and_no_lock_is_written_into_a_directory_not_the_labs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    s = Settings().replace(stack_dir=home, pg_password=None, rabbitmq_password=None)
    for write in (lambda: s.secret("pg"), lambda: s.pg_passfile, s.connect_env, lambda: s.run_lock):
        with pytest.raises(NotAStackDir):
            write()
    given = s.replace(pg_password="given", rabbitmq_password="given")  # nothing generated, files still
    with pytest.raises(NotAStackDir):
        given.connect_env()
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]


def test_a_users_directory_survives_env_provision_and_purge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """What a user would type: `lab stack env`, `lab stack provision`, `lab stack down --purge` with
    LAB_STACK_DIR at a directory holding their file. Each is refused in one line (exit status 2),
    and the directory keeps exactly what it held."""
    from lab import cli

    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes").write_text("keep\n")
    monkeypatch.setenv("LAB_STACK_DIR", str(d))
    monkeypatch.setenv("LAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LAB_BACKEND", "native")
    monkeypatch.setattr(cli, "get_settings", Settings.from_env)  # not the process's cached settings
    for command in (["stack", "env"], ["stack", "provision"], ["stack", "down", "--purge"]):
        code = cli.main(command)
        err = capsys.readouterr().err
        assert code == 2, (command, err)
        assert len(err.strip().splitlines()) == 1 and str(d) in err, (command, err)
        assert sorted(p.name for p in d.iterdir()) == ["notes"], command
    assert (d / "notes").read_text() == "keep\n"


def test_an_interrupted_purge_keeps_the_marker_to_the_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker goes last: a purge cut short (here: one entry that cannot be deleted) leaves it, and
    the next purge still recognises the directory."""
    d = tmp_path / "stack"
    stackdir.claim(d)
    (d / "postgres").mkdir()
    (d / "kafka").mkdir()
    (d / "kafka" / "kafka.log").write_text("x")
    real = stackdir.rootfs.remove_tree

    def stuck(path: Path) -> None:
        if path.name != "kafka":
            real(path)

    monkeypatch.setattr(stackdir.rootfs, "remove_tree", stuck)
    with pytest.raises(StackError, match="its marker is kept"):
        stackdir.remove(d)
    assert stackdir.is_marked(d) and not (d / "postgres").exists()
    monkeypatch.setattr(stackdir.rootfs, "remove_tree", real)
    stackdir.remove(d)
    assert not d.exists()


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
    from lab.stack.leftover_slots import missing_database

    error = ('connection failed: connection to server at "10.231.7.2", port 5432 failed: '
             'FATAL:  database "lab" does not exist')
    assert missing_database(error, "lab")
    assert not missing_database(error, "other")
    assert not missing_database('connection to server at "10.231.7.2", port 5432 failed: Connection refused', "lab")


def test_slots_a_down_could_not_drop_are_recorded_and_dropped_by_the_next_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`down` on a netns layout that is not routed any more cannot reach PostgreSQL to drop the slots
    (its address would lead off the machine): it records that, and the next `up` drops them."""
    from lab.pg import slots
    from lab.stack import hosts

    settings = Settings().replace(stack_dir=tmp_path / "stack", data_dir=tmp_path / "data", hosts="netns")
    stackdir.claim(settings.stack_dir)
    monkeypatch.setattr(hosts, "routed", lambda settings: False)
    dropped: list[str] = []
    monkeypatch.setattr(slots, "drop_slots", lambda dsn, prefix: dropped.append(prefix) or ["load_test_slot_0"])
    errors: list[str] = []
    leftover_slots.drop_all(settings, errors)  # what `down` does while PostgreSQL runs
    assert errors == [] and dropped == [] and leftover_slots.pending(settings).exists()
    leftover_slots.drop_pending(settings)  # what `up` does once PostgreSQL runs, before the topology's own slot
    assert dropped == [""] and not leftover_slots.pending(settings).exists()
    leftover_slots.drop_pending(settings)  # nothing recorded: nothing dropped
    assert dropped == [""]
