"""Ack ids: the batch parser of the stream-ack hot path agrees with the per-id parser, or declines."""

from hypothesis import given
from hypothesis import strategies as st

from pigeon.core import ackid
from pigeon.core.errors import InvalidArgument

UID = 7


def one_by_one(ack_ids):
    """What the per-id path makes of a batch: message numbers of this subscription's ids; None when any id
    is another subscription's or malformed (the batch parser must decline those batches)."""
    nums = []
    for a in ack_ids:
        try:
            p = ackid.parse(UID, a)
        except InvalidArgument:
            return None
        if p is None:
            return None
        nums.append(p[0])
    return nums


issued = st.builds(ackid.make, st.just(UID), st.integers(0, 2**62), st.integers(1, 2**20))
odd = st.one_of(
    st.builds(ackid.make, st.integers(0, 20), st.integers(0, 99), st.integers(0, 9)),  # other subscriptions
    st.text(alphabet="0123456789.x +-_", max_size=12),  # malformed, or well-formed by chance
)


@given(st.lists(issued, max_size=50))
def test_issued_ids_parse_in_one_batch(ack_ids):
    assert ackid.parse_many(UID, ack_ids) == [int(a.split(".")[1]) for a in ack_ids]


@given(st.lists(st.one_of(issued, odd), max_size=20))
def test_batch_parser_agrees_or_declines(ack_ids):
    got = ackid.parse_many(UID, ack_ids)
    if got is not None:
        assert got == one_by_one(ack_ids)
    elif all(a.count(".") == 2 for a in ack_ids):
        # declined: something in the batch is not a plain digit ack id of this subscription
        assert not all(a.split(".")[0] == str(UID) and a.split(".")[2].isdigit() and a.split(".")[1].isdigit()
                       for a in ack_ids)


def test_declines_other_subscriptions_and_malformed_ids():
    assert ackid.parse_many(UID, ["7.1.1", "8.2.1"]) is None
    assert ackid.parse_many(UID, ["7.1.1", "7.2"]) is None
    assert ackid.parse_many(UID, ["7.1.1", "7.2.1.4"]) is None
    assert ackid.parse_many(UID, ["7.1.", "7.2.1"]) is None
    assert ackid.parse_many(UID, ["7.x.1"]) is None
    assert ackid.parse_many(UID, ["7.1.+1"]) is None
    assert ackid.parse_many(UID, []) == []


def test_ids_of_an_earlier_seek_generation_ack_nothing():
    before = [ackid.make(UID, n, 1) for n in range(3)]
    after = [ackid.make(UID, n, 2, generation=1) for n in range(3)]
    assert [ackid.parse(UID, a, [1, 1, 1]) for a in before] == [None] * 3
    assert [ackid.parse(UID, a, [1, 1, 1]) for a in after] == [(n, 2) for n in range(3)]
    assert [ackid.parse(UID, a) for a in after] == [None] * 3  # (ids of a later generation: not from here)
    assert ackid.parse_many(UID, after, 1) == [0, 1, 2]
    assert ackid.parse_many(UID, before, 1) is None  # the per-id path sorts them out
    assert ackid.parse_many(UID, after) is None
    assert ackid.parse_many(UID, before + after, 1) is None


def test_a_generation_is_its_shards():
    """A spread topic's shards are sought one by one: an ack id is checked against its own shard's generation,
    and the batch parser declines while the shards' generations differ."""
    gens = [1, 0]  # shard 0 sought once, shard 1 not yet
    shard0 = ackid.make(UID, 0 << 6 | 0, 1, generation=1)
    shard1 = ackid.make(UID, 0 << 6 | 1, 1)
    stale0 = ackid.make(UID, 1 << 6 | 0, 1)
    assert [ackid.parse(UID, a, gens) for a in (shard0, shard1, stale0)] == [(0, 1), (1, 1), None]
    assert ackid.common(gens) == -1 and ackid.common([2, 2]) == 2 and ackid.common([]) == 0
    assert ackid.parse_many(UID, [shard0, shard1], ackid.common(gens)) is None
