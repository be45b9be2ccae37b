"""The processes a run starts (web, senders, consumers): recorded, tied to their runner, stopped by pid.

A run's processes must never outlive it: a web service or a consumer left behind by a killed
runner bills CPU to the next run, holds its port and keeps a replication slot active. Three
guards, each enough on its own for the usual case:

* **Parent-death signal.** Every child is started with ``prctl(PR_SET_PDEATHSIG, SIGKILL)``
  (Linux), so the kernel kills it the moment the thread that started it exits, SIGKILL of the
  runner included. A child whose parent died before the ``prctl`` took effect exits at once.
  The same applies to the Debezium Server a run starts (:func:`lab.stack.proc.spawn` inside
  :func:`lab.stack.proc.tied`); the stack's services are never tied, they outlive every run.
* **Registry.** Each child is recorded in ``<stack_dir>/children/<name>-<pid>.json`` (pid,
  start ticks, owner pid) until it was stopped, so ``lab stack down`` finds any survivor by pid
  (:func:`stop_all`; never by name) and a new run refuses to start next to one (:func:`require_clean`).
* **Bounded stop.** :func:`stop` sends SIGTERM, waits, then SIGKILLs and waits again: it returns
  only when every process exited, after at most ``timeout + KILL_WAIT`` seconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

from lab.settings import Settings
from lab.stack.base import StackError
from lab.stack.netns import entered
from lab.stack.proc import deferred_signals, die_with_parent, same_process, start_ticks, wait_gone

log = logging.getLogger(__name__)

KILL_WAIT = 5.0  # seconds to wait for the kernel to reap a SIGKILLed process


def registry(settings: Settings) -> Path:
    return settings.stack_dir / "children"


def spawn(settings: Settings, name: str, argv: Sequence[str], *, log_path: Path,
          env: Mapping[str, str] | None = None, cwd: Path | None = None,
          netns: str | None = None) -> psutil.Popen:
    """Start ``argv`` as a child that dies with this thread, and record it under ``name``;
    ``netns``: inside that network namespace (a host of ``LAB_HOSTS=netns``)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    folder = registry(settings)
    folder.mkdir(parents=True, exist_ok=True)
    with deferred_signals():  # started means recorded
        with open(log_path, "ab") as out, entered(netns):
            child = psutil.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None, cwd=cwd,
                preexec_fn=die_with_parent(os.getpid()),
            )
        record = {"name": name, "pid": child.pid, "start_ticks": start_ticks(child.pid),
                  "owner": os.getpid(), "argv0": " ".join(argv[:3])}
        (folder / f"{name}-{child.pid}.json").write_text(json.dumps(record))
    return child


def _records(settings: Settings) -> list[tuple[Path, dict[str, object]]]:
    folder = registry(settings)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            out.append((path, json.loads(path.read_text())))
    return out


def leftovers(settings: Settings) -> list[tuple[str, psutil.Process]]:
    """Recorded children still alive, as (name, process); records of the dead are dropped."""
    out = []
    for path, record in _records(settings):
        p = same_process(dict(record))
        if p is None:
            path.unlink(missing_ok=True)
        else:
            out.append((str(record.get("name")), p))
    return out


def stop(procs: Iterable[psutil.Process], *, timeout: float = 10.0) -> list[psutil.Process]:
    """SIGTERM, wait up to ``timeout``, SIGKILL, wait; returns those that still did not exit."""
    procs = list(procs)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    alive = wait_gone(procs, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return wait_gone(alive, timeout=KILL_WAIT)


def forget(settings: Settings, procs: Iterable[psutil.Process]) -> None:
    """Drop the records of ``procs`` (after they were stopped)."""
    pids = {p.pid for p in procs}
    for path, record in _records(settings):
        if record.get("pid") in pids:
            path.unlink(missing_ok=True)


def stop_all(settings: Settings, *, timeout: float = 10.0) -> list[str]:
    """Stop every recorded child of this stack (``lab stack down``); returns 'name pid' stopped.

    Raises :class:`StackError` naming any that survived SIGKILL.
    """
    found = leftovers(settings)
    if not found:
        return []
    names = [f"{name} {p.pid}" for name, p in found]
    log.warning("stopping processes left by a run: %s", ", ".join(names))
    stuck = stop([p for _, p in found], timeout=timeout)
    if stuck:
        raise StackError(f"pids {', '.join(str(p.pid) for p in stuck)} did not exit after SIGKILL")
    forget(settings, [p for _, p in found])
    return names


def port_holder(port: int) -> int | None:
    """The pid listening on TCP ``port`` (any address), or None; -1 when it cannot be told."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return -1
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            return c.pid if c.pid is not None else -1
    return None


def require_clean(settings: Settings, ports: Mapping[str, int], *, ours: set[int]) -> None:
    """Fail at once, with one line naming the pid, when a run's process or port is taken.

    ``ports``: what the run will bind (name -> port); ``ours``: pids that may hold one of them
    because the run stops them itself (the stack's own Debezium instances).
    """
    for name, p in leftovers(settings):
        raise StackError(f"{name} pid {p.pid} of an earlier run is still alive; "
                         "stop it with `lab stack down` (or kill it) and run again")
    for what, port in ports.items():
        pid = port_holder(port)
        if pid is not None and pid not in ours:
            who = f"pid {pid}" if pid > 0 else "another process"
            raise StackError(f"port {port} for {what} is held by {who}; stop it "
                             "(`lab stack down` stops what a killed run left) and run again")
