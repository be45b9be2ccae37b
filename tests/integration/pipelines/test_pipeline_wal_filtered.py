"""``wal-filtered`` on the real native stack.

A whole run through :func:`lab.runner.run_scenario` at N = 4 (1 and 16 in the matrix), started
over a leftover split of another N, and the consumer half on its own: two readers of a 2-way split
each receive only their share and still confirm the WAL past the rows that went to the other.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from lab.pipelines.wal_filtered import (
    FilteredWalPipeline,
    FilteredWalSource,
    publication_name,
    reset_publications,
    share,
)
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from tests.integration.checks import scalar

pytestmark = pytest.mark.integration

M = 1000
OUR_SLOTS = "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'load\\_test\\_slot%'"
OUR_PUBLICATIONS = "SELECT count(*) FROM pg_publication WHERE pubname LIKE 'filtered\\_pub\\_%'"


def assert_clean(settings: Settings) -> None:
    """No slot and no filtered publication of ours outlives a run; wal's publication stays."""
    assert scalar(settings, OUR_SLOTS) == 0
    assert scalar(settings, OUR_PUBLICATIONS) == 0
    assert scalar(settings, "SELECT count(*) FROM pg_publication WHERE pubname = 'load_test_pub'") == 1


def claims_by_slot(settings: Settings) -> dict[str, int]:
    with psycopg.connect(settings.pg_dsn) as conn:
        return dict(conn.execute("SELECT slot, count(*) FROM inbox_wal GROUP BY 1").fetchall())


@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.matrix), 4,
                               pytest.param(16, marks=pytest.mark.matrix)])
def test_a_run_delivers_every_share_once_and_leaves_nothing(settings: Settings, stack: object, n: int) -> None:
    reset_publications(settings.pg_dsn, 3)  # a split of another N left behind (an interrupted run)
    scenario = Scenario(pipeline="wal-filtered", consumers=n, messages=M, senders=20, cooldown_s=0)
    result: dict[str, Any] = asyncio.run(run_scenario(scenario, settings))
    assert result["success"], result["error"]
    c = result["counters"]
    assert c["inbox_rows"] == c["distinct_ids"] == M
    assert c["skipped"] == 0  # nobody receives another's row: no claim is ever lost
    assert result["pipeline_settings"]["publications"] == [publication_name(n, k) for k in range(n)]
    with psycopg.connect(settings.pg_dsn) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM messages ORDER BY 1").fetchall()]
    # each slot claimed exactly its share of the ids: the filter split the rows, not a race
    assert claims_by_slot(settings) == {f"load_test_slot_{k}": len(share(ids, n, k)) for k in range(n)
                                        if share(ids, n, k)}
    assert_clean(settings)


async def _two_readers(settings: Settings, stack: object) -> None:
    scenario = Scenario(pipeline="wal-filtered", consumers=2, messages=40, cooldown_s=0)
    pipeline = FilteredWalPipeline(scenario, settings, stack)  # type: ignore[arg-type]
    await pipeline.prepare()
    sources = [FilteredWalSource(scenario, settings, k) for k in range(2)]
    try:
        for s in sources:
            await s.open()
        await pipeline.wait_ready()
        async with await psycopg.AsyncConnection.connect(settings.pg_dsn, autocommit=True) as conn:
            ids = [(await (await conn.execute("INSERT INTO messages (content) VALUES (%s) RETURNING id",
                                              [f"m{i}"])).fetchone())[0] for i in range(40)]
            end = (await (await conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).fetchone())[0]
        got: list[list[int]] = [[], []]
        for k, s in enumerate(sources):
            for _ in range(50):
                if len(got[k]) >= len(share(ids, 2, k)):
                    break
                for item in await s.claim(await s.fill(100, 0.2, 0.05)):
                    got[k].append(item.id)
                    s.done(item)
            assert sorted(got[k]) == share(ids, 2, k)
            assert s.skipped == 0 and s.db_ops >= 1
        # the last row went to one reader; the other saw no Begin or Commit for it (pgoutput skips
        # empty transactions) and still confirms past it, from a keepalive once nothing is held
        for s in sources:
            for _ in range(100):
                await s.fill(100, 0.1, 0.05)
                await s.idle()
                assert s._stream is not None
                if s._stream.status_lsn >= end:
                    break
            assert s._stream is not None and s._stream.status_lsn >= end, s.slot
    finally:
        for s in sources:
            await s.close()
        await pipeline.teardown()
    assert_clean(settings)


def test_readers_receive_only_their_share_and_confirm_past_the_rest(settings: Settings, stack: object) -> None:
    asyncio.run(_two_readers(settings, stack))
