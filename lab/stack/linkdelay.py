"""The link delay of the host layout (``--link-delay``, ``LAB_LINK_DELAY``): netem, or a userspace delayer.

Every packet a host sends to another leaves through its ``eth0`` and is held there for the delay:
a one-way hop is delayed once, a round trip twice. Two mechanisms, chosen by
``Settings.link_delay_via`` (``auto``: the first that works here):

* ``netem``: the kernel's queueing discipline on each host's ``eth0`` (``CONFIG_NET_SCH_NETEM``);
  its work runs in softirq and no process of the lab does it.
* ``nfqueue``: on a kernel without netem, one iptables rule per host namespace
  (:func:`rule`: output via ``eth0`` to the lab's /24, so a host's traffic to itself over ``lo``
  is left alone) queues each packet to the delayer (:mod:`lab.stack.delayer`), one process for
  every host, which accepts it once the delay has passed. No ``--queue-bypass``: if the delayer
  dies the hosts' packets are dropped and :func:`check` fails the run, never reporting undelayed
  figures as delayed.

The delayer is started (before the rules, so that no packet meets an unbound queue) and removed
(after the rules, releasing what it holds) with the delay: :func:`apply` on every ``stack up``
(a run's start included) makes the delay what the settings say, ``0`` removes it, and
:func:`remove` runs first in :func:`lab.stack.hosts.remove` (``lab stack down``, and the removal of
a layout a crash left incomplete). Its pid, start time and what it delays are recorded under
``<stack_dir>/delayer/``, so it is found and stopped by pid, never by name, after a crash too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from lab.settings import Settings, child_env
from lab.stack import netns, proc
from lab.stack.base import StackError
from lab.stack.netns import entered

log = logging.getLogger(__name__)

QUEUE = 0  # as lab.stack.delayer.QUEUE: each namespace has queues of its own
RECORD = "link.json"
READY_S = 20.0


def state_dir(settings: Settings) -> Path:
    return settings.stack_dir / "delayer"


def rule(subnet: str) -> list[str]:
    """The iptables rule (after ``-A``, ``-C`` or ``-D``) that queues a host's packets to its other
    hosts (and the runner) to the delayer; nothing else leaves ``eth0``."""
    return ["OUTPUT", "-o", "eth0", "-d", subnet, "-j", "NFQUEUE", "--queue-num", str(QUEUE)]


def delayer_argv(delay_ms: float, namespaces: list[str], ready: Path, stats: Path) -> list[str]:
    argv = [sys.executable, "-m", "lab.stack.delayer", "--delay-ms", f"{delay_ms:g}"]
    for ns in namespaces:
        argv += ["--netns", ns]
    return [*argv, "--ready-file", str(ready), "--stats-file", str(stats)]


def netem_argv(delay_ms: float) -> list[str]:
    return ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", f"{round(delay_ms * 1000)}us"]


def no_netem(why: str) -> bool:
    """Whether ``tc``'s error says the kernel has no netem (rather than anything else failing)."""
    return "unknown" in why or "not found" in why.lower()


# What runs now ------------------------------------------------------------------------------------
def recorded(settings: Settings) -> dict[str, Any]:
    """What :func:`apply` set last (``mechanism``, ``delay_ms``, the namespaces' identities), {} if none."""
    try:
        return dict(json.loads((state_dir(settings) / RECORD).read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def _record(settings: Settings, payload: dict[str, Any] | None) -> None:
    path = state_dir(settings) / RECORD
    if payload is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


def identities(namespaces: list[str]) -> dict[str, int | None]:
    return {ns: netns.inode(ns) for ns in namespaces}


def delayer(settings: Settings) -> psutil.Process | None:
    """The running delayer of this stack, if any (by its recorded pid and start time)."""
    return proc.running(state_dir(settings))


def mechanism(settings: Settings) -> str | None:
    """``netem`` or ``nfqueue`` while a delay is set, None without one."""
    return recorded(settings).get("mechanism")


# Setting and removing -----------------------------------------------------------------------------
def apply(settings: Settings, namespaces: list[str], subnet: str) -> str | None:
    """Make the hosts' delay ``settings.link_delay_ms`` (0: none); returns the mechanism used.
    Kept as it is when it already is what the settings say."""
    delay = settings.link_delay_ms
    if delay <= 0:
        remove(settings, namespaces, subnet)
        return None
    want = {"delay_ms": delay, "namespaces": identities(namespaces)}
    now = recorded(settings)
    if now.get("mechanism") == "nfqueue" and settings.link_delay_via != "netem" and \
            {k: now.get(k) for k in want} == want and delayer(settings) is not None and \
            _rules_present(namespaces, subnet):
        return "nfqueue"
    if settings.link_delay_via != "nfqueue":
        why = _netem(namespaces, delay)
        if why is None:
            _remove_nfqueue(settings, namespaces, subnet)
            _record(settings, {**want, "mechanism": "netem"})
            return "netem"
        if settings.link_delay_via == "netem" or not no_netem(why):
            raise StackError(f"cannot delay the links by {delay:g} ms: {why}")
        log.info("no netem in this kernel: the link delay is a userspace queue (NFQUEUE)")
    _remove_nfqueue(settings, namespaces, subnet)
    _remove_netem(namespaces)
    try:
        _start_delayer(settings, namespaces, delay)
        for ns in namespaces:
            _iptables(ns, "-A", subnet)
    except BaseException:
        with contextlib.suppress(Exception):
            _remove_nfqueue(settings, namespaces, subnet)
        raise
    _record(settings, {**want, "mechanism": "nfqueue"})
    return "nfqueue"


def remove(settings: Settings, namespaces: list[str], subnet: str) -> None:
    """No delay: the rules, the delayer and netem gone from whichever namespaces exist."""
    _remove_nfqueue(settings, namespaces, subnet)
    _remove_netem(namespaces)
    _record(settings, None)


def check(settings: Settings) -> None:
    """Raise when the delay the settings ask for is not in force (the delayer died): a run's
    figures would be undelayed, or its packets dropped."""
    if settings.link_delay_ms <= 0 or mechanism(settings) != "nfqueue":
        return
    if delayer(settings) is None:
        raise StackError(f"the link delayer is gone (log: {proc.tail(state_dir(settings) / 'delayer.log', 3)}); "
                         "the hosts' packets were not delayed as asked")


def _netem(namespaces: list[str], delay: float) -> str | None:
    """netem on every host's ``eth0``; None when done, else why not (the first namespace's error)."""
    for ns in namespaces:
        with entered(ns):
            done = netns.run_tool(netem_argv(delay))
        if done.returncode != 0:
            return done.stderr.strip() or f"tc exited with {done.returncode}"
    return None


def _remove_netem(namespaces: list[str]) -> None:
    for ns in _existing(namespaces):
        with entered(ns):
            netns.run_tool(["tc", "qdisc", "del", "dev", "eth0", "root"])


def _existing(namespaces: list[str]) -> list[str]:
    return [ns for ns in namespaces if netns.inode(ns) is not None]


XTABLES_WAIT_S = "10"  # iptables waits this long for another holder's xtables lock, then fails


def iptables_argv(op: str, subnet: str) -> list[str]:
    """``iptables`` with ``op`` (``-A``, ``-C``, ``-D``) on :func:`rule`, waiting a bounded time for the
    xtables lock (a bare ``-w`` waits for ever behind a holder that never lets go)."""
    return ["iptables", "-w", XTABLES_WAIT_S, op, *rule(subnet)]


def _iptables(ns: str, op: str, subnet: str) -> subprocess.CompletedProcess[str]:
    try:
        with entered(ns):
            done = netns.run_tool(iptables_argv(op, subnet))
    except FileNotFoundError:
        raise StackError("a link delay on a kernel without netem needs the iptables command "
                         "(Debian's iptables package)") from None
    if op == "-A" and done.returncode != 0:
        raise StackError(f"iptables in {ns} failed: {done.stderr.strip() or done.returncode}")
    return done


def _rules_present(namespaces: list[str], subnet: str) -> bool:
    return all(_iptables(ns, "-C", subnet).returncode == 0 for ns in namespaces)


def _remove_nfqueue(settings: Settings, namespaces: list[str], subnet: str) -> None:
    """The rules first (no new packet is queued), then the delayer (it releases what it holds)."""
    for ns in _existing(namespaces):
        with contextlib.suppress(StackError):
            for _ in range(8):  # every copy of the rule a crash between two applies may have left
                if _iptables(ns, "-D", subnet).returncode != 0:
                    break
    if proc.terminate(state_dir(settings), timeout=10):
        log.info("link delayer stopped")


def _start_delayer(settings: Settings, namespaces: list[str], delay: float) -> None:
    d = state_dir(settings)
    ready, stats = d / "ready.json", d / "stats.json"
    d.mkdir(parents=True, exist_ok=True)
    ready.unlink(missing_ok=True)
    stats.unlink(missing_ok=True)
    p = proc.spawn(delayer_argv(delay, namespaces, ready, stats), state_dir=d, log_path=d / "delayer.log",
                   env=child_env(settings), cwd=settings.root)
    proc.wait_until(ready.exists, timeout=READY_S, what="the link delayer", proc=p, log_path=d / "delayer.log")


# Reading ------------------------------------------------------------------------------------------
def delayer_cpu_s(settings: Settings) -> float | None:
    """CPU-seconds the running delayer has used so far (scheduler runtime: exact for a process that
    works in short bursts); None without one."""
    p = delayer(settings)
    if p is None:
        return None
    total = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{p.pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9
    return None


def queue_counters(namespaces: list[str]) -> dict[str, int]:
    """Summed over the hosts' queue 0: ``packets`` queued so far and ``dropped`` (queue full, or not
    handed over), from each namespace's ``/proc/net/netfilter/nfnetlink_queue``."""
    out = {"packets": 0, "dropped": 0}
    for ns in _existing(namespaces):
        with entered(ns), contextlib.suppress(OSError):
            text = Path("/proc/thread-self/net/netfilter/nfnetlink_queue").read_text()
            for q in parse_queue_status(text):
                if q["queue"] == QUEUE:
                    out["packets"] += q["packets"]
                    out["dropped"] += q["dropped"]
    return out


def parse_queue_status(text: str) -> list[dict[str, int]]:
    """``/proc/net/netfilter/nfnetlink_queue``: per queue its number, ``held`` now, ``dropped``
    (queue full + not handed over) and ``packets`` (the last id given: every packet queued so far)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0].isdigit():
            out.append({"queue": int(f[0]), "held": int(f[2]), "dropped": int(f[5]) + int(f[6]), "packets": int(f[7])})
    return out


def delayer_stats(settings: Settings) -> dict[str, Any]:
    """The delayer's own counters (packets, lateness of its releases, errors), {} without them."""
    try:
        return dict(json.loads((state_dir(settings) / "stats.json").read_text()))
    except (FileNotFoundError, ValueError):
        return {}
