"""PostgreSQL's CPU by group, from two readings of its processes."""

from __future__ import annotations

import pytest

from lab.measure.pgbackends import Process, breakdown, group_of


def test_groups_come_from_backend_type_and_application_name() -> None:
    assert group_of("walsender", "") == "walsenders"
    assert group_of("client backend", "lab-claims") == "claims"
    assert group_of("client backend", "lab-web") == "inserts"
    assert group_of("client backend", "lab-shards") == "shards"
    assert group_of("client backend", "lab-relay") == "relay"
    assert group_of("client backend", "lab-prune") == "prune"
    assert group_of("client backend", "psql") == ""
    assert group_of("checkpointer", "") == ""


def test_each_group_is_charged_its_window_and_the_rest_is_other() -> None:
    start = {10: Process("walsenders", "load_test_slot_0", 5.0), 11: Process("walsenders", "load_test_slot_1", 1.0),
             20: Process("claims", "", 2.0), 30: Process("inserts", "", 7.0), 40: Process("", "", 9.0),
             50: Process("claims", "", 1.0)}  # 50 exits inside the window: not seen at the end
    end = {10: Process("walsenders", "load_test_slot_0", 8.0), 11: Process("walsenders", "load_test_slot_1", 3.5),
           20: Process("claims", "", 3.0), 30: Process("inserts", "", 11.0), 40: Process("", "", 9.5),
           60: Process("walsenders", "dbz_kafka", 0.5)}  # started inside the window: all of it counts
    out = breakdown(start, end, postgres_cpu_s=15.0, messages=10_000)
    assert out["cpu_s"]["walsenders"] == pytest.approx(3.0 + 2.5 + 0.5)
    assert out["walsender_cpu_s_per_slot"] == {"load_test_slot_0": 3.0, "load_test_slot_1": 2.5, "dbz_kafka": 0.5}
    assert out["cpu_s"]["claims"] == 1.0 and out["cpu_s"]["inserts"] == 4.0
    assert out["cpu_s"]["other"] == pytest.approx(15.0 - 11.0)
    assert out["ms_per_msg"]["walsenders"] == pytest.approx(0.6)
    assert out["processes"] == {"walsenders": 3, "claims": 1, "inserts": 1, "shards": 0, "relay": 0, "prune": 0}
    assert breakdown(start, end, None, 10_000)["cpu_s"]["other"] is None
