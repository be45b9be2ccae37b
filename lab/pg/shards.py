"""Shard ownership over PostgreSQL session advisory locks.

Rows are split into :data:`SHARDS` shards by ``id % 64``. Every consumer holds one *member*
lock (key space :data:`MEMBER_SPACE`, so that a consumer owning no shard is still counted) and a
set of *shard* locks (key space :data:`SHARD_SPACE`), in the two-int4 form: ``pg_locks`` shows
them with ``classid`` = key space, ``objid`` = number, ``objsubid`` = 2.

Locks are session locks, so each consumer keeps them on a dedicated connection of its own (never
a pooled one: a pooled session would go back to the pool still holding them, the reference's
"No free member slot" bug). :meth:`ShardOwnership.close` runs ``pg_advisory_unlock_all()`` and
then closes that connection, each in its own try block.

The pure parts (:func:`target`, :func:`plan`, :func:`read_snapshot`) carry the rules; the class
runs them against the database::

    shards = ShardOwnership(dsn, members=4)
    await shards.open()           # connect and take a member number
    await shards.wait_members(4)  # everyone has joined
    await shards.refresh(force=True)
    ...
    if shards.claimable[row_id % SHARDS]: ...   # the row filter, no round trip
    await shards.refresh()        # between batches only; at most once per refresh_s
    await shards.close()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

log = logging.getLogger(__name__)

SHARDS = 64
SHARD_SPACE = 0x7761  # 30561
MEMBER_SPACE = 0x7762  # 30562
REFRESH_S = 1.0
SHARDS_APPLICATION = "lab-shards"  # how the shard owners' connections show in pg_stat_activity
JOIN_ATTEMPTS = 10
JOIN_DELAY_S = 1.0

# The aggregate evaluates the WHERE for every row, so this locks *all* free numbers; the ones
# above the chosen minimum are released right after.
JOIN_SQL = (
    "SELECT min(m) FROM generate_series(0, %s::int) AS m "
    f"WHERE pg_try_advisory_lock({MEMBER_SPACE}, m)"
)
LEAVE_SQL = (
    f"SELECT pg_advisory_unlock({MEMBER_SPACE}, m) FROM generate_series(%s::int, %s::int) AS m"
)
LOCKS_SQL = (
    "SELECT objid::bigint, pid, classid::bigint FROM pg_locks WHERE locktype = 'advisory' "
    f"AND classid IN ({MEMBER_SPACE}::oid, {SHARD_SPACE}::oid) AND objsubid = 2 AND granted"
)
RELEASE_SQL = f"SELECT pg_advisory_unlock({SHARD_SPACE}, s) FROM unnest(%s::int[]) AS s"
TAKE_SQL = f"SELECT s, pg_try_advisory_lock({SHARD_SPACE}, s) FROM unnest(%s::int[]) AS s"
UNLOCK_ALL_SQL = "SELECT pg_advisory_unlock_all()"


def target(members: int, shards: int = SHARDS) -> int:
    """Shards each consumer should hold: ``ceil(shards / max(1, members))``."""
    return -(-shards // max(1, members))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one read of ``pg_locks`` says: how many members, which shards others hold."""

    members: int
    others: frozenset[int]


def read_snapshot(rows: Iterable[tuple[int, int, int]], my_pid: int) -> Snapshot:
    """Members (sessions holding a member lock, this one included) and the shards held by
    other sessions.

    ``rows`` are ``(objid, pid, classid)`` as :data:`LOCKS_SQL` returns them. Members are
    counted by session, not by lock (the reference counts locks): a join between its two
    statements holds every number that was free, and counting those would see N members while
    fewer have joined (the N = 16 loss in docs/benchmarks.md).
    """
    members: set[int] = set()
    others: set[int] = set()
    for objid, pid, classid in rows:
        if classid == MEMBER_SPACE:
            members.add(pid)
        elif classid == SHARD_SPACE and pid != my_pid:
            others.add(objid)
    return Snapshot(len(members), frozenset(others))


@dataclass(frozen=True, slots=True)
class Census:
    """Everyone's locks at once, as the runner sees them (it holds none itself)."""

    members: int  # sessions holding a member lock
    member_locks: int  # more than ``members`` while a join is between its two statements
    shards_held: int
    most_held: int  # the most shards one session holds

    def settled(self, n: int, shards: int = SHARDS) -> bool:
        """N members done joining, every shard held, nobody above target.

        Once this holds, and the membership does not change, no refresh moves a shard: each
        member is at or below target, and those below find nothing free. A shard that moved
        while rows flow could lose rows: each reader applies its own view of the owners at its
        own position in the WAL, so a row the new owner read before taking the shard and the
        old owner read after seeing it taken is left alone by both.
        """
        return (self.members == self.member_locks == n and self.shards_held == shards
                and self.most_held <= target(n, shards))

    def __str__(self) -> str:
        return (f"{self.members} members on {self.member_locks} member locks, "
                f"{self.shards_held} of {SHARDS} shards held, at most {self.most_held} per member")


def census(rows: Iterable[tuple[int, int, int]]) -> Census:
    """:class:`Census` of the ``(objid, pid, classid)`` rows of :data:`LOCKS_SQL`."""
    members: set[int] = set()
    member_locks = 0
    held: dict[int, int] = {}
    for _, pid, classid in rows:
        if classid == MEMBER_SPACE:
            members.add(pid)
            member_locks += 1
        elif classid == SHARD_SPACE:
            held[pid] = held.get(pid, 0) + 1
    return Census(len(members), member_locks, sum(held.values()), max(held.values(), default=0))


def plan(
    mine: Collection[int], others: Collection[int], members: int, shards: int = SHARDS
) -> tuple[list[int], list[int]]:
    """``(release, take)`` for one rebalance; at most one of them is non-empty.

    Above target: release the highest-numbered surplus. Below: try the lowest shards that are
    neither ours nor known to be someone else's, as many as are missing.
    """
    want = target(members, shards)
    if len(mine) > want:
        return sorted(mine)[want:], []
    if len(mine) < want:
        free = [s for s in range(shards) if s not in mine and s not in others]
        return [], free[: want - len(mine)]
    return [], []


def bitmaps(
    mine: Collection[int], others: Collection[int], shards: int = SHARDS
) -> tuple[tuple[bool, ...], tuple[bool, ...], tuple[bool, ...]]:
    """``(is_mine, held_by_others, claimable)`` indexed by shard.

    The filter is asymmetric on purpose: a row is left alone only when its shard is *known* to
    be someone else's. A row of an ownerless shard is claimed (a duplicate attempt is caught by
    the inbox claim; a row nobody claims would be lost).
    """
    is_mine = tuple(s in mine for s in range(shards))
    held = tuple(s in others for s in range(shards))
    return is_mine, held, tuple(m or not o for m, o in zip(is_mine, held, strict=True))


class ShardOwnership:
    """One consumer's member number and shards, on its own non-pooled lock connection.

    Published after every refresh (all indexed by shard): ``is_mine``, ``held_by_others`` (from
    the snapshot this refresh started with) and ``claimable`` = ``is_mine or not
    held_by_others``, the row filter. Before the first refresh every shard is claimable.
    """

    def __init__(
        self,
        dsn: str,
        members: int,
        *,
        shards: int = SHARDS,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dsn = dsn
        self.expected = members  # N: member numbers are 0..N-1
        self.shards = shards
        self.refresh_s = refresh_s
        self.clock = clock
        self.member: int | None = None
        self.members = 0  # as of the last refresh
        self.mine: set[int] = set()
        self.refreshes = 0
        self.is_mine: tuple[bool, ...] = (False,) * shards
        self.held_by_others: tuple[bool, ...] = (False,) * shards
        self.claimable: tuple[bool, ...] = (True,) * shards
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._pid = 0
        self._due = 0.0

    async def open(self, *, attempts: int = JOIN_ATTEMPTS, delay: float = JOIN_DELAY_S) -> int:
        """Connect (autocommit, no prepared statements, no pool) and join; returns the member."""
        self._conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, prepare_threshold=None, application_name=SHARDS_APPLICATION
        )
        self._pid = self._conn.info.backend_pid
        return await self.join(attempts=attempts, delay=delay)

    async def join(self, *, attempts: int = JOIN_ATTEMPTS, delay: float = JOIN_DELAY_S) -> int:
        """Take the lowest free member number in ``0..N-1``, retrying while none is free.

        A session of a previous run may take a moment to die and free its number.
        """
        conn, last = self._require(), self.expected - 1
        for attempt in range(1, attempts + 1):
            row = await (await conn.execute(JOIN_SQL, (last,))).fetchone()
            member = row[0] if row else None
            if member is not None:
                if member < last:
                    await conn.execute(LEAVE_SQL, (member + 1, last))
                self.member = member
                return member
            if attempt < attempts:
                await asyncio.sleep(delay)
        raise RuntimeError(
            f"No free member slot among 0..{last} after {attempts} attempts: another session "
            f"holds advisory locks in key space {MEMBER_SPACE} (see pg_locks)"
        )

    async def snapshot(self) -> Snapshot:
        """Read ``pg_locks`` once."""
        cur = await self._require().execute(LOCKS_SQL)
        return read_snapshot(await cur.fetchall(), self._pid)

    async def wait_members(
        self, count: int, *, timeout: float, interval: float = 0.05  # noqa: ASYNC109 - many polls
    ) -> int:
        """Poll until at least ``count`` sessions hold a member lock; returns how many do.

        Sessions, not locks (:func:`read_snapshot`): a join in progress holds many numbers."""
        deadline = self.clock() + timeout
        while (members := (await self.snapshot()).members) < count:
            if self.clock() > deadline:
                raise TimeoutError(
                    f"only {members} of {count} consumers joined after {timeout:.0f} s"
                )
            await asyncio.sleep(interval)
        return members

    async def refresh(self, *, force: bool = False) -> bool:
        """Rebalance if due (or forced); returns whether it ran.

        Call it only between batches, on the task that does the work, so that no shard is
        released while work on one of its rows is pending.
        """
        now = self.clock()
        if not force and now < self._due:
            return False
        self._due = now + self.refresh_s
        conn = self._require()
        snap = await self.snapshot()
        release, take = plan(self.mine, snap.others, snap.members, self.shards)
        if release:
            await conn.execute(RELEASE_SQL, (release,))
            self.mine.difference_update(release)
        elif take:
            rows = await (await conn.execute(TAKE_SQL, (take,))).fetchall()
            self.mine.update(s for s, ok in rows if ok)
        self._publish(snap)
        return True

    def _publish(self, snap: Snapshot) -> None:
        self.members = snap.members
        self.refreshes += 1
        self.is_mine, self.held_by_others, self.claimable = bitmaps(
            self.mine, snap.others, self.shards
        )

    def may_claim(self, row_id: int) -> bool:
        """The row filter: ours, or not known to be anyone else's."""
        return self.claimable[row_id % self.shards]

    async def close(self) -> None:
        """``pg_advisory_unlock_all()``, then close the connection, each alone; never raises."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await conn.execute(UNLOCK_ALL_SQL)
        except Exception as exc:
            log.warning("pg_advisory_unlock_all failed: %s", exc)
        try:
            await conn.close()
        except Exception as exc:
            log.warning("closing the lock connection failed: %s", exc)
        self.mine.clear()

    def _require(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None:
            raise RuntimeError("ShardOwnership is not open")
        return self._conn
