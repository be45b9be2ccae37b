"""The inbox claims (lab.workload.inbox) against the session stack's PostgreSQL: the reference's
claim keeps a row with its consumer's name for good; the takeover claim hands a row over only
once its claimant's session is gone, and never to two live consumers."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from lab.settings import Settings
from lab.workload.inbox import LEASE_SPACE, claim_ids, take_lease

pytestmark = pytest.mark.integration
BASE = 2_000_000_000  # ids far above any run's, removed again


async def _connect(settings: Settings) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(settings.pg_dsn, autocommit=True)


async def _owners(db: psycopg.AsyncConnection) -> dict[int, str]:
    cur = await db.execute("SELECT id - %s, consumer FROM inbox WHERE id >= %s", (BASE, BASE))
    return dict(await cur.fetchall())


def ids(*xs: int) -> list[int]:
    return [BASE + x for x in xs]


def test_claims(stack: object, settings: Settings) -> None:
    asyncio.run(_claims(settings))


async def _claims(settings: Settings) -> None:
    db = await _connect(settings)
    await db.execute("DELETE FROM inbox WHERE id >= %s", (BASE,))
    a, b = await _connect(settings), await _connect(settings)
    try:
        # the reference's claim: by name, for good
        assert await claim_ids(a, ids(1, 2), "x") == set(ids(1, 2))
        assert await claim_ids(b, ids(2, 3), "y") == set(ids(3))
        assert await claim_ids(b, ids(1, 2, 3), "x") == set(ids(1, 2))  # the same name gets them back
        await a.close()
        assert await claim_ids(b, ids(1), "y") == set()  # x's session is gone: still x's

        # takeover: a lease per session; a live claimant keeps its rows
        a = await _connect(settings)
        me_a, me_b = await take_lease(a, "dbz-quorum-1"), await take_lease(b, "dbz-quorum-0")
        assert me_a.startswith("dbz-quorum-1#") and me_b.startswith("dbz-quorum-0#") and me_a[13:] != me_b[13:]
        held = await (await db.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objsubid = 2 "
            "AND objid = ANY(%s::oid[]) AND granted", (LEASE_SPACE, [int(me_a[13:]), int(me_b[13:])]))).fetchone()
        assert held == (2,)
        assert await claim_ids(a, ids(11, 12, 13), me_a, takeover=True) == set(ids(11, 12, 13))
        assert await claim_ids(b, ids(12, 14), me_b, takeover=True) == set(ids(14))  # a is alive
        assert await claim_ids(a, ids(11), me_a, takeover=True) == set(ids(11))  # its own, again
        # a row of the reference's claim (no lease) is never taken over
        assert await claim_ids(b, ids(1), me_b, takeover=True) == set()
        await a.close()  # a is gone: its rows go to whoever gets them next, once
        for _ in range(50):  # its backend ends a moment after the client closed
            if await claim_ids(b, ids(11, 12), me_b, takeover=True) == set(ids(11, 12)):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the rows of a closed session were never taken over")
        owners = await _owners(db)
        assert owners[11] == owners[12] == owners[14] == me_b and owners[13] == me_a
        assert await claim_ids(b, ids(11), me_b, takeover=True) == set(ids(11))  # now b's own

        # two live consumers race for the rows of a gone one: each row goes to exactly one
        c, d = await _connect(settings), await _connect(settings)
        me_c, me_d = await take_lease(c, "dbz-quorum-2"), await take_lease(d, "dbz-quorum-3")
        rows = ids(*range(100, 300))
        for _ in range(5):
            e = await _connect(settings)
            me_e = await take_lease(e, "dbz-quorum-4")
            await db.execute("DELETE FROM inbox WHERE id = ANY(%s)", (rows,))
            assert await claim_ids(e, rows, me_e, takeover=True) == set(rows)
            await e.close()
            await asyncio.sleep(0.3)
            got_c, got_d = await asyncio.gather(claim_ids(c, rows, me_c, takeover=True),
                                                claim_ids(d, rows, me_d, takeover=True))
            assert not got_c & got_d and got_c | got_d <= set(rows)
            rest = set(rows) - got_c - got_d  # any row not taken yet: once more, then every row is taken
            got_c |= await claim_ids(c, sorted(rest), me_c, takeover=True)
            assert got_c | got_d == set(rows) and not got_c & got_d
            owners = await _owners(db)
            assert {owners[i - BASE] for i in got_c} <= {me_c} and {owners[i - BASE] for i in got_d} <= {me_d}
        await c.close()
        await d.close()
    finally:
        await db.execute("DELETE FROM inbox WHERE id >= %s", (BASE,))
        for conn in (db, a, b):
            await conn.close()
