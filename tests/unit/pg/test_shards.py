"""The shard rules of the reference study without a database: target, release/take plan, lock
snapshot, the row filter, and N consumers rebalancing against an in-memory lock table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.pg.shards import (
    MEMBER_SPACE,
    SHARD_SPACE,
    SHARDS,
    Census,
    ShardOwnership,
    Snapshot,
    bitmaps,
    census,
    plan,
    read_snapshot,
    target,
)


@pytest.mark.parametrize(
    ("members", "want"),
    [(0, 64), (1, 64), (2, 32), (3, 22), (4, 16), (5, 13), (8, 8), (12, 6), (60, 2), (64, 1),
     (65, 1)],
)
def test_target_is_the_ceiling_of_64_over_members(members: int, want: int) -> None:
    assert target(members) == want


def test_surplus_releases_the_highest_numbered_shards() -> None:
    mine = {3, 40, 7, 63, 0}
    assert plan(mine, others=set(), members=32) == ([7, 40, 63], [])  # target 2: keep 0 and 3


def test_a_deficit_tries_the_lowest_shards_nobody_is_known_to_hold() -> None:
    release, take = plan({1}, others={0, 2, 3, 5}, members=16)  # target 4: three missing
    assert (release, take) == ([], [4, 6, 7])


def test_at_target_nothing_moves_and_a_full_table_offers_nothing() -> None:
    assert plan(set(range(16)), others=set(range(16, 64)), members=4) == ([], [])
    assert plan(set(), others=set(range(64)), members=4) == ([], [])  # nothing free: no take
    assert plan(set(range(20)), others=set(), members=4)[0] == [16, 17, 18, 19]


def test_snapshot_counts_every_member_and_only_other_sessions_shards() -> None:
    me, other = 100, 200
    rows = [
        (0, me, MEMBER_SPACE), (1, other, MEMBER_SPACE),
        (5, me, SHARD_SPACE), (6, other, SHARD_SPACE), (7, other, SHARD_SPACE),
        (9, 300, 12345),  # someone else's advisory lock in another key space
    ]
    assert read_snapshot(rows, me) == Snapshot(members=2, others=frozenset({6, 7}))


def test_a_join_in_progress_counts_as_one_member_however_many_numbers_it_holds() -> None:
    """The join locks every free number before it gives back all but the lowest: a
    snapshot taken between its two statements must still count sessions, not numbers."""
    first, joining = 100, 200
    rows = [(0, first, MEMBER_SPACE), *((m, joining, MEMBER_SPACE) for m in range(1, 16))]
    assert read_snapshot(rows, first).members == 2


def _locks(by_session: list[list[int]], extra_numbers: int = 0) -> list[tuple[int, int, int]]:
    rows = [(i, 1000 + i, MEMBER_SPACE) for i in range(len(by_session))]
    rows += [(len(rows) + k, 1000, MEMBER_SPACE) for k in range(extra_numbers)]  # mid-join
    return rows + [(s, 1000 + i, SHARD_SPACE) for i, mine in enumerate(by_session) for s in mine]


def test_ownership_is_settled_only_with_n_members_all_shards_and_nobody_above_target() -> None:
    blocks = [list(range(i * 16, i * 16 + 16)) for i in range(4)]
    assert census(_locks(blocks)) == Census(members=4, member_locks=4, shards_held=64, most_held=16)
    assert census(_locks(blocks)).settled(4)
    assert not census(_locks(blocks)).settled(5)  # someone has not joined
    assert not census(_locks(blocks, extra_numbers=1)).settled(4)  # a join not finished
    assert not census(_locks([*blocks[:3], blocks[3][:15]])).settled(4)  # shard 63 ownerless
    # the N = 16 incident: 3 readers at 5 shards (target 4) would give one away while rows flow
    unsettled = [list(range(5 * i, 5 * i + 5)) for i in range(3)]
    unsettled += [list(range(15 + 4 * i, 19 + 4 * i)) for i in range(12)] + [[63]]
    assert sorted(s for mine in unsettled for s in mine) == list(range(64))
    assert not census(_locks(unsettled)).settled(16)
    # N = 12: target 6, ten readers at 6, one at 4, one at none is settled (nothing is free)
    twelve = [list(range(6 * i, 6 * i + 6)) for i in range(10)] + [[60, 61, 62, 63], []]
    assert census(_locks(twelve)).settled(12)


def test_row_filter_skips_only_shards_known_to_be_someone_elses() -> None:
    is_mine, held, claimable = bitmaps(mine={1}, others={2})
    assert (is_mine[1], held[2]) == (True, True)
    assert claimable[1] and claimable[3]  # mine, and ownerless (a duplicate is caught by the claim)
    assert not claimable[2]
    assert sum(claimable) == SHARDS - 1


def test_before_any_refresh_every_row_may_be_claimed() -> None:
    shards = ShardOwnership("", members=4)
    assert all(shards.may_claim(row_id) for row_id in range(1000, 1064))
    assert not any(shards.is_mine) and not any(shards.held_by_others)


# --- N consumers against one lock table ------------------------------------------------------
class Table:
    """Granted advisory locks: (key space, number) -> owning session."""

    def __init__(self) -> None:
        self.locks: dict[tuple[int, int], int] = {}

    def rows(self) -> list[tuple[int, int, int]]:
        return [(num, pid, space) for (space, num), pid in self.locks.items()]

    def try_lock(self, space: int, num: int, pid: int) -> bool:
        return self.locks.setdefault((space, num), pid) == pid

    def unlock_all(self, pid: int) -> None:
        self.locks = {k: v for k, v in self.locks.items() if v != pid}


class Member:
    """What ShardOwnership.refresh does, over the in-memory table."""

    def __init__(self, table: Table, pid: int, number: int) -> None:
        self.table, self.pid, self.mine = table, pid, set[int]()
        assert table.try_lock(MEMBER_SPACE, number, pid)
        self.claimable: tuple[bool, ...] = (True,) * SHARDS

    def refresh(self) -> None:
        snap = read_snapshot(self.table.rows(), self.pid)
        release, take = plan(self.mine, snap.others, snap.members)
        for s in release:
            del self.table.locks[(SHARD_SPACE, s)]
        self.mine.difference_update(release)
        self.mine.update(s for s in take if self.table.try_lock(SHARD_SPACE, s, self.pid))
        self.claimable = bitmaps(self.mine, snap.others)[2]


def join(n: int) -> tuple[Table, list[Member]]:
    table = Table()
    members = [Member(table, pid=1000 + i, number=i) for i in range(n)]
    for m in members:  # the forced initial refresh, in index order
        m.refresh()
    return table, members


def test_initial_refresh_in_index_order_hands_out_contiguous_blocks() -> None:
    _, members = join(4)
    assert [sorted(m.mine) for m in members] == [list(range(i * 16, i * 16 + 16)) for i in range(4)]
    # the early overlap: consumer 0 saw no other owner yet, the last one knows everybody
    assert all(members[0].claimable)
    assert [i for i, ok in enumerate(members[3].claimable) if ok] == list(range(48, 64))


def test_a_leaver_s_shards_are_taken_over_and_a_joiner_gets_its_share() -> None:
    table, members = join(4)
    gone = members.pop(1)
    table.unlock_all(gone.pid)
    for m in members:
        m.refresh()
    assert sorted(len(m.mine) for m in members) == [20, 22, 22]  # target 22; the last gets the rest
    assert set().union(*(m.mine for m in members)) == set(range(SHARDS))
    members.append(Member(table, pid=2000, number=1))
    for _ in range(2):  # one round to release surplus, one to take it
        for m in members:
            m.refresh()
    assert sorted(len(m.mine) for m in members) == [16, 16, 16, 16]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), order=st.randoms(use_true_random=False))
def test_ownership_stays_exclusive_and_covers_every_shard(n: int, order: object) -> None:
    _, members = join(n)
    for _ in range(3):  # later refreshes in any order change nothing once settled
        shuffled = list(members)
        order.shuffle(shuffled)  # type: ignore[attr-defined]
        for m in shuffled:
            m.refresh()
    owned = [s for m in members for s in m.mine]
    assert sorted(owned) == list(range(SHARDS))  # every shard, each exactly once
    assert max(len(m.mine) for m in members) <= target(n)
    for m in members:  # once settled, a row is claimable by exactly its owner
        assert [i for i, ok in enumerate(m.claimable) if ok] == sorted(m.mine)
