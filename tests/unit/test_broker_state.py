"""broker.state: BrokerState.apply of metadata records, and checkpoint round trips (the state written as the
records that recreate it plus compact images, read back into an empty state)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pigeon.broker import images
from pigeon.core import names
from pigeon.core.errors import InvalidArgument, NotFound
from pigeon.broker.state import BrokerState, Contradiction
from pigeon.broker.resources import Snapshot, Subscription, Topic
from pigeon.storage import checkpoint as ck
from pigeon.storage import records as R

TOPICS = [f"projects/p/topics/top{i}" for i in range(3)]
SUBS = [f"projects/p/subscriptions/sub{i}" for i in range(4)]
SNAPS = [f"projects/p/snapshots/snap{i}" for i in range(2)]


def topic_put(uid, name, shards=2, **labels):
    t = Topic(name=name)
    t.labels.update(labels)
    return R.TopicPut(uid, shards, t.SerializeToString())


def sub_put(uid, name, topic_uid, topic_name, ack=10, start=None, **extra):
    s = Subscription(name=name, topic=topic_name, ack_deadline_seconds=ack, **extra)
    return R.SubPut(uid, topic_uid or 0, s.SerializeToString(), start)


def new_sub(r: BrokerState, uid, name, topic_uid, topic_name, **kw):
    """A SubPut that creates: it starts at the end of each shard of the topic (as commands make it)."""
    return sub_put(uid, name, topic_uid, topic_name, start=r.topics_by_uid[topic_uid].backlog_end(), **kw)


def snap_put(name, topic_uid, floors=None, acked=None, **labels):
    s = Snapshot(name=name, topic="projects/p/topics/x")
    s.labels.update(labels)
    return R.SnapPut(topic_uid, s.SerializeToString(), floors, acked)


def summary(r: BrokerState) -> dict:
    """Everything a restart must preserve, as plain values."""
    return {
        "next_uid": r.next_uid,
        "topics": {n: (t.uid, len(t.shards), dict(t.config.labels)) for n, t in r.topics.items()},
        "topics_by_uid": {u: (t.name, t.deleted, sorted(t.subscriptions)) for u, t in r.topics_by_uid.items()},
        "subs": {n: (s.uid, s.topic.uid if s.topic else None, s.config.topic, s.config.ack_deadline_seconds,
                     s.detached) for n, s in r.subs.items()},
        "subs_by_uid": sorted(r.subs_by_uid),
        "snaps": {n: (s.topic_uid, s.floors, s.acked, dict(s.config.labels)) for n, s in r.snapshots.items()},
        "census": {k: v for k, v in r.census.items() if v},
    }


def restored(r: BrokerState) -> BrokerState:
    """Through a checkpoint: encoded, decoded and loaded into an empty state."""
    buf = b"".join(ck.encode(ck.Header(0, r.next_uid), images.meta_records(r), images.images(r)))
    header, meta, imgs = ck.decode(buf)
    back = BrokerState()
    for rec in meta:
        back.apply(rec)
    for image in imgs:
        back.restore(image)
    back.next_uid = max(back.next_uid, header.next_uid)
    return back


def exported(r: BrokerState) -> list[bytes]:
    return ck.encode(ck.Header(0, r.next_uid), images.meta_records(r), images.images(r))


# --- direct examples ---------------------------------------------------------------------------
def test_topic_put_creates_and_updates():
    r = BrokerState()
    r.apply(topic_put(5, TOPICS[0], shards=3, a="1"))
    t = r.topic(TOPICS[0])
    assert t.uid == 5 and len(t.shards) == 3 and r.topics_by_uid[5] is t
    assert r.next_uid == 6
    r.apply(topic_put(5, TOPICS[0], shards=3, a="2"))
    assert r.topic(TOPICS[0]) is t and t.config.labels["a"] == "2"
    assert r.next_uid == 6


def test_sub_put_attaches_to_topic_and_starts_at_the_end():
    r = BrokerState()
    r.apply(topic_put(1, TOPICS[0]))
    t = r.topic(TOPICS[0])
    t.shards[0].append(3, 0, 0)
    t.shards[0].durable = t.shards[0].visible = 3
    r.apply(new_sub(r, 2, SUBS[0], 1, TOPICS[0]))
    s = r.sub(SUBS[0])
    assert s.topic is t and 2 in t.subscriptions
    assert not s.take(10, 0.0)  # messages published before the subscription existed
    assert s.export_state() == ([3, 0], [[], []])
    r.apply(sub_put(3, SUBS[1], 1, TOPICS[0], start=[1, 0]))
    assert r.sub(SUBS[1]).export_state() == ([1, 0], [[], []])
    assert r.next_uid == 4


def test_sub_put_update_keeps_state_and_sets_detached():
    r = BrokerState()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(new_sub(r, 2, SUBS[0], 1, TOPICS[0]))
    s = r.sub(SUBS[0])
    r.apply(sub_put(2, SUBS[0], 1, TOPICS[0], ack=30, detached=True))
    assert r.sub(SUBS[0]) is s
    assert s.config.ack_deadline_seconds == 30 and s.detached


def test_topic_delete_with_subscriptions_keeps_them_working():
    r = BrokerState()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(new_sub(r, 2, SUBS[0], 1, TOPICS[0]))
    r.apply(R.TopicDel(1))
    assert TOPICS[0] not in r.topics
    assert r.topics_by_uid[1].deleted
    assert r.sub(SUBS[0]).config.topic == names.DELETED_TOPIC
    with pytest.raises(NotFound):
        r.topic(TOPICS[0])
    r.apply(R.SubDel(2))
    assert 1 not in r.topics_by_uid
    assert SUBS[0] not in r.subs and 2 not in r.subs_by_uid


def test_topic_delete_without_subscriptions_forgets_it():
    r = BrokerState()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(R.TopicDel(1))
    assert r.topics == {} and r.topics_by_uid == {}
    with pytest.raises(Contradiction):
        r.apply(R.TopicDel(1))


def test_sub_reset_and_snapshots():
    r = BrokerState()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(new_sub(r, 2, SUBS[0], 1, TOPICS[0]))
    r.apply(R.Seek(2, [4, 1], [[6], []]))
    assert r.sub(SUBS[0]).export_state() == ([4, 1], [[6], []])
    r.apply(snap_put(SNAPS[0], 1, [4, 1], [[6], []], x="1"))
    sn = r.snapshot(SNAPS[0])
    assert (sn.topic_uid, sn.floors, sn.acked) == (1, [4, 1], [[6], []])
    r.apply(snap_put(SNAPS[0], 1, x="2"))  # an update (labels) keeps the ack state
    sn = r.snapshot(SNAPS[0])
    assert (sn.floors, sn.acked, sn.config.labels["x"]) == ([4, 1], [[6], []], "2")
    r.apply(R.SnapDel(SNAPS[0]))
    with pytest.raises(NotFound):
        r.snapshot(SNAPS[0])
    r.apply(R.SnapDel(SNAPS[0]))  # idempotent


def test_lookups_check_names_first():
    r = BrokerState()
    with pytest.raises(InvalidArgument):
        r.topic("projects/p/topics/x")  # id too short
    with pytest.raises(InvalidArgument):
        r.sub("projects/p/topics/abc")  # wrong kind
    with pytest.raises(NotFound):
        r.sub(SUBS[0])
    with pytest.raises(NotFound):
        r.snapshot(SNAPS[0])


def test_records_that_do_not_fit_are_contradictions():
    r = BrokerState()
    r.apply(topic_put(1, TOPICS[0]))
    with pytest.raises(Contradiction):
        r.apply(topic_put(2, TOPICS[0]))  # the name is taken
    with pytest.raises(Contradiction):
        r.apply(R.Publish(1, 0, 5, 0, 1, 0, b""))  # shard 0 is at offset 0
    with pytest.raises(Contradiction):
        r.apply(R.Publish(9, 0, 0, 0, 1, 0, b""))  # no such topic
    with pytest.raises(Contradiction):
        r.apply(sub_put(3, SUBS[0], 9, TOPICS[1], start=[0]))  # no such topic
    with pytest.raises(Contradiction):
        r.apply(sub_put(3, SUBS[0], 1, TOPICS[0]))  # created without its start offsets
    assert r.apply(R.Ack(77, [1, 2])) is None  # a deleted subscription's data record: dead, changes nothing


def test_restore_after_a_topic_name_is_reused():
    """A deleted topic kept alive by its subscription, and a new topic with the same name."""
    r = BrokerState()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(new_sub(r, 2, SUBS[0], 1, TOPICS[0]))
    r.apply(R.TopicDel(1))
    r.apply(topic_put(3, TOPICS[0]))
    assert r.topic(TOPICS[0]).uid == 3
    back = restored(r)
    assert summary(back) == summary(r)
    assert back.topic(TOPICS[0]).uid == 3


def test_restore_meta_round_trip_example():
    r = BrokerState()
    r.apply(topic_put(1, TOPICS[0], shards=4, env="x"))
    r.apply(topic_put(2, TOPICS[1]))
    r.apply(new_sub(r, 3, SUBS[0], 1, TOPICS[0], ack=20))
    r.apply(new_sub(r, 4, SUBS[1], 2, TOPICS[1], detached=True))
    r.apply(R.TopicDel(2))
    r.apply(snap_put(SNAPS[0], 1, [0, 0, 0, 0], [[], [1], [], []]))
    r.next_uid = 10
    back = restored(r)
    assert summary(back) == summary(r)
    assert exported(back) == exported(r)


# --- random histories --------------------------------------------------------------------------
class StateMachine(RuleBasedStateMachine):
    @initialize()
    def init(self):
        self.r = BrokerState()
        self.live_topics: dict[str, int] = {}  # name → uid
        self.subs: dict[str, int] = {}  # name → uid

    def uid(self) -> int:
        return self.r.next_uid

    @rule(name=st.sampled_from(TOPICS), shards=st.integers(1, 4), label=st.sampled_from(["a", "b"]))
    def put_topic(self, name, shards, label):
        uid = self.live_topics.get(name) or self.uid()
        self.r.apply(topic_put(uid, name, shards, l=label))
        self.live_topics[name] = uid
        assert self.r.topic(name).uid == uid

    @precondition(lambda self: self.live_topics)
    @rule(data=st.data())
    def delete_topic(self, data):
        name = data.draw(st.sampled_from(sorted(self.live_topics)))
        uid = self.live_topics.pop(name)
        self.r.apply(R.TopicDel(uid))
        assert name not in self.r.topics

    @precondition(lambda self: self.live_topics)
    @rule(name=st.sampled_from(SUBS), data=st.data(), ack=st.integers(10, 600), detached=st.booleans())
    def put_sub(self, name, data, ack, detached):
        if name in self.subs:
            s = self.r.sub(name)
            c = sub_put(s.uid, name, s.topic.uid if s.topic else None, s.config.topic, ack=ack, detached=detached)
        else:
            topic = data.draw(st.sampled_from(sorted(self.live_topics)))
            c = new_sub(self.r, self.uid(), name, self.live_topics[topic], topic, ack=ack, detached=detached)
        self.r.apply(c)
        self.subs[name] = c.uid
        assert self.r.sub(name).config.ack_deadline_seconds == ack

    @precondition(lambda self: self.subs)
    @rule(data=st.data())
    def delete_sub(self, data):
        name = data.draw(st.sampled_from(sorted(self.subs)))
        self.r.apply(R.SubDel(self.subs.pop(name)))

    @precondition(lambda self: self.subs)
    @rule(data=st.data(), snap=st.sampled_from(SNAPS))
    def put_snapshot(self, data, snap):
        s = self.r.sub(data.draw(st.sampled_from(sorted(self.subs))))
        if s.topic is None:
            return
        self.r.apply(snap_put(snap, s.topic.uid, *s.export_state()))

    @rule(snap=st.sampled_from(SNAPS))
    def delete_snapshot(self, snap):
        self.r.apply(R.SnapDel(snap))

    @invariant()
    def consistent(self):
        r = self.r
        assert set(r.topics) == set(self.live_topics)
        for name, uid in self.live_topics.items():
            assert r.topics[name].uid == uid and r.topics_by_uid[uid] is r.topics[name]
        assert set(r.subs) == set(self.subs)
        for t in r.topics_by_uid.values():
            assert not t.deleted or t.subscriptions, "a deleted topic without subscriptions is kept"
            for u in t.subscriptions:
                assert r.subs_by_uid[u].topic is t
        for s in r.subs.values():
            if s.topic is not None and s.topic.deleted:
                assert s.config.topic == names.DELETED_TOPIC
        used = set(r.topics_by_uid) | set(r.subs_by_uid)
        assert all(u < r.next_uid for u in used)
        # the census the quotas read counts what exists, however it came to be
        counted = {("p", "topics"): len(r.topics), ("p", "subscriptions"): len(r.subs),
                   ("p", "snapshots"): len(r.snapshots), (None, None): len(r.topics) + len(r.subs) + len(r.snapshots)}
        assert {k: v for k, v in r.census.items() if v} == {k: v for k, v in counted.items() if v}

    @invariant()
    def checkpoint_round_trip(self):
        back = restored(self.r)
        assert summary(back) == summary(self.r)
        assert exported(back) == exported(self.r)


StateMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=25, deadline=None)
TestStateHistories = StateMachine.TestCase


def test_a_reset_bundle_log_applied_again_rebuilds_exactly_its_topics():
    """A node taking a bundle over resets the bundle's state (Reset) and applies its log again: the result is
    the state before, and topics of other bundles are never touched."""
    from pigeon.core import limits
    from pigeon.core.bundles import bundle_log

    bundles = 4
    names_ = [f"projects/p/topics/t{i}" for i in range(40)]
    mine = next(n for n in names_ if bundle_log(n, bundles) == 1)
    other = next(n for n in names_ if bundle_log(n, bundles) != 1)
    r = BrokerState()
    r.apply(topic_put(1, mine))
    r.apply(topic_put(2, other))
    r.apply(new_sub(r, 3, SUBS[0], 1, mine))
    r.apply(new_sub(r, 4, SUBS[1], 2, other))
    bits = limits.shard_bits  # a message number is offset << bits | shard
    log = [R.Publish(1, 0, 0, 1000, 5, 0, b""), R.Publish(1, 1, 0, 1001, 3, 0, b""),
           R.Deliver(3, 99.0, [0 << bits, 1 << bits]), R.Ack(3, [0 << bits]), R.Publish(1, 0, 5, 1002, 2, 0, b"")]
    for at, rec in enumerate(log):
        r.apply(rec, at)
    r.apply(R.Publish(2, 0, 0, 1000, 4, 0, b""), 100)
    r.apply(R.Ack(4, [0]))
    before = exported(r)

    r.apply(R.Reset(1, bundles))
    t, s = r.topics_by_uid[1], r.subs_by_uid[3]
    assert [ix.next for ix in t.shards] == [0, 0] and not s.leases and s.backlog() == 0
    assert r.topics_by_uid[2].shards[0].next == 4, "a topic of another bundle is untouched"
    assert exported(r) != before
    for at, rec in enumerate(log):
        r.apply(rec, at)
    r.resume_log(1, bundles, 0.0)
    assert exported(r) == before


def test_a_bundle_snapshot_and_the_log_after_it_rebuild_the_state():
    """An owner writes its bundle's state into the log (Snapshot), message indexes included; a node taking the
    bundle over reads the log from there: Reset, the snapshot, the entries after it — the same state as applying
    the whole log, indexes and the addresses of their batches too (invariant S2, docs/cluster.md)."""
    from pigeon.core import limits
    from pigeon.core.bundles import bundle_log

    bundles = 4
    names_ = [f"projects/p/topics/t{i}" for i in range(40)]
    mine = next(n for n in names_ if bundle_log(n, bundles) == 1)
    other = next(n for n in names_ if bundle_log(n, bundles) != 1)
    bits = limits.shard_bits

    def fresh() -> BrokerState:
        r = BrokerState()
        r.apply(topic_put(1, mine))
        r.apply(topic_put(2, other))
        r.apply(new_sub(r, 3, SUBS[0], 1, mine))
        r.apply(new_sub(r, 4, SUBS[1], 2, other))
        r.apply(new_sub(r, 5, SUBS[2], 1, mine, enable_message_ordering=True))
        return r

    n = lambda offset, shard=0: offset << bits | shard  # noqa: E731
    before = [R.Publish(1, 0, 0, 1000, 5, 0, b""), R.Publish(1, 1, 0, 1001, 3, 7, b""),
              R.Deliver(3, 99.0, [n(0), n(1), n(0, 1)]), R.Ack(3, [n(0)]), R.Modack(3, 50.0, 30, [n(1)], [1]),
              R.Deliver(5, 80.0, [n(0, 1), n(1, 1)], keys=[7, 7])]
    after = [R.Publish(1, 0, 5, 1002, 2, 0, b""), R.Ack(3, [n(i) for i in range(1, 7)] + [n(i, 1) for i in range(3)]),
             R.Ack(5, [n(i) for i in range(7)] + [n(i, 1) for i in range(3)]),
             R.Publish(1, 1, 3, 1003, 4, 7, b""), R.Deliver(3, 120.0, [n(3, 1), n(4, 1)]), R.Ack(5, [n(3, 1)])]
    whole = fresh()
    for at, rec in enumerate(before + after):
        whole.apply(rec, at)
    whole.apply(R.Publish(2, 0, 0, 1000, 4, 0, b""), 100)

    owner = fresh()
    for at, rec in enumerate(before):
        owner.apply(rec, at)
    snap = images.bundle_snapshot(owner, 1, bundles)
    snap = R.decode(R.RecordType.SNAPSHOT, b"".join(snap.parts()))  # as the log carries it
    assert images.bundle_need(owner, 1, bundles) == 0, "the snapshot's messages are still needed"
    assert images.bundle_need(owner, 1, bundles, lambda a: a + 7) == 7, "as addresses the owner names"

    taker = fresh()  # another node: other bundles' state of its own, this bundle's from the log
    taker.apply(R.Publish(1, 0, 0, 999, 1, 0, b""), 200)  # stale state of the bundle, which Reset drops
    taker.apply(R.Publish(2, 0, 0, 1000, 4, 0, b""), 100)
    taker.apply(R.Reset(1, bundles))
    taker.apply(snap)
    for at, rec in enumerate(after, start=len(before)):
        taker.apply(rec, at)
    taker.resume_log(1, bundles, 0.0)
    whole.resume_log(1, bundles, 0.0)
    assert exported(taker) == exported(whole)
    for r in (whole, taker):
        r.trim_indexes(0.0)  # the batches of the messages acked everywhere go
    assert images.bundle_need(whole, 1, bundles) == len(before) + 3, "only the batch published after the cut is needed"
    assert exported(taker) == exported(whole)


def test_a_snapshot_skips_what_was_deleted_since():
    r = BrokerState()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(new_sub(r, 3, SUBS[0], 1, TOPICS[0]))
    from pigeon.core.bundles import bundle_log

    snap = images.bundle_snapshot(r, bundle_log(TOPICS[0], 4), 4)
    r.apply(R.SubDel(3))
    r.apply(snap)  # the subscription's image finds no subscription: nothing to load, no Contradiction
    assert 3 not in r.subs_by_uid and r.topics_by_uid[1].shards[0].next == 0
