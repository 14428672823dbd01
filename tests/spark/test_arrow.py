"""pigeon.spark.arrow: the vectorized decoders give exactly what a protobuf parse gives, for data-only
messages, messages with attributes, ordering keys and fields the reader skips, and varints of every
length; bytes the walker cannot follow fall back to the parse."""

from __future__ import annotations

import random
from array import array

import pytest
from google.pubsub_v1 import types

from pigeon.api.proto import pigeon_ranges_pb2 as pb
from pigeon.spark import arrow

pytestmark = pytest.mark.spark
Msg = types.PubsubMessage.pb()


def response(raw: list[bytes], start: int = 7, batch: int = 3) -> pb.ReadRangeResponse:
    n = len(raw)
    starts = list(range(start, start + n, batch))
    return pb.ReadRangeResponse(
        start_offset=start, next_offset=start + n, lengths=array("I", map(len, raw)).tobytes(),
        messages=b"".join(raw), batch_starts=starts, batch_publish_ms=[1_700_000_000_000 + i for i in range(len(starts))],
        topic_uid=5, offset_bits=40, shard_bits=6)


def expected(raw: list[bytes], shard: int, start: int = 7) -> list[dict]:
    out = []
    for i, b in enumerate(raw):
        m = Msg.FromString(b)
        out.append({"message_id": str((((5 << 40) | (start + i)) << 6) | shard), "shard": shard, "offset": start + i,
                    "ordering_key": m.ordering_key, "attributes": sorted(m.attributes.items()), "data": m.data})
    return out


def rows(rb) -> list[dict]:
    out = rb.to_pylist()
    for r in out:
        r.pop("publish_time")
        r["attributes"] = sorted(r["attributes"])
    return out


def test_data_only_messages_of_every_size():
    raw = [Msg(data=b"x" * n).SerializeToString() for n in (1, 2, 126, 127, 128, 16383, 16384, 70000, 3)]
    rb = arrow.to_record_batch(response(raw), 2)
    assert rb.schema == arrow.SCHEMA
    assert rows(rb) == expected(raw, 2)
    times = [t.timestamp() for t in rb.column("publish_time").to_pylist()]
    assert times == [1_700_000_000 + (i // 3) / 1000 for i in range(len(raw))]


@pytest.mark.parametrize("seed", range(5))
def test_mixed_messages_equal_a_protobuf_parse(seed):
    rnd = random.Random(seed)
    raw = []
    for i in range(400):
        m = Msg()
        if rnd.random() < 0.9:
            m.data = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 1, 5, 130, 300])))
        for k in range(rnd.choice([0, 0, 1, 2, 5])):
            m.attributes[f"k{k}-{'é' * rnd.randrange(3)}"] = "v" * rnd.choice([0, 1, 200])
        if rnd.random() < 0.4:
            m.ordering_key = rnd.choice(["a", "ключ", "k" * 300])
        if not m.data and not m.attributes:
            m.data = b"d"
        b = m.SerializeToString()
        if rnd.random() < 0.1:  # fields a reader skips: a varint field and a fixed64 field
            b += b"\x30" + bytes([0x96, 0x01]) + b"\x39" + b"\x00" * 8
        raw.append(b)
    assert rows(arrow.to_record_batch(response(raw), 1)) == expected(raw, 1)


def test_attributes_keep_their_wire_order():
    raw = [Msg(data=b"a", attributes={"z": "1", "a": "2"}).SerializeToString()]
    got = arrow.to_record_batch(response(raw), 0).column("attributes").to_pylist()[0]
    assert got == list(Msg.FromString(raw[0]).attributes.items()) or sorted(got) == [("a", "2"), ("z", "1")]


def test_unparseable_bytes_fall_back_to_the_parse():
    good = Msg(data=b"x", attributes={"a": "b"}).SerializeToString()
    group = b"\x0b\x0c"  # a (deprecated) group: the walker does not follow it, the parser skips it
    raw = [good + group, good]
    assert rows(arrow.to_record_batch(response(raw), 0)) == expected(raw, 0)


def test_empty_response():
    assert arrow.to_record_batch(response([]), 0).num_rows == 0
