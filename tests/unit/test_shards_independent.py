"""Invariant T3 of docs/cluster.md (shards are independent) and what it rests on: a spread topic's records are cut
one a shard's log; a shard's seek generation, snapshot and reset are its own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.broker import images, shard_split
from pigeon.broker.resources import Subscription, Topic
from pigeon.broker.state import BrokerState
from pigeon.core import ackid
from pigeon.core.bundles import shard_log
from pigeon.storage import records as R
from pigeon.testing import shard_check
from pigeon.testing.simulator import Simulator

BUNDLES = 16
T, S = "projects/p/topics/wide", "projects/p/subscriptions/s"


def spread_state(shards: int = 4) -> BrokerState:
    st = BrokerState()
    st.apply(R.TopicPut(1, shards, Topic(name=T).SerializeToString(), spread=True))
    st.apply(R.SubPut(2, 1, Subscription(name=S, topic=T, ack_deadline_seconds=10).SerializeToString(),
                      [0] * shards))
    return st


def publish(st: BrokerState, shard: int, count: int, at: int) -> None:
    ix = st.topics_by_uid[1].shards[shard]
    st.apply(R.Publish(1, shard, ix.next, 1000, count, 0, b""), at)


def num(offset: int, shard: int) -> int:
    return offset << 6 | shard


nums = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 3)).map(lambda p: num(*p)), max_size=20, unique=True)


@settings(max_examples=200, deadline=None)
@given(nums, st.booleans(), st.booleans())
def test_a_record_cut_by_shard_holds_each_message_once_in_its_shard_in_order(picked, versions, dead):
    """The parts of a Deliver name exactly its messages, each in the part of its shard, in the order they had,
    with their versions and keys; a Seek of every shard becomes one a shard."""
    rec = R.Deliver(2, 5.0, picked, [n % 7 + 1 for n in picked] if versions else None, [n % 3 for n in picked],
                    [(n + 64, 2) for n in picked[:2]] if dead else None)
    parts = shard_split.split(rec)
    assert sorted(n for _, p in parts for n in p.nums) == sorted(picked)
    for shard, p in parts:
        assert all(n & 63 == shard for n in p.nums) and p.nums == [n for n in picked if n & 63 == shard]
        assert p.versions == (None if rec.versions is None else [n % 7 + 1 for n in p.nums])
        assert p.keys == [n % 3 for n in p.nums]
        assert all(d[0] & 63 == shard for d in p.dead or ())
    assert sum(len(p.dead or ()) for _, p in parts) == len(rec.dead or ())
    seeks = shard_split.split(R.Seek(2, [3, 4], [[5], []]))
    assert [(k, p.floors, p.acked, p.shard) for k, p in seeks] == [(0, [3], [[5]], 0), (1, [4], [[]], 1)]


def test_each_record_of_a_spread_topic_goes_to_its_shards_log():
    st = spread_state()
    logs = [shard_log(T, k, BUNDLES, True) for k in range(4)]
    assert len(set(logs)) > 1  # (the name spreads its four shards over at least two of 16 bundles)
    for k in range(4):
        assert st.log_of(R.Publish(1, k, 0, 0, 1, 0, b""), BUNDLES) == logs[k]
    parts = st.split(R.Ack(2, [num(0, 0), num(0, 1), num(1, 0)]))
    assert [(st.log_of(p, BUNDLES), list(p.nums)) for p in parts] == [(logs[0], [num(0, 0), num(1, 0)]),
                                                                       (logs[1], [num(0, 1)])]


def test_a_seek_of_one_shard_leaves_the_other_shards_ack_ids_valid():
    """A spread topic's seek is one Seek a shard; until all are applied — as on owners that apply theirs at
    different times — an ack id of a shard not sought yet still acks, one of a shard sought acks nothing."""
    st = spread_state(2)
    publish(st, 0, 3, 10)
    publish(st, 1, 3, 20)
    st.all_durable()
    s = st.subs_by_uid[2]
    ids = {n: ackid.make(2, n, 1, s.generation_of(n)) for n in (num(0, 0), num(0, 1))}
    st.apply(R.Seek(2, [0], [[]], 0))
    assert s.generations == [1, 0]
    assert ackid.parse(2, ids[num(0, 0)], s.generations) is None
    assert ackid.parse(2, ids[num(0, 1)], s.generations) == (num(0, 1), 1)


def test_a_snapshot_of_one_shards_log_loads_that_shard_and_leaves_the_others():
    """A new owner of one shard's log loads its snapshot beside the shards it already holds (another log's):
    only the shards of the snapshot's log change."""
    old = spread_state()
    for k in range(4):
        publish(old, k, 5 + k, 100 * k)
    old.all_durable()
    old.apply(R.Ack(2, [num(o, k) for k in range(4) for o in range(k + 1)]))
    old.apply(R.Deliver(2, 30.0, [num(4, 0), num(4, 3)]))
    log = shard_log(T, 3, BUNDLES, True)
    mine = {k for k in range(4) if shard_log(T, k, BUNDLES, True) == log}
    new = spread_state()
    publish(new, 1, 2, 7)  # what the new owner holds of the others (made up: it must stay as it is)
    others = {k: shard_check.shard_view(new, 1, k) for k in range(4) if k not in mine}
    new.apply(images.bundle_snapshot(old, log, BUNDLES))
    for k in range(4):
        want = shard_check.shard_view(old, 1, k) if k in mine else others[k]
        assert shard_check.shard_view(new, 1, k) == want, k


def test_the_check_finds_a_reset_that_clears_every_shard(monkeypatch):
    """Rule-breaking: a reset of one log that clears the topic's other shards too is caught."""
    from pigeon.broker.topic import TopicState

    clear = TopicState.clear_data
    monkeypatch.setattr(TopicState, "clear_data", lambda self, shards=None: clear(self))
    history = [(R.TopicPut(1, 4, Topic(name=T).SerializeToString(), spread=True), 0),
               (R.SubPut(2, 1, Subscription(name=S, topic=T).SerializeToString(), [0] * 4), 0)]
    history += [(R.Publish(1, k, 0, 1000, 2, 0, b""), 10 + k) for k in range(4)]
    assert shard_check.check_history(history, BUNDLES)


def test_simulated_histories_with_spread_topics_keep_shards_independent():
    """The single-node simulator spreads half its topics and checks T3 after each seed (shard_check); here, that
    those seeds run and did spread some."""
    runs = [Simulator(seed, 150).run() for seed in range(40)]
    assert sum(any(t.spread for t in r.state.topics_by_uid.values()) for r in runs) >= 10
