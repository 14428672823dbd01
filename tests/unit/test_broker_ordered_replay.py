"""The durable state of an ordered subscription is what a replay of its log gives (recovery, a replica), also
after a lease ran out: `make sim` seed 18470 found the two apart. Time ends a lease at its own deadline only (a
replay cannot tell when an Ack record, which carries no time, came): an expiry leaves a later member of its key's
batch leased until that member's own deadline, ack or nack — the batch goes out again once none of it is
leased — and only a nack, a record with its time, ends the later members' leases with its own."""

from __future__ import annotations

from google.pubsub_v1 import types

from pigeon.broker import images
from pigeon.broker.resources import Topic
from pigeon.broker.state import BrokerState
from pigeon.core import limits
from pigeon.storage import records as R

KEY = 7  # an ordering key's hash


def _normalized(s, now: float) -> tuple:
    """Acks, leases still running at `now` (deadline, version, key) and delivery counts (as
    tests/unit/test_broker_subscription.py's machine compares them: expiry is time's, not a record's)."""
    leases = {n: (d, v, k) for n, (d, v, _, k) in s.leases.items() if d > now}
    counts = dict(s.versions)
    counts.update({n: v for n, (d, v, _, _) in s.leases.items() if d <= now})
    return s.export_state(), leases, counts


def test_an_extended_lease_of_a_keys_batch_is_the_same_live_and_replayed():
    """A key's batch of three goes out; the client extends the second's lease (60 s), the first's runs out, then
    the client acks the first and the third late. A replay of the same records — Deliver, Modack, Ack — ends
    where the live state is: the second's lease stands to its extended deadline (the same records would follow
    had the acks come before the first's deadline), and the key goes on once it ends."""
    log: list[tuple[R.Record, int]] = []
    live = BrokerState()

    def record(rec: R.Record) -> None:
        log.append((rec, len(log)))
        live.apply(rec, len(log) - 1)

    record(R.TopicPut(1, 1, Topic(name="projects/p/topics/t").SerializeToString()))
    config = types.Subscription.pb()(name="projects/p/subscriptions/s", topic="projects/p/topics/t",
                                     ack_deadline_seconds=10, enable_message_ordering=True)
    record(R.SubPut(2, 1, config.SerializeToString(), live.topics_by_uid[1].backlog_end()))
    record(R.Publish(1, 0, 0, 0, 3, KEY, b""))
    live.all_durable()
    s = live.subs_by_uid[2]
    first, second, third = (o << limits.shard_bits for o in range(3))
    picks = s.take(10, 0.0)
    assert [n for n, _ in picks.out] == [first, second, third]
    record(picks.record(2, 10.0))
    record(R.Modack(2, 5.0, 60, [second], [1]))  # the second's lease now runs to 65 s
    s.expire(10.0)  # the first's runs out
    record(R.Ack(2, [first, third]))

    replayed = BrokerState()
    replayed.dispatch_off()
    for rec, at in log:
        replayed.apply(rec, at)
    assert _normalized(replayed.subs_by_uid[2], 10.0) == _normalized(s, 10.0)
    assert s.leases[second][:2] == (65.0, 1)
    assert not s.take(10, 10.0)  # the key waits for its leased member
    again = s.take(10, 65.0)  # which ran out: the batch from the first on goes out again, the acked ones too
    assert [n for n, _ in again.out] == [first, second, third] and dict(again.out)[second] == 2


def test_after_a_restart_a_key_resends_what_ran_out_before_its_extended_member():
    """The state an expiry leaves — the first of a key's batch unleased and unacked, a later member leased on —
    read back by a restart (from a checkpoint written then): the key waits for its leased member, then the first
    goes out again before it (nothing of a key goes out before an earlier message that is not acked)."""
    live = BrokerState()
    live.apply(R.TopicPut(1, 1, Topic(name="projects/p/topics/t").SerializeToString()))
    config = types.Subscription.pb()(name="projects/p/subscriptions/s", topic="projects/p/topics/t",
                                     ack_deadline_seconds=10, enable_message_ordering=True)
    live.apply(R.SubPut(2, 1, config.SerializeToString(), live.topics_by_uid[1].backlog_end()))
    live.apply(R.Publish(1, 0, 0, 0, 3, KEY, b""))
    live.all_durable()
    s = live.subs_by_uid[2]
    first, second, third = (o << limits.shard_bits for o in range(3))
    live.apply(s.take(10, 0.0).record(2, 10.0))
    live.apply(R.Modack(2, 5.0, 60, [second], [1]))
    s.expire(10.0)  # the first and the third ran out, the second runs to 65 s
    restarted = BrokerState()
    restarted.dispatch_off()
    for rec in images.meta_records(live):
        restarted.apply(rec)
    for image in images.images(live):
        restarted.restore(image)
    restarted.rebuild(10.0)
    s = restarted.subs_by_uid[2]
    assert set(s.leases) == {second} and s.versions == {first: 1, third: 1}

    def take(now: float) -> list[tuple[int, int]]:
        picks = s.take(10, now)
        if picks:
            restarted.apply(picks.record(2, now + 10))
        return picks.out

    assert take(10.0) == []  # the key waits for its leased member
    assert take(65.0) == [(first, 2), (second, 2)]
    restarted.apply(R.Ack(2, [first, second]))
    assert take(65.0) == [(third, 2)]

