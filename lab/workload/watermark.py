"""The position watermark of the reference study: confirm only up to the last resolved position that has
no unresolved position before it.

One instance per Kafka partition (offsets) or per replication slot (LSNs). Positions arrive in
stream order: a claimed message is ``hold``-ed, then ``resolve``-d when its work is done or it was
skipped; a position that never needs work (a non-insert message, a filtered row, a Commit) is
``advance``-d. ``confirmable`` is the highest position p such that every held position ≤ p is
resolved; Kafka stores ``p + 1``, a replication slot reports p as flushed/applied.

Ordering rules:

* ``hold`` positions never decrease. Equal holds are allowed (several rows confirmed by one
  commit LSN) but must all be made before the position becomes confirmable: holding a position
  that is already confirmable raises ``ValueError``, because it cannot be taken back. A hold
  below the last position seen raises ``ValueError`` too.
* ``advance`` at or below the last position seen is ignored: the higher position already
  implies it (keep-alive LSNs may run ahead of the next Commit's).

For a replication slot, a row's own LSN (its XLogData ``data_start``) is unique but not monotone:
transactions are streamed in commit order, so a row of a transaction that began earlier and
committed later arrives with a lower LSN. :class:`SlotWatermark` (what the ``wal`` readers use)
therefore numbers the stream's messages (1, 2, 3, ...) and runs the watermark over those sequence
numbers: ``hold`` per claimed row, ``advance`` per other message, and each Commit's ``end_lsn``
remembered with its number. The slot may confirm the end LSN of the newest Commit whose number
is confirmable: every row streamed before it was worked on or lost its claim.

Every operation is O(1) amortised: a deque of distinct positions in stream order, a count of
unresolved holds per position, and the front of the deque popped while it is resolved.
"""

from __future__ import annotations

from collections import deque


class Watermark:
    """Confirmable position of one ordered stream with out-of-order completion."""

    __slots__ = ("_below", "_confirmed", "_in_flight", "_last", "_open", "_queue")

    def __init__(self) -> None:
        self._queue: deque[int] = deque()  # distinct positions > confirmed, increasing
        self._open: dict[int, int] = {}  # position -> unresolved holds at it
        self._confirmed: int | None = None
        self._last: int | None = None
        self._in_flight = 0
        self._below: int | None = None  # last position before a collapsed (resolved) tail

    @property
    def confirmable(self) -> int | None:
        """Highest position with every held position at or below it resolved (None: nothing yet)."""
        return self._confirmed

    @property
    def in_flight(self) -> int:
        """Number of held, unresolved positions."""
        return self._in_flight

    @property
    def last(self) -> int | None:
        """The highest position seen (held or advanced)."""
        return self._last

    def hold(self, pos: int) -> None:
        """Claim ``pos``: it is in flight until :meth:`resolve`."""
        last = self._last
        if last is not None and pos < last:
            raise ValueError(f"hold({pos}) below the last position seen ({last})")
        if self._confirmed is not None and pos <= self._confirmed:
            raise ValueError(f"hold({pos}) at an already confirmable position ({self._confirmed})")
        queue = self._queue
        if not queue or queue[-1] != pos:  # the tail is always the last position
            queue.append(pos)
            self._below = None
        elif self._below is not None:  # re-holding a collapsed tail: restore what it subsumed
            queue[-1] = self._below
            queue.append(pos)
            self._below = None
        self._open[pos] = self._open.get(pos, 0) + 1
        self._in_flight += 1
        self._last = pos

    def advance(self, pos: int) -> None:
        """Pass a position that needs no work: confirmable once every earlier hold is resolved."""
        if self._last is not None and pos <= self._last:
            return
        self._last = pos
        queue = self._queue
        if not queue:
            self._confirmed = pos
        elif queue[-1] in self._open:
            queue.append(pos)
            self._below = None
        else:  # a resolved tail is subsumed by the higher position
            self._below = queue[-1]
            queue[-1] = pos

    def resolve(self, pos: int) -> None:
        """Mark one hold at ``pos`` done (worked or skipped)."""
        left = self._open.get(pos)
        if left is None:
            raise ValueError(f"resolve({pos}): position is not held or already resolved")
        self._in_flight -= 1
        if left > 1:
            self._open[pos] = left - 1
            return
        del self._open[pos]
        queue, still_open = self._queue, self._open
        while queue and queue[0] not in still_open:
            self._confirmed = queue.popleft()

    def __repr__(self) -> str:
        return (f"Watermark(confirmable={self._confirmed}, last={self._last}, "
                f"in_flight={self.in_flight})")


class SlotWatermark:
    """The confirmable LSN of one replication slot, from stream sequence numbers (module doc).

    ``row()`` numbers and holds a row that needs work and returns its number, ``resolve(seq)``
    marks it done; ``passed(end_lsn)`` numbers any other message (``end_lsn``: a Commit's, else
    None). Both return the LSN the slot may now report as flushed, or None when it did not move.
    """

    __slots__ = ("_commits", "_marks", "_seq")

    def __init__(self) -> None:
        self._marks = Watermark()
        self._commits: deque[tuple[int, int]] = deque()  # (seq, end lsn), seq increasing
        self._seq = 0

    @property
    def in_flight(self) -> int:
        return self._marks.in_flight

    def settled(self) -> bool:
        """Nothing read is unresolved and no commit waits to be confirmed."""
        return not self._marks.in_flight and not self._commits

    def row(self) -> int:
        self._seq = seq = self._seq + 1
        self._marks.hold(seq)
        return seq

    def passed(self, end_lsn: int | None = None) -> int | None:
        self._seq = seq = self._seq + 1
        self._marks.advance(seq)
        if end_lsn is None:
            return None
        self._commits.append((seq, end_lsn))
        return self._confirm()

    def resolve(self, seq: int) -> int | None:
        self._marks.resolve(seq)
        return self._confirm()

    def _confirm(self) -> int | None:
        upto, commits = self._marks.confirmable, self._commits
        if upto is None or not commits or commits[0][0] > upto:
            return None
        lsn = 0
        while commits and commits[0][0] <= upto:
            lsn = commits.popleft()[1]
        return lsn
