"""core.wire: hand-rolled protobuf bytes must be what the real protobuf runtime reads."""

from __future__ import annotations

import pytest
from google.protobuf import timestamp_pb2
from google.pubsub_v1 import types
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.core import wire

SETTINGS = settings(max_examples=120, deadline=None)

PubsubMessage = types.PubsubMessage.pb()
PublishRequest = types.PublishRequest.pb()
ReceivedMessage = types.ReceivedMessage.pb()

u64 = st.integers(0, 2**64 - 1)
short_text = st.text(max_size=40)
attributes = st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=60), max_size=6)
messages = st.builds(
    lambda data, attrs, key: PubsubMessage(data=data, attributes=attrs, ordering_key=key),
    st.binary(max_size=400),
    attributes,
    st.sampled_from(["", "k", "order-key-1"]),
)
seconds = st.integers(0, 253402300799)
nanos = st.integers(0, 999_999_999)


@SETTINGS
@given(u64, st.binary(max_size=8), st.binary(max_size=8))
def test_varint_round_trip(n, before, after):
    enc = wire.varint(n)
    assert len(enc) == max(1, (n.bit_length() + 6) // 7)
    assert all(b & 0x80 for b in enc[:-1]) and not enc[-1] & 0x80
    value, pos = wire.read_varint(before + enc + after, len(before))
    assert value == n
    assert pos == len(before) + len(enc)
    assert wire.read_varint(memoryview(enc), 0) == (n, len(enc))


def test_varint_known_values():
    assert wire.varint(0) == b"\x00"
    assert wire.varint(127) == b"\x7f"
    assert wire.varint(128) == b"\x80\x01"
    assert wire.varint(300) == b"\xac\x02"
    assert wire.varint(2**64 - 1) == b"\xff" * 9 + b"\x01"


def test_read_varint_rejects_overlong():
    with pytest.raises(ValueError):
        wire.read_varint(b"\xff" * 11, 0)


@pytest.mark.parametrize("field", [16, 31])
def test_length_delimited_large_field_numbers(field):
    enc = wire.length_delimited(field, b"xy")
    assert wire.split_repeated(enc, field) == [b"xy"]


@SETTINGS
@given(st.integers(1, 15), st.binary(max_size=300))
def test_length_delimited_small_fields(field, payload):
    enc = wire.length_delimited(field, payload)
    key, pos = wire.read_varint(enc, 0)
    n, pos = wire.read_varint(enc, pos)
    assert (key, n, enc[pos:]) == ((field << 3) | 2, len(payload), payload)
    assert wire.split_repeated(enc, field) == [payload]
    assert wire.split_repeated(enc, field + 1 if field < 15 else 1) == []


@SETTINGS
@given(st.lists(messages, max_size=8), st.text(max_size=50))
def test_split_repeated_yields_each_published_message(msgs, topic):
    req = PublishRequest(topic=topic, messages=msgs)
    raw = req.SerializeToString(deterministic=True)
    parts = wire.split_repeated(raw, 2)
    assert parts == [m.SerializeToString(deterministic=True) for m in msgs]
    for part, m in zip(parts, msgs):
        back = PubsubMessage()
        back.ParseFromString(part)
        assert back == m
    topics = wire.split_repeated(raw, 1)
    assert topics == ([topic.encode()] if topic else [])


@SETTINGS
@given(st.lists(st.one_of(
    st.tuples(st.just(0), st.integers(1, 30), u64),
    st.tuples(st.just(1), st.integers(1, 30), st.binary(min_size=8, max_size=8)),
    st.tuples(st.just(5), st.integers(1, 30), st.binary(min_size=4, max_size=4)),
    st.tuples(st.just(2), st.integers(1, 30), st.binary(max_size=200)),
), max_size=12), st.integers(1, 30))
def test_split_repeated_skips_every_other_wire_type(fields, wanted):
    buf = b""
    for wt, f, v in fields:
        buf += wire.varint((f << 3) | wt)
        if wt == 0:
            buf += wire.varint(v)
        elif wt == 2:
            buf += wire.varint(len(v)) + v
        else:
            buf += v
    assert wire.split_repeated(buf, wanted) == [v for wt, f, v in fields if wt == 2 and f == wanted]


@SETTINGS
@given(st.lists(messages, min_size=1, max_size=4), st.data())
def test_split_repeated_rejects_truncated_input(msgs, data):
    raw = PublishRequest(topic="projects/p/topics/t", messages=msgs).SerializeToString()
    # cut inside the last message's payload (its length prefix promises more than is there)
    last = msgs[-1].SerializeToString()
    if not last:
        return
    cut = data.draw(st.integers(len(raw) - len(last), len(raw) - 1), label="cut")
    with pytest.raises((ValueError, IndexError)):
        wire.split_repeated(raw[:cut], 2)


def test_split_repeated_rejects_group_wire_types():
    with pytest.raises(ValueError):
        wire.split_repeated(b"\x0b\x0c", 1)  # start group / end group


@SETTINGS
@given(seconds, nanos)
def test_timestamp_parses(s, n):
    ts = timestamp_pb2.Timestamp()
    ts.ParseFromString(wire.timestamp(s, n))
    assert (ts.seconds, ts.nanos) == (s, n)


message_ids = st.integers(0, 2**63 - 1).map(str) | st.text(st.characters(codec="ascii"), max_size=127)


@SETTINGS
@given(messages, message_ids, seconds, nanos)
def test_stamp_message_sets_server_fields_and_keeps_the_rest(m, mid, s, n):
    raw = m.SerializeToString()
    out = PubsubMessage()
    out.ParseFromString(wire.stamp_message(raw, mid, wire.timestamp(s, n)))
    assert out.message_id == mid
    assert (out.publish_time.seconds, out.publish_time.nanos) == (s, n)
    assert out.HasField("publish_time")
    assert out.data == m.data
    assert dict(out.attributes) == dict(m.attributes)
    assert out.ordering_key == m.ordering_key


ack_ids = st.text(st.characters(codec="ascii"), max_size=127)


@SETTINGS
@given(ack_ids, messages, message_ids, st.integers(0, 2**31 - 1))
def test_received_message_parses(ack_id, m, mid, attempt):
    stamped = wire.stamp_message(m.SerializeToString(), mid, wire.timestamp(1_700_000_000, 5))
    rm = ReceivedMessage()
    rm.ParseFromString(wire.received_message(ack_id.encode(), stamped, attempt))
    assert rm.ack_id == ack_id
    assert rm.delivery_attempt == attempt
    assert rm.message.data == m.data
    assert dict(rm.message.attributes) == dict(m.attributes)
    assert rm.message.message_id == mid
    assert rm.message.publish_time.seconds == 1_700_000_000 and rm.message.publish_time.nanos == 5


def test_received_message_omits_zero_attempt():
    with_attempt = wire.received_message(b"a", b"", 3)
    without = wire.received_message(b"a", b"", 0)
    assert with_attempt == without + b"\x18\x03"
    rm = ReceivedMessage()
    rm.ParseFromString(without)
    assert rm.delivery_attempt == 0 and rm.HasField("message")


def test_leading_string_reads_a_routing_key_only_where_a_serializer_puts_it():
    leading_string = wire.leading_string
    raw = types.PublishRequest.pb()(topic="projects/p/topics/t", messages=[{"data": b"x" * 300}]).SerializeToString()
    assert leading_string(raw, 1) == "projects/p/topics/t"
    assert leading_string(raw, 2) is None  # not the first field
    no_topic = types.PublishRequest.pb()(messages=[{"data": b"x"}]).SerializeToString()
    assert leading_string(no_topic, 1) is None
    assert leading_string(b"", 1) is None
    assert leading_string(b"\x0a\x05abc", 1) is None  # its length runs past the end
    assert leading_string(b"\x0a\x02\xff\xfe", 1) is None  # not UTF-8
    assert leading_string(b"\x0a\xff", 1) is None  # a varint cut short
