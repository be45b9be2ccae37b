"""The copy-both framing of the Streaming Replication Protocol, with WAL positions and PostgreSQL's
timestamps (no I/O): :func:`parse_copy_data` turns a CopyData payload of the replication stream
into :class:`XLogData` (``w``) or :class:`Keepalive` (``k``), and :func:`standby_status_update`
builds the client's ``r`` reply. Format: PostgreSQL docs, "Streaming Replication Protocol"; the
pgoutput messages inside XLogData are :mod:`lab.pg.pgoutput`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from struct import Struct
from struct import error as struct_error

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
AWARE_MAX, AWARE_MIN = datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC)
INF, NINF = 2**63 - 1, -(2**63)  # PostgreSQL's infinite timestamps
_UNIX_TO_PG_US = 946_684_800_000_000
_XLOGDATA = Struct(">QQq")  # after 'w': dataStart, walEnd, sendTime
_KEEPALIVE = Struct(">Qq?")  # after 'k': walEnd, sendTime, replyRequested
_STATUS = Struct(">cQQQq?")  # 'r', written, flushed, applied, clock, replyRequested


class DecodeError(ValueError):
    """The bytes are not a message of the replication stream or of pgoutput this lab understands
    (unknown kind, truncated, or malformed): every decoding failure is raised as this, never as a
    ``struct.error``, ``IndexError`` or ``UnicodeDecodeError``."""


def format_lsn(lsn: int) -> str:
    """``0x16B3748`` -> ``'0/16B3748'``, the text form of pg_lsn."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str | bytes) -> int:
    hi, lo = (text.decode() if isinstance(text, bytes | bytearray) else text).split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def pg_timestamp(us: int) -> datetime:
    """A PostgreSQL timestamp (microseconds since 2000-01-01 UTC) as an aware UTC datetime."""
    if us == INF:
        return AWARE_MAX
    if us == NINF:
        return AWARE_MIN
    return PG_EPOCH + timedelta(microseconds=us)


def pg_now() -> int:
    """Now, in PostgreSQL microseconds since 2000-01-01 UTC."""
    return time.time_ns() // 1000 - _UNIX_TO_PG_US


@dataclass(slots=True)
class XLogData:
    """One ``w`` message: a chunk of WAL (for pgoutput: exactly one logical message)."""

    data_start: int
    wal_end: int
    send_time_us: int
    payload: bytes

    @property
    def send_time(self) -> datetime:
        return pg_timestamp(self.send_time_us)


@dataclass(slots=True)
class Keepalive:
    """One ``k`` message (primary keepalive)."""

    wal_end: int
    send_time_us: int
    reply_requested: bool


def parse_copy_data(data: bytes | memoryview) -> XLogData | Keepalive:
    """Split one CopyData payload of the replication stream into its frame."""
    if not data:
        raise DecodeError("empty replication stream message")
    kind = data[0]
    try:
        if kind == 0x77:  # 'w'
            start, end, sent = _XLOGDATA.unpack_from(data, 1)
            return XLogData(start, end, sent, bytes(data[25:]))
        if kind == 0x6B:  # 'k'
            return Keepalive(*_KEEPALIVE.unpack_from(data, 1))
    except struct_error:
        raise DecodeError(f"truncated replication stream message {chr(kind)!r} ({len(data)} bytes)") from None
    raise DecodeError(f"unknown replication stream message {chr(kind)!r}")


def standby_status_update(
    written: int, flushed: int, applied: int, *, now_us: int | None = None, reply: bool = False
) -> bytes:
    """The ``r`` message: positions the client has written, flushed and applied."""
    now = pg_now() if now_us is None else now_us
    return _STATUS.pack(b"r", written, flushed, applied, now, reply)
