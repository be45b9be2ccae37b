"""Start, find and stop the lab's own processes, by pid and never by name.

Every process is started detached (its own session, so it survives ``lab stack up``) and
recorded in ``<stack_dir>/<name>/pid.json`` with its start time, so that a recycled pid is
never mistaken for ours. The start time is the kernel's, in clock ticks since boot
(:func:`start_ticks`), not psutil's ``create_time``: that one is boot time plus ticks in wall
clock seconds and moves whenever the wall clock is stepped (measured on the shared VM: 82 s
within an hour), which made running services look foreign. Inside :func:`tied` (a run starting its
Debezium Server) a process is also given a parent-death signal: it dies with the thread that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import fcntl
import json
import logging
import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil

from lab.stack.base import StackError
from lab.stack.netns import entered, reachable

T = TypeVar("T")

log = logging.getLogger(__name__)


PR_SET_PDEATHSIG = 1
_tied: contextvars.ContextVar[bool] = contextvars.ContextVar("lab_tied", default=False)


def die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGKILL when its parent thread exits (Linux
    ``PR_SET_PDEATHSIG``), and exits at once if the parent ``parent`` is already gone."""

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: nobody would stop us
            os._exit(1)

    return arm


@contextlib.contextmanager
def tied() -> Iterator[None]:
    """Within the block (and in threads ``asyncio.to_thread`` starts from it) :func:`spawn`
    ties each process to the thread that starts it; a run starts its Debezium this way.

    The default executor's threads live as long as the event loop, so a process started in
    ``to_thread`` dies when the loop is closed or the runner process dies, whichever is first.
    """
    token = _tied.set(True)
    try:
        yield
    finally:
        _tied.reset(token)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Within the block SIGTERM and SIGINT interrupt nothing: the first one is delivered again to its
    own handler (an :class:`Interrupted`, a KeyboardInterrupt) once the block is over, so that a
    process started is always recorded (:func:`spawn`) and a rollback always runs to its end (a
    second signal while ``up`` undoes what it started). Only the main thread's handlers run Python
    code, and inside a running event loop a signal cancels at the next ``await``: elsewhere the
    block runs as it is."""
    try:
        asyncio.get_running_loop()
        in_loop = True
    except RuntimeError:
        in_loop = False
    if in_loop or threading.current_thread() is not threading.main_thread():
        yield
        return
    hit: list[int] = []
    sigs = (signal.SIGTERM, signal.SIGINT)
    old = {sig: signal.signal(sig, lambda signum, frame: hit.append(signum)) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if hit:  # after the block only, and only when it ended normally: an exception already propagates
        signal.raise_signal(hit[0])


def start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``: when ``pid`` started, in ticks since boot; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return int(raw[raw.rindex(b")") + 2:].split()[19])


def same_process(record: dict[str, object]) -> psutil.Process | None:
    """The live, non-zombie process a record (``pid``, ``start_ticks``) names, else None."""
    try:
        pid = int(record["pid"])  # type: ignore[call-overload]
        ticks = start_ticks(pid)
        if ticks is None or ticks != record.get("start_ticks"):
            return None
        p = psutil.Process(pid)
        return None if p.status() == psutil.STATUS_ZOMBIE else p
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


def pidfile(state_dir: Path) -> Path:
    return state_dir / "pid.json"


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    *,
    state_dir: Path,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
    netns: str | None = None,
) -> psutil.Process:
    """Start ``argv`` detached, log to ``log_path``, record it in ``state_dir/pid.json``;
    ``netns``: inside that network namespace (:func:`lab.stack.netns.entered`)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    group = extra_groups = None
    if user is not None and os.geteuid() == 0:  # drop root's gid and groups too, not just the uid
        group, extra_groups = pwd.getpwnam(user).pw_gid, list[int]()
    # a signal between the start and the pid file would leave a service nobody can find: deferred
    with deferred_signals(), open(log_path, "ab") as out, entered(netns):
        popen = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            user=user,
            group=group,
            extra_groups=extra_groups,
            start_new_session=True,
            close_fds=True,
            preexec_fn=die_with_parent(os.getpid()) if _tied.get() else None,
        )
        proc = psutil.Process(popen.pid)
        record = {"pid": proc.pid, "start_ticks": start_ticks(proc.pid), "create_time": proc.create_time(),
                  "argv": [str(a) for a in argv]}  # create_time: for readers of older records only
        tmp = pidfile(state_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(pidfile(state_dir))
    return proc


def running(state_dir: Path) -> psutil.Process | None:
    """Our recorded process if it is still alive (same pid and start time), else None."""
    path = pidfile(state_dir)
    try:
        record = json.loads(path.read_text())
        if "start_ticks" not in record:  # a pid file written before start ticks were recorded:
            proc = psutil.Process(record["pid"])  # same start time, or (clock stepped) same argv
            if abs(proc.create_time() - record["create_time"]) > 0.01 and \
                    proc.cmdline() != record.get("argv"):
                return None
        else:
            if start_ticks(record["pid"]) != record["start_ticks"]:
                return None
            proc = psutil.Process(record["pid"])
        if proc.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(proc.pid, os.WNOHANG)
            return None
        return proc
    except (FileNotFoundError, ValueError, KeyError, psutil.Error):
        return None


def terminate(
    state_dir: Path, *, timeout: float = 30.0, sig: int = signal.SIGTERM
) -> bool:
    """Stop our recorded process tree: ``sig``, wait up to ``timeout``, then SIGKILL.

    Returns True if something was running. The pid file is removed either way.
    """
    proc = running(state_dir)
    if proc is None:
        pidfile(state_dir).unlink(missing_ok=True)
        return False
    tree = [proc]
    with contextlib.suppress(psutil.Error):
        tree += proc.children(recursive=True)
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(sig)
    alive = wait_gone([proc], timeout=timeout)
    for p in alive + tree[1:]:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running():
                p.kill()
    wait_gone(tree, timeout=5)
    pidfile(state_dir).unlink(missing_ok=True)
    return True


def _gone(p: psutil.Process) -> bool:
    """Exited: not running any more, or a zombie that is ours and reaped here or someone else's.

    A zombie thread-group leader whose other threads are still exiting (a JVM shutting down)
    has not exited yet, nor has a child of ours that ``waitpid`` cannot reap yet.
    """
    try:
        if not p.is_running():
            return True
        if p.status() != psutil.STATUS_ZOMBIE:
            return False
        if len(os.listdir(f"/proc/{p.pid}/task")) > 1:
            return False
    except (psutil.NoSuchProcess, FileNotFoundError):
        return True
    try:
        return os.waitpid(p.pid, os.WNOHANG)[0] != 0
    except ChildProcessError:  # not our child: its parent reaps it
        return True


def wait_gone(
    procs: Sequence[psutil.Process], *, timeout: float, interval: float = 0.1
) -> list[psutil.Process]:
    """Wait until every process has exited; return those still alive after ``timeout``.

    Unlike ``psutil.wait_procs`` a zombie counts as exited: the stack's processes are children
    of whoever started them (a Python session, a notebook kernel, a PID 1 that never reaps), so
    another process stopping them would otherwise wait out the whole timeout for each one.
    """
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if not _gone(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts a TCP connection on ``host``:``port``. A netns layout address
    that is not routed onto the lab's bridge (:func:`lab.stack.netns.reachable`) is not open, and
    no packet is sent to it."""
    if not reachable(host):
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def require_free(port: int, what: str, setting: str, host: str = "127.0.0.1") -> None:
    """Fail with one clear line if something else listens on ``port`` (of ``host``)."""
    if port_open(port, host):
        raise StackError(
            f"port {port} needed by {what} is already in use by another process; "
            f"stop that process or choose another port with {setting}=<port>"
        )


def wait_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    proc: psutil.Process | None = None,
    log_path: Path | None = None,
    interval: float = 0.2,
) -> None:
    """Poll ``check`` until true; fail early with the log's tail if ``proc`` dies."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if check():
                return
        if proc is not None and (not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE):
            raise StackError(f"{what} exited during start-up; last log lines: {tail(log_path)}")
        if time.monotonic() > deadline:
            raise StackError(f"{what} not ready after {timeout:.0f} s; last log lines: {tail(log_path)}")
        time.sleep(interval)


def tail(path: Path | None, lines: int = 5) -> str:
    if path is None or not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return " | ".join(line.strip() for line in text) or "(empty log)"


def tree_rss_mb(procs: Sequence[psutil.Process]) -> float:
    total = 0
    for root in procs:
        with contextlib.suppress(psutil.Error):
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
    return round(total / 2**20, 1)


def ensure_os_user(name: str, home: Path) -> tuple[int, int]:
    """Create (once) the unprivileged system user that runs PostgreSQL when we are root."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--home-dir", str(home),
             "--shell", "/usr/sbin/nologin", name],
            check=True, capture_output=True,
        )
        pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


_held: dict[Path, list[int]] = {}  # lock file -> [fd, depth] held by this process


def holder_label() -> str:
    """What this process is, for a refused one's message: its command line, shortened."""
    if not sys.argv or not sys.argv[0]:
        return ""
    name = Path(sys.argv[0]).name
    return " ".join(["lab" if name == "__main__.py" else name, *sys.argv[1:]])[:200]


def lock_holder(text: str) -> str:
    """The lock file's ``"<pid> <command>"`` as one message part: ``lab run ... (pid 123)``."""
    pid, _, label = text.strip().partition(" ")
    if not pid:
        return "another lab process (pid ?)"
    return f"`{label}` (pid {pid})" if label else f"another lab process (pid {pid})"


def inherited(text: str, owner: int | None) -> bool:
    """Whether the lock file's ``"<pid> <command>"`` names ``owner`` and ``owner`` is an ancestor of
    this process: a command that holds the lock for its children (``lab report`` and the notebook
    kernel that runs its series)."""
    pid = text.strip().partition(" ")[0]
    if owner is None or pid != str(owner):
        return False
    with contextlib.suppress(psutil.Error):
        return owner in {p.pid for p in psutil.Process().parents()}
    return False


@contextlib.contextmanager
def exclusive(path: Path, what: str, owner: int | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the block, or fail at once with one line.

    Two runs on one stack would truncate each other's tables and stop each other's Debezium, so
    every run, series and idle baseline holds the stack's lock. Re-entrant within a process (a
    series holds it around its runs) and for the descendants of ``owner`` when ``owner`` holds it
    (:func:`inherited`); the holder's pid is written into the file for the message.
    """
    held = _held.get(path)
    if held is not None:
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        os.close(fd)
        if inherited(text, owner):
            yield  # the owner holds the lock around this block
            return
        holder = lock_holder(text)
        raise StackError(f"{what} is in use by {holder}: wait for it to "
                         "finish, or give this one its own LAB_STACK_DIR and ports") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {holder_label()}".strip().encode(), 0)
    _held[path] = [fd, 1]
    try:
        yield
    finally:
        del _held[path]
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def waited(path: Path, what: str, timeout: float) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the block, waiting up to ``timeout`` seconds for
    another holder to finish (another stack's build of the same cached root or images, which this
    one would otherwise delete half-made); after that a StackError naming the holder. Not
    re-entrant: each lock file is taken once per call chain."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = lock_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
                    raise StackError(f"{what} is in use by {holder} for over {timeout:.0f} s; "
                                     "wait for it to finish") from None
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {holder_label()}".strip().encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


class Interrupted(BaseException):
    """A command ended by SIGTERM or SIGINT after its cleanup ran; ``signame``: which signal.

    A BaseException, like KeyboardInterrupt: nothing that catches ``Exception`` swallows it, so a
    series stops after the interrupted run instead of starting the next one."""

    def __init__(self, signame: str, detail: str = "") -> None:
        super().__init__(signame, detail)
        self.signame = signame
        self.detail = detail

    @property
    def exit_status(self) -> int:
        return 128 + int(getattr(signal, self.signame, signal.SIGTERM))

    def __str__(self) -> str:
        return f"interrupted by {self.signame}" + (f": {self.detail}" if self.detail else "")


def raise_interrupted(signum: int, frame: object) -> None:
    """A ``signal.signal`` handler: SIGTERM raises like SIGINT does (``finally`` blocks run)."""
    raise Interrupted(signal.Signals(signum).name)


def run_interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, with SIGTERM and SIGINT cancelling its task once (a second signal
    while it cleans up is ignored): a run catches the cancellation, cleans up and stores its
    result marked interrupted, then raises :class:`Interrupted`; anything else cancelled ends
    in :class:`Interrupted` too."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        hit: list[str] = []

        def on_signal(sig: signal.Signals) -> None:
            if not hit and task is not None:
                hit.append(sig.name)
                task.cancel(sig.name)

        sigs = (signal.SIGTERM, signal.SIGINT)
        for sig in sigs:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await coro
        except asyncio.CancelledError:
            if hit:
                raise Interrupted(hit[0]) from None
            raise
        finally:
            for sig in sigs:
                loop.remove_signal_handler(sig)

    try:
        return asyncio.run(main())
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, raise_interrupted)
