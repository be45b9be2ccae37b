"""The price per million messages and N* in money, on synthetic runs with known costs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.study import crossover, money
from lab.study.money import GIB, MILLION, Prices


def test_cpu_is_priced_per_vcpu_second() -> None:
    p = Prices(vcpu_hour=3.6)  # a millicent per vCPU-second
    assert money.cpu_per_million(1.0, p) == pytest.approx(1.0)  # 1 ms × 1e6 = 1,000 s
    assert money.cpu_per_million(0.0, p) == 0.0
    assert Prices().vcpu_hour == pytest.approx(0.0408)


def test_only_hops_that_leave_their_zone_are_priced() -> None:
    zones = {"postgres": "a", "consumers": "b", "web": "a"}
    assert money.crosses("postgres>consumers", zones) and money.crosses("consumers_postgres", zones)
    assert not money.crosses("web>postgres", zones)
    assert not money.crosses("web>broker", zones) and not money.crosses("postgres>runner", zones)  # not placed
    p = Prices(cross_zone_gb=1.0)
    per_msg = {"postgres>consumers": GIB / MILLION, "web>postgres": 5 * GIB / MILLION}
    assert money.transfer_per_million(per_msg, zones, p) == pytest.approx(1.0)  # one GiB crossed
    assert money.transfer_per_million(per_msg, {h: "a" for h in ("postgres", "consumers", "web")}, p) == 0.0
    assert money.transfer_per_million({"postgres>consumers": math.nan}, zones, p) == 0.0


def test_disk_writes_are_free_by_default_and_priced_per_request_otherwise() -> None:
    assert money.disk_per_million(10_000.0) == 0.0
    per_request = money.disk_per_million(4096.0, money.PER_REQUEST_STORAGE)  # one 4 KiB request a message
    assert per_request == pytest.approx(0.20)  # $0.20 per million requests


def test_a_runs_price_adds_what_was_measured() -> None:
    p = Prices(vcpu_hour=3.6, cross_zone_gb=1.0, disk_write_gb=1.0)
    row = {"cpu_ms_per_msg": 2.0, "messages": 1000, "cpu_s.postgres": 0.5,
           "net_bytes_per_msg_postgres_consumers": GIB / MILLION, "disk_write_bytes_per_msg": 2 * GIB / MILLION}
    price = money.price_row(row, p, {"postgres": "a", "consumers": "b"}, participants=["postgres", "kafka"])
    assert price["cpu"] == pytest.approx(2.0) and price["transfer"] == pytest.approx(1.0)
    assert price["disk"] == pytest.approx(2.0) and price["total"] == pytest.approx(5.0)
    assert price["cpu.postgres"] == pytest.approx(0.5) and price["cpu.kafka"] is None
    bare = money.price_row({"cpu_ms_per_msg": 2.0, "messages": 1000, "disk_write_bytes_per_msg": math.nan}, p)
    assert bare["transfer"] is None and bare["disk"] is None and bare["total"] == pytest.approx(2.0)


def _runs(noise: float = 0.005, seed: int = 0) -> pd.DataFrame:
    """wal: 0.6 + 0.1·(N−1) ms/msg, every reader gets its WAL from postgres (600 B) and claims back
    (150 B); kafka: 1.5 ms/msg flat, Debezium reads the WAL once and the broker serves each reader
    (400 B), the readers claim back (150 B). N = 1, 2, 4, 8, 16, 3 repeats; N* in CPU = 10."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (1, 2, 4, 8, 16):
        for _ in range(3):
            rows.append({"pipeline": "wal", "consumers": n, "messages": 5000, "success": True, "warmup": False,
                         "cpu_ms_per_msg": 0.6 + 0.1 * (n - 1) + rng.normal(0, noise),
                         "net_bytes_per_msg_postgres_consumers": 600.0 * n,
                         "net_bytes_per_msg_consumers_postgres": 150.0 * n, "disk_write_bytes_per_msg": 900.0})
            rows.append({"pipeline": "kafka", "consumers": n, "messages": 5000, "success": True, "warmup": False,
                         "cpu_ms_per_msg": 1.5 + rng.normal(0, noise),
                         "net_bytes_per_msg_postgres_debezium": 600.0, "net_bytes_per_msg_debezium_broker": 700.0,
                         "net_bytes_per_msg_broker_consumers": 400.0 * n,
                         "net_bytes_per_msg_consumers_postgres": 150.0 * n, "disk_write_bytes_per_msg": 2500.0})
    return pd.DataFrame(rows)


def _first(ans: crossover.Answer) -> float:
    n = ans.models[0].n_star
    assert n is not None
    return n


def test_money_without_transfer_crosses_where_cpu_does() -> None:
    df = _runs()
    cpu = _first(crossover.crossings(df, "wal", "kafka", n_boot=50))
    assert cpu == pytest.approx(10.0, rel=0.05)
    assert _first(money.money_crossing(df, "wal", "kafka", transfer=False, n_boot=50)) == pytest.approx(cpu, rel=1e-6)
    one_zone = {h: "a" for h in money.ZONES}
    assert _first(money.money_crossing(df, "wal", "kafka", zones=one_zone, n_boot=50)) == pytest.approx(cpu, rel=1e-6)


def test_cross_zone_traffic_moves_the_crossover_by_its_slope() -> None:
    """Default placement: wal pays (600 + 150)·N B crossing zones, kafka 700 + 150·N B (Debezium →
    broker and the claims; the broker serves the readers in their own zone): N* in money comes far
    before N* in CPU."""
    df = _runs(noise=0.0)
    p = Prices()
    pb = p.cross_zone_gb / p.gb_bytes * MILLION  # USD per million messages for one byte a message
    a_w, b_w = money.cpu_per_million(0.6, p) + 750 * pb, money.cpu_per_million(0.1, p) + 750 * pb  # at x = N − 1
    kafka = {n: money.cpu_per_million(1.5, p) + (700 + 150 * n) * pb for n in (1, 2, 4, 8, 16)}
    flat = 1 + (kafka[4] - a_w) / b_w  # the flat broker: its median over N (N = 4)
    sloped = 1 + (kafka[1] - a_w) / (b_w - 150 * pb)  # the broker's own line
    ans = money.money_crossing(df, "wal", "kafka", p, n_boot=20)
    by_model = {m.model: m.n_star for m in ans.models}
    assert by_model[crossover.MODELS[0]] == pytest.approx(flat, rel=1e-3)
    assert by_model[crossover.MODELS[1]] == pytest.approx(sloped, rel=1e-3)
    assert max(flat, sloped) < 3.0  # from 10 in CPU
    shift = money.crossover_shift(df, "wal", "kafka", p, n_boot=20)
    by = dict(zip(shift["condition"], shift["n_star"], strict=True))
    assert by["CPU"] == pytest.approx(10.0, rel=1e-3) and by["money, no transfer"] == pytest.approx(10.0, rel=1e-3)
    assert by["money, one zone"] == pytest.approx(10.0, rel=1e-3)
    assert by["money, consumers beside the broker, away from the database"] == pytest.approx(flat, rel=1e-3)
    assert by["money, every host in a zone of its own"] < 10.0
    assert shift["transfer_measured"].all()


def test_runs_without_a_network_block_price_cpu_and_disk_only() -> None:
    df = _runs().drop(columns=[c for c in _runs().columns if c.startswith("net_")])
    table = money.price_table(df, money.PER_REQUEST_STORAGE)
    assert table["usd_per_million.transfer"].isna().all()
    assert (table["usd_per_million.disk"] > 0).all()
    shift = money.crossover_shift(df, "wal", "kafka", n_boot=20)
    assert not shift["transfer_measured"].any()
    assert np.allclose(shift["n_star"], shift["n_star"].iloc[0], rtol=1e-9)  # nothing to move it


def test_the_report_tables_take_the_median_per_cell_and_name_the_parts() -> None:
    from lab.study import report

    df = _runs()
    df["wal_bytes_per_msg"] = 800.0
    df["disk_write_bytes_per_msg_postgres"] = df["disk_write_bytes_per_msg"]
    df["disk_write_bytes_per_msg_kafka"] = None
    table = report.bytes_table(df)
    assert {"WAL", "disk, total", "disk, postgres", "net, postgres → consumers"} <= set(table.columns)
    assert "disk, kafka" not in table.columns  # never measured
    wal16 = table[(table["pipeline"] == "wal") & (table["consumers"] == 16)].iloc[0]
    assert wal16["net, postgres → consumers"] == 9600.0 and wal16["WAL"] == 800.0
    assert report.bytes_table(df.drop(columns=[c for c in df.columns if "bytes_per_msg" in c])).empty
    usd = report.money_table(df)
    row = usd[(usd["pipeline"] == "kafka") & (usd["consumers"] == 1)].iloc[0]
    assert row["USD/M msg, cpu"] == pytest.approx(money.cpu_per_million(1.5), rel=0.02)
    assert row["USD/M msg, total"] == pytest.approx(row["USD/M msg, cpu"] + row["USD/M msg, transfer"])


def test_the_report_section_says_what_it_shows_and_saves_its_tables(tmp_path: Path) -> None:
    from lab.study import report

    df = _runs()
    df["wal_bytes_per_msg"] = 800.0
    parts = report.bytes_and_money(df, tmp_path, n_boot=20)
    assert isinstance(parts[0], str) and parts[0].startswith("## Bytes per message")
    tables = [p for p in parts if isinstance(p, pd.DataFrame)]
    saved = {p.name for p in tmp_path.iterdir()}
    assert len(tables) == 3 and {"bytes.csv", "money.csv", "crossover_money.csv"} <= saved
    shift = pd.read_csv(tmp_path / "crossover_money.csv")
    assert set(shift["condition"]) >= {"CPU", "money, no transfer", "money, one zone"}
    bare = report.bytes_and_money(df.drop(columns=[c for c in df.columns if "bytes_per_msg" in c]), n_boot=20)
    assert any(isinstance(p, str) and "No run of this series" in p for p in bare)


def test_every_host_of_the_ha_layout_is_placed_and_each_node_away_from_its_peers() -> None:
    from lab.settings import HA_NETNS_HOSTS, NETNS_HOSTS
    assert set(NETNS_HOSTS) | set(HA_NETNS_HOSTS) == set(money.ZONES)
    for nodes in (("broker", "broker-2", "broker-3"), ("rabbitmq", "rabbitmq-2", "rabbitmq-3"),
                  ("postgres", "postgres-standby")):
        assert len({money.ZONES[n] for n in nodes}) == len(nodes)


def test_an_ha_runs_replication_is_priced_as_cross_zone() -> None:
    """A kafka run under ha: Debezium writes to the partitions' leaders on every node, the nodes
    replicate to each other, the primary streams its WAL to the standby, the consumers fetch from
    a leader and claim back."""
    p = Prices(cross_zone_gb=1.0)
    gib = GIB / MILLION  # bytes per message for one GiB a million messages, $1 at this price
    hops = {"postgres>debezium": 7 * gib,  # a -> a
            "postgres>postgres-standby": 1 * gib,  # a -> b
            "debezium>broker": 2 * gib, "debezium>broker-2": 3 * gib,  # a -> b, a -> c
            "debezium>broker-3": 11 * gib,  # a -> a
            "broker>broker-2": 4 * gib, "broker-2>broker-3": 5 * gib, "broker-3>broker": 6 * gib,
            "broker-3>consumers": 8 * gib,  # a -> b
            "broker>consumers": 13 * gib,  # b -> b
            "consumers>postgres": 9 * gib,  # b -> a
            "postgres>runner": 17 * gib}  # the lab's own reads: never priced
    by_hop = money.transfer_by_hop(hops, prices=p)
    assert by_hop == pytest.approx({"postgres>postgres-standby": 1.0, "debezium>broker": 2.0, "debezium>broker-2": 3.0,
                                    "broker>broker-2": 4.0, "broker-2>broker-3": 5.0, "broker-3>broker": 6.0,
                                    "broker-3>consumers": 8.0, "consumers>postgres": 9.0})
    assert money.transfer_per_million(hops, prices=p) == pytest.approx(38.0)
    # the same through a run's columns, at the default price ($0.02 a GiB): 1,000 B/msg of replication
    row = {"cpu_ms_per_msg": 0.0, "messages": 2000, "net_bytes_per_msg_broker_broker-2": 600.0,
           "net_bytes_per_msg_broker-2_broker-3": 400.0, "net_bytes_per_msg_broker-3_consumers": 0.0}
    assert money.price_row(row)["transfer"] == pytest.approx(1000 / GIB * 0.02 * MILLION)  # $0.0186
    assert money.price_row(row, zones=money.PLACEMENTS["one zone"])["transfer"] == 0.0
