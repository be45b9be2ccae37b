"""lab.measure.recovery on hand-made timelines whose lag, phases and recovery time are known.

The timeline: 100 msg/s for 20 s (message k created at k/100 s after the gate, wall = GATE + that),
even ids worked by consumer 0, odd ids by consumer 1 (50 msg/s each), each 10 ms after its creation.
A fault stops consumer 1 from 5 s to 8 s; from 8 s on it works at most CAPACITY msg/s (one message
every 1/CAPACITY s, first-in first-out), and each message 10 ms after its creation once it caught up.
"""

from __future__ import annotations

import math

import pytest

from lab.measure import recovery as rec
from lab.measure.recovery import Deliveries, backlog_peak, bands, consumer_lag, phases, recovery_s
from lab.measure.sampler import Snapshot

GATE = 1_700_000_000.0
RATE, SECONDS, LATENCY = 100, 20, 0.010
STOP, RESUME = 5.0, 8.0


def timeline(capacity: float, *, lose: int = 0) -> tuple[list[int], list[float], list[int], dict[int, float]]:
    """Arrivals (ids, wall t, by) and created_at of the module docstring's run; ``lose``: the first
    ``lose`` messages of consumer 1 created during the stop are never worked."""
    created = {k: GATE + k / RATE for k in range(RATE * SECONDS)}
    ones = [k for k in created if k % 2 == 1]
    lost = set([k for k in ones if created[k] - GATE >= STOP][:lose])
    arrivals: list[tuple[float, int, int]] = []
    free = 0.0
    for k, c in created.items():
        if k in lost:
            continue
        t = c - GATE + LATENCY
        if k % 2 == 1:
            if STOP <= t < RESUME:
                t = RESUME
            if t >= RESUME:  # the catch-up: one message every 1/capacity s at most
                t = max(t, free)
                free = t + 1 / capacity
        arrivals.append((t + GATE, k, k % 2))
    arrivals.sort()
    return [a[1] for a in arrivals], [a[0] for a in arrivals], [a[2] for a in arrivals], created


def deliveries(capacity: float = 300.0, **kw: int) -> Deliveries:
    ids, t, by, created = timeline(capacity, **kw)
    return Deliveries(ids, t, by, created, GATE)


def test_recovery_is_the_catch_up_time() -> None:
    # at 8 s consumer 1 has the 150 messages created in [4.99 s, 8 s) pending; it works 300/s while
    # 50/s more arrive: the backlog is gone 150 / (300 - 50) = 0.6 s after the resume
    r = recovery_s(deliveries(300.0), STOP, RESUME)
    assert r is not None and 0.45 <= r <= 0.7, r
    # a slower catch-up (100/s against 50/s arriving): 150 / 50 = 3 s
    r = recovery_s(deliveries(100.0), STOP, RESUME)
    assert r is not None and 2.7 <= r <= 3.1, r


def test_recovery_after_the_load_ended_is_the_lag_alone() -> None:
    # 40/s < 50/s: the backlog grows until the senders stop at 20 s (150 + 12 * 10 = 270), then
    # drains at 40/s: back within the lag band (11 messages) about 26.5 s after the gate
    r = recovery_s(deliveries(40.0), STOP, RESUME)
    assert r is not None and 17.8 <= r <= 19.0, r


def test_no_recovery_when_messages_were_lost_beyond_the_band() -> None:
    assert recovery_s(deliveries(300.0, lose=30), STOP, RESUME) is None
    assert recovery_s(deliveries(300.0, lose=3), STOP, RESUME) is not None  # within the band


def test_no_recovery_without_a_pre_fault_reference() -> None:
    assert recovery_s(deliveries(300.0), 1.5, RESUME) is None
    assert bands(deliveries(300.0), 1.5) is None


def test_bands() -> None:
    b = bands(deliveries(300.0), STOP)
    assert b is not None
    assert b["rate"] == pytest.approx(100, abs=1)
    assert b["rate_hi"] - b["rate"] == pytest.approx(max(15, 3 * math.sqrt(100 / rec.WINDOW_S)), abs=1)
    assert b["lag_peak"] == 1  # one message in flight for 10 ms of every 10 ms
    assert b["lag_hi"] == pytest.approx(1 + 10, abs=0.5)  # 100 ms of deliveries at 100/s


def test_consumer_lag_of_the_stopped_consumer() -> None:
    rows = {(r["t_s"], r["consumer"]): r for r in consumer_lag(deliveries(300.0))}
    # at 7 s: consumer 1 has every odd message created in (4.99 s, 7 s] pending, the oldest
    # created at 4.99 s (its delivery was due at 5.00 s, inside the stop)
    one = rows[(7.0, 1)]
    assert one["lag_messages"] == 101
    assert one["lag_s"] == pytest.approx(7.0 - 4.99, abs=0.011)
    assert rows[(7.0, 0)]["lag_messages"] <= 1 and rows[(7.0, 0)]["lag_s"] <= 0.011
    assert rows[(4.0, 1)]["lag_messages"] <= 1
    assert rows[(10.0, 1)]["lag_messages"] <= 1  # caught up at 8.6 s
    assert {c for _, c in rows} == {0, 1}
    assert min(t for t, _ in rows) == 0.0 and max(t for t, _ in rows) == 20.0


def _snapshots() -> list[Snapshot]:
    """CPU growing linearly: consumer-0 10 ms/s, consumer-1 20 ms/s, web 50 ms/s, the probe 1 s/s
    (left out), host busy 1 s/s; read every 0.5 s from 1 s before the gate (monotonic 100)."""
    out = []
    for k in range(-2, 2 * 22):
        t = k / 2
        out.append(Snapshot(100.0 + t, GATE + t, {"consumer-0": 0.01 * t, "consumer-1": 0.02 * t,
                                                   "web": 0.05 * t, "probe": 1.0 * t},
                            {}, 1.0 * t, 0.0))
    return out


def test_phases() -> None:
    p = phases(deliveries(300.0), STOP, RESUME, timeline=_snapshots(), gate_mono=100.0)
    before, during, after = p["before"], p["during"], p["after"]
    assert (before["t0_s"], before["t1_s"], during["t1_s"]) == (0.0, STOP, RESUME)
    assert after["t1_s"] == pytest.approx(SECONDS - 0.01 + LATENCY, abs=0.001)
    assert before["delivered"] == 500 - 1  # message 499 (4.99 s) was due at 5.00 s: stopped
    assert before["delivered_per_s"] == pytest.approx(100, abs=0.5)
    assert during["delivered_per_s"] == pytest.approx(50, abs=0.5)  # consumer 0 alone
    assert before["delivered"] + during["delivered"] + after["delivered"] == RATE * SECONDS
    cpu = before["cpu_ms_per_msg"]
    assert cpu["consumers"] == pytest.approx(0.03 * 5 * 1000 / 499, rel=1e-3)
    assert cpu["web"] == pytest.approx(0.05 * 5 * 1000 / 499, rel=1e-3)
    assert "probe" not in cpu and "consumer-0" not in cpu
    assert set(cpu) == {"consumers", "web", "unattributed"}
    assert before["cpu_ms_per_msg_total"] == pytest.approx(0.08 * 5 * 1000 / 499, rel=1e-3)
    assert cpu["unattributed"] == pytest.approx((1.0 - 0.08) * 5 * 1000 / 499, rel=1e-3)
    assert before["latency_ms"]["p99"] == pytest.approx(10, abs=0.01)
    # during: consumer 0's messages only, at 10 ms; after: consumer 1's backlog, up to ~3 s late
    assert during["latency_ms"]["max"] == pytest.approx(10, abs=0.01)
    assert after["latency_ms"]["max"] == pytest.approx((RESUME - 4.99) * 1000 + 1000 / 300, abs=5)


def test_phases_without_timeline_or_deliveries() -> None:
    p = phases(deliveries(300.0), STOP, RESUME)
    assert p["before"]["cpu_ms_per_msg"] is None and p["during"]["delivered"] > 0
    empty = Deliveries([], [], [], {}, GATE)
    q = phases(empty, 1.0, 2.0)
    assert q["after"]["delivered"] == 0 and q["after"]["latency_ms"]["n"] == 0
    assert consumer_lag(empty) == [] and recovery_s(empty, 3.0, 4.0) is None


def test_first_arrival_wins_and_foreign_ids_are_left_out() -> None:
    # id 1 worked twice (by 1, then again by 0): its delivery is the first call, its owner 1
    d = Deliveries([1, 2, 1, 99], [GATE + 1.0, GATE + 1.5, GATE + 3.0, GATE + 2.0], [1, 0, 0, 0],
                   {1: GATE + 0.5, 2: GATE + 1.0, 3: GATE + 1.0}, GATE)
    assert list(d.delivered) == [1.0, 1.5] and list(d.owner) == [1, 0]
    assert list(d.lost_created) == [1.0]  # id 3: never worked
    import numpy as np
    assert list(d.total_lag(np.array([0.6, 1.2, 10.0]))) == [1, 2, 1]


def test_backlog_peak() -> None:
    assert backlog_peak([{"messages": 3}, {"messages": None}, {"messages": 7}]) == 7
    assert backlog_peak([]) is None


def test_excess_cpu_is_the_faults_own_price_above_the_steady_state() -> None:
    """Steady state: consumers 10 + 20 ms/s, web 50 ms/s; the run's start costs the web 2 s more
    in its first 2 s (warm-up, outside the baseline: the later half before the fault). The fault
    at 10 s: consumer-1 stops for 3 s, then catches up with 1.5 s of CPU in one second; a restarted
    JVM ("debezium", idle before) burns 4 s in [10, 12)."""

    def cpu(t: float) -> dict[str, float]:
        c1 = 0.02 * min(t, 10.0) + (1.5 * min(max(t - 13.0, 0.0), 1.0)) + 0.02 * max(t - 14.0, 0.0)
        return {"consumer-0": 0.01 * t, "consumer-1": c1, "web": 0.05 * t + 2.0 * min(max(t, 0.0), 2.0) / 2.0,
                "debezium": 2.0 * min(max(t - 10.0, 0.0), 2.0), "probe": t}

    snaps = [Snapshot(100.0 + k / 10, GATE + k / 10, cpu(k / 10), {}, 1.0 * k / 10, 0.0) for k in range(-5, 200)]
    out = rec.excess_cpu(snaps, 100.0, 10.0, 16.0)
    assert out is not None and (out["t0_s"], out["t1_s"], out["baseline_s"]) == (10.0, 16.0, 5.0)
    e = out["excess_s"]
    assert e["debezium"] == pytest.approx(4.0, abs=1e-6)
    assert e["consumers"] == pytest.approx(1.5 - 0.02 * 4, abs=1e-6)  # the burst, less 4 s not worked
    assert e["web"] == pytest.approx(0.0, abs=1e-6)  # its warm-up is not held against the steady state
    assert "probe" not in e
    assert out["total_s"] == pytest.approx(4.0 + 1.5 - 0.08, abs=1e-3)
    assert rec.excess_cpu(snaps, 100.0, 1.5, 16.0) is None  # no steady state before the fault
    assert rec.excess_cpu([], 100.0, 10.0, 16.0) is None
