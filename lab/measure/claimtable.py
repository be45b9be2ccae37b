"""The claim table as it stands: how big ``inbox_wal`` and its primary key are, and what vacuum left.

Read at a run's end by the pipelines that claim there (run.json's ``pipeline_settings.claim_table``,
after the consumers exited) and by ``lab bench claims`` (:mod:`lab.study.claim_table`) around each of
its cells:

* ``rows`` (``count(*)``), ``heap_bytes`` and ``index_bytes`` (``pg_relation_size`` of the table and
  of ``pk_inbox_wal``); ``rows_max``, the most rows it held: ``rows``, or under a retention the
  largest count a prune found before it deleted, if larger (the table only grows between prunes);
* from ``pg_stat_user_tables``: ``live_tuples`` and ``dead_tuples`` as PostgreSQL counts them, and
  its cumulative ``inserted`` and ``deleted`` (a speculative insert that lost a race with another
  reader's is counted as inserted and deleted: its row is dead the moment the race is lost);
* ``index``: the B-tree's depth (``tree_level``, 0 for a root that is a leaf), ``leaf_pages``,
  ``deleted_pages`` and ``avg_leaf_density`` (%), from ``pgstatindex`` of the ``pgstattuple``
  extension, created when missing (None where the server lacks it);
* ``pruned`` and ``prunes``: the claims a retention deleted and in how many prunes
  (:mod:`lab.workload.retention`; 0 under ``never``).

Every figure but the index's is a cheap catalog or statistics read; ``pgstatindex`` and ``count(*)``
read the whole index and table, which is why this runs outside a run's window.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

from lab.workload.retention import LEDGER, TABLE

log = logging.getLogger(__name__)
INDEX = "pk_inbox_wal"  # schema.sql

SIZES = sql.SQL(
    "SELECT (SELECT count(*) FROM {t}), pg_relation_size({tl}), pg_relation_size({il}), "
    "(SELECT coalesce(sum(claims), 0)::int8 FROM {l}), (SELECT count(DISTINCT upto) FROM {l}), "
    "(SELECT coalesce(max(rows_before), 0)::int8 FROM {l})"
).format(t=sql.Identifier(TABLE), tl=sql.Literal(TABLE), il=sql.Literal(INDEX), l=sql.Identifier(LEDGER))
STATS = ("SELECT n_live_tup, n_dead_tup, n_tup_ins, n_tup_del FROM pg_stat_user_tables "
         "WHERE relid = %s::regclass")
BTREE = sql.SQL("SELECT tree_level, leaf_pages, deleted_pages, avg_leaf_density FROM pgstatindex({})").format(
    sql.Literal(INDEX))


async def index_shape(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any] | None:
    """``pgstatindex`` of the primary key (module docstring), or None without the extension."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple SCHEMA public")
        row = await (await conn.execute(BTREE)).fetchone()
    except psycopg.Error as exc:
        log.warning("pgstatindex not available: %s", " ".join(str(exc).split()))
        return None
    if row is None:
        return None
    depth, leaves, deleted, density = row
    return {"depth": int(depth), "leaf_pages": int(leaves), "deleted_pages": int(deleted),
            "avg_leaf_density": None if density is None else round(float(density), 1)}


async def read(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    """The claim table now (module docstring); ``conn`` in autocommit mode."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")  # the counters as they are, not as first read
    one = await (await conn.execute(SIZES)).fetchone()
    assert one is not None  # aggregates always answer
    rows, heap, index, pruned, prunes, before_prunes = one
    stats = await (await conn.execute(STATS, (TABLE,))).fetchone()
    live, dead, inserted, deleted = stats if stats is not None else (None,) * 4
    return {"rows": int(rows), "rows_max": max(int(rows), int(before_prunes)),
            "heap_bytes": int(heap), "index_bytes": int(index),
            "live_tuples": live, "dead_tuples": dead, "inserted": inserted, "deleted": deleted,
            "index": await index_shape(conn), "pruned": int(pruned), "prunes": int(prunes)}
