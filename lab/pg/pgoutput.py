"""Decode the pgoutput logical-replication stream (protocol versions 1-4).

Two layers, no I/O:

* the copy-both framing of the Streaming Replication Protocol: :func:`parse_copy_data` turns
  a CopyData payload into :class:`XLogData` (``w``) or :class:`Keepalive` (``k``), and
  :func:`standby_status_update` builds the client's ``r`` reply;
* the pgoutput messages inside XLogData: :class:`Decoder` keeps the two pieces of state the
  protocol needs (Relation messages by OID, and whether we are inside a Stream Start/Stop
  block, where every change carries its xid) and returns one small ``__slots__`` object per
  message.

Tuple values are decoded by the column type OIDs of the Relation message, for both the text
(``t``) and the binary (``b``) column kinds, to the same Python values: int2/4/8 and oid ->
int, bool, float4/8, text-like -> str, bytea -> bytes, uuid, date, timestamp, timestamptz ->
aware UTC datetime (binary: int64 microseconds since 2000-01-01), pg_lsn -> int. Any other
type stays ``str`` (text) or ``bytes`` (binary). NULL is ``None`` and an unchanged TOASTed
value is :data:`UNCHANGED`. A change's row is a plain tuple in Relation column order
(``insert.new``); ``insert["id"]`` looks a column up by name through ``relation.index``, the
"column names are the contract" of the reference study. Transaction timestamps are kept as raw
microseconds (``*_us``, with datetime properties), so the per-row path builds nothing nobody reads.

Formats: PostgreSQL docs, "Streaming Replication Protocol" and "Logical Replication Message
Formats". Stream Abort carries abort LSN and time only with ``streaming 'parallel'`` (v4);
the decoder tells by the message length.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from struct import Struct
from struct import error as struct_error

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_PG_EPOCH_NAIVE = datetime(2000, 1, 1)  # noqa: DTZ001 - for timestamp without time zone
_NAIVE_MAX, _NAIVE_MIN = datetime.max, datetime.min  # noqa: DTZ901 - same
_AWARE_MAX, _AWARE_MIN = _NAIVE_MAX.replace(tzinfo=UTC), _NAIVE_MIN.replace(tzinfo=UTC)
_PG_EPOCH_DATE = date(2000, 1, 1)
_UNIX_TO_PG_US = 946_684_800_000_000
_INF, _NINF = 2**63 - 1, -(2**63)
_DATE_INF, _DATE_NINF = 2**31 - 1, -(2**31)

_I16, _I32, _U32, _I64, _U64, _F32, _F64 = (
    Struct(f) for f in (">h", ">i", ">I", ">q", ">Q", ">f", ">d")
)
_XLOGDATA = Struct(">QQq")  # after 'w': dataStart, walEnd, sendTime
_KEEPALIVE = Struct(">Qq?")  # after 'k': walEnd, sendTime, replyRequested
_STATUS = Struct(">cQQQq?")  # 'r', written, flushed, applied, clock, replyRequested
_BEGIN = Struct(">QqI")
_COMMIT = Struct(">BQQq")
_PREPARE = Struct(">BQQqI")  # Prepare, Commit Prepared, Stream Prepare (flags first)
_BEGIN_PREPARE = Struct(">QQqI")
_ROLLBACK_PREPARED = Struct(">BQQqqI")
_STREAM_COMMIT = Struct(">IBQQq")
_STREAM_ABORT = Struct(">II")
_STREAM_ABORT_PARALLEL = Struct(">IIQq")
_MESSAGE = Struct(">BQ")
_XID_OID = Struct(">II")
_REL_COLUMN = Struct(">Ii")  # type oid, type modifier


class DecodeError(ValueError):
    """The bytes are not a pgoutput message this decoder understands (unknown kind, truncated,
    or malformed): every decoding failure is raised as this, never as a ``struct.error``,
    ``IndexError`` or ``UnicodeDecodeError``."""


class _Unchanged:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()
"""Value of a TOASTed column the change did not modify (tuple column kind ``u``)."""


def protocol_version(server_version_num: int) -> int:
    """The newest pgoutput ``proto_version`` a server supports: 4 on 16+, 3 on 15, 2 on 14."""
    if server_version_num >= 160000:
        return 4
    if server_version_num >= 150000:
        return 3
    return 2 if server_version_num >= 140000 else 1


def format_lsn(lsn: int) -> str:
    """``0x16B3748`` -> ``'0/16B3748'``, the text form of pg_lsn."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str | bytes) -> int:
    hi, lo = (text.decode() if isinstance(text, bytes | bytearray) else text).split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def pg_timestamp(us: int) -> datetime:
    """A PostgreSQL timestamp (microseconds since 2000-01-01 UTC) as an aware UTC datetime."""
    if us == _INF:
        return _AWARE_MAX
    if us == _NINF:
        return _AWARE_MIN
    return PG_EPOCH + timedelta(microseconds=us)


def pg_now() -> int:
    """Now, in PostgreSQL microseconds since 2000-01-01 UTC."""
    return time.time_ns() // 1000 - _UNIX_TO_PG_US


# --- copy-both framing ---------------------------------------------------------------------


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


# --- column values -------------------------------------------------------------------------


def _utf8(b: bytes) -> str:
    return b.decode()


def _bin_timestamptz(b: bytes) -> datetime:
    us = _I64.unpack(b)[0]
    if us in (_INF, _NINF):
        return pg_timestamp(us)
    return PG_EPOCH + timedelta(microseconds=us)


def _bin_timestamp(b: bytes) -> datetime:
    us = _I64.unpack(b)[0]
    if us in (_INF, _NINF):
        return _NAIVE_MAX if us > 0 else _NAIVE_MIN
    return _PG_EPOCH_NAIVE + timedelta(microseconds=us)


def _bin_date(b: bytes) -> date:
    days = _I32.unpack(b)[0]
    if days in (_DATE_INF, _DATE_NINF):
        return date.max if days > 0 else date.min
    return _PG_EPOCH_DATE + timedelta(days=days)


def _text_datetime(b: bytes) -> datetime | str:
    s = b.decode()
    if s in ("infinity", "-infinity"):
        return _AWARE_MAX if s[0] == "i" else _AWARE_MIN
    try:
        return datetime.fromisoformat(s).astimezone(UTC)
    except ValueError:  # a non-ISO DateStyle, or a BC date
        return s


def _text_timestamp(b: bytes) -> datetime | str:
    s = b.decode()
    if s in ("infinity", "-infinity"):
        return _NAIVE_MAX if s[0] == "i" else _NAIVE_MIN
    try:
        return datetime.fromisoformat(s)
    except ValueError:
        return s


def _text_date(b: bytes) -> date | str:
    s = b.decode()
    if s in ("infinity", "-infinity"):
        return date.max if s[0] == "i" else date.min
    try:
        return date.fromisoformat(s)
    except ValueError:
        return s


def _text_bytea(b: bytes) -> bytes:
    return bytes.fromhex(b[2:].decode()) if b[:2] == b"\\x" else b


_TEXTLIKE = (25, 1043, 1042, 19, 18, 114, 142)  # text varchar bpchar name char json xml
Value = Callable[[bytes], object]
BINARY_DECODERS: dict[int, Value] = {
    16: lambda b: b != b"\x00",
    20: lambda b: _I64.unpack(b)[0],
    21: lambda b: _I16.unpack(b)[0],
    23: lambda b: _I32.unpack(b)[0],
    26: lambda b: _U32.unpack(b)[0],
    700: lambda b: _F32.unpack(b)[0],
    701: lambda b: _F64.unpack(b)[0],
    17: bytes,
    2950: lambda b: uuid.UUID(bytes=b),
    1082: _bin_date,
    1114: _bin_timestamp,
    1184: _bin_timestamptz,
    3220: lambda b: _U64.unpack(b)[0],
    3802: lambda b: b[1:].decode(),  # jsonb: version byte, then the text
    **dict.fromkeys(_TEXTLIKE, _utf8),
}
"""Binary (``b``) value decoders by type OID; add entries to support more types."""

TEXT_DECODERS: dict[int, Value] = {
    16: lambda b: b == b"t",
    **dict.fromkeys((20, 21, 23, 26), int),
    **dict.fromkeys((700, 701), float),
    17: _text_bytea,
    2950: lambda b: uuid.UUID(b.decode()),
    1082: _text_date,
    1114: _text_timestamp,
    1184: _text_datetime,
    3220: parse_lsn,
    3802: _utf8,
    **dict.fromkeys(_TEXTLIKE, _utf8),
}
"""Text (``t``) value decoders by type OID; unknown types decode to ``str``."""


# --- pgoutput messages ---------------------------------------------------------------------


@dataclass(slots=True)
class Column:
    flags: int  # 1: part of the replica identity key
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(slots=True, eq=False)
class Relation:
    """``R``: a table's identity and columns; tuples of later changes follow this order."""

    oid: int
    namespace: str  # "" means pg_catalog
    name: str
    replica_identity: str  # d(efault) n(othing) f(ull) i(ndex)
    columns: tuple[Column, ...]
    xid: int | None = None
    index: dict[str, int] = field(init=False, repr=False)  # column name -> position
    decoders: tuple[tuple[Value, Value], ...] = field(init=False, repr=False)  # (binary, text)

    def __post_init__(self) -> None:
        self.index = {c.name: i for i, c in enumerate(self.columns)}
        self.decoders = tuple(
            (BINARY_DECODERS.get(c.type_oid, bytes), TEXT_DECODERS.get(c.type_oid, _utf8))
            for c in self.columns
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


Row = tuple[object, ...]


@dataclass(slots=True)
class Begin:
    final_lsn: int
    commit_time_us: int
    xid: int

    @property
    def commit_time(self) -> datetime:
        return pg_timestamp(self.commit_time_us)


@dataclass(slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int

    @property
    def commit_time(self) -> datetime:
        return pg_timestamp(self.commit_time_us)


@dataclass(slots=True)
class Origin:
    origin_lsn: int
    name: str


@dataclass(slots=True)
class Type:
    oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(slots=True)
class Insert:
    relation: Relation
    new: Row
    xid: int | None = None

    def __getitem__(self, column: str) -> object:
        return self.new[self.relation.index[column]]

    def as_dict(self) -> dict[str, object]:
        return dict(zip(self.relation.names, self.new, strict=True))


@dataclass(slots=True)
class Update:
    relation: Relation
    new: Row
    old: Row | None = None  # old key (old_kind "K") or whole old row ("O": REPLICA IDENTITY FULL)
    old_kind: str | None = None
    xid: int | None = None

    def __getitem__(self, column: str) -> object:
        return self.new[self.relation.index[column]]


@dataclass(slots=True)
class Delete:
    relation: Relation
    old: Row
    old_kind: str  # "K": key columns only, the rest None; "O": the whole old row
    xid: int | None = None

    def __getitem__(self, column: str) -> object:
        return self.old[self.relation.index[column]]


@dataclass(slots=True)
class Truncate:
    relations: tuple[Relation, ...]
    options: int  # 1: CASCADE, 2: RESTART IDENTITY
    xid: int | None = None

    @property
    def cascade(self) -> bool:
        return bool(self.options & 1)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & 2)


@dataclass(slots=True)
class LogicalMessage:
    """``M``: a pg_logical_emit_message() (needs the ``messages 'true'`` option)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(slots=True)
class StreamStop:
    pass


@dataclass(slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(slots=True)
class StreamAbort:
    xid: int
    subxid: int  # == xid when the whole transaction aborted
    abort_lsn: int | None = None  # only with streaming 'parallel' (protocol 4)
    abort_time_us: int | None = None


@dataclass(slots=True)
class BeginPrepare:
    prepare_lsn: int
    end_lsn: int
    prepare_time_us: int
    xid: int
    gid: str


@dataclass(slots=True)
class Prepare:
    """``P`` (Prepare) and, with ``stream=True``, ``p`` (Stream Prepare)."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time_us: int
    xid: int
    gid: str
    stream: bool = False


@dataclass(slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int
    xid: int
    gid: str


@dataclass(slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time_us: int
    rollback_time_us: int
    xid: int
    gid: str


Message = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate
    | LogicalMessage | StreamStart | StreamStop | StreamCommit | StreamAbort
    | BeginPrepare | Prepare | CommitPrepared | RollbackPrepared
)  # fmt: skip


def _cstring(buf: bytes, off: int) -> tuple[str, int]:
    end = buf.index(0, off)
    return buf[off:end].decode(), end + 1


class Decoder:
    """Stateful pgoutput decoder for one replication stream.

    ``decode(payload)`` takes the payload of one XLogData message and returns one message
    object. It remembers Relation messages (changes refer to tables by OID) and whether the
    stream is between Stream Start and Stream Stop, where changes carry their xid.
    """

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self.in_stream = False
        self._dispatch: dict[int, Callable[[bytes], Message]] = {
            ord(k): f
            for k, f in (
                ("B", self._begin), ("C", self._commit), ("O", self._origin),
                ("R", self._relation), ("Y", self._type), ("I", self._insert),
                ("U", self._update), ("D", self._delete), ("T", self._truncate),
                ("M", self._message), ("S", self._stream_start), ("E", self._stream_stop),
                ("c", self._stream_commit), ("A", self._stream_abort),
                ("b", self._begin_prepare), ("P", self._prepare), ("p", self._stream_prepare),
                ("K", self._commit_prepared), ("r", self._rollback_prepared),
            )
        }  # fmt: skip

    def decode(self, payload: bytes) -> Message:
        try:
            handler = self._dispatch[payload[0]]
        except (KeyError, IndexError):
            raise DecodeError(f"unknown pgoutput message {bytes(payload[:1])!r}") from None
        try:  # free unless it raises (zero-cost exceptions)
            return handler(payload)
        except DecodeError:
            raise
        except (struct_error, IndexError, ValueError, UnicodeDecodeError, OverflowError) as exc:
            raise DecodeError(
                f"truncated or malformed pgoutput {chr(payload[0])!r} message ({len(payload)} bytes): {exc}"
            ) from None

    # -- transaction control
    def _begin(self, buf: bytes) -> Begin:
        return Begin(*_BEGIN.unpack_from(buf, 1))

    def _commit(self, buf: bytes) -> Commit:
        return Commit(*_COMMIT.unpack_from(buf, 1))

    def _origin(self, buf: bytes) -> Origin:
        return Origin(_U64.unpack_from(buf, 1)[0], _cstring(buf, 9)[0])

    def _stream_start(self, buf: bytes) -> StreamStart:
        self.in_stream = True
        return StreamStart(_U32.unpack_from(buf, 1)[0], buf[5] == 1)

    def _stream_stop(self, buf: bytes) -> StreamStop:
        self.in_stream = False
        return StreamStop()

    def _stream_commit(self, buf: bytes) -> StreamCommit:
        return StreamCommit(*_STREAM_COMMIT.unpack_from(buf, 1))

    def _stream_abort(self, buf: bytes) -> StreamAbort:
        if len(buf) >= 1 + _STREAM_ABORT_PARALLEL.size:
            return StreamAbort(*_STREAM_ABORT_PARALLEL.unpack_from(buf, 1))
        return StreamAbort(*_STREAM_ABORT.unpack_from(buf, 1))

    def _begin_prepare(self, buf: bytes) -> BeginPrepare:
        lsn, end, at, xid = _BEGIN_PREPARE.unpack_from(buf, 1)
        return BeginPrepare(lsn, end, at, xid, _cstring(buf, 29)[0])

    def _prepare(self, buf: bytes, stream: bool = False) -> Prepare:
        flags, lsn, end, at, xid = _PREPARE.unpack_from(buf, 1)
        return Prepare(flags, lsn, end, at, xid, _cstring(buf, 30)[0], stream)

    def _stream_prepare(self, buf: bytes) -> Prepare:
        return self._prepare(buf, True)

    def _commit_prepared(self, buf: bytes) -> CommitPrepared:
        flags, lsn, end, at, xid = _PREPARE.unpack_from(buf, 1)
        return CommitPrepared(flags, lsn, end, at, xid, _cstring(buf, 30)[0])

    def _rollback_prepared(self, buf: bytes) -> RollbackPrepared:
        flags, prepare_end, end, prepared_at, at, xid = _ROLLBACK_PREPARED.unpack_from(buf, 1)
        return RollbackPrepared(flags, prepare_end, end, prepared_at, at, xid, _cstring(buf, 38)[0])

    # -- catalog
    def _xid(self, buf: bytes) -> tuple[int | None, int]:
        return (_U32.unpack_from(buf, 1)[0], 5) if self.in_stream else (None, 1)

    def _relation(self, buf: bytes) -> Relation:
        xid, off = self._xid(buf)
        oid = _U32.unpack_from(buf, off)[0]
        namespace, off = _cstring(buf, off + 4)
        name, off = _cstring(buf, off)
        identity, ncols = chr(buf[off]), _I16.unpack_from(buf, off + 1)[0]
        off += 3
        columns = []
        for _ in range(ncols):
            flags = buf[off]
            cname, off = _cstring(buf, off + 1)
            type_oid, typmod = _REL_COLUMN.unpack_from(buf, off)
            off += 8
            columns.append(Column(flags, cname, type_oid, typmod))
        rel = Relation(oid, namespace, name, identity, tuple(columns), xid)
        self.relations[oid] = rel
        return rel

    def _type(self, buf: bytes) -> Type:
        xid, off = self._xid(buf)
        oid = _U32.unpack_from(buf, off)[0]
        namespace, off = _cstring(buf, off + 4)
        return Type(oid, namespace, _cstring(buf, off)[0], xid)

    # -- changes
    def _rel(self, oid: int) -> Relation:
        try:
            return self.relations[oid]
        except KeyError:
            raise DecodeError(f"change for relation {oid} before its Relation message") from None

    def _insert(self, buf: bytes) -> Insert:  # the hot path: keep it flat
        if self.in_stream:
            xid, oid = _XID_OID.unpack_from(buf, 1)
            off = 10
        else:
            xid, oid, off = None, _U32.unpack_from(buf, 1)[0], 6
        rel = self.relations.get(oid) or self._rel(oid)
        return Insert(rel, _tuple(buf, off, rel)[0], xid)  # off: after the oid and 'N'

    def _update(self, buf: bytes) -> Update:
        xid, off = self._xid(buf)
        rel = self._rel(_U32.unpack_from(buf, off)[0])
        kind = buf[off + 4]
        old = old_kind = None
        off += 5
        if kind != 0x4E:  # 'K' or 'O' before 'N'
            old, off = _tuple(buf, off, rel)
            old_kind = chr(kind)
            off += 1
        return Update(rel, _tuple(buf, off, rel)[0], old, old_kind, xid)

    def _delete(self, buf: bytes) -> Delete:
        xid, off = self._xid(buf)
        rel = self._rel(_U32.unpack_from(buf, off)[0])
        return Delete(rel, _tuple(buf, off + 5, rel)[0], chr(buf[off + 4]), xid)

    def _truncate(self, buf: bytes) -> Truncate:
        xid, off = self._xid(buf)
        n = _U32.unpack_from(buf, off)[0]
        options = buf[off + 4]
        oids = Struct(f">{n}I").unpack_from(buf, off + 5)
        return Truncate(tuple(self._rel(oid) for oid in oids), options, xid)

    def _message(self, buf: bytes) -> LogicalMessage:
        xid, off = self._xid(buf)
        flags, lsn = _MESSAGE.unpack_from(buf, off)
        prefix, off = _cstring(buf, off + 9)
        size = _U32.unpack_from(buf, off)[0]
        return LogicalMessage(bool(flags & 1), lsn, prefix, buf[off + 4 : off + 4 + size], xid)


def commit_end_lsn(payload: bytes) -> int:
    """The end LSN of a Commit (``C``) message, without building a :class:`Commit`."""
    return _COMMIT.unpack_from(payload, 1)[2]


def _tuple(buf: bytes, off: int, rel: Relation) -> tuple[Row, int]:
    """TupleData at ``off``: the decoded row and the offset after it."""
    decoders = rel.decoders
    if (buf[off] << 8 | buf[off + 1]) != len(decoders):
        raise DecodeError(f"tuple of {rel.name} does not match its Relation message")
    off += 2
    values: list[object] = []
    append = values.append
    unpack_size = _I32.unpack_from
    for binary, text in decoders:
        kind = buf[off]
        if kind == 0x62:  # 'b'
            size = unpack_size(buf, off + 1)[0]
            off += 5
            append(binary(buf[off : off + size]))
            off += size
        elif kind == 0x74:  # 't'
            size = unpack_size(buf, off + 1)[0]
            off += 5
            append(text(buf[off : off + size]))
            off += size
        elif kind == 0x6E:  # 'n'
            append(None)
            off += 1
        elif kind == 0x75:  # 'u'
            append(UNCHANGED)
            off += 1
        else:
            raise DecodeError(f"unknown tuple value kind {chr(kind)!r} in a change of {rel.name}")
    if off > len(buf):  # a slice past the end is silently short: the message was truncated
        raise DecodeError(f"truncated tuple of {rel.name}: needs {off} bytes, has {len(buf)}")
    return tuple(values), off
