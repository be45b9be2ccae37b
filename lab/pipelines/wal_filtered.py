"""``wal-filtered``: every consumer reads its own slot on a publication with a row filter.

Consumer ``k`` of N streams ``load_test_slot_<k>`` (as ``wal``) on its own publication
``filtered_pub_n<N>_k<k>``, ``FOR TABLE messages WHERE (id % N = k)``: its walsender sends it only
its share of the rows, so no reader sees another's rows and no claim is ever lost. Everything after
the stream is ``wal``'s reader (:class:`~lab.pipelines.wal.WalSource`: the pgoutput read loop, the
watermark over the stream order, the resume after a broken stream, the ``inbox_wal`` claim); only the
publication it streams differs.

What the filter saves and what it does not. PostgreSQL still decodes the whole WAL once per slot:
the row filter runs in the walsender *after* a change is decoded (pgoutput evaluates it on the
decoded tuple), so N slots still cost N decodings of every change. What goes away is everything
after that: the walsender serialises and sends M/N rows instead of M (and, since pgoutput skips
empty transactions, it sends no Begin/Commit for a transaction whose row is another's), the reader
receives and parses M/N Inserts, and the claims are M/N rows in about M/(100·N) statements per
reader instead of M rows in M/100 statements, none of them lost (``skipped`` is 0).

The row-filter rules (PostgreSQL ≥ 15): the expression may use only immutable built-in operators
and functions, and when the publication publishes UPDATE or DELETE (the default publish, as for
``load_test_pub``) only columns covered by the replica identity. ``id`` is the primary key and
``messages`` keeps the default replica identity, so ``id % N = k`` is valid with every action
published. TRUNCATE is never filtered.

The claim is kept. With no claim race it decides nothing on the happy path, but it is the
exactly-once proof the Success predicate counts (one ``inbox_wal`` row per worked position,
``distinct_ids`` = M) and it costs the same per won row as ``wal``'s, so the comparison with ``wal``
measures the filter and nothing else. It is also what keeps a row worked once when a slot resends
it (a reconnect replays a slot's own claims to the same slot) and when two splits overlap (below).

Publications are per N. :meth:`FilteredWalPipeline.prepare` drops the slots and *every*
``filtered_pub_*`` publication, whatever its N, and creates the N of this run before any reader
creates its slot (a slot's decoder looks its publication up in the catalog as of each change, so the
publication must predate the slot); :meth:`FilteredWalPipeline.teardown` drops both again. A run at
another N therefore starts clean: the runner's reset empties ``messages`` and the inbox tables, and no
slot or publication of the old split survives. Outside the lab, changing N on a live outbox is a
re-split: the new N slots start at their creation LSN, and rows committed before it and not yet
confirmed by the old slots are only in the old split, so the old readers must first drain their
slots past that LSN (writers paused, or every old slot's confirmed position ≥ the new slots'
creation point) before they stop; until then a row may reach an old and a new reader, and the
``inbox_wal`` claim (keyed by WAL position, not by reader) lets only one of them work it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from psycopg import sql

from lab.pg.slots import like_prefix
from lab.pipelines.base import Capabilities, SharedResources
from lab.pipelines.wal import WalPipeline, WalSource
from lab.scenario import Scenario
from lab.settings import Settings

log = logging.getLogger(__name__)

TABLE = "messages"
KEY = "id"
PUBLICATION_PREFIX = "filtered_pub_"


def publication_name(consumers: int, index: int) -> str:
    """Consumer ``index``'s publication among ``consumers``: ``filtered_pub_n<N>_k<k>``."""
    if not 0 <= index < consumers:
        raise ValueError(f"no consumer {index} among {consumers}")
    return f"{PUBLICATION_PREFIX}n{consumers}_k{index}"


def row_filter(consumers: int, index: int) -> sql.Composed:
    """``(id % N = k)``: the rows consumer ``index`` of ``consumers`` receives."""
    return sql.SQL("({} % {} = {})").format(sql.Identifier(KEY), sql.Literal(consumers), sql.Literal(index))


def create_publication(consumers: int, index: int) -> sql.Composed:
    """The statement that creates consumer ``index``'s publication."""
    return sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WHERE {}").format(
        sql.Identifier(publication_name(consumers, index)), sql.Identifier(TABLE), row_filter(consumers, index))


def share(ids: list[int], consumers: int, index: int) -> list[int]:
    """The ids of ``ids`` that :func:`row_filter` passes for consumer ``index`` (ids are ≥ 1)."""
    return [i for i in ids if i % consumers == index]


def drop_publications(conn: psycopg.Connection[Any]) -> list[str]:
    """Drop every ``filtered_pub_*`` publication (of any N); returns the names dropped."""
    rows = conn.execute("SELECT pubname FROM pg_publication WHERE pubname LIKE %s ORDER BY 1",
                        (like_prefix(PUBLICATION_PREFIX),)).fetchall()
    for (name,) in rows:
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
    return [name for (name,) in rows]


def reset_publications(dsn: str, consumers: int) -> list[str]:
    """Drop every split's publications and create this run's ``consumers``; returns their names."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        if dropped := drop_publications(conn):
            log.info("dropped publications %s", ", ".join(dropped))
        with conn.transaction():
            for k in range(consumers):
                conn.execute(create_publication(consumers, k))
    return [publication_name(consumers, k) for k in range(consumers)]


def remove_publications(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        drop_publications(conn)


class FilteredWalPipeline(WalPipeline):
    """Runner side: ``wal``'s slots, plus this run's N filtered publications created before them."""

    name: ClassVar[str] = "wal-filtered"
    capabilities: ClassVar[Capabilities] = Capabilities(inbox_table="inbox_wal", consumer_slots=True)

    def describe(self) -> dict[str, Any]:
        n = self.scenario.consumers
        wal = {k: v for k, v in super().describe().items() if k != "publication"}
        return {
            **wal,
            "publications": [publication_name(n, k) for k in range(n)],
            "row_filter": f"{KEY} % {n} = k",
            "claim": "inbox_wal by WAL position (exactly-once proof; no claim is lost)",
        }

    async def prepare(self) -> None:
        await super().prepare()  # the slots first: a publication in use by a walsender is still dropped
        await asyncio.to_thread(reset_publications, self.settings.pg_dsn, self.scenario.consumers)

    async def teardown(self) -> None:
        try:
            await super().teardown()
            await asyncio.to_thread(remove_publications, self.settings.pg_dsn)
        except Exception as exc:  # never raises: the next prepare drops what is left
            log.warning("wal-filtered teardown: %s: %s", type(exc).__name__, exc)


class FilteredWalSource(WalSource):
    """Consumer side: a ``wal`` reader streaming its own share's publication."""

    def __init__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> None:
        super().__init__(scenario, settings, index)
        self.publication = publication_name(scenario.consumers, index)
