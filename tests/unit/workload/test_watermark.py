"""The watermark never confirms past an unresolved hold, and catches up once all resolve."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lab.workload.watermark import SlotWatermark, Watermark


def test_confirms_only_up_to_the_first_unresolved_hold():
    w = Watermark()
    assert w.confirmable is None
    for offset in (10, 11, 12):
        w.hold(offset)
    w.resolve(12)
    w.resolve(11)
    assert w.confirmable is None  # 10 still in flight
    w.resolve(10)
    assert w.confirmable == 12
    assert w.in_flight == 0


def test_never_held_positions_wait_for_earlier_holds():
    w = Watermark()
    w.advance(1)  # nothing held before it: confirmable at once
    assert w.confirmable == 1
    w.hold(2)
    w.advance(3)  # a skipped message behind a claimed one
    w.advance(4)
    assert w.confirmable == 1
    w.hold(5)
    w.resolve(2)
    assert w.confirmable == 4
    w.resolve(5)
    assert w.confirmable == 5
    w.advance(5)  # at or below the last position: nothing new
    w.advance(3)
    assert (w.confirmable, w.last) == (5, 5)


def test_equal_holds_share_one_position_until_all_resolve():
    w = Watermark()
    w.hold(100)
    w.hold(100)  # two rows confirmed by one commit LSN
    w.hold(200)
    w.resolve(100)
    assert w.confirmable is None
    w.resolve(200)
    w.resolve(100)
    assert w.confirmable == 200


def test_misuse_is_rejected_without_changing_state():
    w = Watermark()
    w.hold(5)
    with pytest.raises(ValueError, match="below"):
        w.hold(4)
    with pytest.raises(ValueError, match="not held"):
        w.resolve(6)
    w.resolve(5)
    with pytest.raises(ValueError, match="not held"):
        w.resolve(5)
    with pytest.raises(ValueError, match="confirmable"):
        w.hold(5)
    assert (w.confirmable, w.last, w.in_flight) == (5, 5, 0)


def _model_confirmable(seen: list[int], holds: list[tuple[int, bool]]) -> int | None:
    """Brute force: the highest seen position with every hold at or below it resolved."""
    ok = [p for p in seen if all(done for q, done in holds if q <= p)]
    return max(ok, default=None)


@given(
    steps=st.lists(st.tuples(st.booleans(), st.integers(1, 5)), min_size=1, max_size=60),
    data=st.data(),
)
def test_random_streams_and_resolve_orders(steps, data):
    w, pos, held = Watermark(), 0, []
    for is_hold, gap in steps:
        pos += gap
        (w.hold if is_hold else w.advance)(pos)
        if is_hold:
            held.append(pos)
    unresolved = set(held)
    previous = w.confirmable
    for p in data.draw(st.permutations(held)):
        w.resolve(p)
        unresolved.discard(p)
        c = w.confirmable
        assert not unresolved or c is None or c < min(unresolved)
        assert previous is None or (c is not None and c >= previous)
        previous = c
    assert w.confirmable == pos
    assert w.in_flight == 0


class WatermarkMachine(RuleBasedStateMachine):
    """Holds (equal positions too), advances (stale ones too) and resolves, interleaved."""

    def __init__(self) -> None:
        super().__init__()
        self.w = Watermark()
        self.seen: list[int] = []
        self.holds: list[tuple[int, bool]] = []
        self.last: int | None = None
        self.high: int | None = None

    def _expect(self) -> int | None:
        return _model_confirmable(self.seen, self.holds)

    @rule(gap=st.integers(0, 3))
    def hold(self, gap):
        pos = (self.last or 0) + gap
        expected = self._expect()
        below_last = self.last is not None and pos < self.last
        if below_last or (expected is not None and pos <= expected):
            with pytest.raises(ValueError):
                self.w.hold(pos)
            return
        self.w.hold(pos)
        self.holds.append((pos, False))
        self.seen.append(pos)
        self.last = pos

    @precondition(lambda self: self.last is not None)
    @rule(back=st.integers(1, 3))
    def hold_below_last(self, back):
        with pytest.raises(ValueError):
            self.w.hold(self.last - back)

    @rule(gap=st.integers(-3, 3))
    def advance(self, gap):
        pos = (self.last or 0) + gap
        self.w.advance(pos)
        if self.last is None or pos > self.last:
            self.seen.append(pos)
            self.last = pos

    @precondition(lambda self: any(not done for _, done in self.holds))
    @rule(data=st.data())
    def resolve(self, data):
        i = data.draw(st.sampled_from([i for i, (_, done) in enumerate(self.holds) if not done]))
        self.w.resolve(self.holds[i][0])
        self.holds[i] = (self.holds[i][0], True)

    @rule(pos=st.integers(-2, 40))
    def resolve_unheld(self, pos):
        if any(q == pos and not done for q, done in self.holds):
            return
        with pytest.raises(ValueError):
            self.w.resolve(pos)

    @invariant()
    def matches_the_brute_force_model(self):
        c = self.w.confirmable
        assert c == self._expect()
        pending = [q for q, done in self.holds if not done]
        assert not pending or c is None or c < min(pending)
        assert self.high is None or (c is not None and c >= self.high)
        self.high = c
        assert self.w.in_flight == len(pending)
        assert self.w.last == self.last


TestWatermarkMachine = WatermarkMachine.TestCase


def test_slot_watermark_confirms_a_commit_only_once_every_earlier_row_is_done():
    """The scheme the wal readers use: stream sequence numbers, commits mapped to their end LSN.

    Transactions arrive in commit order, so LSNs inside the stream are not monotone (the second
    transaction's row has a lower LSN than the first's commit); the sequence numbers are.
    """
    s = SlotWatermark()
    assert s.passed() is None  # Begin of T1
    a = s.row()  # T1's row (claimed by this reader)
    assert s.passed(0x3000) is None  # T1's Commit: its row is still in flight
    assert s.passed() is None  # Begin of T2 (began before T1, committed after)
    b = s.row()
    assert s.passed(0x3100) is None
    assert s.passed() is None  # Begin of T3
    c = s.row()
    assert s.passed(0x3200) is None
    assert s.resolve(c) is None and s.resolve(b) is None  # later rows done (or lost their claim)
    assert s.in_flight == 1
    assert s.resolve(a) == 0x3200  # the oldest row done: every commit up to the newest
    assert s.in_flight == 0


def test_slot_watermark_moves_commit_by_commit():
    s = SlotWatermark()
    rows = []
    for end in (100, 200, 300):
        s.passed()
        rows.append(s.row())
        assert s.passed(end) is None
    assert s.resolve(rows[0]) == 100
    assert s.resolve(rows[2]) is None  # 200's row still open
    assert s.resolve(rows[1]) == 300
    s.passed()
    assert s.passed(400) == 400  # a transaction without rows for us: confirmable at its commit


def test_slot_watermark_keeps_a_multi_row_transaction_open_until_all_rows_are_done():
    s = SlotWatermark()
    s.passed()
    first, second = s.row(), s.row()
    assert s.passed(500) is None
    assert s.resolve(second) is None
    assert s.resolve(first) == 500


def test_slot_watermark_is_settled_only_with_nothing_held():
    """``settled`` lets the reader confirm a keepalive's WAL end (lab.pg.replication): never while a
    row read is unresolved, even one whose transaction has not committed yet."""
    s = SlotWatermark()
    assert s.settled()  # nothing read yet
    s.passed()  # Begin
    a = s.row()
    assert not s.settled()  # mid-transaction, the row in flight
    assert s.passed(0x100) is None
    assert not s.settled()  # committed, its row still in flight
    assert s.resolve(a) == 0x100
    assert s.settled()
    s.passed()  # Begin of a transaction whose row is done before its Commit arrives
    assert s.resolve(s.row()) is None
    assert s.settled()  # a keepalive now reports a position before that Commit: safe to confirm
