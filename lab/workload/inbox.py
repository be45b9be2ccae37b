"""The inbox claims: one statement per batch decides which rows this consumer owns.

Both shapes follow the reference bench:

* ``inbox`` (broker pipelines) is keyed by message id. The data-modifying CTE inserts the batch
  with ``on conflict do nothing``; the ``union all`` branch returns ids this consumer already
  owns (a re-read after its own crash). Data-modifying CTEs share one snapshot, so the second
  branch cannot see rows the first just inserted: nothing is counted twice.
* ``inbox_wal`` (direct readers) is keyed by the row's WAL position. Positions travel as text
  (as in the reference, where the driver could not send ``pg_lsn[]``) and the statement returns
  the 1-based ordinals of the claimed inputs, so the caller maps them back to its batch.

Takeover (``Scenario.claim == "takeover"``), for ``inbox`` only. The reference's claim
binds a row to a consumer *name*: only that name gets it back. A broker that moves a message to
another consumer (RabbitMQ requeues a dead consumer's unacked deliveries to anyone; a Kafka
partition moves after a session timeout) then makes the new holder lose the claim and ack the
message as skipped: nobody works it (docs/benchmarks.md, "Faults"). A takeover claim binds a row
to a consumer's *claim session* instead, which the database can see:

* At open, the consumer takes a number from the sequence ``inbox_lease`` (unique for good) and holds
  the session advisory lock ``(LEASE_SPACE, number)`` on its claim connection for its whole life;
  it claims as ``<name>#<number>`` (:func:`claimant`), so ``inbox.consumer`` still names it.
* The claim is the reference's statement plus one data-modifying CTE: a row of the batch held by
  another claimant is re-assigned to us when ``pg_try_advisory_xact_lock`` on that claimant's
  number succeeds, i.e. when no session holds its lease: its consumer is gone (process dead,
  connection closed). A live claimant's lease always fails the try, so two live consumers never
  both hold a row; the transaction-level lock held until our statement commits makes a second
  taker wait or fail, and a re-check of the updated row (``READ COMMITTED``) sees the new live owner.
* On the happy path every id is new: the extra CTE scans the primary key for the batch's ids in
  the statement's snapshot, finds none (the insert's rows are not visible to it), and takes no
  lock. Its cost is measured in docs/benchmarks.md ("The takeover claim").
* Duplicates: a takeover re-works a row whose claimant is gone whether or not that claimant had
  worked it (there is no done mark): one extra work call per message the broker hands out again
  after its claimant's session ended, at-least-once as the fault runs count it.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from lab.pg.walstream import format_lsn

CLAIM_IDS = sql.SQL(
    "with claimed as ("
    "insert into inbox (id, consumer) select unnest(%(ids)s::int[]), %(me)s "
    "on conflict do nothing returning id) "
    "select id from claimed "
    "union all "
    "select id from inbox where id = any(%(ids)s::int[]) and consumer = %(me)s"
)

CLAIMS = ("owner", "takeover")
LEASE_SPACE = 0x7763  # pg_locks.classid of the inbox leases (wal-sharded's spaces are 0x7761, 0x7762)
LEASE_SEQUENCE = "inbox_lease"  # schema.sql
LEASE_MARK = "#"  # claimant = <consumer name>#<lease number>
CLAIMS_APPLICATION = "lab-claims"  # how the consumers' claim connections show in pg_stat_activity
RELAY_APPLICATION = "lab-relay"  # the wal-relay's hand-over connection (its work-table inserts)

CLAIM_IDS_TAKEOVER = sql.SQL(
    "with claimed as ("
    "insert into inbox (id, consumer) select unnest(%(ids)s::int[]), %(me)s "
    "on conflict do nothing returning id), "
    "taken as ("
    "update inbox set consumer = %(me)s where id = any(%(ids)s::int[]) and consumer <> %(me)s "
    "and pg_try_advisory_xact_lock({space}, nullif(split_part(consumer, {mark}, 2), '')::int) "
    "returning id) "
    "select id from claimed "
    "union all "
    "select id from taken "
    "union all "
    "select id from inbox where id = any(%(ids)s::int[]) and consumer = %(me)s"
).format(space=sql.Literal(LEASE_SPACE), mark=sql.Literal(LEASE_MARK))
NEXT_LEASE = sql.SQL("select nextval({})::int").format(sql.Literal(LEASE_SEQUENCE))
HOLD_LEASE = sql.SQL("select pg_advisory_lock({}, %s::int)").format(sql.Literal(LEASE_SPACE))

CLAIM_LSNS = sql.SQL(
    "with input as ("
    "select ord, txt::pg_lsn as wal from unnest(%(lsns)s::text[]) with ordinality as t(txt, ord)), "
    "claimed as (insert into inbox_wal (wal, slot) select wal, %(me)s from input "
    "on conflict do nothing returning wal) "
    "select i.ord from input i join claimed c on c.wal = i.wal "
    "union all "
    "select i.ord from input i join inbox_wal w on w.wal = i.wal and w.slot = %(me)s"
)


async def claim_ids(conn: psycopg.AsyncConnection, ids: Sequence[int], me: str, *,
                    takeover: bool = False) -> set[int]:
    """The subset of ``ids`` this consumer owns after the claim (``me``: a :func:`claimant` for
    ``takeover``)."""
    cur = await conn.execute(CLAIM_IDS_TAKEOVER if takeover else CLAIM_IDS, {"ids": list(ids), "me": me},
                             prepare=False)
    return {row[0] for row in await cur.fetchall()}


async def take_lease(conn: psycopg.AsyncConnection, name: str) -> str:
    """A new lease held by ``conn``'s session until it ends; returns the claimant to claim as."""
    row = await (await conn.execute(NEXT_LEASE)).fetchone()
    assert row is not None
    await conn.execute(HOLD_LEASE, (row[0],))  # a number never handed out before: nobody holds it
    return claimant(name, row[0])


def claimant(name: str, lease: int) -> str:
    """What a takeover claim writes into ``inbox.consumer``: the name and the lease number."""
    return f"{name}{LEASE_MARK}{lease}"


def consumer_of(claimed_by: str) -> str:
    """The consumer name in an ``inbox.consumer`` value (either claim)."""
    return claimed_by.split(LEASE_MARK, 1)[0]


async def claim_lsns(conn: psycopg.AsyncConnection, lsns: Sequence[int], me: str) -> list[int]:
    """0-based indexes into ``lsns`` of the positions this slot owns after the claim."""
    params = {"lsns": [format_lsn(x) for x in lsns], "me": me}
    cur = await conn.execute(CLAIM_LSNS, params, prepare=False)
    return sorted(row[0] - 1 for row in await cur.fetchall())


ID_SETS = sql.SQL(
    "with worked as (select distinct unnest(%(ids)s::int8[]) as id) "
    "select (select count(*) from outbox_record), "
    "(select count(*) from worked w where not exists (select 1 from outbox_record m where m.id = w.id)), "
    "(select count(*) from outbox_record m where not exists (select 1 from worked w where w.id = m.id))"
)
CLAIMED_IDS = sql.SQL(
    "select (select count(*) from inbox i where not exists (select 1 from outbox_record m where m.id = i.id)), "
    "(select count(*) from outbox_record m where not exists (select 1 from inbox i where i.id = m.id))"
)


async def id_sets(conn: psycopg.AsyncConnection, worked: Sequence[int], inbox_table: str) -> dict[str, int | None]:
    """Compare this run's id sets with the ids of ``messages`` (not only their counts), read
    through the view ``outbox_record`` (schema.sql), which adds the rows a pipeline moved to
    ``messages_done`` when it finished them.

    ``worked_not_in_messages`` / ``messages_not_worked``: the ids the work endpoint was called
    with against the rows of ``messages``. For the id-keyed ``inbox`` also the claimed set
    (``claimed_not_in_messages`` / ``messages_not_claimed``); the WAL-keyed ``inbox_wal`` holds
    positions, not ids, so its claims are tied to ids through the work calls (one call per claim).
    All zero: the sets are equal.
    """
    cur = await conn.execute(ID_SETS, {"ids": list(worked)})
    one = await cur.fetchone()
    assert one is not None  # aggregates always answer
    rows, foreign, missing = one
    out: dict[str, int | None] = {"messages_rows": rows, "worked_not_in_messages": foreign,
                                  "messages_not_worked": missing,
                                  "claimed_not_in_messages": None, "messages_not_claimed": None}
    if inbox_table == "inbox":
        cur = await conn.execute(CLAIMED_IDS)
        claimed = await cur.fetchone()
        assert claimed is not None
        out["claimed_not_in_messages"], out["messages_not_claimed"] = claimed
    return out


def sets_equal(checks: dict[str, int | None]) -> bool:
    """True when every set difference of :func:`id_sets` is empty."""
    return all(not checks.get(k) for k in ("worked_not_in_messages", "messages_not_worked",
                                           "claimed_not_in_messages", "messages_not_claimed"))
