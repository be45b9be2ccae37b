"""The few pieces of the Kafka protocol (kafka.apache.org/protocol) the lab speaks itself, without a
client library: framing a request and checking its answer, the flexible versions' encodings
(compact strings and arrays, unsigned varints, tagged fields) and their reader, and the brokers'
readiness probe (:func:`metadata_brokers`). A socket's worth of trouble at most: no librdkafka in
the calling process (an ``AdminClient`` polled while a broker restarted once aborted a whole
process)."""

from __future__ import annotations

import socket
import struct
from typing import Any

NO_TAGS = b"\x00"  # an empty tagged-field section


def frame(api_key: int, version: int, correlation: int, client_id: bytes, body: bytes, *,
          flexible: bool = False) -> bytes:
    """A request with its size: header v1, or v2 for a ``flexible`` version (the same with an empty
    tagged-field section; the client id keeps the old two-byte length either way), then ``body``."""
    message = (struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id
               + (NO_TAGS if flexible else b"") + body)
    return struct.pack(">i", len(message)) + message


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def compact_string(text: str) -> bytes:
    data = text.encode()
    return uvarint(len(data) + 1) + data


def compact_array(items: list[bytes]) -> bytes:
    return uvarint(len(items) + 1) + b"".join(items)


class Reader:
    """Reads the fields of one answer in order."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self) -> str | None:
        size = self.uvarint() - 1
        if size < 0:
            return None
        text = self.data[self.at:self.at + size].decode()
        self.at += size
        return text

    def count(self) -> int:
        return max(0, self.uvarint() - 1)

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.at += self.uvarint()


# A readiness probe in the Kafka protocol (kafka.apache.org/protocol), two requests over one socket:
# ApiVersions v0 (which every broker answers), then Metadata at a version both sides know, asking
# for no topic (an empty list, never null: no topic is listed or auto-created).
API_VERSIONS, METADATA = 18, 3
UNSUPPORTED_VERSION = 35
METADATA_VERSIONS = (4, 8)  # non-flexible versions with allow_auto_topic_creation (Kafka 4 keeps 4+)
PROBE_CLIENT_ID = b"fanout-lab-probe"


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> int:
    """How many brokers the node at ``host:port`` lists in its cluster metadata.

    Raises ``OSError`` (no answer, connection closed) or ``ValueError`` (an answer that is not
    what the protocol says, or no Metadata version in :data:`METADATA_VERSIONS`); never more than
    a socket's worth of trouble for the calling process."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        body = _request(sock, API_VERSIONS, 0, 1, b"")
        error, count = struct.unpack_from(">hi", body)
        if error not in (0, UNSUPPORTED_VERSION):  # the latter still lists what the broker supports
            raise ValueError(f"ApiVersions error {error}")
        keys = {k: (lo, hi) for k, lo, hi in struct.iter_unpack(">hhh", body[6:6 + 6 * count])}
        lo, hi = keys.get(METADATA, (0, -1))
        version = min(hi, METADATA_VERSIONS[1])
        if version < max(lo, METADATA_VERSIONS[0]):
            raise ValueError(f"no common Metadata version: broker {lo}..{hi}, probe {METADATA_VERSIONS}")
        # topics: empty array; allow_auto_topic_creation false; v8: no authorized operations
        request = struct.pack(">i?", 0, False) + (struct.pack(">??", False, False) if version >= 8 else b"")
        body = _request(sock, METADATA, version, 2, request)
        _throttle_ms, brokers = struct.unpack_from(">ii", body)
        return brokers


def _request(sock: socket.socket, api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    """One request (header v1) and its response body (header v0: the correlation id)."""
    sock.sendall(frame(api_key, version, correlation, PROBE_CLIENT_ID, body))
    size = struct.unpack(">i", _recv(sock, 4))[0]
    if not 4 <= size <= 1 << 20:
        raise ValueError(f"Kafka response of {size} bytes")
    response = _recv(sock, size)
    if struct.unpack_from(">i", response)[0] != correlation:
        raise ValueError("Kafka answered another request")
    return response[4:]


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("Kafka closed the connection")
        buf += chunk
    return bytes(buf)
