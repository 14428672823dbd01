"""broker.registry: Registry.apply of metadata changes, and export_meta/restore_meta round trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pigeon.core import names
from pigeon.core.errors import InvalidArgument, NotFound
from pigeon.broker.registry import Registry, pb64
from pigeon.broker.resources import Snapshot, Subscription, Topic

TOPICS = [f"projects/p/topics/top{i}" for i in range(3)]
SUBS = [f"projects/p/subscriptions/sub{i}" for i in range(4)]
SNAPS = [f"projects/p/snapshots/snap{i}" for i in range(2)]


def topic_put(uid, name, shards=2, **labels):
    t = Topic(name=name)
    t.labels.update(labels)
    return {"op": "topic.put", "uid": uid, "pb": pb64(t), "shards": shards}


def sub_put(uid, name, topic_uid, topic_name, ack=10, **extra):
    s = Subscription(name=name, topic=topic_name, ack_deadline_seconds=ack, **extra)
    return {"op": "sub.put", "uid": uid, "topic": topic_uid, "pb": pb64(s)}


def snap_put(name, topic_uid, floors=None, acked=None, **labels):
    s = Snapshot(name=name, topic="projects/p/topics/x")
    s.labels.update(labels)
    c = {"op": "snap.put", "pb": pb64(s), "topic": topic_uid}
    if floors is not None:
        c["floors"] = floors
        c["acked"] = acked
    return c


def summary(r: Registry) -> dict:
    """Everything a restart must preserve, as plain values."""
    return {
        "next_uid": r.next_uid,
        "topics": {n: (t.uid, len(t.shards), dict(t.config.labels)) for n, t in r.topics.items()},
        "topics_by_uid": {u: (t.name, t.deleted, sorted(t.subscriptions)) for u, t in r.topics_by_uid.items()},
        "subs": {n: (s.uid, s.topic.uid if s.topic else None, s.config.topic, s.config.ack_deadline_seconds,
                     s.detached) for n, s in r.subs.items()},
        "subs_by_uid": sorted(r.subs_by_uid),
        "snaps": {n: (s.topic_uid, s.floors, s.acked, dict(s.config.labels)) for n, s in r.snapshots.items()},
    }


def restored(r: Registry) -> Registry:
    meta = json.loads(json.dumps(r.export_meta()))  # it goes through JSON in a checkpoint
    back = Registry()
    back.restore_meta(meta)
    return back


# --- direct examples ---------------------------------------------------------------------------
def test_topic_put_creates_and_updates():
    r = Registry()
    r.apply(topic_put(5, TOPICS[0], shards=3, a="1"))
    t = r.topic(TOPICS[0])
    assert t.uid == 5 and len(t.shards) == 3 and r.topics_by_uid[5] is t
    assert r.next_uid == 6
    r.apply(topic_put(5, TOPICS[0], shards=3, a="2"))
    assert r.topic(TOPICS[0]) is t and t.config.labels["a"] == "2"
    assert r.next_uid == 6


def test_sub_put_attaches_to_topic_and_starts_at_the_end():
    r = Registry()
    r.apply(topic_put(1, TOPICS[0]))
    t = r.topic(TOPICS[0])
    t.shards[0].append(3, 0, 0)
    t.shards[0].durable = 3
    r.apply(sub_put(2, SUBS[0], 1, TOPICS[0]))
    s = r.sub(SUBS[0])
    assert s.topic is t and 2 in t.subscriptions
    assert s.take(10, 0.0, 10) == []  # messages published before the subscription existed
    assert s.export_state() == ([3, 0], [[], []])
    r.apply(sub_put(3, SUBS[1], 1, TOPICS[0]) | {"start": [1, 0]})
    assert r.sub(SUBS[1]).export_state() == ([1, 0], [[], []])
    assert r.next_uid == 4


def test_sub_put_update_keeps_state_and_sets_detached():
    r = Registry()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(sub_put(2, SUBS[0], 1, TOPICS[0]))
    s = r.sub(SUBS[0])
    r.apply(sub_put(2, SUBS[0], 1, TOPICS[0], ack=30, detached=True))
    assert r.sub(SUBS[0]) is s
    assert s.config.ack_deadline_seconds == 30 and s.detached


def test_topic_delete_with_subscriptions_keeps_them_working():
    r = Registry()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(sub_put(2, SUBS[0], 1, TOPICS[0]))
    r.apply({"op": "topic.del", "uid": 1})
    assert TOPICS[0] not in r.topics
    assert r.topics_by_uid[1].deleted
    assert r.sub(SUBS[0]).config.topic == names.DELETED_TOPIC
    with pytest.raises(NotFound):
        r.topic(TOPICS[0])
    r.apply({"op": "sub.del", "uid": 2})
    assert 1 not in r.topics_by_uid
    assert SUBS[0] not in r.subs and 2 not in r.subs_by_uid


def test_topic_delete_without_subscriptions_forgets_it():
    r = Registry()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply({"op": "topic.del", "uid": 1})
    assert r.topics == {} and r.topics_by_uid == {}


def test_sub_reset_and_snapshots():
    r = Registry()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(sub_put(2, SUBS[0], 1, TOPICS[0]))
    r.apply({"op": "sub.reset", "uid": 2, "floors": [4, 1], "acked": [[6], []]})
    assert r.sub(SUBS[0]).export_state() == ([4, 1], [[6], []])
    r.apply(snap_put(SNAPS[0], 1, [4, 1], [[6], []], x="1"))
    sn = r.snapshot(SNAPS[0])
    assert (sn.topic_uid, sn.floors, sn.acked) == (1, [4, 1], [[6], []])
    r.apply(snap_put(SNAPS[0], 1, x="2"))  # an update (labels) keeps the ack state
    sn = r.snapshot(SNAPS[0])
    assert (sn.floors, sn.acked, sn.config.labels["x"]) == ([4, 1], [[6], []], "2")
    r.apply({"op": "snap.del", "name": SNAPS[0]})
    with pytest.raises(NotFound):
        r.snapshot(SNAPS[0])
    r.apply({"op": "snap.del", "name": SNAPS[0]})  # idempotent


def test_lookups_check_names_first():
    r = Registry()
    with pytest.raises(InvalidArgument):
        r.topic("projects/p/topics/x")  # id too short
    with pytest.raises(InvalidArgument):
        r.sub("projects/p/topics/abc")  # wrong kind
    with pytest.raises(NotFound):
        r.sub(SUBS[0])
    with pytest.raises(NotFound):
        r.snapshot(SNAPS[0])


def test_unknown_change_is_refused():
    with pytest.raises(AssertionError):
        Registry().apply({"op": "nope"})


def test_restore_after_a_topic_name_is_reused():
    """A deleted topic kept alive by its subscription, and a new topic with the same name."""
    r = Registry()
    r.apply(topic_put(1, TOPICS[0]))
    r.apply(sub_put(2, SUBS[0], 1, TOPICS[0]))
    r.apply({"op": "topic.del", "uid": 1})
    r.apply(topic_put(3, TOPICS[0]))
    assert r.topic(TOPICS[0]).uid == 3
    back = restored(r)
    assert summary(back) == summary(r)
    assert back.topic(TOPICS[0]).uid == 3


def test_restore_meta_round_trip_example():
    r = Registry()
    r.apply(topic_put(1, TOPICS[0], shards=4, env="x"))
    r.apply(topic_put(2, TOPICS[1]))
    r.apply(sub_put(3, SUBS[0], 1, TOPICS[0], ack=20))
    r.apply(sub_put(4, SUBS[1], 2, TOPICS[1], detached=True))
    r.apply({"op": "topic.del", "uid": 2})
    r.apply(snap_put(SNAPS[0], 1, [0, 0, 0, 0], [[], [1], [], []]))
    r.next_uid = 10
    back = restored(r)
    assert summary(back) == summary(r)
    assert back.export_meta() == r.export_meta()


# --- random histories --------------------------------------------------------------------------
class RegistryMachine(RuleBasedStateMachine):
    @initialize()
    def init(self):
        self.r = Registry()
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
        self.r.apply({"op": "topic.del", "uid": uid})
        assert name not in self.r.topics

    @precondition(lambda self: self.live_topics)
    @rule(name=st.sampled_from(SUBS), data=st.data(), ack=st.integers(10, 600), detached=st.booleans())
    def put_sub(self, name, data, ack, detached):
        if name in self.subs:
            s = self.r.sub(name)
            c = sub_put(s.uid, name, s.topic.uid if s.topic else None, s.config.topic, ack=ack, detached=detached)
        else:
            topic = data.draw(st.sampled_from(sorted(self.live_topics)))
            c = sub_put(self.uid(), name, self.live_topics[topic], topic, ack=ack, detached=detached)
        self.r.apply(c)
        self.subs[name] = c["uid"]
        assert self.r.sub(name).config.ack_deadline_seconds == ack

    @precondition(lambda self: self.subs)
    @rule(data=st.data())
    def delete_sub(self, data):
        name = data.draw(st.sampled_from(sorted(self.subs)))
        self.r.apply({"op": "sub.del", "uid": self.subs.pop(name)})

    @precondition(lambda self: self.subs)
    @rule(data=st.data(), snap=st.sampled_from(SNAPS))
    def put_snapshot(self, data, snap):
        s = self.r.sub(data.draw(st.sampled_from(sorted(self.subs))))
        if s.topic is None:
            return
        self.r.apply(snap_put(snap, s.topic.uid, *s.export_state()))

    @rule(snap=st.sampled_from(SNAPS))
    def delete_snapshot(self, snap):
        self.r.apply({"op": "snap.del", "name": snap})

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

    @invariant()
    def checkpoint_round_trip(self):
        back = restored(self.r)
        assert summary(back) == summary(self.r)
        assert back.export_meta() == self.r.export_meta()


RegistryMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=25, deadline=None)
TestRegistryHistories = RegistryMachine.TestCase
