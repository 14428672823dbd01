"""While a node takes one bundle log of a spread topic over, its subscriptions' dispatch is off (broker.log_state
`reset`: the dispatch state of every shard is cleared, and derived again by `resume_log` once the log is applied
and its snapshot durable) — but the node goes on owning the topic's other shards, and a pull of one of them can
come in while the take-over waits for that sync. Dispatch must hand nothing out then: with the ordering keys'
state cleared and the cursors where they were, a key whose earlier messages are leased (or wait behind them) looked
idle, and its next new message went out ahead of them (`make sim-cluster` seed 7011, spread: topic0's k3:57 went
out while k3:17..49 were leased and k3:51, 53 waited)."""

from __future__ import annotations

from google.pubsub_v1 import types

from pigeon.broker.resources import Topic
from pigeon.broker.state import BrokerState
from pigeon.core import limits
from pigeon.storage import records as R

BUNDLES = 4
KEY = 7  # an ordering key's hash


def _spread_state() -> tuple[BrokerState, int, int]:
    """A spread topic of two shards in different logs, an ordered subscription: (state, log of shard 0, of 1)."""
    st = BrokerState()
    st.apply(R.TopicPut(1, 2, Topic(name="projects/p/topics/t").SerializeToString(), spread=True))
    config = types.Subscription.pb()(name="projects/p/subscriptions/s", topic="projects/p/topics/t",
                                     ack_deadline_seconds=10, enable_message_ordering=True)
    st.apply(R.SubPut(2, 1, config.SerializeToString(), st.topics_by_uid[1].backlog_end()))
    logs = st.shard_logs(st.topics_by_uid[1], BUNDLES)
    assert logs[0] != logs[1], "the two shards lie in different logs"
    return st, logs[0], logs[1]


def test_a_take_over_of_another_shards_log_does_not_let_a_busy_key_jump_ahead():
    st, mine, other = _spread_state()
    n = lambda offset: offset << limits.shard_bits  # noqa: E731  (shard 0)
    st.apply(R.Publish(1, 0, 0, 0, 3, KEY, b""), 0)  # offsets 0..2 of shard 0, key KEY
    st.all_durable()
    s = st.subs_by_uid[2]
    picks = s.take(10, 0.0)
    assert [m for m, _ in picks.out] == [n(0), n(1), n(2)]
    st.apply(picks.record(2, 10.0), 1)  # leased until 10 s
    st.apply(R.Publish(1, 0, 3, 1, 1, KEY, b""), 2)  # offset 3: waits behind the leased batch
    st.all_durable()
    assert not s.take(10, 1.0), "the key's batch is out"
    st.apply(R.Publish(1, 0, 4, 2, 1, KEY, b""), 3)  # offset 4
    st.all_durable()

    st.apply(R.Reset(other, BUNDLES))  # the node takes the log of shard 1 over: dispatch off until resume_log
    # a pull of shard 0 (this node's all along) while the take-over waits for its snapshot to be durable
    assert not s.take(10, 2.0), "nothing goes out while dispatch is off"

    st.resume_log(other, BUNDLES, 2.0)
    assert not s.take(10, 3.0), "the key's batch is still out"
    picks = s.take(10, 10.5)  # the batch's leases ran out: it goes out again, then what waited behind it
    assert [m for m, _ in picks.out][:3] == [n(0), n(1), n(2)]
