"""The compiled twins of `pigeon.core.hot`'s loops return exactly what the Python functions return, for inputs
drawn at random around every branch (batch edges, overrides, the byte budget, two-byte and longer varints,
numbers too big for the C types); and what both return is what Pub/Sub's ReceivedMessage says."""

import pytest
from google.pubsub_v1.types import pubsub as pubsub_types
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.core import ackid, hot, wire

compiled = pytest.importorskip("pigeon.core._compiled") if hot.COMPILED else None
ReceivedMessage = pubsub_types.ReceivedMessage.pb()
PubsubMessage = pubsub_types.PubsubMessage.pb()
UID = 7
BITS = 6


def test_the_install_built_the_twins():
    assert hot.COMPILED, "pigeon.core._compiled was not built: `pip install -e .` needs a C compiler (setup.py)"
    assert hot.received_entries is compiled.received_entries and hot.ack_numbers is compiled.ack_numbers
    assert hot.ack_groups is compiled.ack_groups


@st.composite
def deliveries(draw):
    """Stored batches on a few shards, leased (number, version) pairs among them, and the call's other inputs."""
    batches = {}  # shard → [(first offset, messages, publish_time field)]
    for shard in draw(st.sets(st.integers(0, (1 << BITS) - 1), min_size=1, max_size=3)):
        offset, rows = draw(st.integers(0, 2**30)), []
        for _ in range(draw(st.integers(1, 3))):
            messages = tuple(PubsubMessage(data=draw(st.binary(max_size=300)), ordering_key=draw(st.text(max_size=3)))
                             .SerializeToString() for _ in range(draw(st.integers(1, 5))))
            ms = draw(st.integers(0, 2**41))
            rows.append((offset, messages, wire.length_delimited(4, wire.timestamp(ms // 1000, ms % 1000 * 10**6))))
            offset += len(messages)
        batches[shard] = rows
    numbers = [off + i << BITS | shard for shard, rows in batches.items() for off, ms, _ in rows for i in range(len(ms))]
    nums = draw(st.lists(st.sampled_from(numbers), min_size=1, max_size=12))
    big = st.integers(2**62, 2**63 - 1)  # past the C fast path, still a protobuf varint
    taken = [(n, draw(st.one_of(st.integers(1, 200), st.integers(16_000, 20_000), big))) for n in nums]
    overrides = {n: PubsubMessage(data=b"updated %d" % n).SerializeToString()
                 for n in draw(st.sets(st.sampled_from(numbers), max_size=2))}
    return (batches, taken, draw(st.one_of(st.integers(0, 2**20), big)), draw(st.booleans()),
            draw(st.one_of(st.integers(1, 2_000), st.just(1 << 30))), overrides or draw(st.sampled_from([None, {}])),
            draw(st.one_of(st.integers(0, 2**16), st.integers(2**16, 2**30))) << 46)


def locator(batches, calls):
    def locate(topic, num):
        calls.append(num)
        shard, offset = num & ((1 << BITS) - 1), num >> BITS
        for lo, messages, time_field in batches[shard]:
            if lo <= offset < lo + len(messages):
                return shard, lo, lo + len(messages), messages, time_field
        raise AssertionError(num)
    return locate


@settings(max_examples=300)
@given(deliveries())
def test_received_entries_twin_returns_what_python_returns(case):
    batches, taken, sub_uid, show_attempt, max_bytes, overrides, id_base = case
    py_calls, c_calls = [], []
    want = hot.PYTHON.received_entries(locator(batches, py_calls), None, taken, sub_uid, show_attempt, max_bytes,
                                       overrides, id_base, BITS)
    got = compiled.received_entries(locator(batches, c_calls), None, taken, sub_uid, show_attempt, max_bytes,
                                    overrides, id_base, BITS)
    assert got == want
    if all(n < 2**62 and v < 2**62 for n, v in taken) and sub_uid < 2**62 and id_base < 2**62:
        assert c_calls == py_calls  # the same stored batches looked up, in the same order (else it starts over)

    entries, sizes = want
    assert 1 <= len(entries) <= len(taken) and len(sizes) == len(entries)
    for entry, size, (num, version) in zip(entries, sizes, taken):
        rm = ReceivedMessage.FromString(_field_1(entry))
        assert rm.ack_id == f"{sub_uid}.{num}.{version}"
        assert rm.message.message_id == str(id_base | num)
        if version < 2**31:  # delivery_attempt is an int32
            assert rm.delivery_attempt == (version if show_attempt else 0)
        assert rm.message.ByteSize() == size
        if overrides and num in overrides:
            assert rm.message.data == b"updated %d" % num
    if len(entries) < len(taken):  # stopped by the budget, never before the first
        assert sum(sizes) + _size_of_next(batches, taken[len(entries)], overrides, id_base) > max_bytes
    if all(v < 2**32 for _, v in taken):  # after a seek: the ack ids carry its generation, nothing else changes
        gen = compiled.received_entries(locator(batches, []), None, taken, sub_uid, show_attempt, max_bytes,
                                        overrides, id_base, BITS, 2)
        assert gen == hot.PYTHON.received_entries(locator(batches, []), None, taken, sub_uid, show_attempt,
                                                  max_bytes, overrides, id_base, BITS, 2)
        assert gen[1] == sizes
        for entry, (num, version) in zip(gen[0], taken):
            rm = ReceivedMessage.FromString(_field_1(entry))
            assert rm.ack_id == f"{sub_uid}.{num}.{version | 2 << 32}"
            assert ackid.parse(sub_uid, rm.ack_id, [2] * 64) == (num, version)


def _field_1(entry: bytes) -> bytes:
    """The ReceivedMessage inside one `received_messages` entry (tag 0x0a, length, bytes)."""
    assert entry[0] == 0x0A
    length, pos = wire.read_varint(entry, 1)
    assert pos + length == len(entry)
    return entry[pos:]


def _size_of_next(batches, pair, overrides, id_base) -> int:
    num = pair[0]
    body = (overrides or {}).get(num)
    if body is None:
        shard, offset = num & ((1 << BITS) - 1), num >> BITS
        lo, messages, time_field = next(r for r in batches[shard] if r[0] <= offset < r[0] + len(r[1]))
        body = messages[offset - lo]
    time_field = next(r[2] for r in batches[num & ((1 << BITS) - 1)] if r[0] <= num >> BITS < r[0] + len(r[1]))
    return len(body) + 2 + len(str(id_base | num)) + len(time_field)


ids = st.one_of(
    st.builds(ackid.make, st.just(UID), st.integers(0, 2**70), st.integers(0, 2**70)),  # this subscription's
    st.builds(ackid.make, st.integers(0, 80), st.integers(0, 99), st.integers(0, 9)),  # others'
    st.text(alphabet="0123456789.x +-_٣", max_size=14),  # malformed, or well-formed by chance
    st.text(max_size=6),
)


@settings(max_examples=500)
@given(st.lists(ids, max_size=20), st.sampled_from([UID, 0, 77, 2**63]))
def test_ack_numbers_twin_returns_what_python_returns(ack_ids, sub_uid):
    assert compiled.ack_numbers(sub_uid, ack_ids) == hot.PYTHON.ack_numbers(sub_uid, ack_ids)
    assert compiled.ack_numbers(sub_uid, tuple(ack_ids)) == hot.PYTHON.ack_numbers(sub_uid, ack_ids)
    for generation in (1, 3):
        assert compiled.ack_numbers(sub_uid, ack_ids, generation) == \
            hot.PYTHON.ack_numbers(sub_uid, ack_ids, generation)


@settings(max_examples=500)
@given(st.lists(ids, max_size=20), st.lists(st.integers(0, 3), max_size=70), st.sampled_from([BITS, 1, 0]))
def test_ack_groups_twin_splits_as_python_does(ack_ids, table, bits):
    groups = max(table, default=0) + 1
    want = hot.PYTHON.ack_groups(ack_ids, table, groups, bits)
    assert compiled.ack_groups(ack_ids, table, groups, bits) == want
    assert compiled.ack_groups(tuple(ack_ids), tuple(table), groups, bits) == want
    assert sorted(a for g in want for a in g) == sorted(ack_ids)


def test_ack_groups_send_an_id_to_its_shards_group_and_one_it_cannot_read_to_the_first():
    for f in (compiled.ack_groups, hot.PYTHON.ack_groups):
        ids = [ackid.make(UID, 5 << BITS | 2, 1), ackid.make(UID, 9 << BITS | 1, 1), "junk", "7.x.1",
               ackid.make(UID, 3 << BITS | 40, 1), "7.-1.1"]
        # shard 2 → group 1, shard 1 → group 2; shard 40 is beyond the table, -1 reads as shard 63 (int() takes it)
        assert f(ids, [0, 2, 1], 3, BITS) == [["junk", "7.x.1", ids[4], "7.-1.1"], [ids[0]], [ids[1]]]


def test_ack_numbers_decline_ids_whose_dots_only_add_up():
    for f in (compiled.ack_numbers, hot.PYTHON.ack_numbers):
        assert f(UID, ["7.1", "7.7.2.1"]) is None  # six parts for two ids, but neither id is well-formed
        assert f(UID, ["7.1.2.3", "7.1"]) is None
        assert f(UID, ["7.12.3", "7.99999999999999999999999.1"]) == [12, 99999999999999999999999]
