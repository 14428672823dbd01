"""broker.topic: ShardIndex against a list-of-batches model; message numbers and ids."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pigeon.core import limits
from pigeon.broker.topic import SHARD_MASK, ShardIndex, TopicState, msgnum, parse_message_id, split_msgnum


@dataclass
class Batch:
    base: int
    count: int
    pos: int
    ms: int

    @property
    def end(self) -> int:
        return self.base + self.count


class ShardIndexMachine(RuleBasedStateMachine):
    @initialize(start=st.integers(0, 1000))
    def init(self, start):
        self.ix = ShardIndex(start)
        self.next = start
        self.batches: list[Batch] = []  # retained, oldest first
        self.last_ms = None

    @rule(count=st.integers(1, 5), pos=st.integers(0, 10**9), ms=st.integers(0, 200))
    def append(self, count, pos, ms):
        if self.batches and ms < self.batches[-1].ms:
            ms = self.batches[-1].ms
        got = self.ix.append(count, pos, ms)
        assert got == self.next
        self.batches.append(Batch(self.next, count, pos, ms))
        self.next += count

    @rule(data=st.data())
    def trim_before(self, data):
        lo = self.batches[0].base if self.batches else self.next
        offset = data.draw(st.integers(max(0, lo - 3), self.next + 3), label="offset")
        self.ix.trim_before(offset)
        self.batches = [b for b in self.batches if b.end > offset]

    @rule()
    def export_restore(self):
        nxt, base, pos, ms, keys = self.ix.export()
        back = ShardIndex.restore(nxt, base, pos, ms, keys)
        assert back.next == back.durable == self.next
        assert (list(back.base), list(back.pos), list(back.ms), list(back.keys)) == (
            list(self.ix.base), list(self.ix.pos), list(self.ix.ms), list(self.ix.keys))
        back.durable, back.visible = self.ix.durable, self.ix.visible
        self.ix = back

    @invariant()
    def matches_model(self):
        ix = self.ix
        assert ix.next == self.next
        assert list(ix.base) == [b.base for b in self.batches]
        assert list(ix.pos) == [b.pos for b in self.batches]
        assert list(ix.ms) == [b.ms for b in self.batches]
        assert ix.first() == (self.batches[0].base if self.batches else self.next)
        assert list(ix.ms) == sorted(ix.ms)
        for i, b in enumerate(self.batches):
            assert ix.batch_end(i) == b.end
            for o in range(b.base, b.end):
                assert ix.batch_of(o) == i
                assert ix.publish_ms(o) == b.ms
        for t in range(-1, 203, 7):
            want = next((b.base for b in self.batches if b.ms >= t), self.next)
            assert ix.offset_at_ms(t) == want, t


ShardIndexMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
TestShardIndex = ShardIndexMachine.TestCase


def test_batch_of_beyond_next_is_refused():
    ix = ShardIndex()
    ix.append(3, 0, 0)
    assert ix.batch_of(2) == 0
    with pytest.raises(AssertionError):
        ix.batch_of(3)


def test_append_keeps_time_monotonic():
    ix = ShardIndex()
    ix.append(1, 0, 100)
    ix.append(1, 10, 50)  # clock went backwards
    assert list(ix.ms) == [100, 100]
    assert ix.offset_at_ms(100) == 0 and ix.offset_at_ms(101) == 2


@given(st.integers(0, 2**40 - 1), st.integers(0, SHARD_MASK))
def test_msgnum_round_trip(offset, shard):
    n = msgnum(offset, shard)
    assert n == offset << limits.shard_bits | shard
    assert split_msgnum(n) == (offset, shard)


@given(st.integers(1, 2**16), st.integers(0, 2**limits.topic_offset_bits - 1), st.integers(1, 64), st.data())
def test_message_id_round_trip(uid, offset, shards, data):
    shard = data.draw(st.integers(0, shards - 1))
    t = TopicState(uid, "projects/p/topics/t", None, shards)
    mid = t.message_id(offset, shard)
    assert mid.isdigit()
    assert parse_message_id(mid) == (uid, offset, shard)


@given(st.integers(1, 64), st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=20))
def test_shard_for_ordering_key_is_stable_and_in_range(shards, keys):
    a = TopicState(1, "projects/p/topics/a", None, shards)
    b = TopicState(2, "projects/p/topics/b", None, shards)
    for k in keys:
        s = a.shard_for(k)
        assert 0 <= s < shards
        assert a.shard_for(k) == s == b.shard_for(k)


@given(st.integers(1, 64))
def test_shard_for_without_key_cycles_through_every_shard(shards):
    t = TopicState(1, "projects/p/topics/a", None, shards)
    picks = [t.shard_for("") for _ in range(2 * shards)]
    assert sorted(picks[:shards]) == list(range(shards))
    assert picks[shards:] == picks[:shards]
    assert len(t.shards) == shards and t.backlog_end() == [0] * shards


def test_topic_state_shard_count_limits():
    with pytest.raises(AssertionError):
        TopicState(1, "n", None, 0)
    with pytest.raises(AssertionError):
        TopicState(1, "n", None, limits.shards_per_topic_max + 1)
