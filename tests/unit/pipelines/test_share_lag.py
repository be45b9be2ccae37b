"""The share group's lag over the Kafka protocol: the encoding, and the reader against a broker that
answers as Kafka 4.2 does (a local socket speaking the two requests), then against nothing."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

import pytest

from lab.pipelines.share_lag import CLIENT_ID, ShareBacklog, describe_offsets, find_coordinator, parse_offsets, request
from lab.stack.kafka_wire import NO_TAGS, Reader, compact_array, compact_string, uvarint


def test_the_flexible_encoding() -> None:
    assert uvarint(0) == b"\x00" and uvarint(127) == b"\x7f" and uvarint(300) == b"\xac\x02"
    assert Reader(b"\xac\x02").uvarint() == 300
    assert compact_string("g") == b"\x02g" and Reader(b"\x00").string() is None
    framed = request(90, 1, 7, b"body")
    size, key, version, correlation, client = struct.unpack_from(">ihhih", framed)
    assert (size, key, version, correlation, client) == (len(framed) - 4, 90, 1, 7, len(CLIENT_ID))
    assert framed.endswith(b"\x00body")
    assert find_coordinator("g") == b"\x00\x02\x02g\x00"  # key type group, one key, no tags
    # one group "g", topic "t", partitions [0, 1], each level closed by its (empty) tags
    assert describe_offsets("g", "t", 2) == (b"\x02\x02g\x02\x02t\x03" + struct.pack(">ii", 0, 1)
                                             + b"\x00\x00\x00")


def _offsets_answer(group_error: int = 0, lag: int = 7, start: int = 40) -> bytes:
    partition = struct.pack(">iqiqh", 0, start, 3, lag, 0) + b"\x00" + NO_TAGS  # error message null
    topic = compact_string("t") + bytes(16) + compact_array([partition]) + NO_TAGS
    group = compact_string("g") + compact_array([topic]) + struct.pack(">h", group_error) + b"\x00" + NO_TAGS
    return struct.pack(">i", 0) + compact_array([group]) + NO_TAGS


def test_the_answer_gives_each_partitions_start_and_lag() -> None:
    [p] = parse_offsets(Reader(_offsets_answer()))
    assert (p.partition, p.start_offset, p.lag) == (0, 40, 7)
    with pytest.raises(Exception, match="GROUP_ID_NOT_FOUND"):
        parse_offsets(Reader(_offsets_answer(group_error=69)))


async def _broker(answer: Callable[[int], bytes]) -> tuple[asyncio.Server, int, list[int]]:
    """A broker that answers FindCoordinator with itself and DescribeShareGroupOffsets with ``answer``."""
    asked: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
            except asyncio.IncompleteReadError:
                break
            data = await reader.readexactly(size)
            key, _version, correlation = struct.unpack_from(">hhi", data)
            asked.append(key)
            if key == 10:
                coordinator = (compact_string("g") + struct.pack(">i", 1) + compact_string("127.0.0.1")
                               + struct.pack(">ih", port, 0) + b"\x00" + NO_TAGS)
                body = struct.pack(">i", 0) + compact_array([coordinator]) + NO_TAGS
            else:
                body = answer(len(asked))
            message = struct.pack(">i", correlation) + NO_TAGS + body
            writer.write(struct.pack(">i", len(message)) + message)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, port, asked


def test_the_reader_asks_the_coordinator_and_keeps_its_connection() -> None:
    async def go() -> None:
        server, port, asked = await _broker(lambda n: _offsets_answer(lag=7 + n, start=40 + n))
        reader = ShareBacklog(f"127.0.0.1:{port}", "g", "t", 1)
        try:
            first, second = await reader.read(), await reader.read()
        finally:
            await reader.aclose()
            server.close()
        assert [(s["messages"], s["start_offset"]) for s in first + second] == [(9, 42), (10, 43)]
        assert asked == [10, 90, 90]  # the coordinator found once, then asked on the kept connection
        assert reader.where == "kafka" and reader.pids() == []

    asyncio.run(go())


def test_an_error_an_unknown_lag_or_no_broker_is_a_gap_never_an_exception() -> None:
    async def go() -> None:
        server, port, _ = await _broker(
            lambda n: _offsets_answer(group_error=69) if n == 2 else _offsets_answer(lag=-1))
        reader = ShareBacklog(f"127.0.0.1:{port}", "g", "t", 1)
        [gap] = await reader.read()
        assert "GROUP_ID_NOT_FOUND" in gap["error"] and "messages" not in gap
        [gap] = await reader.read()  # connected again, to a group whose partition has no state yet
        assert gap["error"] == "the broker has no share-partition lag yet"
        await reader.aclose()
        server.close()
        await server.wait_closed()
        [gap] = await ShareBacklog(f"127.0.0.1:{port}", "g", "t", 1).read()  # nothing listens any more
        assert "error" in gap and "messages" not in gap

    asyncio.run(go())
