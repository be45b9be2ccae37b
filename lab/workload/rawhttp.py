"""Minimal HTTP/1.1 keep-alive on raw asyncio protocols: the senders' client and the web's insert
listener, each for the one request they exchange.

**Client** (:class:`RawPost`).

The senders send one fixed request (``POST /load/messages`` with a fixed JSON body) and need
only the response status, so the request bytes are built once and a response is parsed only as
far as framing needs (status line, ``Content-Length``, ``Connection: close``). Measured against
aiohttp's client on this machine it costs the senders far less CPU per request (figures in
docs/benchmarks.md, "Harness"). Semantics kept from the aiohttp path: at most ``limit``
connections, opened by the first sends (no warm-up), kept alive, a ``timeout`` per request, no
retries (a failure is raised to the caller, who counts it).

Not a general client: no chunked responses, no redirects, no TLS, no pipelining.

**Server** (:class:`PostServer`): one ``POST`` route. A request is framed by its
``Content-Length`` (chunked bodies are refused with 501), requests on a connection are answered
in order, one at a time, keep-alive unless the client says ``Connection: close`` or speaks
HTTP/1.0; any other method or path gets 405 or 404, a handler's exception 500. The reply carries
``Date``, ``Server``, ``Content-Type`` and ``Content-Length``, as Kestrel's does. Measured
against aiohttp's server on the insert path in docs/benchmarks.md, "Harness".
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from urllib.parse import urlsplit

log = logging.getLogger(__name__)


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


MAX_HEAD = 64 * 1024
REASONS = {200: b"OK", 201: b"Created", 202: b"Accepted", 204: b"No Content", 400: b"Bad Request",
           404: b"Not Found", 405: b"Method Not Allowed", 411: b"Length Required",
           413: b"Payload Too Large", 431: b"Request Header Fields Too Large",
           500: b"Internal Server Error", 501: b"Not Implemented"}
PostHandler = Callable[[bytes], Awaitable[tuple[int, bytes]]]


class _Date:
    """The ``Date`` header line, rebuilt once a second."""

    second, line = -1, b""

    @classmethod
    def get(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second, cls.line = now, b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return cls.line


def response(status: int, body: bytes = b"", *, close: bool = False,
             content_type: bytes = b"application/json") -> bytes:
    """The bytes of one HTTP/1.1 response."""
    head = b"HTTP/1.1 %d %s\r\n%bServer: lab\r\n" % (status, REASONS.get(status, b"Status"), _Date.get())
    if body:
        head += b"Content-Type: %b\r\n" % content_type
    head += b"Content-Length: %d\r\n" % len(body)
    if close:
        head += b"Connection: close\r\n"
    return head + b"\r\n" + body


class _ServerConn(asyncio.Protocol):
    __slots__ = ("buf", "busy", "conns", "handler", "path", "transport")

    def __init__(self, path: bytes, handler: PostHandler, conns: set[_ServerConn]) -> None:
        self.path, self.handler, self.conns = path, handler, conns
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.conns.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        if not self.busy:
            self._next()

    def _refuse(self, status: int) -> None:
        assert self.transport is not None
        self.transport.write(response(status, close=True))
        self.transport.close()
        self.buf = b""

    def _next(self) -> None:
        """Frame the next complete request in the buffer and start its handler (or answer it)."""
        while self.transport is not None and not self.busy:
            buf = self.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._refuse(431)
                return
            first = buf.find(b"\r\n")
            parts = buf[:first].split(b" ")
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                return self._refuse(400)
            method, target, version = parts
            head = buf[first:end].lower()
            if b"\r\ntransfer-encoding:" in head:
                return self._refuse(501)
            length = 0
            i = head.find(b"\r\ncontent-length:")
            if i >= 0:
                j = head.find(b"\r\n", i + 2)
                try:
                    length = int(head[i + 17: j if j > 0 else len(head)])
                except ValueError:
                    return self._refuse(400)
            total = end + 4 + length
            if len(buf) < total:
                if length > MAX_HEAD:
                    self._refuse(413)
                return
            body, self.buf = buf[end + 4:total], buf[total:]
            close = b"\r\nconnection: close" in head or (
                version == b"HTTP/1.0" and b"\r\nconnection: keep-alive" not in head)
            if target != self.path:
                self._reply(404, b"", close)
            elif method != b"POST":
                self._reply(405, b"", close)
            else:
                self.busy = True
                asyncio.get_running_loop().create_task(self._handle(body, close))

    def _reply(self, status: int, body: bytes, close: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(response(status, body, close=close))
        if close:
            self.transport.close()

    async def _handle(self, body: bytes, close: bool) -> None:
        try:
            status, out = await self.handler(body)
        except Exception:
            log.exception("handler failed")
            status, out = 500, b""
        self._reply(status, out, close)
        self.busy = False
        if self.buf:
            self._next()


class PostServer:
    """Serve ``POST path`` with ``handler(body) -> (status, JSON body)`` on ``host:port``."""

    def __init__(self, path: str, handler: PostHandler) -> None:
        self.path, self.handler = path.encode(), handler
        self.server: asyncio.Server | None = None
        self.conns: set[_ServerConn] = set()

    async def start(self, host: str, port: int, *, backlog: int = 1024) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _ServerConn(self.path, self.handler, self.conns),
                                               host, port, backlog=backlog, reuse_address=True)

    async def close(self) -> None:
        """Stop listening and close every connection (a request in flight loses its reply)."""
        if self.server is not None:
            self.server.close()
            for conn in list(self.conns):
                if conn.transport is not None:
                    conn.transport.close()
            await self.server.wait_closed()
