"""The Kafka readiness probe (lab.stack.kafka_wire.metadata_brokers): its requests, read by a small
socket server that answers as the Kafka protocol says (kafka.apache.org/protocol); the real
broker answers it on every stack start (tests/integration)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

from lab.stack.kafka_wire import metadata_brokers

Handler = Callable[[int, int, bytes], bytes | None]  # (api_key, version, body) -> response body


def _read(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError
        buf += chunk
    return buf


@pytest.fixture
def server() -> Iterator[Callable[[Handler], int]]:
    socks: list[socket.socket] = []
    seen: list[tuple[int, int, bytes]] = []

    def start(handler: Handler) -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        socks.append(sock)

        def serve() -> None:
            conn, _ = sock.accept()
            with conn:
                while True:
                    try:
                        size = struct.unpack(">i", _read(conn, 4))[0]
                    except ConnectionError:
                        return
                    req = _read(conn, size)
                    key, version, corr, n = struct.unpack_from(">hhih", req)
                    assert req[10:10 + n] == b"fanout-lab-probe"
                    body = req[10 + n:]
                    seen.append((key, version, body))
                    out = handler(key, version, body)
                    if out is None:
                        return  # hang up
                    conn.sendall(struct.pack(">ii", len(out) + 4, corr) + out)

        threading.Thread(target=serve, daemon=True).start()
        return sock.getsockname()[1]

    start.seen = seen  # type: ignore[attr-defined]
    yield start
    for s in socks:
        s.close()


def api_versions(metadata: tuple[int, int]) -> bytes:
    keys = [(0, 3, 11), (3, *metadata), (18, 0, 4)]
    return struct.pack(">hi", 0, len(keys)) + b"".join(struct.pack(">hhh", *k) for k in keys)


def metadata(brokers: int) -> bytes:
    entries = b"".join(struct.pack(">ih9sih", i, 9, b"127.0.0.1", 9092, -1) for i in range(brokers))
    return struct.pack(">ii", 0, brokers) + entries + struct.pack(">hii", -1, 1, 0)


def test_counts_the_brokers_of_a_metadata_answer(server: Callable[[Handler], int]) -> None:
    port = server(lambda key, v, body: api_versions((0, 13)) if key == 18 else metadata(3))
    assert metadata_brokers("127.0.0.1", port) == 3
    (k1, v1, b1), (k2, v2, b2) = server.seen  # type: ignore[attr-defined]
    assert (k1, v1, b1) == (18, 0, b"")
    # Metadata v8: no topics (an empty array, not null: nothing listed or auto-created), no
    # auto-creation, no authorized operations
    assert (k2, v2, b2) == (3, 8, struct.pack(">i???", 0, False, False, False))


def test_uses_the_highest_common_version(server: Callable[[Handler], int]) -> None:
    port = server(lambda key, v, body: api_versions((4, 6)) if key == 18 else metadata(1))
    assert metadata_brokers("127.0.0.1", port) == 1
    assert server.seen[1][:2] == (3, 6) and server.seen[1][2] == struct.pack(">i?", 0, False)  # type: ignore[attr-defined]


def test_a_broker_without_a_common_version_is_not_ready(server: Callable[[Handler], int]) -> None:
    port = server(lambda key, v, body: api_versions((0, 3)))
    with pytest.raises(ValueError, match="no common Metadata version"):
        metadata_brokers("127.0.0.1", port)


def test_a_hang_up_or_no_listener_is_an_oserror(server: Callable[[Handler], int]) -> None:
    port = server(lambda key, v, body: None)
    with pytest.raises(OSError):
        metadata_brokers("127.0.0.1", port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(OSError):
        metadata_brokers("127.0.0.1", free, timeout=0.5)
