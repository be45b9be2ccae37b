"""The idle baseline: what every participant costs while nothing happens.

Before a series, :func:`measure_idle` samples the stack's services, an idle web service and both
Debezium instances (started, streaming, no rows) over one window of ``seconds`` (30 by default):
CPU in seconds per second of wall time and mean RSS, per participant, through the same cgroups
and :class:`~lab.measure.sampler.Sampler` the runs use. The record is stored per series
(:func:`lab.results.write_idle`) and every run of that series carries it in ``run.json``
(``idle``), together with what the run would cost without it (:func:`net_of_idle`).

Why it matters: an idle Kafka broker burns ~4 % of a core and an idle Debezium ~2.7 % (measured,
docs/benchmarks.md), so a slow run pays more idle CPU than a fast one; the report shows each run's
cost with and without this floor, and the ``unattributed`` residual next to both.

Decisions: all participants share one window (Debezium connected changes PostgreSQL's idle cost
by a keepalive every 10 s, which is part of what a CDC run pays anyway); consumers and senders
are not measured idle (they do not exist between runs and busy-wait nowhere); the runner's own
idle cost is not subtracted either.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import psutil

from lab.measure.cgroups import attached, choose_cpu_method, tree_pids
from lab.measure.sampler import Participant, Sampler
from lab.settings import Settings, child_env
from lab.stack import children, get_stack
from lab.stack.base import DEBEZIUM_SINKS, ParticipantSource, debezium_participant, services
from lab.stack.proc import exclusive, port_open, require_free, tied, wait_until

log = logging.getLogger(__name__)
Say = Callable[[str], None]
IDLE_SECONDS = 30.0
SERVICES = ("postgres", "kafka", "rabbitmq")
HA_SERVICES = ("postgres-standby", "kafka-1", "kafka-2", "kafka-3", "rabbitmq-1", "rabbitmq-2",
               "rabbitmq-3")  # the ha topology


def _participant(name: str, roots: ParticipantSource, settings: Settings, method: str) -> Participant:
    if callable(roots):  # a container's counter (compose backend)
        return Participant(name, [], counter=roots)
    if method != "cgroup":  # LAB_CPU_METHOD asked for a tree walk: no group, as in a run
        return Participant(name, roots)
    group = attached(settings, f"idle-{name}", (pid for r in roots for pid in tree_pids(r.pid)))
    return Participant(name, roots, cgroup=group)


def sample_idle(settings: Settings, roots: Mapping[str, ParticipantSource], seconds: float, *,
                settle: float = 0.0) -> dict[str, Any]:
    """:meth:`Sampler.window` over ``seconds`` of the named process trees doing nothing, each in
    its own cgroup, or containers through their counters (after ``settle`` seconds, e.g. for something just started)."""
    method = choose_cpu_method(settings.cpu_method)
    walk = method if method != "cgroup" else "proc-ticks"
    sampler = Sampler([_participant(n, r, settings, method) for n, r in roots.items()], cpu_method=walk)
    with sampler:
        time.sleep(settle)
        a = sampler.snapshot()
        time.sleep(seconds)
        b = sampler.snapshot()
    return {**sampler.window(a, b), "cpu_method": method}


def _start_web(settings: Settings) -> psutil.Popen:
    require_free(settings.web_port, "the web service", "LAB_WEB_PORT")
    require_free(settings.control_port, "the web service's control listener", "LAB_WEB_CONTROL_PORT")
    argv = [sys.executable, "-m", "lab.workload.web", "--port", str(settings.web_port),
            "--control-port", str(settings.control_port), "--dsn", settings.pg_dsn]
    proc = children.spawn(settings, "idle-web", argv, log_path=settings.stack_dir / "idle-web.log",
                          env=child_env(settings), cwd=settings.root)
    try:
        # the control listener starts after the pool (up to 120 s) and the insert listener
        wait_until(lambda: port_open(settings.control_port), timeout=150, what="the idle web service",
                   proc=proc)
    except BaseException:
        _stop_web(settings, proc)
        raise
    return proc


def _stop_web(settings: Settings, proc: psutil.Process) -> None:
    children.stop([proc], timeout=10)
    children.forget(settings, [proc])


def measure_idle(settings: Settings, *, seconds: float = IDLE_SECONDS, debezium: bool = True,
                 say: Say = lambda _: None) -> dict[str, Any]:
    """Idle CPU (s per s) and RSS of every participant over one window of ``seconds``.

    Brings the stack up, starts an idle web service and (``debezium``) both Debezium instances,
    samples, and stops what it started. Returns the record :func:`net_of_idle` reads.
    """
    if seconds <= 0:
        raise ValueError(f"the idle window must be positive, got {seconds}")
    with exclusive(settings.run_lock, "the stack", settings.lock_owner):
        return _measure_idle(settings, seconds=seconds, debezium=debezium, say=say)


def _measure_idle(settings: Settings, *, seconds: float, debezium: bool, say: Say) -> dict[str, Any]:
    stack = get_stack(settings)
    stack.up()
    web = None
    started: list[str] = []
    try:
        web = _start_web(settings)
        sources = stack.participants()
        roots: dict[str, ParticipantSource] = {n: sources[n] for n in services(sources)}
        roots["web"] = [web]
        if debezium:
            for sink in DEBEZIUM_SINKS:
                say(f"idle baseline: starting debezium-{sink}")
                started.append(sink)
                with tied():  # dies with this process if it is killed
                    stack.start_debezium(sink)
                name = debezium_participant(sink)
                roots[name] = stack.participants()[name]
        say(f"idle baseline: sampling {', '.join(roots)} for {seconds:.0f} s")
        window = sample_idle(settings, roots, seconds, settle=min(1.0, seconds / 10))
    finally:
        if web is not None:
            _stop_web(settings, web)
        for sink in started:
            with contextlib.suppress(Exception):
                stack.stop_debezium(sink)
    span = window["window_s"]
    parts = window["participants"]
    return {
        "measured_at": datetime.now(UTC).isoformat(),
        "cpu_method": window["cpu_method"],  # as a run's: the analysis nets runs of the same method
        "seconds": round(span, 3),
        "cpu_s_per_s": {n: round(v["cpu_s"] / span, 6) for n, v in parts.items()},
        "rss_mb": {n: v["rss_mb_mean"] for n, v in parts.items()},
        "host_busy_s_per_s": round(window["host_busy_cpu_s"] / span, 6),
        "unattributed_s_per_s": round(window["unattributed_cpu_s"] / span, 6),
    }


def idle_rates_for(record: Mapping[str, Any], *, cdc_sink: str | None) -> dict[str, float]:
    """The idle CPU rates that apply to a run: the services, the web service, and the Debezium
    instance the run used (``cdc_sink``; none for direct readers and broker-native runs)."""
    rates = dict(record.get("cpu_s_per_s") or {})
    out = {n: float(rates[n]) for n in (*SERVICES, *HA_SERVICES, "web") if n in rates}
    if cdc_sink and f"debezium-{cdc_sink}" in rates:
        out["debezium"] = float(rates[f"debezium-{cdc_sink}"])
    return out


def net_of_idle(cpu_s: Mapping[str, float], window_s: float, messages: int,
                rates: Mapping[str, float]) -> dict[str, Any]:
    """A run's cost without the idle floor: per participant ``max(0, cpu - rate·window)``.

    Returns ``idle_cpu_s`` (what idling would have cost over the window, per participant),
    ``net_cpu_s`` per participant and ``cpu_ms_per_msg_net`` (the total without ``unattributed``,
    like ``cpu_ms_per_msg``). A participant is never pushed below zero.
    """
    if window_s <= 0 or messages <= 0:
        raise ValueError("window_s and messages must be positive")
    idle = {n: r * window_s for n, r in rates.items() if n in cpu_s}
    net = {n: max(0.0, v - idle.get(n, 0.0)) for n, v in cpu_s.items() if n != "unattributed"}
    return {
        "idle_cpu_s": {n: round(v, 4) for n, v in idle.items()},
        "net_cpu_s": {n: round(v, 4) for n, v in net.items()},
        "cpu_ms_per_msg_net": round(sum(net.values()) * 1000 / messages, 4),
    }
