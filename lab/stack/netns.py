"""Entering a network namespace: the one primitive every part of the host layout shares.

A thread is switched into a namespace with ``setns(2)`` and back afterwards (:func:`entered`):
sockets it opens and processes it starts belong there, and a child keeps its pid (so pid files,
cgroups and CPU accounting work as on loopback) and its parent-death signal.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

from lab.stack.base import StackError

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise StackError(f"cannot enter a network namespace: {os.strerror(err)}")


@contextlib.contextmanager
def entered(netns: str | None) -> Iterator[None]:
    """Within the block this thread is in network namespace ``netns`` (None: stays where it is):
    sockets it opens and processes it starts belong there. Back in its own one afterwards."""
    if netns is None:
        yield
        return
    try:
        target = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StackError(f"network namespace {netns} does not exist; start the stack "
                         "(`lab stack up --hosts netns`)") from None
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def inode(netns: str) -> int | None:
    """The identity of a named namespace (its inode), None when it does not exist: a namespace
    removed and made again under the same name is another one."""
    try:
        return (NETNS_DIR / netns).stat().st_ino
    except FileNotFoundError:
        return None
