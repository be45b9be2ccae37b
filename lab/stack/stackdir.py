"""The stack dir's own marker, and what ``lab stack down --purge`` may delete.

The lab writes into a stack dir only once it has claimed it (:func:`lab.settings.claim_stack_dir`):
created with :data:`MARKER`, or marked when it is empty or holds only names the lab creates (a
stack dir an older lab made). A directory holding anything else (a mistyped ``LAB_STACK_DIR``: a
home directory, a project checkout) is refused before anything is written into it, secrets and
lock included. ``--purge`` deletes only a directory the lab would claim, and deletes its marker
last, so a purge cut short can be run again.

Stacks nested under the one purged (the test suite keeps its own under ``<stack_dir>/test``) are
purged first, each by its own ``down``, under its own lock: a nested stack in use is refused,
naming the command that holds it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from lab.settings import STACK_MARKER, claim_stack_dir, foreign_entries
from lab.stack import proc, rootfs
from lab.stack.base import StackError

log = logging.getLogger(__name__)

MARKER = STACK_MARKER
NESTED_DEPTH = 3  # how deep below a purged stack dir nested stacks are looked for
claim = claim_stack_dir


def is_marked(stack_dir: Path) -> bool:
    return (stack_dir / MARKER).is_file()


def nested_stacks(stack_dir: Path) -> list[Path]:
    """Marked stack dirs below ``stack_dir`` (not itself), deepest first, symlinks not followed."""
    found: list[Path] = []
    base = len(stack_dir.parts)
    for root, dirs, files in os.walk(stack_dir, followlinks=False):
        here = Path(root)
        if here != stack_dir and MARKER in files:
            found.append(here)
        if len(here.parts) - base >= NESTED_DEPTH:
            dirs[:] = []
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


@contextlib.contextmanager
def locked(stacks: list[Path]) -> Iterator[None]:
    """Hold the lock of every stack dir in ``stacks`` for the block, each taken without waiting: a
    stack another command uses is refused in one line naming that command and its pid."""
    with contextlib.ExitStack() as held:
        for stack_dir in stacks:
            held.enter_context(proc.exclusive(stack_dir / "run.lock", f"the stack nested in {stack_dir}"))
        yield


def check_purgeable(stack_dir: Path) -> None:
    """Refuse, in one line, to delete a directory the lab would not claim as its stack dir."""
    if is_marked(stack_dir) or not foreign_entries(stack_dir):
        return
    raise StackError(f"not purged: {stack_dir} carries no {MARKER} marker, so the lab did not create it "
                     "as a stack dir; check LAB_STACK_DIR, and delete it yourself if it is one")


def remove(stack_dir: Path) -> None:
    """Delete a stack dir (:func:`check_purgeable` first): every entry but the marker, never through
    a mount (:func:`lab.stack.rootfs.remove_tree`), then the marker, then the directory. A purge cut
    short keeps the marker, so the next one recognises the rest as the lab's."""
    check_purgeable(stack_dir)
    if not stack_dir.exists():
        return
    for entry in stack_dir.iterdir():
        if entry.name == MARKER:
            continue
        if entry.is_dir() and not entry.is_symlink():
            rootfs.remove_tree(entry)
        else:
            entry.unlink(missing_ok=True)
    left = sorted(p.name for p in stack_dir.iterdir() if p.name != MARKER)
    if left:
        raise StackError(f"not purged: {', '.join(left[:3])} in {stack_dir} could not be deleted; "
                         "its marker is kept, so `lab stack down --purge` can be run again")
    (stack_dir / MARKER).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # another process may have created something meanwhile
        stack_dir.rmdir()
