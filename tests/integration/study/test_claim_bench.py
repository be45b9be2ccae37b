"""``lab bench claims`` on the real stack, small: the claimers race for every position and win each
once, a small claim table is read whole by the claim, and the bench leaves the runs' table alone."""

from __future__ import annotations

import psycopg
import pytest

from lab.settings import Settings
from lab.study.claim_table import SCHEMA, bench_claims
from tests.integration.checks import scalar

pytestmark = pytest.mark.integration


def test_a_small_claim_table_is_read_whole_by_every_claim(stack: object, settings: Settings) -> None:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE inbox_wal")
        conn.execute("INSERT INTO inbox_wal VALUES ('0/10', 'a run''s claim')")
    out = bench_claims(settings, sizes=(0, 3_000), claimers=(1, 2), messages=300, conditions=("reference",),
                       switch_max=5_000)
    cells = out["cells"]
    assert [(c["rows_before"], c["claimers"]) for c in cells] == [(0, 1), (0, 2), (3_000, 1), (3_000, 2)]
    for c in cells:
        assert c["won"] == 300 and c["lost"] == 300 * (c["claimers"] - 1)  # every position once
        assert c["statements"] == 3 * c["claimers"] + (c["claimers"] > 1)  # the second claimer's first batch is short
        assert c["claim_us_per_msg"] > 0
        # the table as a run leaves it: the plan reads all of it for the rows the slot already owns
        assert any(n["node"] == "Seq Scan" and not n["keyed"] for n in c["plan"]["on_table"])
        assert c["table"]["index_depth"] >= 1 and c["table"]["heap_bytes"] > 0
    assert out["switch_rows"] == {"reference": None}  # no switch up to 5,000 rows
    # the bench's schema is gone and the runs' table is as it was
    assert scalar(settings, f"SELECT count(*) FROM pg_namespace WHERE nspname = '{SCHEMA}'") == 0
    assert scalar(settings, "SELECT count(*) FROM inbox_wal") == 1
