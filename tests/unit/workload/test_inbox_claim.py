"""The inbox claims' statements (lab.workload.inbox): the takeover claim is the reference's
statement plus one CTE, and its claimant names the consumer. Their behaviour against PostgreSQL:
tests/integration/workload/test_inbox_takeover.py."""

from __future__ import annotations

import pytest

from lab import scenario
from lab.scenario import Scenario
from lab.workload import inbox


def text(q: object) -> str:
    return q.as_string(None)  # type: ignore[attr-defined]


def test_owner_is_the_reference_statement_and_takeover_adds_one_cte() -> None:
    owner, takeover = text(inbox.CLAIM_IDS), text(inbox.CLAIM_IDS_TAKEOVER)
    assert owner == (  # the reference study, word for word
        "with claimed as (insert into inbox (id, consumer) select unnest(%(ids)s::int[]), %(me)s "
        "on conflict do nothing returning id) select id from claimed union all "
        "select id from inbox where id = any(%(ids)s::int[]) and consumer = %(me)s")
    head, tail = owner.split(" select id from claimed ")
    assert takeover.startswith(head + ", taken as (update inbox set consumer = %(me)s ")
    assert takeover.endswith(" select id from claimed union all select id from taken " + tail)
    # a row changes hands only when no session holds its claimant's lease
    assert "pg_try_advisory_xact_lock(30563, nullif(split_part(consumer, '#', 2), '')::int)" in takeover
    assert "consumer <> %(me)s" in takeover


def test_a_claimant_names_its_consumer() -> None:
    who = inbox.claimant("dbz-quorum-1", 17)
    assert who == "dbz-quorum-1#17" and inbox.consumer_of(who) == "dbz-quorum-1"
    assert inbox.consumer_of("dbz-quorum-1") == "dbz-quorum-1"  # the reference's claim: a bare name
    assert len(inbox.claimant("dbz-quorum-59", 2**31 - 1)) <= 64  # inbox.consumer is varchar(64)


def test_the_lease_space_is_not_a_shard_space() -> None:
    from lab.pg.shards import MEMBER_SPACE, SHARD_SPACE

    assert inbox.LEASE_SPACE not in (MEMBER_SPACE, SHARD_SPACE)
    assert text(inbox.HOLD_LEASE) == "select pg_advisory_lock(30563, %s::int)"
    assert text(inbox.NEXT_LEASE) == "select nextval('inbox_lease')::int"


def test_the_scenario_chooses_a_claim() -> None:
    assert scenario.CLAIMS == inbox.CLAIMS
    assert Scenario().claim == "owner"  # the reference's unless asked
    assert Scenario(pipeline="rabbitmq", claim="takeover").claim == "takeover"
    with pytest.raises(ValueError, match="unknown claim 'lease': choose one of owner, takeover"):
        Scenario(claim="lease")
