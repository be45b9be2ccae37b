"""lab.pg.pgoutput fuzzed: random, truncated and mutated messages raise DecodeError or decode,
nothing else escapes (no struct.error, IndexError, OverflowError, MemoryError, ...).

The seeds are the real PostgreSQL 18 messages of tests/unit/pg/data/pgoutput_capture.json, fed
in stream order so that a change meets the Relation it refers to, in every protocol variant.
"""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.pg.pgoutput import Decoder
from lab.pg.walstream import DecodeError, XLogData, parse_copy_data

CAPTURE = json.loads((Path(__file__).parent / "data" / "pgoutput_capture.json").read_text())
VARIANTS = list(CAPTURE["variants"])
FRAMES = {v: [bytes.fromhex(h) for h in CAPTURE["variants"][v]["copy_data"]] for v in VARIANTS}
KINDS = b"BCORYIUDTMSEcAbPpKr"


def _payloads(variant: str) -> list[bytes]:
    out = []
    for frame in FRAMES[variant]:
        parsed = parse_copy_data(frame)
        if isinstance(parsed, XLogData):
            out.append(bytes(parsed.payload))
    return out


PAYLOADS = {v: _payloads(v) for v in VARIANTS}
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _seen(variant: str) -> Decoder:
    """A decoder that has decoded every real message of the variant, in stream order."""
    dec = Decoder()
    for payload in PAYLOADS[variant]:
        dec.decode(payload)
    return dec


# What the real messages leave in a decoder: its relations (the only state besides ``in_stream``;
# a Relation message replaces its entry, nothing changes one in place). Decoded once per variant,
# not once per truncation or example (that made these tests cost minutes).
RELATIONS = {v: dict(_seen(v).relations) for v in VARIANTS}


def _primed(variant: str) -> Decoder:
    """A fresh decoder that knows every relation of the variant, as one that decoded all its real
    messages does; outside a stream. Each call gets its own copy of the relations."""
    dec = Decoder()
    dec.relations = dict(RELATIONS[variant])
    return dec


def test_a_primed_decoder_is_one_that_decoded_every_real_message() -> None:
    def known(dec: Decoder) -> list[tuple[object, ...]]:
        return [(oid, r.oid, r.namespace, r.name, r.replica_identity, r.columns, r.xid)
                for oid, r in dec.relations.items()]

    for variant in VARIANTS:
        seen, primed = _seen(variant), _primed(variant)
        assert known(primed) == known(seen) and known(primed)
        assert primed.relations is not RELATIONS[variant] and not primed.in_stream


def _decode_only_decode_error(dec: Decoder, payload: bytes) -> None:
    with contextlib.suppress(DecodeError):
        dec.decode(payload)


def _frame_only_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        parse_copy_data(data)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_truncation_of_every_real_message(variant: str) -> None:
    for frame in FRAMES[variant]:
        for n in range(len(frame)):
            _frame_only_decode_error(frame[:n])
    for payload in PAYLOADS[variant]:
        for in_stream in (False, True):
            for n in range(len(payload)):
                dec = _primed(variant)
                dec.in_stream = in_stream
                _decode_only_decode_error(dec, payload[:n])


@FUZZ
@given(variant=st.sampled_from(VARIANTS), kind=st.sampled_from(KINDS), body=st.binary(max_size=200),
       in_stream=st.booleans())
def test_random_bodies_behind_every_message_kind(variant: str, kind: int, body: bytes, in_stream: bool) -> None:
    dec = _primed(variant)
    dec.in_stream = in_stream
    _decode_only_decode_error(dec, bytes([kind]) + body)


@FUZZ
@given(data=st.data(), variant=st.sampled_from(VARIANTS), in_stream=st.booleans())
def test_mutated_real_messages(data: st.DataObject, variant: str, in_stream: bool) -> None:
    payload = bytearray(data.draw(st.sampled_from(PAYLOADS[variant])))
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(payload) - 1))
        payload[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    dec = _primed(variant)
    dec.in_stream = in_stream
    _decode_only_decode_error(dec, bytes(payload[:cut]))


@FUZZ
@given(data=st.binary(max_size=120))
def test_random_replication_frames(data: bytes) -> None:
    _frame_only_decode_error(data)
    _frame_only_decode_error(b"w" + data)
    _frame_only_decode_error(b"k" + data)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_cut_real_message_never_decodes_as_if_whole(variant: str) -> None:
    """A truncated message is an error, never a shorter row, prefix or content. (A Stream Abort
    of protocol 4 cut to protocol 2's length is indistinguishable from one: not checked.)"""
    wrong = []
    streaming = _in_stream_before(variant)
    for i, payload in enumerate(PAYLOADS[variant]):
        if payload[:1] == b"A":
            continue
        for n in range(len(payload)):
            dec = _primed(variant)
            dec.in_stream = streaming[i]
            try:
                dec.decode(payload[:n])
            except DecodeError:
                continue
            wrong.append((chr(payload[0]), n, len(payload)))
    assert not wrong, wrong[:10]


def _in_stream_before(variant: str) -> list[bool]:
    """Whether the stream is inside a Stream Start … Stream Stop before each real message."""
    dec, out = Decoder(), []
    for payload in PAYLOADS[variant]:
        out.append(dec.in_stream)
        dec.decode(payload)
    return out


def test_a_negative_value_size_is_refused() -> None:
    """A negative length would step the reader backwards and decode garbage as a row."""
    dec = _primed("v1-text")
    rel = next(r for r in dec.relations.values() if r.name == "messages")
    body = struct.pack(">I", rel.oid) + b"N" + struct.pack(">H", len(rel.columns))
    values = b"t" + struct.pack(">i", 1) + b"7" + b"t" + struct.pack(">i", -5) + b"n" * (len(rel.columns) - 2)
    with pytest.raises(DecodeError):
        dec.decode(b"I" + body + values)
