"""The backlog of ``kafka-share``'s share group, asked of the group's coordinator.

A share group has no committed offsets: what it has not yet acknowledged is the *share-partition
lag* the broker keeps per partition (KIP-1226: the records from the share-partition start offset to
the log end that are not yet acknowledged, those a member holds under its acquisition lock
included). ``DescribeShareGroupOffsets`` v1 (Kafka 4.2, the version ``kafka-share`` needs anyway)
answers it; confluent-kafka 2.16 has no call for it, so :class:`ShareBacklog` speaks those two
requests of the Kafka protocol itself (``FindCoordinator`` v4 for the group's coordinator, then
``DescribeShareGroupOffsets`` v1 on one kept connection, in :mod:`lab.stack.kafka_wire`'s
encoding): a few hundred bytes a sample, from the runner's event loop, no client library and no
child process. A sample is ``{"t", "messages"}`` (the lag summed over the topic's partitions) with
``start_offset``; a failed reading is a gap ``{"t", "error"}`` and the next one connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from dataclasses import dataclass
from typing import Any

from lab.stack.kafka_wire import NO_TAGS, Reader, compact_array, compact_string, frame, uvarint

FIND_COORDINATOR, FIND_COORDINATOR_VERSION = 10, 4
DESCRIBE_OFFSETS, DESCRIBE_OFFSETS_VERSION = 90, 1  # v1 adds Lag (KIP-1226)
CLIENT_ID = "fanout-lab-backlog"
TIMEOUT_S = 4.0  # one reading (the coordinator found again, a connection, a request), at most
ERRORS = {3: "UNKNOWN_TOPIC_OR_PARTITION", 14: "COORDINATOR_LOAD_IN_PROGRESS", 15: "COORDINATOR_NOT_AVAILABLE",
          16: "NOT_COORDINATOR", 35: "UNSUPPORTED_VERSION", 69: "GROUP_ID_NOT_FOUND"}


class KafkaProtocolError(Exception):
    """An error code in an answer (one line: its name)."""

    def __init__(self, code: int, what: str, message: str | None = None) -> None:
        super().__init__(f"{what}: {ERRORS.get(code, f'error {code}')}" + (f" ({message})" if message else ""))
        self.code = code


def request(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    """A framed request of a flexible version (header v2), then ``body``."""
    return frame(api_key, version, correlation, CLIENT_ID.encode(), body, flexible=True)


def find_coordinator(group: str) -> bytes:
    """``FindCoordinator`` v4's body: the group's coordinator (key type 0, a group)."""
    return struct.pack(">b", 0) + compact_array([compact_string(group)]) + NO_TAGS


def describe_offsets(group: str, topic: str, partitions: int) -> bytes:
    """``DescribeShareGroupOffsets`` v1's body: ``group`` on partitions 0..``partitions``-1 of ``topic``."""
    parts = uvarint(partitions + 1) + b"".join(struct.pack(">i", p) for p in range(partitions))
    topics = compact_array([compact_string(topic) + parts + NO_TAGS])
    return compact_array([compact_string(group) + topics + NO_TAGS]) + NO_TAGS


# decoding --------------------------------------------------------------------------------------
def parse_coordinator(r: Reader) -> tuple[str, int]:
    """(host, port) from a ``FindCoordinator`` v4 answer; :class:`KafkaProtocolError` on an error code."""
    r.take(">i")  # throttle time
    found: tuple[str, int] | None = None
    for _ in range(r.count()):
        r.string()  # the key asked
        r.take(">i")  # node id
        host, port, code, message = r.string(), r.take(">i"), r.take(">h"), r.string()
        r.skip_tags()
        if code:
            raise KafkaProtocolError(code, "FindCoordinator", message)
        found = (host or "", port)
    if found is None:
        raise KafkaProtocolError(15, "FindCoordinator", "no coordinator in the answer")
    return found


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    start_offset: int  # the share-partition start offset
    lag: int  # -1: the broker does not know it yet


def parse_offsets(r: Reader) -> list[PartitionLag]:
    """Every partition of a ``DescribeShareGroupOffsets`` v1 answer; :class:`KafkaProtocolError` on
    the first error code (the group's, a partition's)."""
    r.take(">i")  # throttle time
    out: list[PartitionLag] = []
    for _ in range(r.count()):
        r.string()  # group id
        for _ in range(r.count()):
            r.string()  # topic name
            r.at += 16  # topic id
            for _ in range(r.count()):
                partition, start, _epoch, lag = r.take(">i"), r.take(">q"), r.take(">i"), r.take(">q")
                code, message = r.take(">h"), r.string()
                r.skip_tags()
                if code:
                    raise KafkaProtocolError(code, f"DescribeShareGroupOffsets partition {partition}", message)
                out.append(PartitionLag(partition, start, lag))
            r.skip_tags()
        code, message = r.take(">h"), r.string()
        r.skip_tags()
        if code:
            raise KafkaProtocolError(code, "DescribeShareGroupOffsets", message)
    return out


# the reader ------------------------------------------------------------------------------------
class ShareBacklog:
    """The share group's lag on its topic, about once a second from the runner
    (:class:`lab.pipelines.base.BacklogReader`)."""

    where = "kafka"

    def __init__(self, bootstrap: str, group: str | None, topic: str, partitions: int) -> None:
        pairs = (server.strip().rsplit(":", 1) for server in bootstrap.split(","))
        self.servers = [(host, int(port)) for host, port in pairs]
        self.group, self.topic, self.partitions = group or "", topic, partitions
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._correlation = 0

    def start(self) -> None:
        """Nothing to start: each reading is one request on the runner's loop."""

    def pids(self) -> list[int]:
        return []

    async def read(self) -> list[dict[str, Any]]:
        t = time.monotonic()
        try:
            async with asyncio.timeout(TIMEOUT_S):
                lags = await self._lags()
        except (OSError, TimeoutError, KafkaProtocolError, struct.error, IndexError, ValueError) as exc:
            await self.aclose()  # a coordinator that moved or restarted: found again next time
            return [{"t": t, "error": f"{type(exc).__name__}: {exc}"[:200]}]
        if not lags or any(p.lag < 0 for p in lags):
            return [{"t": t, "error": "the broker has no share-partition lag yet"}]
        return [{"t": t, "messages": sum(p.lag for p in lags), "start_offset": min(p.start_offset for p in lags)}]

    async def _lags(self) -> list[PartitionLag]:
        if self._conn is None:
            host, port = await self._coordinator()
            self._conn = await asyncio.open_connection(host, port)
        return parse_offsets(await self._call(self._conn, DESCRIBE_OFFSETS, DESCRIBE_OFFSETS_VERSION,
                                              describe_offsets(self.group, self.topic, self.partitions)))

    async def _coordinator(self) -> tuple[str, int]:
        error: Exception = OSError("no bootstrap server")
        for host, port in self.servers:
            try:
                conn = await asyncio.open_connection(host, port)
            except OSError as exc:
                error = exc
                continue
            try:
                return parse_coordinator(await self._call(conn, FIND_COORDINATOR, FIND_COORDINATOR_VERSION,
                                                          find_coordinator(self.group)))
            finally:
                conn[1].close()
        raise error

    async def _call(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], api_key: int, version: int,
                    body: bytes) -> Reader:
        reader, writer = conn
        self._correlation += 1
        writer.write(request(api_key, version, self._correlation, body))
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        r = Reader(await reader.readexactly(size))
        if r.take(">i") != self._correlation:
            raise KafkaProtocolError(-1, "answer", "out of order")
        r.skip_tags()  # response header v1
        return r

    def close(self) -> None:
        """Drop the connection (its loop closes the transport); never raises."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn[1].close()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn[1].close()
                await conn[1].wait_closed()
