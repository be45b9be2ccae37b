"""A `lab` process SIGKILLed on the netns host layout leaves nothing behind once `lab stack down` ran.

`lab stack up --hosts netns` is killed as soon as PostgreSQL runs in its host: the layout (its
namespaces, the veth pairs, the switch's bridge) and a daemon inside one of its namespaces outlive
the killed process. `lab stack down`, given no `--hosts` (it finds the layout by its record), must
stop that daemon and then remove every namespace and link of the stack.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from lab.settings import Settings
from lab.stack import hosts
from lab.stack.native import NativeStack
from tests.conftest import lab_env
from tests.conftest import test_settings as moved_settings

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]
LAB = [sys.executable, "-m", "lab"]
OFFSET = 700


@pytest.fixture
def crash_settings() -> Iterator[Settings]:
    s = moved_settings(OFFSET, "hosts-crash", hosts="netns")
    # down as `lab stack down` without --hosts: on the layout when its record says so, else on
    # loopback (the netns addresses are routed nowhere while the layout does not exist)
    clean = NativeStack(s.replace(hosts="loopback"))
    if s.stack_dir.exists():
        clean.down(purge=True)
    try:
        yield s
    finally:
        try:
            if s.stack_dir.exists():
                clean.down(purge=True)
        finally:
            hosts.remove(s)


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def _stack_processes(settings: Settings) -> list[str]:
    """Live processes whose command line names this stack's dir."""
    here, out = f"{settings.stack_dir}/", []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if here in cmd and p.pid != os.getpid():
            out.append(f"{p.pid} {cmd[:200]}")
    return out


def test_a_sigkilled_stack_up_on_hosts_leaves_no_namespace_veth_or_bridge_after_down(
        crash_settings: Settings) -> None:
    s = crash_settings
    lay = hosts.layout(s)
    env = lab_env(s)
    up = subprocess.Popen([*LAB, "stack", "up"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    postgres = NativeStack(s).postgres
    deadline = time.monotonic() + 120
    while not (hosts.complete(s) and postgres.processes()):
        assert up.poll() is None, f"stack up ended before PostgreSQL ran: {up.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "PostgreSQL never ran in its host"
        time.sleep(0.05)
    up.send_signal(signal.SIGKILL)
    up.communicate(timeout=30)
    pid = postgres.processes()[0].pid
    assert _ip("netns", "identify", str(pid)).strip() == lay.namespaces["postgres"]  # outlived the kill
    assert lay.bridge in _ip("-n", lay.switch, "link")
    assert hosts.leftovers(s)

    t0 = time.monotonic()
    down = subprocess.run([*LAB, "stack", "down"], env={k: v for k, v in env.items() if k != "LAB_HOSTS"},
                          capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - t0
    assert down.returncode == 0, down.stderr[-2000:]
    assert _stack_processes(s) == []
    assert not hosts.leftovers(s)
    assert not [n for n in _ip("netns", "list").split() if n.startswith(lay.prefix_ns)]  # namespaces, the switch
    assert lay.prefix_link not in _ip("link")  # the runner's veth end (the others died with their namespaces)
    assert not (s.stack_dir / hosts.RECORD).exists()
    sys.stderr.write(f"\n[hosts crash] stack up killed with PostgreSQL in {lay.namespaces['postgres']}; "
                     f"`lab stack down` removed every host in {took:.1f} s\n")
