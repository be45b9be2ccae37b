"""pgoutput's messages, one small ``__slots__`` object each (:class:`lab.pg.pgoutput.Decoder`
builds them), and the column values of their tuples, decoded by the column type OIDs of the
Relation message (:data:`BINARY_DECODERS`, :data:`TEXT_DECODERS`; the module docstring of
:mod:`lab.pg.pgoutput` lists the types). Transaction timestamps are kept as raw microseconds
(``*_us``, with datetime properties), so the per-row path builds nothing nobody reads.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from struct import Struct

from lab.pg.walstream import AWARE_MAX, AWARE_MIN, INF, NINF, PG_EPOCH, parse_lsn, pg_timestamp

_PG_EPOCH_NAIVE = datetime(2000, 1, 1)  # noqa: DTZ001 - for timestamp without time zone
_NAIVE_MAX, _NAIVE_MIN = datetime.max, datetime.min  # noqa: DTZ901 - same
_PG_EPOCH_DATE = date(2000, 1, 1)
_DATE_INF, _DATE_NINF = 2**31 - 1, -(2**31)
_I16, _I32, _U32, _I64, _U64, _F32, _F64 = (
    Struct(f) for f in (">h", ">i", ">I", ">q", ">Q", ">f", ">d")
)


class _Unchanged:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()
"""Value of a TOASTed column the change did not modify (tuple column kind ``u``)."""


# --- column values ---------------------------------------------------------------------------


def _utf8(b: bytes) -> str:
    return b.decode()


def _bin_timestamptz(b: bytes) -> datetime:
    us = _I64.unpack(b)[0]
    if us in (INF, NINF):
        return pg_timestamp(us)
    return PG_EPOCH + timedelta(microseconds=us)


def _bin_timestamp(b: bytes) -> datetime:
    us = _I64.unpack(b)[0]
    if us in (INF, NINF):
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
        return AWARE_MAX if s[0] == "i" else AWARE_MIN
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
