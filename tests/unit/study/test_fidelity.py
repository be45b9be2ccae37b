"""Against the article: the published numbers reproduce the article's own figures, and small
hand-computed frames give the values worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lab.study import costmodel, fidelity


def _run(pipeline: str, n: int, k: int, *, total: float, postgres: float, messages: int = 1000,
         **cpu_s: float) -> dict[str, object]:
    """One successful run; ``total`` and ``postgres`` in ms CPU/msg, other participants in CPU-s."""
    return {"run_id": f"{pipeline}-c{n}-{k}", "pipeline": pipeline, "consumers": n, "messages": messages,
            "success": True, "warmup": False, "window_s": 10.0, "cpu_ms_per_msg": total,
            "cpu_s.postgres": postgres * messages / 1000, **{f"cpu_s.{p}": v for p, v in cpu_s.items()}}


def _frame() -> pd.DataFrame:
    # wal c1: postgres 0.5, 0.6, 5.0 (an outlier) -> median 0.6; totals 0.9, 1.0, 1.1 -> 1.0
    # wal c8: postgres 1.3, 1.3, 1.4 -> 1.3, so PostgreSQL's slope is (1.3 - 0.6) / 7 = 0.1
    # kafka c8: totals 2.0, 2.1, 9.9 -> 2.1; N* = 1 + (2.1 - 1.0) / 0.1 = 12
    wal_c1, wal_c8 = [(0.9, 0.5), (1.0, 0.6), (1.1, 5.0)], [(1.8, 1.3), (1.9, 1.3), (2.0, 1.4)]
    rows = [_run("wal", 1, k, total=t, postgres=p) for k, (t, p) in enumerate(wal_c1)]
    rows += [_run("wal", 8, k, total=t, postgres=p) for k, (t, p) in enumerate(wal_c8)]
    rows += [_run("kafka", n, k, total=t, postgres=0.7) for n in (1, 8) for k, t in enumerate([2.0, 2.1, 9.9])]
    return pd.DataFrame(rows)


def test_the_published_inputs_give_the_articles_slope_and_n_of_about_11() -> None:
    x = fidelity.article_crossover(costmodel.published_runs(), "wal", "kafka")
    assert round(x["slope_pg"], 3) == 0.094  # "PG pays ≈ 9.4 CPU-s per extra reader"
    assert round(x["n_star"]) == 11 and x["missing"] is None  # "crosses ... at N ≈ 11"
    assert x["level"] == pytest.approx(2.159) and x["direct_lo"] == pytest.approx(1.187)


def test_medians_per_cell_feed_the_articles_recipe() -> None:
    x = fidelity.article_crossover(_frame(), "wal", "kafka")
    assert x["pg_lo"] == pytest.approx(0.6) and x["pg_hi"] == pytest.approx(1.3)  # the 5.0 outlier is ignored
    assert x["slope_pg"] == pytest.approx(0.1) and x["level"] == pytest.approx(2.1)
    assert x["slope_total"] == pytest.approx((1.9 - 1.0) / 7)
    assert x["n_star"] == pytest.approx(12.0)


def test_a_missing_cell_is_named_and_gives_no_n_star() -> None:
    df = _frame()
    x = fidelity.article_crossover(df[~((df["pipeline"] == "wal") & (df["consumers"] == 8))], "wal", "kafka")
    assert math.isnan(x["n_star"]) and x["missing"] == "wal N=8"
    flat = df.assign(**{"cpu_s.postgres": 0.6})  # PostgreSQL does not grow: no crossing the article's way
    assert math.isnan(fidelity.article_crossover(flat)["n_star"])


def test_crossover_table_puts_ours_beside_the_published_and_our_own_fit() -> None:
    crossing = pd.DataFrame([dict(direct="wal", broker="kafka", n_star_upto8=9.5, n_star_all=9.7,
                                  first_measured_n=None, verdict="no crossing up to N=8")])
    t = fidelity.crossover_table(_frame(), crossing=crossing)
    assert list(zip(t["direct"], t["broker"], strict=True)) == [("wal", "kafka"), ("wal", "rabbitmq")]
    row = t.iloc[0]
    assert row["n_star_ours"] == pytest.approx(12.0) and round(row["n_star_published"]) == 11
    assert row["n_star_all"] == 9.7 and pd.isna(row["missing_ours"])
    assert t.iloc[1]["missing_ours"] == "rabbitmq N=8" and math.isnan(t.iloc[1]["n_star_all"])


def test_throughput_follows_the_references_definitions() -> None:
    run = _run("wal", 2, 0, total=1.0, postgres=0.5) | {
        "sent": 1000, "processed": 1000, "db_ops": 20, "window_s": 6.0,
        "senders.first_send_mono": 100.0, "senders.last_send_mono": 104.0, "senders.send_p95_ms": 50.0}
    t = fidelity.throughput_runs(pd.DataFrame([run])).iloc[0]
    assert t["produce_s"] == 4.0 and t["send_per_s"] == 250.0
    assert t["drain_only_s"] == 2.0 and t["drain_only_per_s"] == 500.0  # every processed message / the tail
    assert t["ops_per_msg"] == 0.02 and t["send_p95_ms"] == 50.0
    table = fidelity.throughput_table(pd.DataFrame([run])).iloc[0]
    assert table["send_per_s_published"] == 7783 and table["ops_per_msg_published"] == 0.02  # published: wal c2
    assert table["ops_per_msg_ratio"] == pytest.approx(1.0)


def test_participants_sum_ours_into_the_articles_test_column() -> None:
    run = _run("wal", 1, 0, total=1.0, postgres=0.32, senders=0.1, consumers=0.2, runner=0.05, web=0.3)
    long = fidelity.participants_table(pd.DataFrame([run])).set_index("participant")
    assert long.loc["test", "ours"] == pytest.approx(0.35)  # (0.1 + 0.2 + 0.05) s * 1000 / 1000 messages
    assert long.loc["test", "published"] == pytest.approx(0.152)  # 15.2 CPU-s / 100,000 (published: wal c1)
    assert long.loc["postgres", "ratio"] == pytest.approx(0.5)  # 0.32 against 0.64
    assert long.loc["test", "ours_from"] == "senders + consumers + runner"
    wide = fidelity.participants_wide(long.reset_index())
    assert wide.loc[("wal", 1), "postgres"] == "0.32 (0.64)"
    assert wide.loc[("wal", 1), "sum"] == "1.00 (1.19)"


def test_agreement_flags_only_gaps_over_ten_percent() -> None:
    same = fidelity.agreement(costmodel.published_runs())
    assert (same["ratio"].round(9) == 1).all() and not same["over_gap"].any()
    ours = costmodel.published_runs()
    wal_c1 = (ours["pipeline"] == "wal") & (ours["consumers"] == 1) & ~ours["warmup"]
    ours.loc[wal_c1, "cpu_s.postgres"] *= 1.2
    ours.loc[wal_c1, "cpu_s.web"] *= 1.05
    got = fidelity.agreement(ours).set_index("quantity")
    assert got.loc["postgres, wal c1", "ratio"] == pytest.approx(1.2) and got.loc["postgres, wal c1", "over_gap"]
    assert not got.loc["web, wal c1", "over_gap"]  # 5 %: within the article's noise
    assert got.loc["PostgreSQL's growth with N, wal c1→c8", "over_gap"]  # 2.03 / 1.2
    no_kafka = fidelity.agreement(ours[ours["pipeline"] != "kafka"]).set_index("quantity")
    assert pd.isna(no_kafka.loc["debezium, kafka c1", "over_gap"])
    assert math.isnan(no_kafka.loc["debezium, kafka c1", "ours"])
    ours.loc[ours["pipeline"] == "kafka", "cpu_s.kafka"] = 0.0  # no division by zero
    idle = fidelity.agreement(ours).set_index("quantity")
    assert math.isnan(idle.loc["Debezium against the Kafka broker, kafka c1", "ours"])


def test_mapping_covers_every_participant_but_the_residual() -> None:
    ours = {p for parts in fidelity.MAPPING.values() for p in parts}
    assert ours == {"postgres", "kafka", "rabbitmq", "debezium", "web", "senders", "consumers", "runner"}
    assert fidelity.mapping_table().loc["test", "ours"] == "senders + consumers + runner"
