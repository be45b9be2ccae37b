"""The F + c·M split recovers known costs from synthetic timelines shaped like real runs."""

from __future__ import annotations

import math
import random

import pytest

from lab.measure import steady
from lab.measure.steady import Sample, split, theil_sen


def _timeline(m: int, *, f_s: float = 4.5, warmup_s: float = 3.0, insert_rate: float = 2000.0,
              deliver_rate: float = 1000.0, web_in_ms: float = 0.2, web_out_ms: float = 0.08,
              dbz_in_ms: float = 0.3, cons_ms: float = 0.2, noise_s: float = 0.0, period: float = 0.5,
              seed: int = 1):
    """Closed loop on two cores: inserts at ``insert_rate`` run ahead of deliveries at
    ``deliver_rate`` (which start once the first row exists). ``dbz`` pays ``f_s`` over its warm-up
    (decaying like a JIT) plus ``dbz_in_ms`` per insert; ``web`` pays per insert and per work call;
    ``cons`` per delivery."""
    rng = random.Random(seed)
    t0 = 1_000_000.0
    inserted = [t0 + i / insert_rate for i in range(m)]
    delivered = [max(inserted[i], t0 + i / deliver_rate) + 0.01 for i in range(m)]
    delivered.sort()
    end = delivered[-1] + 1.0
    tau = warmup_s / 3
    samples, t = [], t0
    while t <= end:
        k, n = steady._count(inserted, t), steady._count(delivered, t)
        warm = f_s * (1 - math.exp(-(t - t0) / tau))
        jitter = rng.gauss(0, noise_s) if noise_s else 0.0
        samples.append(Sample(t, {"dbz": warm + dbz_in_ms / 1000 * k + jitter,
                                  "web": web_in_ms / 1000 * k + web_out_ms / 1000 * n,
                                  "cons": cons_ms / 1000 * n}, t_s=t - t0))
        t += period
    window = {"dbz": f_s + dbz_in_ms / 1000 * m, "web": (web_in_ms + web_out_ms) / 1000 * m,
              "cons": cons_ms / 1000 * m, "unattributed": 0.7}
    return samples, window, inserted, delivered


def test_theil_sen_ignores_one_outlier() -> None:
    assert theil_sen([0, 1, 2, 3, 4, 5, 6], [0, 2, 4, 60, 8, 10, 12]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        theil_sen([1, 1], [0, 1])


@pytest.mark.parametrize(("m", "warmup_s"), [(5_000, 0.3), (20_000, 1.0), (100_000, 3.0)])
def test_known_fixed_and_steady_costs_come_back_at_every_volume(m: int, warmup_s: float) -> None:
    samples, window, ins, dlv = _timeline(m, warmup_s=warmup_s, noise_s=0.005)
    out = split(samples, window, m, ins, dlv)
    p = out["participants"]
    assert p["dbz"]["steady_ms_per_msg"] == pytest.approx(0.3, rel=0.05)
    assert p["dbz"]["fixed_cpu_s"] == pytest.approx(4.5, abs=0.3)
    assert p["cons"]["steady_ms_per_msg"] == pytest.approx(0.2, rel=0.02)
    assert abs(p["cons"]["insert_ms"]) < 0.01  # a consumer works on deliveries only
    # web works in both stages: both costs come back, and their sum is its steady cost
    assert p["web"]["insert_ms"] == pytest.approx(0.2, rel=0.05)
    assert p["web"]["delivery_ms"] == pytest.approx(0.08, rel=0.1)
    assert abs(p["web"]["fixed_cpu_s"]) < 0.1
    assert "unattributed" not in p
    total = out["total"]
    assert total["fixed_cpu_s"] + total["steady_ms_per_msg"] / 1000 * m == pytest.approx(
        window["dbz"] + window["web"] + window["cons"], rel=1e-3)
    # the whole-window figure moves with M; the split does not
    assert window["dbz"] * 1000 / m == pytest.approx(0.3 + 4500 / m)
    assert out["progress"][0][0] == 0.0 and out["progress"][-1][2] == m


def test_a_warm_up_outlasting_the_start_of_the_loaded_part_inflates_c() -> None:
    # the limit of a split from one run: 5,000 messages with a 3 s warm-up, still going when 20 %
    # were inserted, is charged to the messages; only more messages (or runs at several volumes) help
    samples, window, ins, dlv = _timeline(5_000, warmup_s=3.0)
    dbz = split(samples, window, 5_000, ins, dlv)["participants"]["dbz"]
    assert dbz["steady_ms_per_msg"] > 0.4 and dbz["fixed_cpu_s"] < 4.0


def test_open_loop_with_inserts_and_deliveries_together_is_one_stage() -> None:
    samples, window, ins, dlv = _timeline(20_000, insert_rate=500.0, deliver_rate=500.0, warmup_s=1.0)
    p = split(samples, window, 20_000, ins, dlv)["participants"]
    assert p["dbz"]["model"].startswith("one stage")
    assert p["web"]["steady_ms_per_msg"] == pytest.approx(0.28, rel=0.02)
    assert p["dbz"]["fixed_cpu_s"] == pytest.approx(4.5, abs=0.3)


def test_a_participant_missing_from_the_timeline_counts_whole_and_says_so() -> None:
    m = 20_000
    samples, window, ins, dlv = _timeline(m)
    window = {**window, "late": 2.0}
    out = split(samples, window, m, ins, dlv)
    assert out["participants"]["late"] == {"fixed_cpu_s": 0.0, "steady_ms_per_msg": 0.1, "split": False}
    assert out["total"]["unsplit_cpu_s"] == 2.0


def test_a_run_too_short_to_split_says_why() -> None:
    samples, window, ins, dlv = _timeline(1_000)  # one second of traffic
    out = split(samples, window, 1_000, ins, dlv)
    assert "participants" not in out and "too short" in out["error"]
    assert split([], window, 0, ins, [])["error"] == "no message delivered"


def test_per_message_cost_at_any_volume() -> None:
    rec = {"total": {"fixed_cpu_s": 4.5, "steady_ms_per_msg": 0.3}}
    assert steady.per_message(rec, 5_000) == pytest.approx(1.2)
    assert steady.per_message(rec, 100_000) == pytest.approx(0.345)
    assert steady.per_message({"error": "x"}, 5_000) is None
