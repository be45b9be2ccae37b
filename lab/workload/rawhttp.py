"""A minimal HTTP/1.1 keep-alive client on a raw asyncio protocol, for the senders' one request.

The senders send one fixed request (``POST /load/messages`` with a fixed JSON body) and need
only the response status, so the request bytes are built once and a response is parsed only as
far as framing needs (status line, ``Content-Length``, ``Connection: close``). Measured against
aiohttp's client on this machine it costs the senders far less CPU per request (figures in
docs/benchmarks.md, "Harness"). Semantics kept from the aiohttp path: at most ``limit``
connections, opened by the first sends (no warm-up), kept alive, a ``timeout`` per request, no
retries (a failure is raised to the caller, who counts it).

Not a general client: no chunked responses, no redirects, no TLS, no pipelining.
"""

from __future__ import annotations

import asyncio
import collections
from urllib.parse import urlsplit


class _Conn(asyncio.Protocol):
    __slots__ = ("buf", "closed", "fut", "reusable", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.fut: asyncio.Future[int] | None = None
        self.buf = b""
        self.closed = False
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            self.buf = buf
            return
        head = buf[:end].lower()
        length = 0
        i = head.find(b"\r\ncontent-length:")
        if i >= 0:
            j = head.find(b"\r\n", i + 2)
            length = int(head[i + 17 : j if j > 0 else len(head)])
        total = end + 4 + length
        if len(buf) < total:
            self.buf = buf
            return
        self.buf = buf[total:]
        if b"\r\nconnection: close" in head:
            self.reusable = False
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_result(int(buf[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_exception(exc or ConnectionResetError("the server closed the connection"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(fut: asyncio.Future[int], timeout: float) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError(f"no response within {timeout:g} s"))


class RawPost:
    """``await post()`` sends the fixed request and returns the response status."""

    def __init__(self, url: str, body: bytes, *, limit: int, timeout: float,
                 content_type: str = "application/json") -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.request = (
            f"POST {u.path or '/'} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.limit, self.timeout = limit, timeout
        self._idle: list[_Conn] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def _acquire(self) -> _Conn:
        while True:
            if self._idle:
                return self._idle.pop()
            if self._open < self.limit:
                self._open += 1
                try:
                    loop = asyncio.get_running_loop()
                    _, conn = await loop.create_connection(_Conn, self.host, self.port)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
                return conn
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _wake(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def _release(self, conn: _Conn) -> None:
        if conn.closed or not conn.reusable:
            conn.close()
            self._open -= 1
        else:
            self._idle.append(conn)
        self._wake()

    async def post(self) -> int:
        conn = await self._acquire()
        loop = asyncio.get_running_loop()
        conn.fut = fut = loop.create_future()
        timer = loop.call_later(self.timeout, _expire, fut, self.timeout)
        try:
            assert conn.transport is not None
            conn.transport.write(self.request)
            status = await fut
        except BaseException:
            conn.close()  # a failed or timed-out connection is never reused
            raise
        finally:
            timer.cancel()
            self._release(conn)
        return status

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
