"""The stack dir's own marker, and what ``lab stack down --purge`` may delete.

A stack dir the lab creates carries :data:`MARKER`. ``--purge`` deletes a directory only when it
carries it, so a mistyped ``LAB_STACK_DIR`` (a home directory, a project checkout) is refused
instead of deleted. A stack dir made by an older lab is recognised by its generated secrets and
marked at its next start. Stacks nested under the one purged (the test suite keeps its own under
``<stack_dir>/test``) are stopped first, by their recorded pids.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lab.stack import proc
from lab.stack.base import StackError

log = logging.getLogger(__name__)

MARKER = ".fanout-lab-stack"
NESTED_DEPTH = 3  # how deep below a purged stack dir nested stacks are looked for
_LAB_ONLY = {MARKER, "run.lock"}  # what a stack dir holds before its first start (the lock)


def is_marked(stack_dir: Path) -> bool:
    return (stack_dir / MARKER).is_file()


def mark(stack_dir: Path) -> bool:
    """Create ``stack_dir`` with its marker, or mark an existing one the lab made (empty but for
    the lock, or holding the lab's generated secrets). Returns whether it is marked now."""
    stack_dir.mkdir(parents=True, exist_ok=True)
    if is_marked(stack_dir):
        return True
    names = {p.name for p in stack_dir.iterdir()}
    if names <= _LAB_ONLY or (stack_dir / "secrets" / "secrets.json").is_file():
        fd = os.open(stack_dir / MARKER, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"a fanout-lab stack dir: `lab stack down --purge` may delete it\n")
        os.close(fd)
        return True
    log.warning("%s holds files the lab did not create: not marked, `lab stack down --purge` will keep it",
                stack_dir)
    return False


def nested_stacks(stack_dir: Path) -> list[Path]:
    """Marked stack dirs below ``stack_dir`` (not itself), symlinks not followed."""
    found: list[Path] = []
    base = len(stack_dir.parts)
    for root, dirs, files in os.walk(stack_dir, followlinks=False):
        here = Path(root)
        if here != stack_dir and MARKER in files:
            found.append(here)
        if len(here.parts) - base >= NESTED_DEPTH:
            dirs[:] = []
    return found


def stop_recorded(stack_dir: Path, timeout: float = 30.0) -> list[int]:
    """Stop every process recorded by a pid file under ``stack_dir`` (services and a run's
    children); returns the pids that were running."""
    stopped: list[int] = []
    for pid_file in sorted(stack_dir.rglob(proc.pidfile(Path()).name)):
        running = proc.running(pid_file.parent)
        if running is not None:
            stopped.append(running.pid)
            proc.terminate(pid_file.parent, timeout=timeout)
    return stopped


def check_purgeable(stack_dir: Path) -> None:
    """Refuse, in one line, to delete a directory the lab did not mark as its stack dir."""
    if not stack_dir.exists() or is_marked(stack_dir):
        return
    if {p.name for p in stack_dir.iterdir()} <= _LAB_ONLY:  # only the lock this very command created
        return
    raise StackError(f"not purged: {stack_dir} carries no {MARKER} marker, so the lab did not create it "
                     "as a stack dir; check LAB_STACK_DIR, and delete it yourself if it is one")
