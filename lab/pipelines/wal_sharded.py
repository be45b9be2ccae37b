"""``wal-sharded``: the ``wal`` readers plus 64 shards on advisory locks.

Every consumer still reads and decodes the whole WAL through its own slot (sharding removes the
claim tax, not the decoding tax), but it only tries to claim rows whose shard ``id % 64`` it
owns or does not know to be owned by someone else (:class:`~lab.pg.shards.ShardOwnership`). Rows
filtered out are confirmed through the watermark at once and are *not* counted as skipped; rows
that pass go through the same ``inbox_wal`` batch claim as ``wal`` (losers are skipped).
Rebalancing happens at the start of :meth:`ShardedWalSource.fill` only (between batches, on the
processing task), at most once per second.

Initial ownership: all N consumers join, then each one does a forced refresh in
index order 0..N-1 before any row is sent. The consumers are separate processes, so they chain
themselves through files in the run directory, inside :meth:`ShardedWalSource.open` (before the
consumer writes its ``.ready`` file): consumer *i* waits until N sessions hold a member lock
in ``pg_locks`` and ``shards-<i-1>.json`` exists, refreshes, and writes ``shards-<i>.json``. The
runner's existing gate (every ``.ready`` file) therefore already means "ownership settled";
:meth:`ShardedWalPipeline.wait_ready` checks it independently in ``pg_locks``
(:meth:`~lab.pg.shards.Census.settled`: N members done joining, all 64 shards held, nobody above
target) so the runner needs no run directory and the runner/pipeline contract is unchanged.
As in the reference, consumer 0 knows nobody else's shards until its next refresh
≥ 1 s later and claims every row until then: that early overlap is where the small ``skipped``
counts come from (291, 1073, 1044 at 100k).

Deviations from the reference, and why:

* Members are counted by session, not by member lock (:func:`~lab.pg.shards.read_snapshot`).
  The reference's readers join one after another in one process before any of them counts; ours
  join concurrently, and a join between its two statements holds every number that was free.
  Counted by lock, that moment looked like N members: at N = 16 readers 0 to 2 did their forced
  refresh against 6 members, took 11 shards each, gave shards away after rows had started, and
  15 rows of the moved shards were left alone by every reader (docs/benchmarks.md). The runner's
  gate also waits for nobody above target, so a wrong initial share cannot move shards while
  rows flow.

* :meth:`ShardedWalSource.fill` wraps ``WalSource.fill`` instead of filtering inside its read
  loop (the brief: compose, do not copy). A filtered row therefore costs an ``Item`` and a
  watermark hold/resolve instead of one ``advance``; the batch still fills up to 100
  *claimable* rows, so claim statements stay at about M/100 in total.
* :meth:`ShardedWalPipeline.prepare` terminates sessions still holding locks in our two key
  spaces (a previous run's orphaned consumer) and waits until the locks are gone, so a new run
  never starts against stale owners; the join still retries 10 times, 1 s apart.
* ``shards-<i>.json`` is rewritten on close with the final shard set, refresh and filter counts
  (diagnostics; the consumer result file has no field for them).
* **A reader that replaces a dead one** (``consumer-kill``) claims every row it replays
  from before it started, whatever the shard, instead of filtering them. The dead reader's shards
  were free while it was gone and the others may hold them now; its slot resends the rows it had
  not confirmed, which the others had filtered out while those shards were the dead reader's.
  Filtering them again would lose them; claiming them costs a claim each for the replay only (a row
  another reader owns or worked already is skipped by the inbox claim). Readers with a fresh slot
  (every reader of a run without a fault) have no such rows: the rule never applies to them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import psycopg

from lab.pg.shards import (
    LOCKS_SQL,
    MEMBER_SPACE,
    REFRESH_S,
    SHARD_SPACE,
    SHARDS,
    Census,
    ShardOwnership,
    census,
    target,
)
from lab.pipelines.base import Capabilities, Item, SharedResources
from lab.pipelines.wal import WalPipeline, WalSource
from lab.scenario import Scenario
from lab.settings import Settings

log = logging.getLogger(__name__)

TURN_POLL_S = 0.02
STALE_SQL = (
    "SELECT pg_terminate_backend(pid) FROM (SELECT DISTINCT pid FROM pg_locks "
    "WHERE locktype = 'advisory' AND classid IN (%s::oid, %s::oid) AND objsubid = 2) AS l"
)


def turn_file(run_dir: Path, index: int) -> Path:
    """Written by consumer ``index`` once its forced initial refresh is done."""
    return run_dir / f"shards-{index}.json"


async def lock_census(dsn: str) -> Census:
    """Member and shard locks granted in our key spaces, whoever holds them."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        rows = await (await conn.execute(LOCKS_SQL)).fetchall()
    return census(rows)


class ShardedWalPipeline(WalPipeline):
    """Runner side: ``wal``'s slots plus a gate on the settled shard ownership."""

    name: ClassVar[str] = "wal-sharded"
    capabilities: ClassVar[Capabilities] = Capabilities(inbox_table="inbox_wal", consumer_slots=True)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "shards": SHARDS,
            "shard_key": "id % 64",
            "shard_lock_space": SHARD_SPACE,
            "member_lock_space": MEMBER_SPACE,
            "refresh_ms": int(REFRESH_S * 1000),
            "lock_connection": "one dedicated non-pooled session per consumer",
            "initial_ownership": "forced refresh in index order before ready",
        }

    async def prepare(self) -> None:
        await super().prepare()
        dsn = self.settings.pg_dsn
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute(STALE_SQL, (MEMBER_SPACE, SHARD_SPACE))
            if stale := len(await cur.fetchall()):
                log.warning("terminated %d stale session(s) holding shard or member locks", stale)
        deadline = time.monotonic() + 10
        while (left := await lock_census(dsn)).member_locks or left.shards_held:
            if time.monotonic() > deadline:
                raise RuntimeError("advisory locks of a previous wal-sharded run are still held")
            await asyncio.sleep(0.1)

    async def wait_ready(self) -> None:
        await super().wait_ready()
        await self.wait_settled(timeout=self.scenario.ready_timeout_s)

    async def wait_settled(self, *, timeout: float) -> None:  # noqa: ASYNC109 - many polls
        """Until ownership is settled (:meth:`Census.settled`): no shard moves once rows flow."""
        n, deadline = self.scenario.consumers, time.monotonic() + timeout
        while not (now := await lock_census(self.settings.pg_dsn)).settled(n):
            if time.monotonic() > deadline:
                raise TimeoutError(f"shard ownership not settled: {now} "
                                   f"(want {n} members, at most {target(n)} shards each)")
            await asyncio.sleep(0.1)


class ShardedWalSource(WalSource):
    """Consumer side: a ``wal`` reader that only claims rows of its shards (or ownerless ones).

    ``run_dir`` orders the forced initial refreshes by index (see the module docstring); without
    one (outside a run) each source refreshes as soon as all N have joined, in any order.
    """

    def __init__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> None:
        super().__init__(scenario, settings, index)
        self.index = index
        self.consumers = scenario.consumers
        self.run_dir = run_dir
        self.ready_timeout = scenario.ready_timeout_s
        self.filtered = 0  # rows left to other owners (not skipped: never claimed)
        self.catch_up_lsn = 0  # a replacement claims every replayed row below this LSN
        self.shards = ShardOwnership(settings.pg_dsn, scenario.consumers)

    async def open(self) -> None:
        """Slot and stream as ``wal``, then join, wait for everyone, and refresh in index order."""
        await super().open()
        if self.resumed:
            assert self._claims is not None
            row = await (await self._claims.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).fetchone()
            self.catch_up_lsn = int(row[0]) if row else 0
        await self.shards.open()
        await self.shards.wait_members(self.consumers, timeout=self.ready_timeout)
        if self.run_dir is not None and self.index > 0:
            await self._wait_turn(turn_file(self.run_dir, self.index - 1))
        await self.shards.refresh(force=True)
        self._write_state()

    async def _wait_turn(self, previous: Path) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while not previous.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumer {self.index}: {previous.name} not written "
                                   f"after {self.ready_timeout:.0f} s")
            await asyncio.sleep(TURN_POLL_S)

    async def fill(self, max_items: int, first_wait: float, flush_wait: float) -> list[Item]:
        """Rebalance if due, then up to ``max_items`` claimable rows; the rest is confirmed."""
        await self.shards.refresh()
        claimable, resolve, inner, report = self.shards.claimable, self._marks.resolve, super().fill, self._report
        catch_up = self.catch_up_lsn
        decode = self._decode_row  # the shard is the id's: every row is decoded here, not only won ones
        out: list[Item] = []
        while (want := max_items - len(out)) > 0:
            got = await inner(want, flush_wait if out else first_wait, flush_wait)
            before = len(out)
            for item in got:
                decode(item)
                if claimable[item.id % SHARDS] or item.pos[0] < catch_up:
                    out.append(item)
                else:
                    report(resolve(item.pos[1]))
            self.filtered += len(got) - (len(out) - before)
            if len(got) < want:  # the inner read timed out
                break
        return out

    def _write_state(self) -> None:
        if self.run_dir is None:
            return
        s = self.shards
        state = {
            "index": self.index, "member": s.member, "members": s.members,
            "shards": sorted(s.mine), "refreshes": s.refreshes, "filtered": self.filtered,
            "catch_up_lsn": self.catch_up_lsn,
        }
        path = turn_file(self.run_dir, self.index)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)

    async def close(self) -> None:
        try:
            self._write_state()
        except Exception as exc:
            log.warning("could not write the shard state: %s", exc)
        await self.shards.close()
        await super().close()
