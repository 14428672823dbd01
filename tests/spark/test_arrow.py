"""pigeon.spark.arrow: the vectorized decoders give exactly what a protobuf parse gives, for data-only
messages, messages with attributes, ordering keys and fields the reader skips, and varints of every
length; bytes the walker cannot follow fall back to the parse. Both walkers — numpy, and the compiled twin
(pigeon.spark._decode) when it is built — are run, and held to the decoder they replaced (arrow_reference)."""

from __future__ import annotations

import random
from array import array

import pytest
from google.pubsub_v1 import types

import arrow_reference
import numpy as np
from pigeon.api.proto import pigeon_ranges_pb2 as pb
from pigeon.spark import arrow

pytestmark = pytest.mark.spark
Msg = types.PubsubMessage.pb()
WALKERS = ["numpy", "compiled"]


@pytest.fixture(params=WALKERS)
def walker(request, monkeypatch):
    """to_record_batch with each walker."""
    if request.param == "compiled" and not arrow.COMPILED:
        pytest.skip("pigeon.spark._decode is not built")
    monkeypatch.setattr(arrow, "COMPILED", request.param == "compiled")
    return request.param


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


def test_data_only_messages_of_every_size(walker):
    raw = [Msg(data=b"x" * n).SerializeToString() for n in (1, 2, 126, 127, 128, 16383, 16384, 70000, 3)]
    rb = arrow.to_record_batch(response(raw), 2)
    assert rb.schema == arrow.SCHEMA
    assert rows(rb) == expected(raw, 2)
    times = [t.timestamp() for t in rb.column("publish_time").to_pylist()]
    assert times == [1_700_000_000 + (i // 3) / 1000 for i in range(len(raw))]


@pytest.mark.parametrize("seed", range(5))
def test_mixed_messages_equal_a_protobuf_parse(seed, walker):
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


def test_attributes_keep_their_wire_order(walker):
    raw = [Msg(data=b"a", attributes={"z": "1", "a": "2"}).SerializeToString()]
    got = arrow.to_record_batch(response(raw), 0).column("attributes").to_pylist()[0]
    assert got == list(Msg.FromString(raw[0]).attributes.items()) or sorted(got) == [("a", "2"), ("z", "1")]


def test_unparseable_bytes_fall_back_to_the_parse(walker):
    good = Msg(data=b"x", attributes={"a": "b"}).SerializeToString()
    group = b"\x0b\x0c"  # a (deprecated) group: the walker does not follow it, the parser skips it
    raw = [good + group, good]
    assert rows(arrow.to_record_batch(response(raw), 0)) == expected(raw, 0)


def test_empty_response(walker):
    assert arrow.to_record_batch(response([]), 0).num_rows == 0


# --- the walkers against the decoder they replaced -------------------------------------------------------------
def _split(raw: list[bytes]):
    lengths = np.array([len(b) for b in raw], np.int64)
    ends = np.cumsum(lengths)
    return np.frombuffer(b"".join(raw), np.uint8), ends - lengths, ends


def _walked(fn, malformed, raw: list[bytes]):
    """fn's (data, ordering_key, attributes) columns, or "malformed"."""
    try:
        return fn(*_split(raw))
    except malformed:
        return "malformed"


def assert_walkers_agree(raw: list[bytes]) -> None:
    want = _walked(arrow_reference._walk, arrow_reference._Malformed, raw)
    for name in WALKERS:
        if name == "compiled" and arrow._decode is None:
            continue
        got = _walked(arrow.WALKERS[name], arrow._Malformed, raw)
        if want == "malformed" or got == "malformed":
            assert got == want, name
            continue
        for column, w, g in zip(("data", "ordering_key", "attributes"), want, got):
            assert g.type == w.type and g.equals(w), (name, column, g.to_pylist()[:5], w.to_pylist()[:5])


def test_walkers_equal_the_old_decoder_on_chosen_messages():
    raw = [
        Msg(data=b"plain").SerializeToString(),  # no attributes
        Msg(data=b"one", attributes={"k": "v"}).SerializeToString(),
        Msg(data=b"many", attributes={f"key-{i}": f"value-{i}" * i for i in range(40)}).SerializeToString(),
        Msg(attributes={"empty-value": "", "": "empty-key"}).SerializeToString(),  # no data, empty strings
        Msg(data=b"\x00" * 13, attributes={"ключ": "значение", "名前": "値", "emoji-🐦": "🐦" * 20}).SerializeToString(),
        Msg(data=b"k", ordering_key="order-1").SerializeToString(),
        Msg(data=b"", attributes={"a": "b"}, ordering_key="ключ-" * 30).SerializeToString(),
        Msg(data=b"x" * 12, attributes={"x" * 12: "y" * 13, "y" * 13: "x" * 12}).SerializeToString(),  # views' edge
        b"",  # an empty message
        b"\x12\x00",  # an entry with neither key nor value
        b"\x12\x03\x12\x01v",  # an entry with a value only
        b"\x12\x06\x0a\x01a\x0a\x01b" + b"\x12\x05\x0a\x01a\x12\x00",  # a key given twice in an entry; twice over
        b"\x0a\x01a\x0a\x02bb" + b"\x2a\x01x\x2a\x01y",  # data and ordering key given twice: the last wins
        Msg(data=b"d", attributes={"a": "1"}).SerializeToString() + b"\x30\x96\x01\x39" + b"\x00" * 8 + b"\x45abcd",
        Msg(data=b"long" * 40000, attributes={"big": "v" * 300}).SerializeToString(),  # multi-byte lengths
    ]
    assert _walked(arrow_reference._walk, arrow_reference._Malformed, raw) != "malformed"
    assert_walkers_agree(raw)
    for one in raw:
        assert_walkers_agree([one])
    assert_walkers_agree([])


@pytest.mark.parametrize("bad", [
    b"\x0b\x0c",  # a group
    b"\x02\x00",  # field number 0
    b"\x0a\x05abc",  # a value running past its message
    b"\x12\x04\x0a\x05abc",  # an entry's key running past the entry
    b"\x12\x02\x0b\x0c",  # a group inside an entry
    b"\x08" + b"\xff" * 11,  # a varint longer than 10 bytes
    b"\x0a" + b"\xff" * 10 + b"\x01",  # a length longer than 10 bytes
    b"\x0a\x80\x80\x80\x80\x80\x01",  # a 6-byte length (beyond the exact 5 bytes): runs past its message
    b"\x09abc",  # a fixed64 past the end
])
def test_walkers_call_the_same_bytes_malformed(bad):
    good = Msg(data=b"x", attributes={"a": "b"}).SerializeToString()
    assert_walkers_agree([good, bad, good])
    assert_walkers_agree([bad])


@pytest.mark.parametrize("seed", range(6))
def test_walkers_equal_the_old_decoder_on_random_and_damaged_messages(seed):
    rnd = random.Random(seed)
    raw = []
    for _ in range(300):
        m = Msg()
        if rnd.random() < 0.8:
            m.data = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 1, 11, 12, 13, 130, 300])))
        for k in range(rnd.choice([0, 0, 1, 2, 3, 8, 30])):
            m.attributes[rnd.choice(["k", "ключ", "名", "", "key" * 5]) + str(k)] = \
                rnd.choice(["", "v", "värde", "v" * 12, "v" * 13, "v" * 200])
        if rnd.random() < 0.3:
            m.ordering_key = rnd.choice(["", "a", "ключ", "k" * 300])
        raw.append(m.SerializeToString())
    assert_walkers_agree(raw)
    for _ in range(40):  # damaged copies: most are malformed; the rest must still agree
        damaged = list(raw)
        i = rnd.randrange(len(damaged))
        b = bytearray(damaged[i])
        if b:
            for _ in range(rnd.randint(1, 3)):
                b[rnd.randrange(len(b))] = rnd.randrange(256)
        damaged[i] = bytes(b)
        assert_walkers_agree(damaged)


def test_compiled_and_numpy_batches_are_identical(monkeypatch):
    if arrow._decode is None:
        pytest.skip("pigeon.spark._decode is not built")
    rnd = random.Random(7)
    raw = [Msg(data=bytes(rnd.randrange(256) for _ in range(rnd.randrange(200))),
               attributes={f"k{j}": "v" * rnd.randrange(20) for j in range(rnd.randrange(4))},
               ordering_key=rnd.choice(["", "o"])).SerializeToString() for _ in range(500)]
    r = response(raw)
    batches = {}
    for compiled in (True, False):
        monkeypatch.setattr(arrow, "COMPILED", compiled)
        batches[compiled] = arrow.to_record_batch(r, 3)
    assert batches[True].equals(batches[False])


@pytest.mark.parametrize("topic_uid,offset_bits,shard_bits,shard,start,n", [
    (5, 40, 6, 3, 7, 500),
    (0, 40, 0, 0, 0, 1200),  # 0, 1, … : the digit count grows at 10, 100 and 1000
    (1, 30, 0, 0, 5, 0),  # no ids
    (0, 40, 20, (1 << 20) - 1, 999_990, 40),  # a step of 2^20: carries over several digits
    (3, 50, 10, 1023, (1 << 50) - 30, 30),  # the largest offsets of a shard
    ((1 << 3) - 1, 54, 6, 63, (1 << 54) - 5, 5),  # at and past 2^63: the exact Python path
])
def test_message_ids_are_the_decimal_ids(monkeypatch, topic_uid, offset_bits, shard_bits, shard, start, n):
    offsets = np.arange(start, start + n, dtype=np.uint64 if start + n >= 1 << 63 else np.int64)
    want = [str((((topic_uid << offset_bits) | (start + i)) << shard_bits) | shard) for i in range(n)]
    for compiled in (True, False):
        if compiled and arrow._decode is None:
            continue
        monkeypatch.setattr(arrow, "COMPILED", compiled)
        got = arrow.message_ids(topic_uid, offset_bits, shard_bits, shard, offsets)
        assert got.type == arrow.pa.string() and got.to_pylist() == want, compiled


def test_compiled_walker_grows_its_room_for_entries():
    """More entries than the compiled walker first makes room for (4 a message), ending a message or inside one."""
    many = [Msg(data=b"d", attributes={f"k{j}": f"v{j}" for j in range(k)}).SerializeToString() for k in (60, 5, 1)]
    assert_walkers_agree(many)
    assert_walkers_agree([Msg(data=b"d").SerializeToString()] * 3 + many)
    five = Msg(attributes={f"a{j}": "b" for j in range(5)}).SerializeToString()
    assert_walkers_agree([five] * 16)  # 80 entries: exactly the first room (4 × 16 + 16)
    assert_walkers_agree([five] * 17)  # 85: one message past it
