"""The poll pipeline's pure parts: how often an empty read is repeated, the statements' shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg import sql

from lab.pipelines.poll import DONE, FINISH, OUTBOX, READ, PollPipeline, consumer_name, read_plan
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.native import NativeStack


def text(q: sql.Composable) -> str:
    """The statement as PostgreSQL gets it (identifiers quoted, no connection needed)."""
    return q.as_string(None)


@pytest.mark.parametrize(("first", "flush", "reads"), [
    (0.1, 0.05, 3),  # the defaults: at once, after 50 ms, after 100 ms
    (0.1, 0.03, 4),
    (0.0, 0.05, 1),  # no wait: one read
    (0.1, 0.0, 1),  # no pause between reads: one read, never a busy loop
    (0.15, 0.05, 4),  # an exact multiple is not lost to rounding
])
def test_an_empty_read_is_repeated_every_flush_wait_until_first_wait(first: float, flush: float,
                                                                       reads: int) -> None:
    assert read_plan(first, flush) == reads


def test_the_read_takes_the_oldest_unlocked_rows_of_the_outbox() -> None:
    q = text(READ)
    assert f'FROM "{OUTBOX}"' in q
    assert q.endswith("ORDER BY id LIMIT %(n)s FOR UPDATE SKIP LOCKED")


def test_finishing_deletes_the_rows_and_moves_them_in_one_statement() -> None:
    q = text(FINISH)
    assert q.startswith(f'WITH finished AS (DELETE FROM "{OUTBOX}" WHERE id = ANY(%(ids)s::int[])')
    assert f'INSERT INTO "{DONE}" (id, content, created_at) SELECT id, content, created_at FROM finished' in q
    assert q.count(";") == 0  # one statement


def test_the_runner_half_consumes_the_outbox_and_claims_in_the_id_inbox() -> None:
    settings = Settings()
    p = PollPipeline(Scenario(pipeline="poll", consumers=4), settings, NativeStack(settings))
    caps = p.capabilities
    assert (p.name, caps.fan_out, caps.inbox_table, caps.cdc_sink, caps.consumes_outbox) == (
        "poll", False, "inbox", None, True)
    assert p.backlog(Path("/nonexistent")) is None  # no broker: the backlog waits in the outbox
    assert p.describe()["consumers"] == [consumer_name(i) for i in range(4)] == ["poll-0", "poll-1", "poll-2",
                                                                                   "poll-3"]
