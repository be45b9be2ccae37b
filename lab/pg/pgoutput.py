"""Decode the pgoutput logical-replication stream (protocol versions 1-4).

No I/O. The payload of one XLogData message of the replication stream (its framing:
:mod:`lab.pg.walstream`) is one pgoutput message: :class:`Decoder` keeps the two pieces of state
the protocol needs (Relation messages by OID, and whether we are inside a Stream Start/Stop
block, where every change carries its xid) and returns one small ``__slots__`` object per
message (:mod:`lab.pg.messages`).

Tuple values are decoded by the column type OIDs of the Relation message, for both the text
(``t``) and the binary (``b``) column kinds, to the same Python values: int2/4/8 and oid ->
int, bool, float4/8, text-like -> str, bytea -> bytes, uuid, date, timestamp, timestamptz ->
aware UTC datetime (binary: int64 microseconds since 2000-01-01), pg_lsn -> int. Any other
type stays ``str`` (text) or ``bytes`` (binary). NULL is ``None`` and an unchanged TOASTed
value is :data:`UNCHANGED`. A change's row is a plain tuple in Relation column order
(``insert.new``); ``insert["id"]`` looks a column up by name through ``relation.index``, the
"column names are the contract" of the reference study.

Formats: PostgreSQL docs, "Streaming Replication Protocol" and "Logical Replication Message
Formats". Stream Abort carries abort LSN and time only with ``streaming 'parallel'`` (v4);
the decoder tells by the message length.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from struct import error as struct_error

from lab.pg.messages import (
    UNCHANGED,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    Row,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from lab.pg.walstream import DecodeError

_I16, _U32, _U64 = Struct(">h"), Struct(">I"), Struct(">Q")
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


def protocol_version(server_version_num: int) -> int:
    """The newest pgoutput ``proto_version`` a server supports: 4 on 16+, 3 on 15, 2 on 14."""
    if server_version_num >= 160000:
        return 4
    if server_version_num >= 150000:
        return 3
    return 2 if server_version_num >= 140000 else 1


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
        if off + 4 + size > len(buf):  # a slice past the end is silently short: truncated
            raise DecodeError(f"truncated logical message {prefix!r}: content of {size} bytes, "
                              f"{len(buf) - off - 4} present")
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
    unpack_size = _U32.unpack_from  # unsigned: a corrupt negative size lands past the end (checked below)
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
