"""The durable state of an ordered subscription is what a replay of its log gives (recovery, a replica), also
after a lease ran out: `make sim` seed 18470 found the two apart."""

from __future__ import annotations

import pytest
from google.pubsub_v1 import types

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


@pytest.mark.xfail(strict=True, reason="a batch member's extended lease ends live when an earlier member's runs "
                                       "out, but stays in a replay once that member is acked (make sim seed 18470)")
def test_an_extended_lease_of_a_keys_batch_is_the_same_live_and_replayed():
    """A key's batch of three goes out; the client extends the second's lease (60 s), the first's runs out (the
    live state sends the rest of the batch back with it, the second's lease ending too), then the client acks the
    first and the third late. A replay of the same records — Deliver, Modack, Ack — must end where the live
    state is."""
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
