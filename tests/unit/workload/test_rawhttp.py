"""The raw HTTP server (the web's insert listener) and client, over real loopback sockets.

The server gets a handler that echoes the body; no database is needed for the framing.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from lab.workload.rawhttp import PostServer, RawPost


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _echo(body: bytes) -> tuple[int, bytes]:
    if body == b"boom":
        raise RuntimeError("boom")
    return 201, b'{"got":' + body + b"}"


def _with_server(test: Callable[[int], Awaitable[None]]) -> None:
    async def main() -> None:
        port = _free_port()
        server = PostServer("/load/messages", _echo)
        await server.start("127.0.0.1", port)
        try:
            await test(port)
        finally:
            await server.close()

    asyncio.run(main())


async def _exchange(port: int, data: bytes, *, until_close: bool = False, replies: int = 1) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    got = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            if not chunk:
                break
            got += chunk
            if not until_close and got.count(b"HTTP/1.1 ") >= replies and _complete(got, replies):
                break
    finally:
        writer.close()
    return got


def _complete(data: bytes, replies: int) -> bool:
    """Every one of ``replies`` responses in ``data`` has its whole body."""
    rest = data
    for _ in range(replies):
        end = rest.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = rest[:end].lower()
        i = head.find(b"content-length:")
        length = int(head[i + 15:].split(b"\r\n")[0]) if i >= 0 else 0
        if len(rest) < end + 4 + length:
            return False
        rest = rest[end + 4 + length:]
    return True


def _post(body: bytes, *, extra: bytes = b"", path: bytes = b"/load/messages", version: bytes = b"1.1") -> bytes:
    return (b"POST %s HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\n%bContent-Length: %d\r\n\r\n%s"
            % (path, version, extra, len(body), body))


def test_one_post_gets_its_handlers_reply_with_framing_headers() -> None:
    async def test(port: int) -> None:
        got = await _exchange(port, _post(b'"a"'))
        head, body = got.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        assert lines[0] == b"HTTP/1.1 201 Created"
        assert b"Content-Length: 11" in lines and b"Content-Type: application/json" in lines
        assert any(line.startswith(b"Date: ") and line.endswith(b" GMT") for line in lines)
        assert body == b'{"got":"a"}'

    _with_server(test)


def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    async def test(port: int) -> None:
        got = await _exchange(port, _post(b"1") + _post(b"22") + _post(b"333"), replies=3)
        assert got.count(b"HTTP/1.1 201 Created") == 3
        assert got.index(b'{"got":1}') < got.index(b'{"got":22}') < got.index(b'{"got":333}')

    _with_server(test)


def test_a_request_split_across_writes_is_framed() -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = _post(b'"split"')
        for i in range(0, len(data), 7):  # header and body arrive in pieces
            writer.write(data[i:i + 7])
            await writer.drain()
            await asyncio.sleep(0.001)
        reply = await asyncio.wait_for(reader.readuntil(b'{"got":"split"}'), 5)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 201")

    _with_server(test)


@pytest.mark.parametrize(("request_bytes", "status"), [
    (_post(b"1", path=b"/other"), b"404"),
    (b"GET /load/messages HTTP/1.1\r\nHost: x\r\n\r\n", b"405"),
    (_post(b"boom"), b"500"),
])
def test_wrong_route_method_or_failing_handler_keep_the_connection(request_bytes: bytes, status: bytes) -> None:
    async def test(port: int) -> None:
        got = await _exchange(port, request_bytes + _post(b"2"), replies=2)
        assert got.startswith(b"HTTP/1.1 " + status)
        assert got.endswith(b'{"got":2}')  # the next request on the same connection still works

    _with_server(test)


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"POST /load/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", b"501"),
    (b"NONSENSE\r\n\r\n", b"400"),
    (b"POST /load/messages HTTP/1.1\r\nContent-Length: x\r\n\r\n", b"400"),
])
def test_unframeable_requests_are_refused_and_closed(request_bytes: bytes, status: bytes) -> None:
    async def test(port: int) -> None:
        got = await _exchange(port, request_bytes, until_close=True)
        assert got.startswith(b"HTTP/1.1 " + status)
        assert b"Connection: close" in got

    _with_server(test)


@pytest.mark.parametrize(("extra", "version"), [(b"Connection: close\r\n", b"1.1"), (b"", b"1.0")])
def test_close_is_honoured(extra: bytes, version: bytes) -> None:
    async def test(port: int) -> None:
        got = await _exchange(port, _post(b"3", extra=extra, version=version), until_close=True)
        assert got.startswith(b"HTTP/1.1 201") and b"Connection: close" in got
        assert got.endswith(b'{"got":3}')

    _with_server(test)


def test_raw_client_against_raw_server_keeps_connections_alive() -> None:
    async def test(port: int) -> None:
        post = RawPost(f"http://127.0.0.1:{port}/load/messages", b'"c"', limit=4, timeout=5)
        statuses = await asyncio.gather(*(post.post() for _ in range(40)))
        assert statuses == [201] * 40
        assert post._open <= 4 and len(post._idle) == post._open  # reused, never more than the limit
        post.close()

    _with_server(test)
