"""The durable state of an ordered subscription is what a replay of its log gives (recovery, a replica), also
after a lease ran out: `make sim` seed 18470 found the two apart. Time ends a lease at its own deadline only (a
replay cannot tell when an Ack record, which carries no time, came): an expiry leaves a later member of its key's
batch leased until that member's own deadline, ack or nack — the batch goes out again once none of it is
leased — and only a nack, a record with its time, ends the later members' leases with its own."""

from __future__ import annotations

from google.pubsub_v1 import types
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.broker.resources import Topic
from pigeon.broker.state import BrokerState
from pigeon.broker.topic import SHARD_MASK
from pigeon.core import limits
from pigeon.storage import records as R
from pigeon.testing.shard_check import restarted

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
    again = restarted(live)
    again.rebuild(10.0)
    s = again.subs_by_uid[2]
    assert set(s.leases) == {second} and s.versions == {first: 1, third: 1}

    def take(now: float) -> list[tuple[int, int]]:
        picks = s.take(10, now)
        if picks:
            again.apply(picks.record(2, now + 10))
        return picks.out

    assert take(10.0) == []  # the key waits for its leased member
    assert take(65.0) == [(first, 2), (second, 2)]
    again.apply(R.Ack(2, [first, second]))
    assert take(65.0) == [(third, 2)]


# --- any sequence ------------------------------------------------------------------------------------------------
KEYS = (7, 7, 8, 9, 0)  # three ordering keys' hashes (7 the busiest) and keyless (0)
SUB = 2


class _Run:
    """An ordered subscription (two shards) driven as the executor drives it — every record appended to a log,
    then applied — with the clock, `expire` and restarts between records."""

    def __init__(self, backoff: bool):
        self.log: list[tuple[R.Record, int]] = []
        self.state = BrokerState()
        self.now = 0.0
        self.record(R.TopicPut(1, 2, Topic(name="projects/p/topics/t").SerializeToString()))
        config = types.Subscription.pb()(name="projects/p/subscriptions/s", topic="projects/p/topics/t",
                                         ack_deadline_seconds=10, enable_message_ordering=True)
        if backoff:
            config.retry_policy.minimum_backoff.seconds = 1
        self.record(R.SubPut(SUB, 1, config.SerializeToString(), self.state.topics_by_uid[1].backlog_end()))
        self.key_of: dict[int, int] = {}  # message number → its key's hash
        self.handed: set[int] = set()  # numbers handed out at least once

    @property
    def sub(self):
        return self.state.subs_by_uid[SUB]

    def record(self, rec: R.Record) -> None:
        self.log.append((rec, len(self.log)))
        self.state.apply(rec, len(self.log) - 1)

    def replayed(self) -> BrokerState:
        fresh = BrokerState()
        fresh.dispatch_off()
        for rec, at in self.log:
            fresh.apply(rec, at)
        return fresh

    def publish(self, shard: int, count: int, key: int) -> None:
        """A batch on `shard` — a keyed one on its key's shard (a key hashes to one shard: per-key order is
        shard order)."""
        shard = key % 2 if key else shard
        ix = self.state.topics_by_uid[1].shards[shard]
        base = ix.next
        self.record(R.Publish(1, shard, base, int(self.now * 1000), count, key, b""))
        self.state.all_durable()
        for o in range(base, base + count):
            self.key_of[(o << limits.shard_bits) | shard] = key

    def take(self, max_messages: int, per_key_max: int, deadline_s: float, keep: int | None) -> None:
        s = self.sub
        picks = s.take(max_messages, self.now, per_key_max)
        if keep is not None and keep < len(picks.out):
            s.untake(picks, keep)
        before: set[int] = set()
        for n, _ in picks.out:  # per key, nothing before an earlier message of its key that is not acked
            key, shard = self.key_of[n], n & SHARD_MASK
            if key:
                assert not [m for m, k in self.key_of.items() if k == key and m & SHARD_MASK == shard and m < n
                            and m not in before and not s.is_acked(m)], f"{n} went out before an earlier one"
            before.add(n)
        if picks:
            self.record(picks.record(SUB, self.now + deadline_s))
            self.handed.update(n for n, _ in picks.out)

    def restart(self) -> None:
        """Recovery: the state is the replay of the log, dispatching again from now."""
        self.state = self.replayed()
        self.state.rebuild(self.now)


_OPS = ["publish"] + ["take"] * 4 + ["ack"] * 2 + ["modack"] * 3 + ["advance"] * 3 + ["restart"]


@settings(max_examples=300, deadline=None)
@given(backoff=st.booleans(), data=st.data())
def test_any_sequence_on_an_ordered_subscription_replays_to_the_live_state(backoff, data):
    """Random publishes with a few keys, takes (some cut short by flow control), acks, extensions and nacks
    (current, any or stale versions; at times of leases that ran out by then, seen by `expire` or not), the
    clock moving with or without `expire`, restarts: after every step a replay of the log gives the live
    state's acks, running leases and delivery counts, and per key nothing goes out before an earlier message."""
    run = _Run(backoff)
    draw = data.draw
    for shard, count, key in draw(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 4), st.sampled_from(KEYS)),
                                           min_size=1, max_size=6), label="published"):
        run.publish(shard, count, key)
    for _ in range(draw(st.integers(1, 40), label="steps")):
        s = run.sub
        op = draw(st.sampled_from(_OPS), label="op")
        if op == "publish":
            run.publish(draw(st.integers(0, 1)), draw(st.integers(1, 4)), draw(st.sampled_from(KEYS)))
        elif op == "take":
            run.take(draw(st.integers(1, 8), label="max"), draw(st.sampled_from([0, 0, 0, 1]), label="per key"),
                     draw(st.sampled_from([1.0, 10.0, 10.0, 60.0]), label="deadline"),
                     draw(st.none() | st.integers(0, 4), label="keep"))
        elif op == "ack":
            pool = sorted(run.handed | set(s.leases)) or sorted(run.key_of)
            run.record(R.Ack(SUB, draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4), label="acked")))
        elif op == "modack":
            if draw(st.booleans(), label="expire first"):  # as commands.modacks: the record names running leases
                s.expire(run.now)
            pool = sorted(s.leases) or sorted(run.handed)
            later = [n for n in pool if n in s.leases and any(  # members behind an earlier leased one of their key
                m < n and lease[3] and lease[3] == s.leases[n][3] for m, lease in s.leases.items())]
            if later and draw(st.booleans(), label="a later member"):
                pool = later
            if not pool:
                continue
            nums = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True), label="nums")
            current = [s.leases[n][1] if n in s.leases else 1 for n in nums]
            which = draw(st.sampled_from(["current", "current", "any", "stale"]), label="versions")
            versions = {"current": current, "any": [0] * len(nums), "stale": [v + 1 for v in current]}[which]
            seconds = draw(st.sampled_from([0, 0, 15, 60, 60]), label="seconds")
            run.record(R.Modack(SUB, run.now, seconds, nums, versions))
        elif op == "advance":
            run.now += draw(st.sampled_from([0.5, 1.0, 5.0, 9.99, 10.0, 10.0, 30.0, 61.0]), label="dt")
            if draw(st.booleans(), label="expire"):
                s.expire(run.now)
        else:
            run.restart()
        replayed = run.replayed().subs_by_uid[SUB]
        assert _normalized(replayed, run.now) == _normalized(run.sub, run.now), run.log[-1][0]
