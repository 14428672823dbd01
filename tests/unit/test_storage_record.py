"""storage.record: framing round trips and torn/corrupt tail detection."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pigeon.storage import record
from pigeon.storage.record import HEADER_BYTES, Broken
from pigeon.storage.records import RecordType

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX = 1 << 20

rtypes = st.integers(min_value=0, max_value=255)
payloads = st.binary(max_size=300)
records = st.lists(st.tuples(rtypes, payloads), min_size=1, max_size=12)


def _layout(recs):
    """The encoded buffer and (start, end) of each record."""
    buf = b""
    spans = []
    for t, p in recs:
        r = record.encode(t, p)
        spans.append((len(buf), len(buf) + len(r)))
        buf += r
    return buf, spans


def _scan_all(buf, max_bytes=MAX):
    gen = record.scan(buf, max_bytes)
    out = []
    while True:
        try:
            pos, t, p = next(gen)
        except StopIteration as stop:
            return out, stop.value
        out.append((pos, t, bytes(p)))


def test_header_layout_is_len_crc_type_little_endian():
    r = record.encode(RecordType.ACK, b"xyz")
    assert HEADER_BYTES == 9
    length, crc = struct.unpack_from("<II", r, 0)
    assert length == 4  # type byte + payload
    assert crc == crc32c.crc32c(bytes([RecordType.ACK]) + b"xyz")
    assert r[8] == RecordType.ACK and r[9:] == b"xyz"
    assert len(r) == HEADER_BYTES + 3


@SETTINGS
@given(rtypes, payloads)
def test_encode_decode_round_trip(t, p):
    r = record.encode(t, p)
    got_t, got_p, nxt = record.decode_at(r, 0, MAX)
    assert got_t == t
    assert bytes(got_p) == p
    assert nxt == len(r)


@SETTINGS
@given(rtypes, st.lists(payloads, max_size=6), st.binary(max_size=20))
def test_encode_parts_equals_encode_of_join(t, parts, prefix):
    assert record.encode_parts(t, parts) == record.encode(t, b"".join(parts))
    # decode_at at a non-zero position
    buf = prefix + record.encode_parts(t, parts)
    got_t, got_p, nxt = record.decode_at(buf, len(prefix), MAX)
    assert (got_t, bytes(got_p), nxt) == (t, b"".join(parts), len(buf))


@SETTINGS
@given(records)
def test_scan_yields_every_record_of_a_clean_buffer(recs):
    buf, spans = _layout(recs)
    out, (end, reason) = _scan_all(buf)
    assert reason is None
    assert end == len(buf)
    assert out == [(s, t, p) for (s, _), (t, p) in zip(spans, recs)]


def _expect_prefix(out, recs, spans, k):
    """`out` is exactly the first k records as written."""
    assert len(out) == k
    assert out == [(spans[i][0], recs[i][0], recs[i][1]) for i in range(k)]


@SETTINGS
@given(records, st.data())
def test_bit_flip_stops_scan_at_the_damaged_record(recs, data):
    buf, spans = _layout(recs)
    bit = data.draw(st.integers(min_value=0, max_value=len(buf) * 8 - 1), label="bit")
    damaged = bytearray(buf)
    damaged[bit // 8] ^= 1 << (bit % 8)
    k = next(i for i, (s, e) in enumerate(spans) if s <= bit // 8 < e)
    out, (end, reason) = _scan_all(bytes(damaged))
    _expect_prefix(out, recs, spans, k)
    assert end == spans[k][0]
    assert reason is not None


@SETTINGS
@given(records, st.data())
def test_truncation_yields_only_complete_records(recs, data):
    buf, spans = _layout(recs)
    cut = data.draw(st.integers(min_value=0, max_value=len(buf) - 1), label="cut")
    out, (end, reason) = _scan_all(buf[:cut])
    k = sum(1 for _, e in spans if e <= cut)
    _expect_prefix(out, recs, spans, k)
    assert end == (spans[k - 1][1] if k else 0)
    on_boundary = cut == end
    assert (reason is None) == on_boundary


@SETTINGS
@given(records, st.binary(min_size=1, max_size=64))
def test_appended_garbage_is_not_a_record(recs, garbage):
    buf, spans = _layout(recs)
    # garbage that happens to be a valid record is a record, not garbage
    try:
        record.decode_at(garbage, 0, MAX)
        assume(False)
    except Broken:
        pass
    assume(garbage.strip(b"\0"))  # (only zeros: space reserved for records, below)
    out, (end, reason) = _scan_all(buf + garbage)
    _expect_prefix(out, recs, spans, len(recs))
    assert end == len(buf)
    assert reason is not None


@SETTINGS
@given(records, st.integers(min_value=1, max_value=1 << 16))
def test_zeros_after_the_records_end_them_cleanly(recs, zeros):
    """A journal segment is reserved ahead of its writes: zeros after the last record are not a broken one."""
    buf, spans = _layout(recs)
    out, (end, reason) = _scan_all(buf + bytes(zeros))
    _expect_prefix(out, recs, spans, len(recs))
    assert (end, reason) == (len(buf), None)
    out, (end, reason) = _scan_all(buf + bytes(zeros) + b"\x01")
    assert end == len(buf) and reason is not None, "a byte after the zeros: a broken record"


@SETTINGS
@given(records, st.data())
def test_damage_in_the_middle_hides_everything_after_it(recs, data):
    """Even intact records after the damage are never yielded: the log is a prefix."""
    assume(len(recs) >= 2)
    buf, spans = _layout(recs)
    k = data.draw(st.integers(min_value=0, max_value=len(recs) - 2), label="k")
    s, e = spans[k]
    off = data.draw(st.integers(min_value=s, max_value=e - 1), label="off")
    damaged = bytearray(buf)
    damaged[off] ^= 0xFF
    out, (end, reason) = _scan_all(bytes(damaged))
    _expect_prefix(out, recs, spans, k)
    assert end == s and reason is not None
    assert all(pos < s for pos, _, _ in out)


def test_decode_at_reasons():
    good = record.encode(1, b"hello")
    with pytest.raises(Broken) as e:
        record.decode_at(good[:8], 0, MAX)
    assert e.value.reason == "short header"
    with pytest.raises(Broken) as e:
        record.decode_at(good[:-1], 0, MAX)
    assert e.value.reason == "short record"
    zero_len = struct.pack("<II", 0, 0) + b"\x01"
    with pytest.raises(Broken) as e:
        record.decode_at(zero_len, 0, MAX)
    assert e.value.reason.startswith("bad length")
    bad_crc = bytearray(good)
    bad_crc[4] ^= 1
    with pytest.raises(Broken) as e:
        record.decode_at(bytes(bad_crc), 0, MAX)
    assert e.value.reason == "crc mismatch"


def test_record_longer_than_the_limit_is_broken():
    r = record.encode(1, b"x" * 100)
    with pytest.raises(Broken) as e:
        record.decode_at(r, 0, 100)  # length is 101 (type + payload)
    assert e.value.reason.startswith("bad length")
    t, p, _ = record.decode_at(r, 0, 101)
    assert t == 1 and bytes(p) == b"x" * 100
    out, (end, reason) = _scan_all(record.encode(2, b"ok") + r, max_bytes=100)
    assert [(t, p) for _, t, p in out] == [(2, b"ok")]
    assert end == HEADER_BYTES + 2 and reason.startswith("bad length")


def test_scan_of_empty_buffer_and_memoryview():
    out, (end, reason) = _scan_all(b"")
    assert out == [] and end == 0 and reason is None
    buf = record.encode(3, b"a") + record.encode(4, b"bc")
    out, (end, reason) = _scan_all(memoryview(buf))
    assert [(t, p) for _, t, p in out] == [(3, b"a"), (4, b"bc")]
    assert end == len(buf) and reason is None
