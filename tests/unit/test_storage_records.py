"""storage.records and storage.checkpoint: every record type and checkpoint image decodes to what was encoded
(through the framing, from bytes and from a memoryview), and a payload that does not decode is Malformed —
never another exception, never a wrong record."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.storage import checkpoint as ck
from pigeon.storage import record, records as R

SETTINGS = settings(max_examples=100, deadline=None)
MAX = 1 << 22

u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
seconds = st.floats(allow_nan=False, allow_infinity=False, width=64)
text = st.text(max_size=12)
blob = st.binary(max_size=64)
nums = st.lists(u64, max_size=30)


@st.composite
def ack_state(draw):
    n = draw(st.integers(0, 4))
    return draw(st.lists(u64, min_size=n, max_size=n)), draw(st.lists(nums, min_size=n, max_size=n))


@st.composite
def publishes(draw):
    count = draw(st.integers(1, 6))
    acts = draw(st.none() | st.lists(i64, min_size=count, max_size=count))
    keys = draw(st.none() | st.lists(text, min_size=count, max_size=count))
    return R.Publish(draw(u32), draw(u16), draw(u64), draw(i64), count, draw(i64), draw(blob), acts, keys)


@st.composite
def delivers(draw):
    n = draw(st.integers(0, 8))
    picked = draw(st.lists(u64, min_size=n, max_size=n))
    versions = draw(st.none() | st.lists(u32, min_size=n, max_size=n))
    keys = draw(st.none() | st.lists(i64, min_size=n, max_size=n))
    dead = draw(st.none() | st.lists(st.tuples(u64, u32), min_size=1, max_size=4))
    return R.Deliver(draw(u32), draw(seconds), picked, versions, keys, dead)


@st.composite
def modacks(draw):
    n = draw(st.integers(0, 8))
    return R.Modack(draw(u32), draw(seconds), draw(u32), draw(st.lists(u64, min_size=n, max_size=n)),
                    draw(st.lists(u32, min_size=n, max_size=n)))


ANY_RECORD = st.one_of(
    publishes(), delivers(), modacks(),
    st.builds(R.Ack, u32, nums), st.builds(R.Kick, u32, nums),
    st.builds(lambda sub, state: R.Seek(sub, *state), u32, ack_state()),
    st.builds(lambda sub, floor, acked, shard: R.Seek(sub, [floor], [acked], shard), u32, u64, nums, u16),
    st.builds(R.Trim, u32, u16, u64), st.builds(R.Park, u32, i64, nums), st.builds(R.Update, u32, u64, blob),
    st.builds(R.Reset, u32, u32),
    st.builds(R.TopicPut, u32, st.integers(0, 2**15 - 1), blob, st.booleans()), st.builds(R.TopicDel, u32), st.builds(R.SubDel, u32),
    st.builds(R.SubPut, u32, u32, blob, st.none() | st.lists(u64, max_size=8)),
    st.builds(R.SnapPut, u32, blob), st.builds(lambda t, c, state: R.SnapPut(t, c, *state), u32, blob, ack_state()),
    st.builds(R.SnapDel, text), st.builds(R.SchemaPut, blob), st.builds(R.SchemaDel, text),
    st.builds(R.SchemaRevDel, text, text), st.builds(R.PolicyPut, text, blob),
)


def _plain(rec: R.Record) -> tuple:
    """A record as comparable values (arrays and memoryviews as lists and bytes)."""
    out = [type(rec).__name__]
    for name in rec.__slots__:
        v = getattr(rec, name)
        if isinstance(v, memoryview):
            v = bytes(v)
        elif v is not None and not isinstance(v, (int, float, str, bytes)):
            v = [list(x) if isinstance(x, (list, tuple)) else x for x in v]
        out.append(v)
    return tuple(out)


@SETTINGS
@given(ANY_RECORD)
def test_every_record_round_trips_through_the_framing(rec):
    framed = record.encode_parts(rec.TYPE, rec.parts())
    rtype, payload, end = record.decode_at(framed, 0, MAX)
    assert end == len(framed) and rtype == rec.TYPE
    assert _plain(R.decode(rtype, payload)) == _plain(rec)
    assert _plain(R.decode(rtype, bytes(payload))) == _plain(rec)


def test_the_catalogue_covers_every_type_once():
    assert sorted(R.CATALOGUE) == sorted(R.RecordType)
    assert {cls.TYPE for cls in R.CATALOGUE.values()} == set(R.RecordType)


@SETTINGS
@given(publishes())
def test_publish_head_and_request_are_read_without_decoding_the_rest(rec):
    payload = b"".join(rec.parts())
    assert R.Publish.head(payload) == (rec.topic, rec.shard, rec.base, rec.publish_ms, rec.count, rec.key)
    assert bytes(R.Publish.request_of(memoryview(payload))) == rec.request


@SETTINGS
@given(ANY_RECORD, st.data())
def test_a_cut_or_padded_payload_is_malformed_or_still_its_type(rec, data):
    """What a bug could write (a CRC-valid payload of the wrong shape) decodes as Malformed, or as a record of
    the same type; it never raises anything else."""
    payload = b"".join(rec.parts())
    if data.draw(st.booleans(), label="cut") and payload:
        payload = payload[:data.draw(st.integers(0, len(payload) - 1), label="at")]
    else:
        payload += data.draw(st.binary(min_size=1, max_size=9), label="extra")
    try:
        got = R.decode(rec.TYPE, payload)
    except R.Malformed:
        return
    assert got.TYPE == rec.TYPE


def test_unknown_type_is_malformed():
    with pytest.raises(R.Malformed):
        R.decode(200, b"")


# --- checkpoint files ----------------------------------------------------------------------------------
@st.composite
def images(draw):
    kind = draw(st.sampled_from(["shard", "schedule", "idempotency", "sub"]))
    if kind == "shard":
        n = draw(st.integers(0, 5))
        arr = st.binary(min_size=8 * n, max_size=8 * n)
        return ck.ShardImage(draw(u32), draw(u16), draw(u64), draw(arr), draw(arr), draw(arr), draw(arr))
    if kind == "schedule":
        secs = draw(st.lists(st.tuples(i64, st.integers(0, 4).map(lambda k: bytes(8 * k))), max_size=4))
        return ck.ScheduleImage(draw(u32), secs)
    if kind == "idempotency":
        return ck.IdempotencyImage(draw(u32), draw(st.lists(st.tuples(text, text, i64), max_size=4)))
    floors, acked = draw(ack_state())
    return ck.SubImage(draw(u32), floors, acked,
                       draw(st.lists(st.tuples(u64, seconds, u32, i64), max_size=4)),
                       draw(st.lists(st.tuples(u64, u32), max_size=4)),
                       draw(st.lists(st.tuples(u64, i64), max_size=4)),
                       draw(st.lists(st.tuples(u64, blob), max_size=4)),
                       draw(st.lists(u32, min_size=len(floors), max_size=len(floors))))


def _image(i) -> tuple:
    return (type(i).__name__,) + tuple(
        [tuple(x) if isinstance(x, (list, tuple)) else x for x in v] if isinstance(v, list) else v
        for v in (getattr(i, n) for n in i.__slots__))


@SETTINGS
@given(u64, u32, st.lists(ANY_RECORD.filter(lambda r: r.META), max_size=5), st.lists(images(), max_size=6))
def test_checkpoint_round_trip(pos, next_uid, meta, imgs):
    buf = b"".join(ck.encode(ck.Header(pos, next_uid), meta, imgs))
    header, got_meta, got_images = ck.decode(buf)
    assert header == ck.Header(pos, next_uid)
    assert [_plain(r) for r in got_meta] == [_plain(r) for r in meta]
    assert [_image(i) for i in got_images] == [_image(i) for i in imgs]


def test_checkpoint_without_its_end_or_with_a_wrong_count_is_broken():
    recs = ck.encode(ck.Header(7, 2), [R.TopicDel(1)], [])
    with pytest.raises(record.Broken, match="incomplete"):
        ck.decode(b"".join(recs[:-1]))
    with pytest.raises(record.Broken, match="count"):
        ck.decode(b"".join(recs[:-1]) + record.encode(ck.END, (5).to_bytes(8, "little")))
