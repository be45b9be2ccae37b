"""WAL generated over the window (lab.measure.walstats): LSNs, differences, run.json's ``wal``."""

from __future__ import annotations

import pytest

from lab.measure.walstats import WalWindow, parse_lsn, wal_block, wal_delta


def test_an_lsn_is_a_byte_position() -> None:
    assert parse_lsn("0/0") == 0
    assert parse_lsn("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert parse_lsn("1/0") - parse_lsn("0/FFFFFFFF") == 1
    with pytest.raises(ValueError, match="not an LSN"):
        parse_lsn("16B374D848")


def test_the_window_is_the_difference_of_the_edges() -> None:
    before = {"lsn": parse_lsn("0/1000000"), "records": 10, "fpi": 1, "wal_bytes": 900, "server": "5432 t0"}
    after = {"lsn": parse_lsn("0/1100000"), "records": 4_010, "fpi": 3, "wal_bytes": 1_040_900, "server": "5432 t0"}
    d = wal_delta(before, after)
    assert d == {"lsn_bytes": 0x100000, "wal_bytes": 1_040_000, "records": 4_000, "fpi": 2, "server_changed": False}
    block = wal_block(d, 1_000)
    assert block is not None and block["messages"] == 1_000
    assert block["per_msg"] == pytest.approx(1048.58) and block["stats_per_msg"] == 1040.0
    assert block["records_per_msg"] == 4.0 and block["fpi_per_msg"] == 0.0
    assert wal_block(None, 1_000) is None and wal_block(d, 0) is None


def test_another_server_keeps_the_lsn_distance_and_drops_the_statistics() -> None:
    before = {"lsn": 100, "records": 10, "fpi": 1, "wal_bytes": 900, "server": "5432 t0"}
    after = {"lsn": 5_100, "records": 3, "fpi": 0, "wal_bytes": 50, "server": "5433 t1"}  # the promoted standby
    d = wal_delta(before, after)
    assert d["lsn_bytes"] == 5_000 and d["server_changed"] is True
    assert d["wal_bytes"] is d["records"] is d["fpi"] is None
    block = wal_block(d, 100)
    assert block is not None and block["per_msg"] == 50.0 and block["stats_per_msg"] is None


def test_an_unreachable_server_leaves_the_block_empty_and_says_why() -> None:
    w = WalWindow("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1")
    w.start()
    w.stop()
    assert w.record() is None and w.error is not None
