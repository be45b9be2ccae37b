"""run.json's ``network`` block from two counter readings (pure)."""

from __future__ import annotations

from lab.measure.network import delta, network_block


def test_bytes_per_hop_are_the_window_differences_divided_by_the_messages() -> None:
    before = {"links": {"postgres": {"sent": 100, "received": 50}},
              "pairs": {"postgres>consumers": 1_000, "consumers>postgres": 10, "web>broker": 7}}
    after = {"links": {"postgres": {"sent": 400_100, "received": 200_050}},
             "pairs": {"postgres>consumers": 301_000, "consumers>postgres": 100_010, "web>broker": 7}}
    counted = delta(before, after)
    assert counted == {"links": {"postgres": {"sent": 400_000, "received": 200_000}},
                       "pairs": {"postgres>consumers": 300_000, "consumers>postgres": 100_000, "web>broker": 0}}
    block = network_block(counted, 1_000)
    assert block is not None and block["messages"] == 1_000
    assert block["hops"]["postgres → consumers"] == {"bytes": 300_000, "bytes_per_msg": 300.0}
    assert block["hops"]["consumers → postgres"] == {"bytes": 100_000, "bytes_per_msg": 100.0}
    assert block["hops"]["debezium → broker"] == {"bytes": 0, "bytes_per_msg": 0.0}  # a hop this pipeline lacks
    assert "web>broker" not in block["pairs"]  # pairs that carried nothing are left out
    assert block["links"]["postgres"]["sent"] == {"bytes": 400_000, "bytes_per_msg": 400.0}
    assert network_block(None, 1_000) is None and network_block(counted, 0) is None


def test_the_broker_hops_count_the_runs_broker_on_kafkas_host_or_rabbitmqs() -> None:
    before = {"links": {}, "pairs": {"debezium>rabbitmq": 0, "rabbitmq>consumers": 0, "debezium>broker": 0,
                                     "broker>consumers": 0, "consumers>rabbitmq": 0}}
    after = {"links": {}, "pairs": {"debezium>rabbitmq": 900_000, "rabbitmq>consumers": 1_200_000,
                                    "debezium>broker": 0, "broker>consumers": 0, "consumers>rabbitmq": 80_000}}
    block = network_block(delta(before, after), 2_000)
    assert block is not None
    assert block["hops"]["debezium → broker"] == {"bytes": 900_000, "bytes_per_msg": 450.0}
    assert block["hops"]["broker → consumers"] == {"bytes": 1_200_000, "bytes_per_msg": 600.0}
    assert block["pairs"]["rabbitmq>consumers"]["bytes_per_msg"] == 600.0  # each host's pairs stay apart
    assert set(block["pairs"]) == {"debezium>rabbitmq", "rabbitmq>consumers", "consumers>rabbitmq"}
