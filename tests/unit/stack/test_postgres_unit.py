"""Pure logic of lab.stack.postgres: version parsing, lock file, argv, traverse permissions."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from lab.stack.base import StackError
from lab.stack.postgres import (
    SERVER_FLAGS,
    lock_pid,
    lock_port,
    missing_search_bit,
    parse_version,
    server_argv,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgres (PostgreSQL) 18.6\n", (18, "18.6")),
        ("postgres (PostgreSQL) 18beta1", (18, "18beta1")),
        ("postgres (PostgreSQL) 9.6.24", (9, "9.6.24")),
    ],
)
def test_parse_version(text: str, expected: tuple[int, str]) -> None:
    assert parse_version(text) == expected


def test_parse_version_rejects_garbage() -> None:
    with pytest.raises(StackError, match="cannot read a PostgreSQL version"):
        parse_version("bash: postgres: command not found")


def test_lock_file_fields(tmp_path: Path) -> None:
    assert lock_pid(tmp_path) is None and lock_port(tmp_path) is None
    (tmp_path / "postmaster.pid").write_text(
        f"4242\n{tmp_path}\n1764474606\n25532\n/tmp/sock\n127.0.0.1\n  123456    65536\nready   \n"
    )
    assert (lock_pid(tmp_path), lock_port(tmp_path)) == (4242, 25532)
    (tmp_path / "postmaster.pid").write_text("")  # a postmaster that died while writing it
    assert (lock_pid(tmp_path), lock_port(tmp_path)) == (None, None)


def test_server_argv_carries_every_reference_flag(tmp_path: Path) -> None:
    argv = server_argv(Path("/pg/bin/postgres"), tmp_path / "data", 25532, tmp_path / "sock")
    assert argv[:3] == ["/pg/bin/postgres", "-D", str(tmp_path / "data")]
    pairs = dict(a.split("=", 1) for a in argv[4::2])
    assert argv[3::2] == ["-c"] * len(pairs)
    assert pairs == {
        "wal_level": "logical",
        "max_connections": "400",
        "max_replication_slots": "64",
        "max_wal_senders": "64",
        "idle_replication_slot_timeout": "1h",
        "max_slot_wal_keep_size": "4096MB",
        "max_wal_size": "8GB",
        "wal_sender_timeout": "0",
        "listen_addresses": "127.0.0.1",
        "port": "25532",
        "unix_socket_directories": str(tmp_path / "sock"),
    }
    assert set(SERVER_FLAGS) < set(pairs)
    no_socket = server_argv(Path("/pg/bin/postgres"), tmp_path, 25532, None)
    assert "unix_socket_directories=" in no_socket


@pytest.mark.parametrize(
    ("mode", "owner", "group", "expected"),
    [
        (0o700, 0, 0, stat.S_IXOTH),  # root's private dir: others need o+x
        (0o711, 0, 0, 0),
        (0o755, 0, 0, 0),
        (0o750, 0, 995, 0),  # the user's group may pass
        (0o705, 0, 995, stat.S_IXGRP),  # group bits apply to members even if others may pass
        (0o077, 999, 0, stat.S_IXUSR),  # owner bits apply to the owner
        (0o700, 999, 0, 0),
    ],
)
def test_missing_search_bit(mode: int, owner: int, group: int, expected: int) -> None:
    assert missing_search_bit(mode, owner, group, 999, {995}) == expected


def test_root_needs_no_search_bit() -> None:
    assert missing_search_bit(0o000, 1, 1, 0, {0}) == 0
