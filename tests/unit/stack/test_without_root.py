"""Without root the native stack starts what it can: RabbitMQ 4.0 (a chroot) is left out and
named, PostgreSQL and Kafka stay in (the wal pipelines need nothing else)."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest

from lab.settings import Settings
from lab.stack.base import StackError
from lab.stack.native import NativeStack
from lab.stack.rabbitmq_broker import root_needed


def test_root_needed_names_the_reason() -> None:
    assert "chroot" in (root_needed("4.0", host_installed=True) or "")
    assert "LAB_RABBITMQ_VERSION=3.10 bash scripts/system-deps.sh" in (root_needed("3.10", host_installed=False) or "")
    assert root_needed("3.10", host_installed=True) is None


def test_a_missing_rabbitmq_310_is_named_not_installed_by_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` and `run` provision; as root, with the host's 3.10 package missing, they run no apt-get
    (which would start the distribution's broker on every interface, with no timeout): one line says
    how to install it with the script that keeps that broker from starting."""
    import subprocess

    from lab.stack import rabbitmq_broker

    monkeypatch.setattr(rabbitmq_broker, "SCRIPTS", tmp_path / "no-rabbitmq" / "bin")
    monkeypatch.setattr(rabbitmq_broker, "is_root", lambda: True)
    ran: list[object] = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: ran.append(a) or subprocess.CompletedProcess(a, 0))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: ran.append(a))
    settings = Settings().replace(stack_dir=tmp_path / "stack", rabbitmq_version="3.10")
    with pytest.raises(StackError, match=r"RabbitMQ 3.10 is not installed .*LAB_RABBITMQ_VERSION=3.10 bash "
                                         r"scripts/system-deps.sh"):
        rabbitmq_broker.RabbitMQService(settings).provision()
    assert ran == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become an unprivileged user")
def test_an_unprivileged_user_starts_all_but_rabbitmq_4(tmp_path: Path) -> None:
    """A real unprivileged process (forked, then setuid nobody; the interpreter is not readable by
    nobody here, so no exec): which services `stack up` would start, and the one-line reason."""
    nobody = pwd.getpwnam("nobody")
    settings = Settings().replace(stack_dir=tmp_path / "stack", data_dir=tmp_path / "data", rabbitmq_version="4.0")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            stack = NativeStack(settings)
            names = [s.name for s in stack._startable()]
            os.write(write, json.dumps({"uid": os.geteuid(), "names": names, "skipped": stack.skipped}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = json.loads(f.read())
    os.waitpid(pid, 0)
    assert out["uid"] == nobody.pw_uid
    assert out["names"] == ["postgres", "kafka"]
    assert list(out["skipped"]) == ["rabbitmq"] and "chroot" in out["skipped"]["rabbitmq"]
    as_root = NativeStack(settings)
    assert [s.name for s in as_root._startable()] == ["postgres", "kafka", "rabbitmq"] and not as_root.skipped


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become an unprivileged user")
def test_a_stack_dir_of_another_user_ends_every_command_in_one_line(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`lab stack up`/`down --purge`/`run` as nobody on root's 0700 stack dir: one line naming the
    path, no traceback (forked and setuid, as above)."""
    import io
    import sys

    from lab import cli
    from lab.settings import get_settings

    stack = tmp_path / "stack"
    stack.mkdir(mode=0o700)
    tmp_path.chmod(0o755)
    monkeypatch.setenv("LAB_STACK_DIR", str(stack))
    monkeypatch.setenv("LAB_DATA_DIR", str(stack / "data"))
    get_settings.cache_clear()
    nobody = pwd.getpwnam("nobody")
    results = []
    for argv in (["stack", "up"], ["stack", "down", "--purge"], ["run", "--messages", "10"]):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                sys.stderr = io.StringIO()
                code = cli.main(argv)
                os.write(write, json.dumps({"code": code, "err": sys.stderr.getvalue()}).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            results.append((argv, json.loads(f.read() or '{"code": null, "err": "child died"}')))
        os.waitpid(pid, 0)
    get_settings.cache_clear()
    for argv, out in results:
        lines = out["err"].strip().splitlines()
        assert out["code"] not in (0, None) and len(lines) == 1, (argv, out)
        assert "Traceback" not in out["err"] and str(stack) in lines[0] and "Permission denied" in lines[0], (argv, out)
