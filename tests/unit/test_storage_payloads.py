"""storage.payloads: every WAL and checkpoint payload decodes to what was encoded."""

from __future__ import annotations

from array import array

import pytest
from google.pubsub_v1 import types

from pigeon.core import rawproto
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.broker.topic import ShardIndex
from pigeon.storage import payloads, record
from pigeon.storage.record import RecordType

SETTINGS = settings(max_examples=120, deadline=None)
MAX = 1 << 22

u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _one(buf: bytes):
    """Decode a buffer holding exactly one record; return (type, payload bytes)."""
    t, p, nxt = record.decode_at(buf, 0, MAX)
    assert nxt == len(buf)
    return t, bytes(p)


def _request(msgs: list[bytes]) -> bytes:
    """A PublishRequest whose messages are `msgs` (raw serialized PubsubMessages)."""
    return rawproto.PublishRequestRaw(topic="projects/p/topics/t", messages=msgs).SerializeToString()


_message = st.builds(
    lambda d, a: types.PubsubMessage.pb()(data=d, attributes=a).SerializeToString(),
    st.binary(max_size=200),
    st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=3),
)


@SETTINGS
@given(u32, u16, u64, i64, st.lists(_message, max_size=20))
def test_publish_round_trip(uid, shard, base, ms, msgs):
    t, p = _one(payloads.publish_record(uid, shard, base, ms, len(msgs), _request(msgs)))
    assert t == RecordType.PUBLISH
    assert payloads.publish_head(p) == (uid, shard, base, ms, len(msgs), 0)
    assert payloads.publish_messages(p) == msgs
    # works on a memoryview too (the WAL reader hands out views)
    assert payloads.publish_messages(memoryview(p)) == msgs


@SETTINGS
@given(st.lists(_message, min_size=1, max_size=5), st.integers(-3, 3).filter(bool))
def test_publish_payload_with_wrong_count_is_rejected(msgs, delta):
    _, p = _one(payloads.publish_record(1, 0, 0, 0, max(0, len(msgs) + delta), _request(msgs)))
    if max(0, len(msgs) + delta) == len(msgs):
        return
    with pytest.raises(ValueError):
        payloads.publish_messages(p)


@SETTINGS
@given(u32, st.lists(u64, max_size=100))
def test_ack_round_trip(uid, nums):
    t, p = _one(payloads.ack_record(uid, nums))
    assert t == RecordType.ACK
    got_uid, got = payloads.ack_decode(p)
    assert got_uid == uid
    assert list(got) == nums
    assert isinstance(got, array)


@SETTINGS
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_meta_round_trip(change):
    t, p = _one(payloads.meta_record(change))
    assert t == RecordType.META
    assert payloads.json_decode(p) == change


@SETTINGS
@given(st.integers(0, 2**62), st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_checkpoint_header_round_trip(pos, meta):
    t, p = _one(payloads.checkpoint_header(pos, meta))
    assert t == RecordType.CK_HEADER
    assert payloads.json_decode(p) == {"version": 1, "pos": pos, "meta": meta}


@SETTINGS
@given(u32, u16, u64, st.lists(st.tuples(i64, i64, i64, i64), max_size=30))
def test_checkpoint_shard_round_trip(uid, shard, nxt, rows):
    base = array("q", [r[0] for r in rows]).tobytes()
    pos = array("q", [r[1] for r in rows]).tobytes()
    ms = array("q", [r[2] for r in rows]).tobytes()
    keys = array("q", [r[3] for r in rows]).tobytes()
    t, p = _one(payloads.checkpoint_shard(uid, shard, nxt, base, pos, ms, keys))
    assert t == RecordType.CK_SHARD
    assert payloads.checkpoint_shard_decode(p) == (uid, shard, nxt, base, pos, ms, keys)
    with pytest.raises(ValueError):
        payloads.checkpoint_shard_decode(p + b"\0" * 8)


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 10**9), st.integers(0, 10**12),
                          st.integers(0, 2**62)), max_size=20),
       st.integers(0, 10**6))
def test_shard_index_survives_a_checkpoint_record(batches, start):
    ix = ShardIndex(start)
    for count, pos, ms, key in batches:
        ix.append(count, pos, ms, key)
    t, p = _one(payloads.checkpoint_shard(7, 3, *ix.export()))
    uid, shard, nxt, base, pos, ms, keys = payloads.checkpoint_shard_decode(p)
    assert (uid, shard) == (7, 3)
    back = ShardIndex.restore(nxt, base, pos, ms, keys)
    assert (back.next, list(back.base), list(back.pos), list(back.ms), list(back.keys)) == (
        ix.next, list(ix.base), list(ix.pos), list(ix.ms), list(ix.keys))
    assert back.durable == back.next


@SETTINGS
@given(u32, st.lists(st.tuples(st.integers(0, 2**40), st.lists(st.integers(0, 2**40), max_size=5)), max_size=5))
def test_checkpoint_sub_round_trip(uid, shards):
    floors = [f for f, _ in shards]
    acked = [a for _, a in shards]
    attempts = [[f, len(a)] for f, a in shards]
    t, p = _one(payloads.checkpoint_sub(uid, floors, acked, attempts))
    assert t == RecordType.CK_SUB
    assert payloads.json_decode(p) == {"uid": uid, "floors": floors, "acked": acked, "attempts": attempts}


@SETTINGS
@given(u64)
def test_checkpoint_end_round_trip(n):
    t, p = _one(payloads.checkpoint_end(n))
    assert t == RecordType.CK_END
    assert payloads.checkpoint_end_decode(p) == n


def test_payloads_chain_in_one_scanned_log():
    log = b"".join([
        payloads.meta_record({"op": "topic.put", "uid": 1}),
        payloads.publish_record(1, 0, 0, 1000, 2, _request([b"\n\x01a", b"\n\x02bb"])),
        payloads.ack_record(2, [64, 128]),
    ])
    got = [(t, bytes(p)) for _, t, p in record.scan(log, MAX)]
    assert [t for t, _ in got] == [RecordType.META, RecordType.PUBLISH, RecordType.ACK]
    assert payloads.json_decode(got[0][1])["op"] == "topic.put"
    assert payloads.publish_messages(got[1][1]) == [b"\n\x01a", b"\n\x02bb"]
    assert list(payloads.ack_decode(got[2][1])[1]) == [64, 128]
