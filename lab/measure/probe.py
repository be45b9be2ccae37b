"""The speed probe: how fast the machine is during a run, measured beside it.

On a shared host the same work costs more CPU time when the host is busier (caches, memory
bandwidth, SMT siblings, frequency): every participant's CPU moves together with it. The probe is
its own process, a participant outside the totals: every ``period`` seconds it runs a fixed
pure-Python workload (``UNIT_LOOPS`` iterations, ≈ 1 ms of CPU at best on this VM, so a duty
cycle of 1-2 %) and records the CPU time that unit took (``time.thread_time_ns``), with the
monotonic time. :func:`summarise` turns the samples inside a run's window into its *speed*: the
median ms per unit, and ``speed`` = ``REFERENCE_UNIT_MS / median`` (1: as fast as the reference,
0.5: every unit of work took twice as long). The run's speed-normalised metric is
``cpu_ms_per_msg_norm`` = raw ms/msg × speed (:func:`normalise`).

``REFERENCE_UNIT_MS`` only fixes the unit of the normalised figure (ms/msg at the unit's fastest
time seen on this 2-core VM); spreads and comparisons between runs do not depend on it.

Run by the runner::

    python -m lab.measure.probe --out DIR/probe.json [--period 0.1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any

UNIT_LOOPS = 6_000
REFERENCE_UNIT_MS = 1.0  # about the unit's fastest CPU time on this 2-core VM (docs/benchmarks.md, Trust)
DEFAULT_PERIOD_S = 0.1
SLOW_FACTOR = 1.25  # a run whose probe is this much slower than its group's median is flagged


def unit() -> int:
    """One fixed unit of work; returns its CPU time in ns (this thread only)."""
    t0 = time.thread_time_ns()
    x = 0
    for i in range(UNIT_LOOPS):
        x += (i * i) ^ (x >> 3)
    return time.thread_time_ns() - t0 if x >= 0 else 0


def run(out: Path, period: float, stop: threading.Event) -> None:
    t, ms = [], []
    due = time.monotonic()
    while not stop.is_set():
        t.append(time.monotonic())
        ms.append(unit() / 1e6)
        due += period
        stop.wait(max(0.0, due - time.monotonic()))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"unit_loops": UNIT_LOOPS, "period_s": period, "t": t, "ms": ms}))
    os.replace(tmp, out)


def summarise(path: Path, t0: float, t1: float) -> dict[str, Any] | None:
    """The probe's samples inside [t0, t1] (monotonic): median ms per unit, spread and factor."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ms = [m for t, m in zip(data["t"], data["ms"], strict=True) if t0 <= t <= t1]
    if not ms:
        return None
    med = statistics.median(ms)
    q = statistics.quantiles(ms, n=10) if len(ms) >= 10 else [min(ms), max(ms)]
    return {"samples": len(ms), "unit_ms_median": round(med, 4), "unit_ms_p10": round(q[0], 4),
            "unit_ms_p90": round(q[-1], 4), "speed": round(REFERENCE_UNIT_MS / med, 4) if med else None}


def normalise(cpu_ms_per_msg: float | None, probe: dict[str, Any] | None) -> float | None:
    """ms/msg at the reference speed: raw × speed (a run on a slow machine costs less once normalised)."""
    if cpu_ms_per_msg is None or not probe or not probe.get("speed") or not math.isfinite(cpu_ms_per_msg):
        return None
    return round(cpu_ms_per_msg * probe["speed"], 4)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.measure.probe", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--period", type=float, default=DEFAULT_PERIOD_S)
    a = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(a.out, a.period, stop)


if __name__ == "__main__":
    main()
