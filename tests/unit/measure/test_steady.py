"""The F + c·M split recovers known costs from synthetic timelines shaped like real runs."""

from __future__ import annotations

import math
import random

import pytest

from lab.measure import steady
from lab.measure.steady import Sample, split, theil_sen


def _timeline(m: int, f_s: float, c_ms: float, *, rate: float = 1000.0, period: float = 0.5,
              warmup_s: float = 3.0, tail_s: float = 1.0, noise_s: float = 0.0, seed: int = 1,
              upstream_c_ms: float = 0.0, lead_s: float = 0.0):
    """Deliveries at ``rate`` msg/s; the participant ``dbz`` pays ``f_s`` spread over the first
    ``warmup_s`` seconds (exponentially decaying, like a JIT) plus ``c_ms`` per delivered message;
    ``web`` pays ``upstream_c_ms`` per insert, the inserts running ``lead_s`` ahead."""
    rng = random.Random(seed)
    t0 = 1_000_000.0
    delivered = [t0 + i / rate for i in range(m)]
    inserted = [max(t0, t - lead_s) for t in delivered]
    end = delivered[-1] + tail_s
    samples, t, jitter = [], t0, 0.0
    tau = warmup_s / 3
    while t <= end:
        n = steady._count(delivered, t)
        k = steady._count(inserted, t)
        warm = f_s * (1 - math.exp(-(t - t0) / tau)) if warmup_s else f_s
        jitter = rng.gauss(0, noise_s) if noise_s else 0.0
        samples.append(Sample(t, {"dbz": warm + c_ms / 1000 * n + jitter, "web": upstream_c_ms / 1000 * k}))
        t += period
    window = {"dbz": f_s + c_ms / 1000 * m, "web": upstream_c_ms / 1000 * m, "unattributed": 0.7}
    return samples, window, inserted, delivered


def test_theil_sen_ignores_one_outlier() -> None:
    xs = [0, 1, 2, 3, 4, 5, 6]
    ys = [0, 2, 4, 60, 8, 10, 12]
    assert theil_sen(xs, ys) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        theil_sen([1, 1], [0, 1])


@pytest.mark.parametrize(("m", "warmup_s"), [(5_000, 0.6), (20_000, 3.0), (100_000, 3.0)])
def test_known_fixed_and_steady_costs_come_back_at_every_volume(m: int, warmup_s: float) -> None:
    samples, window, ins, dlv = _timeline(m, f_s=4.5, c_ms=0.3, noise_s=0.01, warmup_s=warmup_s)
    out = split(samples, window, m, ins, dlv)
    dbz = out["participants"]["dbz"]
    assert dbz["steady_ms_per_msg"] == pytest.approx(0.3, rel=0.05)
    assert dbz["fixed_cpu_s"] == pytest.approx(4.5, abs=0.3)
    # the whole-window figure moves with M; the split does not
    assert window["dbz"] * 1000 / m == pytest.approx(0.3 + 4500 / m)
    assert out["points"] >= steady.MIN_POINTS
    assert abs(dbz["drift"]) < 0.2  # steady indeed
    assert "unattributed" not in out["participants"]
    total = out["total"]
    assert total["fixed_cpu_s"] + total["steady_ms_per_msg"] / 1000 * m == pytest.approx(
        window["dbz"] + window["web"], rel=1e-3)


def test_a_warm_up_that_outlasts_the_start_shows_as_drift() -> None:
    # 5,000 messages in 5 s with a JVM warming for 3 s: the "steady" part is not, and says so
    samples, window, ins, dlv = _timeline(5_000, f_s=4.5, c_ms=0.3, warmup_s=3.0)
    dbz = split(samples, window, 5_000, ins, dlv)["participants"]["dbz"]
    assert dbz["steady_ms_per_msg"] > 0.4  # biased high ...
    assert dbz["drift"] < -0.4  # ... and flagged


def test_upstream_participants_are_charged_per_insert_not_per_delivery() -> None:
    # the inserts run 2 s ahead of the deliveries (closed loop on two cores): web's cost per insert
    # is 0.2 ms and it has no fixed part; counting deliveries instead would see a large F
    m = 20_000
    samples, window, ins, dlv = _timeline(m, f_s=1.0, c_ms=0.3, upstream_c_ms=0.2, lead_s=2.0)
    web = split(samples, window, m, ins, dlv)["participants"]["web"]
    assert web["steady_ms_per_msg"] == pytest.approx(0.2, rel=0.02)
    assert abs(web["fixed_cpu_s"]) < 0.05


def test_a_participant_too_quick_to_split_counts_whole_and_says_so() -> None:
    # the inserts all happen in the first 0.4 s: no steady part for web, which stays unsplit
    m = 20_000
    samples, window, ins, dlv = _timeline(m, f_s=1.0, c_ms=0.3, upstream_c_ms=0.2)
    ins = [ins[0] + i * 0.4 / m for i in range(m)]
    out = split(samples, window, m, ins, dlv)
    web = out["participants"]["web"]
    assert web["split"] is False and web["fixed_cpu_s"] == 0.0
    assert web["steady_ms_per_msg"] == pytest.approx(0.2)
    assert out["total"]["unsplit_cpu_s"] == pytest.approx(window["web"], abs=1e-3)
    assert out["participants"]["dbz"]["split"] is True


def test_a_run_too_short_to_split_says_why() -> None:
    samples, window, ins, dlv = _timeline(1_000, f_s=1.0, c_ms=0.3)  # one second of traffic
    out = split(samples, window, 1_000, ins, dlv)
    assert "participants" not in out and "too short" in out["error"]
    assert split([], window, 0, ins, [])["error"] == "no message delivered"


def test_per_message_cost_at_any_volume() -> None:
    rec = {"total": {"fixed_cpu_s": 4.5, "steady_ms_per_msg": 0.3}}
    assert steady.per_message(rec, 5_000) == pytest.approx(1.2)
    assert steady.per_message(rec, 100_000) == pytest.approx(0.345)
    assert steady.per_message({"error": "x"}, 5_000) is None
