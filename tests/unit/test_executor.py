"""The executor's rule that a node writes only the logs it owns (node.executor.commit): a record — or a part of
one, cut by shard — for a log the node does not own is refused with UNAVAILABLE before anything is appended or
applied, together topics and spread ones alike; records of logs it owns, and the metadata log's, commit."""

from __future__ import annotations

import pytest

from pigeon.broker.resources import Subscription, Topic
from pigeon.broker.state import BrokerState
from pigeon.core.bundles import bundle_log, shard_log
from pigeon.core.errors import Unavailable
from pigeon.node.executor import commit
from pigeon.storage import records as R
from pigeon.testing.simdisk import SimDisk
from pigeon.testing.sync_journal import SyncJournal

BUNDLES = 16
SHARDS = 4
T, S = "projects/p/topics/t", "projects/p/subscriptions/s"


def num(offset: int, shard: int) -> int:
    return offset << 6 | shard


def _node(spread: bool) -> tuple[BrokerState, SyncJournal]:
    st = BrokerState()
    st.dispatch_off()
    st.apply(R.TopicPut(1, SHARDS, Topic(name=T).SerializeToString(), spread))
    st.apply(R.SubPut(2, 1, Subscription(name=S, topic=T, ack_deadline_seconds=10).SerializeToString(), [0] * SHARDS))
    for k in range(SHARDS):
        st.apply(R.Publish(1, k, 0, 1000, 3, 0, b""))
    return st, SyncJournal(SimDisk(), "/data")


def _commit(st: BrokerState, sj: SyncJournal, rec: R.Record, owned: set[int]):
    return commit(st, sj, 1, set(), BUNDLES, rec, owns=owned.__contains__)


def test_a_record_of_a_together_topic_whose_bundle_this_node_gave_up_is_refused_and_changes_nothing():
    """A task still working for a bundle the node gave up — a dead letter's ack — must not append to its log."""
    st, sj = _node(spread=False)
    home = bundle_log(T, BUNDLES)
    tail = sj.journal.tail
    with pytest.raises(Unavailable, match="moved to another node"):
        _commit(st, sj, R.Ack(2, [num(0, 0)]), owned={home % BUNDLES + 1})
    assert sj.journal.tail == tail
    assert not st.subs[S].is_acked(num(0, 0))
    _commit(st, sj, R.Ack(2, [num(0, 0)]), owned={home})
    assert sj.journal.tail > tail and st.subs[S].is_acked(num(0, 0))


def test_a_record_of_a_spread_topic_naming_a_shard_another_node_owns_is_refused_whole():
    st, sj = _node(spread=True)
    logs = [shard_log(T, k, BUNDLES, spread=True) for k in range(SHARDS)]
    assert logs[0] != logs[1]
    acks = R.Ack(2, [num(0, 0), num(0, 1)])
    tail = sj.journal.tail
    with pytest.raises(Unavailable, match="moved to another node"):
        _commit(st, sj, acks, owned={logs[0]})
    assert sj.journal.tail == tail
    assert not st.subs[S].is_acked(num(0, 0)) and not st.subs[S].is_acked(num(0, 1))
    steps = _commit(st, sj, acks, owned={logs[0], logs[1]})
    assert len(steps) == 2
    assert st.subs[S].is_acked(num(0, 0)) and st.subs[S].is_acked(num(0, 1))


def test_a_metadata_record_commits_whatever_bundles_the_node_owns():
    st, sj = _node(spread=False)
    _commit(st, sj, R.TopicPut(3, 1, Topic(name="projects/p/topics/other").SerializeToString()), owned=set())
    assert "projects/p/topics/other" in st.topics
