"""An asyncio logical-replication stream over a psycopg 3 ``replication="database"`` connection.

psycopg (3.3+) runs ``START_REPLICATION`` and leaves the connection in copy-both mode; from
there this module talks to libpq directly: ``pgconn.get_copy_data(1)`` without blocking,
``consume_input()`` when the event loop (``loop.add_reader`` on ``pgconn.socket``) says the
socket is readable, and ``put_copy_data`` + ``flush`` for standby status updates.

Reading never loses data on a timeout: everything received stays in libpq's buffer until
a later :meth:`ReplicationStream.read` returns it, so a read that times out is simply
repeated. The socket is only read when the buffer is empty, so a slow
consumer pushes back on the walsender through TCP instead of growing memory.

Unlike Npgsql, the slot becomes active as soon as :meth:`start` returns,
not at the first read: libpq has already received the CopyBothResponse by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import pq, sql

from lab.pg.pgoutput import protocol_version
from lab.pg.walstream import XLogData, format_lsn, parse_copy_data, parse_lsn, standby_status_update

log = logging.getLogger(__name__)

__all__ = ["ReplicationStream", "XLogData", "server_version_num"]


def server_version_num(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> int:
    """The server's ``server_version_num`` (e.g. 180006), known from the handshake."""
    return conn.info.server_version


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class ReplicationStream:
    """One logical replication connection: create a slot, stream it, report positions.

    Status: :meth:`set_status` records the position the consumer is done with (sent as
    flushed and applied; written is the newest ``wal_end`` received); it is sent by
    :meth:`send_status`, when the server asks for a reply, and every ``status_interval``
    seconds while streaming. Use as ``async with await ReplicationStream.connect(dsn)``.

    ``settled``: when set, a callable the owner answers True when it holds nothing read but
    unresolved. At a keepalive it is asked, and if True the keepalive's ``wal_end`` becomes the
    status: every transaction that committed before it was sent already and is done, so nothing
    is skipped on a restart (what PostgreSQL's own apply worker reports when nothing is pending).
    Without it a client stays behind the WAL no change of its lies in (a checkpoint, another
    table's writes), and a fast shutdown of the server never ends: a logical walsender exits only
    once its client confirmed everything it sent, the shutdown checkpoint included.
    """

    def __init__(self, conn: psycopg.AsyncConnection[Any], *, status_interval: float = 10.0):
        self.conn = conn
        self.status_interval = status_interval
        self._pg = conn.pgconn
        self._fd = -1
        self._streaming = False
        self._reading = False
        self._received = 0
        self._status_lsn = 0
        self._status_unsent = False
        self._writer_on = False
        self._timer: asyncio.TimerHandle | None = None
        self._drained: asyncio.Future[None] | None = None
        self.settled: Callable[[], bool] | None = None

    @classmethod
    async def connect(
        cls, conninfo: str, *, status_interval: float = 10.0, **kwargs: Any
    ) -> ReplicationStream:
        """Open a ``replication="database"`` autocommit connection (``kwargs`` go to psycopg)."""
        conn = await psycopg.AsyncConnection.connect(
            conninfo, replication="database", autocommit=True, **kwargs
        )
        return cls(conn, status_interval=status_interval)

    @property
    def server_version_num(self) -> int:
        return server_version_num(self.conn)

    @property
    def received_lsn(self) -> int:
        """The newest ``wal_end`` seen in XLogData."""
        return self._received

    @property
    def status_lsn(self) -> int:
        return self._status_lsn

    async def create_slot(self, name: str, *, failover: bool = False) -> int:
        """Create a permanent pgoutput slot without a snapshot; returns its consistent point.

        ``failover``: a slot the primary's standbys synchronise (``sync_replication_slots``,
        PostgreSQL 17+), so that a promoted standby carries it.
        """
        options = sql.SQL("SNAPSHOT 'nothing', FAILOVER true" if failover else "SNAPSHOT 'nothing'")
        cur = await self.conn.execute(
            sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput ({})").format(sql.Identifier(name), options)
        )
        row = await cur.fetchone()
        assert row is not None
        return parse_lsn(row[1])

    async def drop_slot(self, name: str) -> None:
        """Drop a slot from this (not yet streaming) connection, waiting if it is active."""
        query = sql.SQL("DROP_REPLICATION_SLOT {} WAIT").format(sql.Identifier(name))
        await self.conn.execute(query)

    async def start(
        self,
        slot: str,
        publication: str | Sequence[str],
        proto_version: int | None = None,
        *,
        binary: bool = True,
        start_lsn: int = 0,
        messages: bool = False,
        streaming: str | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        """``START_REPLICATION SLOT slot LOGICAL start_lsn (...)`` and enter copy-both mode.

        ``proto_version`` defaults to the newest the server supports (see
        :func:`lab.pg.pgoutput.protocol_version`); ``binary`` asks for binary tuple data (14+);
        ``messages`` for pg_logical_emit_message() payloads; ``streaming`` ('on', or
        'parallel' with protocol 4) for in-progress transactions, off by default as in the
        reference bench; ``extra`` any other pgoutput option (e.g.
        ``{"two_phase": "on"}``, ``{"origin": "none"}``).
        """
        version = proto_version or protocol_version(self.server_version_num)
        pubs = [publication] if isinstance(publication, str) else list(publication)
        names = ",".join(sql.Identifier(p).as_string(self.conn) for p in pubs)
        options: list[tuple[str, str]] = [
            ("proto_version", str(version)),
            ("publication_names", names),
        ]
        if binary:
            options.append(("binary", "true"))
        if messages:
            options.append(("messages", "true"))
        if streaming:
            options.append(("streaming", streaming))
        options += (extra or {}).items()
        if not all(k.isidentifier() for k, _ in options):
            raise ValueError(f"bad pgoutput option name in {options}")
        query = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
            sql.Identifier(slot),
            sql.SQL(format_lsn(start_lsn)),
            sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.SQL(k), sql.Literal(v)) for k, v in options
            ),
        )
        cur = await self.conn.execute(query)
        if cur.pgresult is None or cur.pgresult.status != pq.ExecStatus.COPY_BOTH:
            raise psycopg.OperationalError(f"no copy-both mode after {query.as_string(self.conn)}")
        self._streaming, self._fd = True, self._pg.socket
        self._received = max(self._received, start_lsn)
        self._timer = asyncio.get_running_loop().call_later(self.status_interval, self._tick)
        log.debug("streaming slot %s from %s, proto %s", slot, format_lsn(start_lsn), version)

    async def read(self, timeout: float) -> XLogData | None:  # noqa: ASYNC109
        """The next XLogData message, or None after ``timeout`` seconds without one.

        Keepalives are handled here (answered when the server asks). A timeout loses
        nothing: bytes already received stay buffered for the next call. Not reentrant.
        """
        if self._reading or not self._streaming:
            raise RuntimeError("read() needs start() first and runs in one task at a time")
        msg = self._next()  # the common case: already buffered, no await at all
        if msg is not None:
            return msg
        self._reading = True
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while (remaining := deadline - loop.time()) > 0:
                await self._wait(loop, remaining)
                self._pg.consume_input()
                if (msg := self._next()) is not None:
                    return msg
            return None
        finally:
            self._reading = False

    def set_status(self, lsn: int) -> None:
        """Record the position the consumer has applied and flushed (sent later).

        Never moves back: a lower ``lsn`` (such as the 0/0 ``wal_end`` of a Relation message)
        is ignored.
        """
        if lsn > self._status_lsn:
            self._status_lsn = lsn

    async def send_status(self, *, reply: bool = False) -> None:
        """Send a standby status update now and wait until it is written to the socket."""
        if not self._streaming:
            raise RuntimeError("send_status() needs a started stream")
        self._queue_status(reply)
        if self._writer_on:  # the socket did not take it all: wait for the writer callback
            if self._drained is None or self._drained.done():
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)

    async def close(self) -> None:
        """Send a last status, end COPY (CopyDone) cleanly, and close the connection."""
        if self._timer is not None:
            self._timer.cancel()
        if self._streaming and not self.conn.closed:
            try:
                await asyncio.wait_for(self.send_status(), 10)
                await asyncio.wait_for(self._end_copy(), 10)
            except (psycopg.Error, TimeoutError) as exc:
                log.warning("replication stream did not end cleanly: %s", exc)
        self._streaming = False
        self._writer(False)
        await self.conn.close()

    async def __aenter__(self) -> ReplicationStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals -------------------------------------------------------------------------
    def _next(self) -> XLogData | None:
        """The next buffered XLogData, answering keepalives on the way; None if none buffered."""
        pg = self._pg
        while True:
            n, data = pg.get_copy_data(1)
            if n > 0:
                if data[0] == 0x6B:  # 'k': a keepalive; its last byte asks for a reply
                    if self.settled is not None and self.settled():  # everything sent is done
                        self._status_lsn = max(self._status_lsn, int.from_bytes(data[1:9]))
                    if data[17]:
                        self._queue_status()
                    continue
                msg = parse_copy_data(data)
                if msg.wal_end > self._received:
                    self._received = msg.wal_end
                return msg  # type: ignore[return-value]
            elif n == 0:
                return None
            else:
                self._streaming = False
                raise self._copy_ended_error()

    def _copy_ended_error(self) -> psycopg.Error:
        res = self._pg.get_result() if not self._pg.is_busy() else None
        if res is not None and res.status == pq.ExecStatus.FATAL_ERROR:
            return psycopg.errors.error_from_result(res, encoding=self.conn.info.encoding)
        return psycopg.OperationalError("the server ended the replication stream")

    async def _wait(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        """Until the socket is readable or ``delay`` seconds have passed."""
        fut = loop.create_future()
        loop.add_reader(self._fd, _wake, fut)
        timer = loop.call_later(delay, _wake, fut)
        try:
            await fut
        finally:
            loop.remove_reader(self._fd)
            timer.cancel()

    def _tick(self) -> None:
        if self._streaming:
            with contextlib.suppress(psycopg.Error):
                self._queue_status()
            self._timer = asyncio.get_running_loop().call_later(self.status_interval, self._tick)

    def _queue_status(self, reply: bool = False) -> None:
        """Queue a status update in libpq and flush what the socket takes without blocking."""
        lsn = self._status_lsn
        msg = standby_status_update(max(self._received, lsn), lsn, lsn, reply=reply)
        self._status_unsent = self._pg.put_copy_data(msg) == 0
        self._writer(self._status_unsent or self._pg.flush() == 1)

    def _writer(self, on: bool) -> None:
        if on == self._writer_on:
            return
        loop = asyncio.get_running_loop()
        if on:
            loop.add_writer(self._fd, self._on_writable)
        else:
            loop.remove_writer(self._fd)
            if self._drained is not None:
                _wake(self._drained)
        self._writer_on = on

    def _on_writable(self) -> None:
        try:
            if self._status_unsent:
                self._queue_status()
            else:
                self._writer(self._pg.flush() == 1)
        except psycopg.Error:
            self._writer(False)

    async def _end_copy(self) -> None:
        pg, loop = self._pg, asyncio.get_running_loop()
        pg.put_copy_end()
        self._writer(pg.flush() == 1)
        while True:  # discard what is still in flight until the server's CopyDone
            n, _ = pg.get_copy_data(1)
            if n == -1:
                break
            if n == 0:
                await self._wait(loop, 1.0)
                pg.consume_input()
        while True:
            while pg.is_busy():
                await self._wait(loop, 1.0)
                pg.consume_input()
            res = pg.get_result()
            if res is None:
                break
            if res.status == pq.ExecStatus.FATAL_ERROR:
                raise psycopg.errors.error_from_result(res, encoding=self.conn.info.encoding)
