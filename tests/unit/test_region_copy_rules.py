"""Cross-region copies' rules (docs/regions.md, "Cross-region copies"): which shards a region stores as copies,
where their records go, that a copy is held back from delivery until its region is declared lost, how a copy
starts over past what its region no longer held, and which settings are refused."""

from __future__ import annotations

import pytest
from google.protobuf import field_mask_pb2

from pigeon.api.proto import pigeon_ranges_pb2 as ranges_pb
from pigeon.broker import commands
from pigeon.broker.resources import Subscription, Topic
from pigeon.broker.restore import Contradiction
from pigeon.broker.state import BrokerState
from pigeon.core.bundles import shard_log
from pigeon.core.errors import InvalidArgument
from pigeon.core.pubsub_types import types
from pigeon.core.regions import COPY_LABEL, Region, copy_shards, is_region_log
from pigeon.node.copies import publish_request, split_batches
from pigeon.storage import records as R

BUNDLES = 16
EAST, WEST = Region("east", 0, 4), Region("west", 1, 4)
NAME = "projects/p/topics/copied"


def _state(region: Region | None, copy_to: str | None = "east", shards: int = 8):
    state = BrokerState()
    state.region = region
    labels = {COPY_LABEL: copy_to} if copy_to else {}
    state.apply(commands.create_topic(state, Topic(name=NAME, labels=labels), shards))
    return state, state.topics[NAME]


def _subscribe(state, name="projects/p/subscriptions/sub"):
    state.apply(commands.create_subscription(state, Subscription(name=name, topic=NAME), ""))
    return state.subs[name]


def _publish(state, t, shard: int, base: int, count: int = 2, ms: int = 1000):
    rec = R.Publish(t.uid, shard, base, ms, count, 0, publish_request(NAME, [b"\x0a\x01x"] * count))
    state.apply(rec, at=base + 1)
    return rec


def test_the_copy_region_stores_every_other_regions_shards_as_copies():
    assert copy_shards(EAST, 8, {COPY_LABEL: "east"}) == frozenset(range(2, 8))
    assert copy_shards(WEST, 8, {COPY_LABEL: "east"}) == frozenset()  # (copied from here, not to here)
    assert copy_shards(None, 8, {COPY_LABEL: "east"}) == frozenset()
    assert copy_shards(EAST, 8, {}) == frozenset()
    state, t = _state(EAST)
    logs = state.shard_logs(t, BUNDLES)
    assert t.copies == frozenset(range(2, 8)) and t.local == range(0, 2)
    # a copy lies in one of this region's bundle logs (by its number), not in its region's log
    assert not any(is_region_log(log) for log in logs)
    assert logs[2:] == [shard_log(NAME, k, BUNDLES, False) for k in range(2, 8)]
    # publishes taken here never go to a copy: keyed or not, they stay in the region's own shards
    assert {t.shard_for("") for _ in range(10)} | {t.shard_for(f"k{i}") for i in range(30)} == {0, 1}


def test_a_copy_is_held_back_until_its_region_is_declared_lost():
    state, t = _state(EAST)
    s = _subscribe(state)
    _publish(state, t, 2, 0, count=3)
    _publish(state, t, 0, 0, count=1)  # (one of the region's own)
    state.all_durable()
    assert (t.shards[2].durable, t.shards[2].visible) == (3, 0)  # durable, not to be handed out
    assert (t.shards[0].durable, t.shards[0].visible) == (1, 1)
    assert [n & 63 for n, _ in s.take(10, 0.0).out] == [0]
    assert t.serve_copies(range(2, 4)) == [2, 3]  # west (slot 1) lost: its copies go out from here
    assert t.shards[2].visible == 3 and not t.shards[2].held and 4 in t.held
    assert sorted(n >> 6 for n, _ in s.take(10, 0.0).out) == [0, 1, 2]
    t.clear_data({3, 4})  # (a log applied again: a fresh index keeps the copy's state)
    assert not t.shards[3].held and t.shards[4].held


def test_a_copy_starts_over_past_what_its_region_no_longer_held():
    state, t = _state(EAST)
    s = _subscribe(state)
    _publish(state, t, 2, 10, count=2)  # the region had dropped 0..9 (nobody needed them)
    assert t.shards[2].next == 12 and s.shards[2].floor == 10
    with pytest.raises(Contradiction):  # but a copy holding messages of its own must follow on
        _publish(state, t, 2, 20)
    with pytest.raises(Contradiction):  # and the region's own shards never skip
        _publish(state, t, 0, 5)


def test_copies_are_asked_for_only_where_there_are_regions():
    with pytest.raises(InvalidArgument, match="not a region"):
        _state(None)
    with pytest.raises(InvalidArgument, match="region name"):
        _state(EAST, copy_to="9east")
    state, t = _state(EAST)
    kept = Topic(name=NAME, labels={COPY_LABEL: "east", "team": "a"})
    state.apply(commands.update_topic(state, kept, field_mask_pb2.FieldMask(paths=["labels"])))
    for labels in ({"team": "a"}, {COPY_LABEL: "west"}):
        with pytest.raises(InvalidArgument, match="cannot change"):
            commands.update_topic(state, Topic(name=NAME, labels=labels),
                                  field_mask_pb2.FieldMask(paths=["labels"]))


def test_a_read_range_answer_is_copied_batch_by_batch():
    msgs = [types.PubsubMessage.pb()(data=f"m{i}".encode()).SerializeToString() for i in range(5)]
    resp = ranges_pb.ReadRangeResponse(start_offset=11, next_offset=16, batch_starts=[10, 13, 15],
                                       batch_publish_ms=[100, 200, 300], lengths=b"".join(
                                           len(m).to_bytes(4, "little") for m in msgs), messages=b"".join(msgs))
    got = split_batches(resp)
    assert [(base, ms, len(ms_)) for base, ms, ms_ in got] == [(11, 100, 2), (13, 200, 2), (15, 300, 1)]
    req = types.PublishRequest.pb().FromString(publish_request(NAME, got[0][2]))
    assert req.topic == NAME and [m.data for m in req.messages] == [b"m0", b"m1"]


def test_a_region_keeps_what_its_copy_has_not_read_yet():
    state, t = _state(WEST)  # copied to the east: the west's messages wait for the copy's reads
    assert t.copies == frozenset() and t.copied == [0] * 8
    _publish(state, t, 2, 0, count=2)
    _publish(state, t, 2, 2, count=2)
    state.trim_indexes(0.0)  # no subscription needs them, but the copy has not had them
    assert t.shards[2].first() == 0
    t.copied[2] = 2  # (the copy read from offset 2 on: it has 0..1)
    state.trim_indexes(0.0)
    assert t.shards[2].first() == 2
    _, plain = _state(WEST, copy_to=None)
    assert plain.copied is None


def test_a_held_copy_counts_in_its_region_only():
    state, t = _state(EAST)
    s = _subscribe(state)
    _publish(state, t, 2, 0, count=3)  # a copy of the west's
    _publish(state, t, 0, 0, count=1)  # the east's own
    state.all_durable()
    assert s.backlog() == 1 and s.statistics(10.0).undelivered == 1
    t.serve_copies(range(2, 4))
    assert s.backlog() == 4 and s.statistics(10.0).undelivered == 4


class _Gateways:
    def __init__(self, lost=()):
        self.lost, self.names = set(lost), {0: "east", 1: "west", 2: "north"}

    def holds(self, slot):
        return slot in self.names


def _router(region: Region, lost=()):
    """A router of a node of `region` owning every bundle of its region (the parts another region serves are
    gateways)."""
    from types import SimpleNamespace

    from pigeon.api.router import Router
    from pigeon.core.regions import region_log, slot_of_log

    state, t = _state(region)
    gateways = _Gateways(lost)
    engine = SimpleNamespace(state=state, region=region, config=SimpleNamespace(bundles=BUNDLES),
                             owns=lambda log: not is_region_log(log), check_open=lambda: None)
    cluster = SimpleNamespace(gateways=gateways, info=SimpleNamespace(dial="here:1"),
                              address_of=lambda log: f"gateway-of-{slot_of_log(log)}" if is_region_log(log) else None,
                              region_held=lambda log: gateways.holds(slot_of_log(log)))
    return Router(engine, cluster), t, region_log


def test_a_copy_is_served_by_its_region_until_that_region_is_lost():
    router, t, region_log = _router(EAST)
    parts = router.spread(t)
    assert [(p.owner, p.shards) for p in parts if p.owner is None] == [(None, (0, 1))]  # the east's own, here
    gateway = [p for p in parts if p.owner is not None]
    assert [(p.owner.address, p.owner.log_ids[0], p.shards) for p in gateway] == [
        ("gateway-of-1", region_log(1), (2, 3)), ("gateway-of-2", region_log(2), (4, 5))]  # (slot 3: nobody's)
    assert router.publish_owner(t, "") is None and {t.shard_for(f"k{i}") for i in range(20)} == {0, 1}

    router, t, _ = _router(EAST, lost={1})  # the west lost: its copies are served here
    assert [(p.owner, p.shards) for p in router.spread(t) if p.owner is None] == [(None, (0, 1, 2, 3))]


def test_other_regions_reach_a_lost_regions_shards_at_its_copy_region():
    router, t, region_log = _router(Region("north", 2, 4), lost={1})
    by_shard = {k: p.owner for p in router.spread(t) for k in p.shards}
    assert by_shard[0] == by_shard[2] and set(by_shard[2].log_ids) == {region_log(0)}  # the west's: the east's
    assert by_shard[4] is None and 6 not in by_shard
