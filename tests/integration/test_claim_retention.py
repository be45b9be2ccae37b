"""A ``wal`` run whose claim table is pruned behind the slots, on the real stack: every message is
still worked once, and the pruned claims are counted exactly while the table stays small."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings

pytestmark = pytest.mark.integration
M = 6_000
RATE = 1_000.0  # msg/s: six seconds of claims whatever the machine's speed, several prune periods


def test_pruned_claims_are_counted_and_the_table_stays_small(stack: object, settings: Settings) -> None:
    scenario = Scenario(pipeline="wal", consumers=4, messages=M, rate=RATE, cooldown_s=0,
                        claim_retention="behind-slots")
    r: dict[str, Any] = asyncio.run(run_scenario(scenario, settings))
    assert r["success"], r["error"]
    c, table = r["counters"], r["pipeline_settings"]["claim_table"]
    # exactly once, the pruned claims included: the predicate counts them from the ledger
    assert c["inbox_rows"] == c["distinct_ids"] == c["work_calls"] == c["work_distinct"] == M
    assert c["ids_match"] is True and c["skipped"] == 3 * M
    assert table["pruned"] + table["rows"] == M and table["prunes"] >= 3
    with psycopg.connect(settings.pg_dsn) as conn:
        ledger = conn.execute("SELECT sum(claims) FROM inbox_wal_pruned").fetchone()
        left = conn.execute("SELECT count(*) FROM inbox_wal").fetchone()
    assert ledger is not None and left is not None and (ledger[0], left[0]) == (table["pruned"], table["rows"])
    # kept small: most claims went during the run, and the table never held half of them
    assert table["pruned"] >= M // 2 and table["rows"] <= table["rows_max"] <= M // 2
    sizes = r["vacuum"]["sizes"]["inbox_wal"]
    print(f"claim table: at most {table['rows_max']} rows, {table['rows']} at the end, {table['pruned']} pruned "
          f"in {table['prunes']} prunes; heap {sizes['heap_bytes']} B, index {sizes['index_bytes']} B")
    # the pruner is a measured participant: its backend is PostgreSQL's prune group
    pg = r["postgres_backends"]
    assert pg["processes"]["prune"] == 1 and pg["cpu_s"]["prune"] > 0
    assert r["pipeline_settings"]["claim_retention"]["mode"] == "behind-slots"
    assert r["scenario"]["claim_retention"] == "behind-slots"
