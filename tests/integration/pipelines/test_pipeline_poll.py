"""``poll`` on the real native stack.

Whole runs through :func:`lab.runner.run_scenario` (N = 4 in the default tier, 1 and 16 in the
matrix): every message worked once, nothing left in the outbox, the finished rows moved to
``messages_done``, no claim connection or transaction left behind, and the run's ``vacuum`` block
(the outbox's deletes, autovacuum). And the consumer half on its own: a consumer process killed
with a batch claimed but not committed gives the batch back to the outbox, inbox claims included.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from lab.pipelines.poll import PollSource
from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings, child_env
from lab.workload.inbox import CLAIMS_APPLICATION
from tests.integration.checks import scalar

pytestmark = pytest.mark.integration

M = 2000
OUR_BACKENDS = f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{CLAIMS_APPLICATION}'"
HELD = 40  # rows the killed consumer holds


def run(settings: Settings, consumers: int) -> dict[str, Any]:
    scenario = Scenario(pipeline="poll", consumers=consumers, messages=M, cooldown_s=0)
    return asyncio.run(run_scenario(scenario, settings))


@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.matrix), 4,
                               pytest.param(16, marks=pytest.mark.matrix)])
def test_a_run_delivers_every_message_once_and_leaves_nothing(
    settings: Settings, stack: object, n: int
) -> None:
    result = run(settings, n)
    assert result["success"], result["error"]
    c = result["counters"]
    assert c["inbox_rows"] == c["distinct_ids"] == c["work_calls"] == M
    assert c["outbox_left"] == 0 and c["ids_match"] is True
    assert c["skipped"] == 0  # a row is read by one consumer only: no claim is lost without a failure
    assert scalar(settings, "SELECT count(*) FROM messages") == 0
    assert scalar(settings, "SELECT count(DISTINCT id) FROM messages_done") == M
    if n > 1:  # the work is shared (the first reader cannot take everything at N = 4)
        assert c["claims_max"] < M
    assert scalar(settings, OUR_BACKENDS) == 0
    assert result["slots"] == {}
    v = result["vacuum"]
    assert v["delta"]["messages"]["n_tup_del"] == M  # read after the consumers' backends ended
    assert v["delta"]["messages_done"]["n_tup_ins"] == M
    assert v["autovacuum"]["cpu_s"] is not None and v["autovacuum"]["cpu_s"] >= 0
    assert v["debt"]["tables"] == ["messages", "messages_done"] and v["debt"]["cpu_s"] >= 0  # whole ticks
    # the deleted rows are dead tuples at the end, unless autovacuum came during the run
    assert v["debt"]["dead_tup"] > 0 or v["delta"]["messages"]["autovacuum_count"] > 0
    assert result["pipeline_settings"]["consumers"] == [f"poll-{i}" for i in range(n)]


CHILD = """
import asyncio, sys
from lab.pipelines.poll import PollSource
from lab.scenario import Scenario
from lab.settings import get_settings

async def main():
    source = PollSource(Scenario(pipeline="poll"), get_settings(), 7)
    await source.open()
    batch = await source.fill({held}, 1.0, 0.05)
    mine = await source.claim(batch)
    print(" ".join(str(item.id) for item in mine), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def _read_all(settings: Settings) -> tuple[list[int], list[int]]:
    """One batch read and claimed by a fresh consumer, then committed: (read ids, claimed ids)."""
    source = PollSource(Scenario(pipeline="poll"), settings, 8)
    await source.open()
    try:
        batch = await source.fill(1000, 0.1, 0.05)
        mine = await source.claim(batch)
        for item in mine:
            source.done(item)
        await source.idle()
        return [i.id for i in batch], [i.id for i in mine]
    finally:
        await source.close()


def test_a_killed_consumers_claimed_batch_returns_to_the_outbox(settings: Settings, stack: object) -> None:
    with psycopg_connect(settings) as conn:
        for table in ("inbox", "messages", "messages_done"):
            conn.execute(f"TRUNCATE {table}")
        conn.execute("INSERT INTO messages (content) SELECT 'm' || g FROM generate_series(1, %s) g", (HELD,))
    env = child_env(settings, PYTHONPATH=str(settings.root))
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(held=HELD)], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        held = [int(x) for x in child.stdout.readline().split()]
        assert len(held) == HELD
        # claimed, not committed: invisible to the others (locked rows skipped; the inbox rows uncommitted)
        assert asyncio.run(_read_all(settings)) == ([], [])
        assert scalar(settings, "SELECT count(*) FROM inbox") == 0
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        deadline = time.monotonic() + 10  # the server ends the dead client's backend and rolls back
        while scalar(settings, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                               "WHERE c.relname = 'messages' AND l.pid <> pg_backend_pid()") and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        read, claimed = asyncio.run(_read_all(settings))
        assert sorted(read) == sorted(claimed) == sorted(held)  # back in the queue, and claimable
        assert scalar(settings, "SELECT count(*) FROM messages") == 0
        assert scalar(settings, "SELECT count(*) FROM inbox WHERE consumer = 'poll-8'") == HELD
        assert scalar(settings, "SELECT count(*) FROM inbox WHERE consumer = 'poll-7'") == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)


def psycopg_connect(settings: Settings) -> Any:
    import psycopg

    return psycopg.connect(settings.pg_dsn, autocommit=True)
