"""A (topic, shard) pair handed to another log (docs/cluster.md, "Scale-out" 4.3), in the pure core: invariant H1 —
at most one log takes the pair's records at a time, and the state its new home starts from is the state its old
home ended with — and the records' codec. The orchestration between owners is not built yet; these check the
state machine it will drive."""

from __future__ import annotations

from pigeon.broker import images
from pigeon.broker.resources import Subscription, Topic
from pigeon.broker.state import BrokerState
from pigeon.core.bundles import META_LOG, bundle_log
from pigeon.core.errors import Unavailable
from pigeon.storage import checkpoint as CK
from pigeon.storage import records as R
from pigeon.testing.shard_check import shard_view

import pytest

BUNDLES = 16
T, S = "projects/p/topics/hot", "projects/p/subscriptions/s"
SHARDS, MOVED = 4, 1
HOME = bundle_log(T, BUNDLES)  # the together topic's one log
NEW = 1 + (HOME % BUNDLES)  # another bundle's log


def num(offset: int, shard: int) -> int:
    return offset << 6 | shard


def meta() -> list[R.Record]:
    return [R.TopicPut(1, SHARDS, Topic(name=T).SerializeToString()),
            R.SubPut(2, 1, Subscription(name=S, topic=T, ack_deadline_seconds=10).SerializeToString(), [0] * SHARDS)]


def fresh() -> BrokerState:
    st = BrokerState()
    st.dispatch_off()
    for rec in meta():
        st.apply(rec)
    return st


def before() -> list[R.Record]:
    """Data records of every shard: publishes, a delivery with leases, acks, a nack."""
    out = [R.Publish(1, k, 0, 1000 + k, 5, 0, b"") for k in range(SHARDS)]
    out.append(R.Deliver(2, 50.0, [num(o, k) for k in range(SHARDS) for o in range(3)], None, None, None))
    out.append(R.Ack(2, [num(0, k) for k in range(SHARDS)] + [num(2, MOVED)]))
    out.append(R.Modack(2, 20.0, 0, [num(1, 0)], [0]))
    return out


def after() -> list[R.Record]:
    return [R.Publish(1, MOVED, 5, 2000, 2, 0, b""), R.Publish(1, 0, 5, 2000, 1, 0, b""),
            R.Deliver(2, 60.0, [num(3, MOVED), num(5, MOVED), num(3, 0)], None, None, None),
            R.Ack(2, [num(1, MOVED), num(3, MOVED), num(3, 0)])]


def apply_cut(states: dict[int, BrokerState], whole: BrokerState, rec: R.Record, at: int) -> None:
    """Apply `rec` as a node does: cut by shard, each part to the state of the log `whole` names for it."""
    for part in whole.split(rec):
        log = whole.log_of(part, BUNDLES)
        states.setdefault(log, fresh()).apply(part, at)


def test_a_pair_handed_over_carries_its_state_whole_and_only_one_log_takes_its_records():
    whole, reference = fresh(), fresh()  # `reference` never hands anything over
    for at, rec in enumerate(before(), start=100):
        whole.apply(rec, at)
        reference.apply(rec, at)
    logs = {HOME: whole}

    out = R.ShardOut(1, MOVED, HOME, NEW, 1, 30.0, images.pair_images(whole, whole.topics_by_uid[1], MOVED))
    whole.apply(out)
    with pytest.raises(Unavailable):  # between ShardOut and ShardHome: no log takes the pair's records (H1)
        whole.log_of(R.Publish(1, MOVED, 5, 2000, 1, 0, b""), BUNDLES)
    assert whole.log_of(R.Publish(1, 0, 5, 2000, 1, 0, b""), BUNDLES) == HOME  # the others' stay
    snap = images.bundle_snapshot(whole, HOME, BUNDLES)  # a new owner of the old home meanwhile: still refused,
    restarted = fresh()                                   # and it holds the image to finish the hand-over with
    restarted.apply(snap)
    assert list(restarted.topics_by_uid[1].away) == [MOVED]
    assert restarted.topics_by_uid[1].away[MOVED].images == out.images
    with pytest.raises(Unavailable):
        restarted.log_of(R.Ack(2, [num(1, MOVED)]), BUNDLES)

    new_home = logs[NEW] = fresh()
    new_home.apply(R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, out.images))
    home = R.ShardHome(1, MOVED, NEW, 1)
    for st in (whole, new_home):
        st.apply(home)
    assert whole.log_of(R.Publish(1, MOVED, 5, 2000, 1, 0, b""), BUNDLES) == NEW
    assert [whole.log_of(p, BUNDLES) for p in whole.split(R.Ack(2, [num(1, 0), num(1, MOVED)]))] == [HOME, NEW]

    for at, rec in enumerate(after(), start=200):
        reference.apply(rec, at)
        apply_cut(logs, whole, rec, at)
    assert shard_view(logs[NEW], 1, MOVED) == shard_view(reference, 1, MOVED), "the pair's state did not move whole"
    for k in set(range(SHARDS)) - {MOVED}:
        assert shard_view(logs[HOME], 1, k) == shard_view(reference, 1, k)
    assert shard_view(logs[HOME], 1, MOVED)["index"][0] == 0, "the old home kept the pair's messages"


def test_a_shard_in_applied_twice_changes_nothing():
    st = fresh()
    for at, rec in enumerate(before(), start=100):
        st.apply(rec, at)
    image = images.pair_images(st, st.topics_by_uid[1], MOVED)
    new_home = fresh()
    new_home.apply(R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, image))
    once = shard_view(new_home, 1, MOVED)
    new_home.apply(R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, image))
    assert shard_view(new_home, 1, MOVED) == once == shard_view(st, 1, MOVED)


def test_homes_and_pending_hand_outs_survive_a_checkpoint():
    st = fresh()
    for at, rec in enumerate(before(), start=100):
        st.apply(rec, at)
    st.apply(R.ShardHome(1, 2, NEW, 1))
    st.apply(R.ShardOut(1, MOVED, HOME, NEW, 1, 30.0, images.pair_images(st, st.topics_by_uid[1], MOVED)))
    again = BrokerState()
    for rec in images.meta_records(st):
        again.apply(rec)
    for image in CK.decode_images(CK.encode_images(list(images.images(st)))):
        again.restore(image)
    t = again.topics_by_uid[1]
    assert t.homes == {2: NEW} and list(t.away) == [MOVED] and not t.layout_spread
    assert again.shard_logs(t, BUNDLES) == [HOME, HOME, NEW, HOME]


def test_the_hand_over_records_round_trip():
    for rec in (R.ShardOut(7, 3, 4, 9, 2, 12.5, b"\x01image"), R.ShardIn(7, 3, 9, 4, 2, 12.5, b"\x01image"),
                R.ShardHome(7, 3, 9, 2)):
        assert R.decode(rec.TYPE, b"".join(rec.parts())) == rec
    assert R.ShardHome(7, 3, 9, 2).META and BrokerState().log_of(R.ShardHome(7, 3, 9, 2), BUNDLES) == META_LOG


def test_shards_handed_over_along_simulated_histories_keep_their_state():
    """`shard_check.check_handover` (run after every `make sim` seed) over a few simulated histories, with
    hand-overs often: the old home's owner lost mid-way, logs read back by owners whose metadata lags."""
    import random

    from pigeon.testing import shard_check
    from pigeon.testing.simulator import BUNDLES as SIM_BUNDLES, Simulator

    counts: dict = {}
    for seed in range(12):
        history = [(rec, at) for rec, at, _ in Simulator(seed, 200).run().history]
        assert shard_check.check_handover(history, SIM_BUNDLES, random.Random(seed), 0.1, counts) == [], seed
    assert counts["hand-overs"] >= 50 and counts["redone"] >= 10 and counts["read back"] >= 50, counts


def test_a_replayed_log_leaves_out_the_records_of_a_pair_handed_over_since():
    """A new owner of the old home whose metadata log already homes the pair elsewhere reads the log back: the
    pair's records before its ShardOut touch nothing — not the pair's live state when this node is its new home
    too — and the ShardOut asks for no hand-over again."""
    st = fresh()
    for at, rec in enumerate(before(), start=100):
        st.apply(rec, at)
    out = R.ShardOut(1, MOVED, HOME, NEW, 1, 30.0, images.pair_images(st, st.topics_by_uid[1], MOVED))
    node = fresh()  # owns NEW, where the pair lives now, with a record applied there since
    node.apply(R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, out.images))
    node.apply(R.ShardHome(1, MOVED, NEW, 1))
    node.apply(R.Ack(2, [num(1, MOVED)]), 300)
    live = shard_view(node, 1, MOVED)
    node.apply(R.Reset(HOME, BUNDLES))  # … and takes the old home over: reads its log back
    for at, rec in enumerate(before() + [out], start=100):
        node.apply_in_log(rec, HOME, BUNDLES, at)
    assert shard_view(node, 1, MOVED) == live
    assert not node.topics_by_uid[1].away and node.shard_logs(node.topics_by_uid[1], BUNDLES)[MOVED] == NEW
    for k in set(range(SHARDS)) - {MOVED}:
        assert shard_view(node, 1, k) == shard_view(st, 1, k)


def test_the_homes_key_round_trips_and_an_unreadable_one_asks_for_nothing():
    from pigeon.cluster.placement import decode_homes, encode_homes

    homes = {T: {1: 9, 3: 2}, "projects/p/topics/other": {0: 0}}
    assert decode_homes(encode_homes(homes)) == homes
    assert decode_homes(encode_homes({T: {}})) == {}
    for raw in (None, b"", b"{", b'{"pairs": [1]}', b'{"pairs": {"t": {"x": 1}}}'):
        assert decode_homes(raw) == {}


def test_a_shard_home_drops_the_copy_a_stale_owner_of_the_old_home_still_holds():
    """A node that owned the old home and lost it before the ShardOut was committed (its log was taken over)
    keeps the pair as it was; the ShardHome it applies later drops that copy — no reset of the old log would
    (the pair is not the old log's any more), and left there it would be dispatched from."""
    stale = fresh()
    for at, rec in enumerate(before(), start=100):
        stale.apply(rec, at)
    assert shard_view(stale, 1, MOVED)["index"][0] > 0
    stale.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))
    assert shard_view(stale, 1, MOVED) == shard_view(fresh(), 1, MOVED)
    stale.apply(R.Reset(HOME, BUNDLES))  # (its forget of the old home, later: the others go, as ever)
    assert all(shard_view(stale, 1, k)["index"][0] == 0 for k in range(SHARDS))
    new_home = fresh()  # where the ShardIn was applied first, the same ShardHome changes nothing
    new_home.apply(R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, images.pair_images(fresh(), fresh().topics_by_uid[1],
                                                                                MOVED)))
    new_home.apply(R.Publish(1, MOVED, 0, 3000, 2, 0, b""), 500)
    held = shard_view(new_home, 1, MOVED)
    new_home.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))
    assert shard_view(new_home, 1, MOVED) == held


def test_on_a_node_owning_both_logs_the_pair_waits_for_its_shard_home():
    """The old home's owner owns the new home too: its own ShardIn loads the pair but leaves the hand-over pending
    (the pair refused, `finish` still driving it) until the metadata log's ShardHome; losing the new home meanwhile
    (a reset of it) keeps it pending; the ShardHome ends it."""
    node = fresh()
    for at, rec in enumerate(before(), start=100):
        node.apply(rec, at)
    out = R.ShardOut(1, MOVED, HOME, NEW, 1, 30.0, images.pair_images(node, node.topics_by_uid[1], MOVED))
    node.apply(out)
    node.apply(R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, out.images))
    t = node.topics_by_uid[1]
    assert t.away[MOVED] == out and node.shard_logs(t, BUNDLES)[MOVED] == NEW
    with pytest.raises(Unavailable):
        node.log_of(R.Publish(1, MOVED, 5, 2000, 1, 0, b""), BUNDLES)
    node.apply(R.Reset(NEW, BUNDLES))  # it lost the new home before the ShardHome was committed
    assert t.away[MOVED] == out, "the hand-over out of the old home is still to finish"
    node.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))
    assert not t.away and node.log_of(R.Publish(1, MOVED, 5, 2000, 1, 0, b""), BUNDLES) == NEW


def _new_home_after_shard_in() -> list[R.Record]:
    """Records of the pair another owner of the new home committed there after its ShardIn (its state homes the
    pair there at once: the ShardIn's own hand-over is not pending on a node that never owned the old home)."""
    return [R.Publish(1, MOVED, 5, 2000, 2, 0, b""),
            R.Deliver(2, 60.0, [num(3, MOVED), num(5, MOVED)], None, None, None),
            R.Ack(2, [num(1, MOVED), num(3, MOVED), num(5, MOVED)])]


def _read_back_new_home(node: BrokerState, shard_in: R.ShardIn) -> dict:
    """`node` takes the new home over: reads back its ShardIn and the records after it; the pair's state as the
    other owner of the new home had it."""
    other = fresh()
    other.apply(shard_in)
    node.apply(R.Reset(NEW, BUNDLES))
    for at, rec in enumerate([shard_in] + _new_home_after_shard_in(), start=500):
        node.apply_in_log(rec, NEW, BUNDLES, at)
        if rec is not shard_in:
            other.apply(rec, at)
    return shard_view(other, 1, MOVED)


def _handed_over_then_new_home_lost() -> tuple[BrokerState, R.ShardOut, R.ShardIn]:
    """A node owning both logs: the pair handed over, its own ShardIn applied (pending until the ShardHome), then
    the new home lost (reset). (the node's state, the ShardOut, the ShardIn)"""
    node = fresh()
    for at, rec in enumerate(before(), start=100):
        node.apply(rec, at)
    out = R.ShardOut(1, MOVED, HOME, NEW, 1, 30.0, images.pair_images(node, node.topics_by_uid[1], MOVED))
    node.apply(out)
    shard_in = R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, out.images)
    node.apply(shard_in)
    node.apply(R.Reset(NEW, BUNDLES))
    return node, out, shard_in


def test_a_node_that_lost_both_logs_of_its_hand_over_keeps_no_pending_shard_out():
    """The cluster simulator (seed 1026, under the owner's lease since taken back) found an ack undone: a node owning both logs applied its
    own ShardIn (the hand-over pending until the ShardHome), then lost both logs. The reset of the old home kept the
    ShardOut — the pair was the new home's by then, so not among the old home's pairs —, and when the node took the
    new home back before the ShardHome reached it, it left out every record of the pair that the new home's owner
    meanwhile had committed (an ack among them): the pair looked handed out of another log. A reset of a log drops
    the ShardOuts written to it, wherever their pair is homed now (the log's next owner finishes them)."""
    node, _, shard_in = _handed_over_then_new_home_lost()
    node.apply(R.Reset(HOME, BUNDLES))
    t = node.topics_by_uid[1]
    assert not t.away, "the ShardOut went with the old home"
    assert _read_back_new_home(node, shard_in) == shard_view(node, 1, MOVED)
    assert node.log_of(R.Publish(1, MOVED, 7, 3000, 1, 0, b""), BUNDLES) == NEW


def test_the_old_homes_owner_reads_the_new_home_back_whole_while_its_hand_over_is_pending():
    """The old home's owner, owning the new home too, lost the new home after its ShardIn and takes it back before
    the ShardHome: the hand-over stays pending (the pair refused), but the records the new home's owner committed
    for the pair after the ShardIn meanwhile are the pair's present stay there, and are applied."""
    node, out, shard_in = _handed_over_then_new_home_lost()
    assert _read_back_new_home(node, shard_in) == shard_view(node, 1, MOVED)
    assert node.topics_by_uid[1].away[MOVED] == out
    with pytest.raises(Unavailable):
        node.log_of(R.Publish(1, MOVED, 7, 3000, 1, 0, b""), BUNDLES)


def test_a_node_owning_the_old_home_keeps_its_hand_over_pending_when_it_loads_the_new_homes_snapshot():
    """The cluster simulator (seed 8707, spread layout): a node owning the old home, its ShardOut pending, took the
    new home over from a snapshot its other owner wrote after the ShardIn — the snapshot carries the pair as a
    ShardHome. Loaded as the metadata log's homing, it dropped the pending ShardOut: no node committed the
    hand-over's ShardHome then, the metadata log routed the pair to the old home for good (which refuses it), and
    no checkpoint was ever taken again (the homing pending): the journals grew without end. A snapshot's homing
    is the log's own, as a ShardIn's: the hand-over stays pending until the metadata log's ShardHome."""
    node = fresh()
    for at, rec in enumerate(before(), start=100):
        node.apply(rec, at)
    out = R.ShardOut(1, MOVED, HOME, NEW, 1, 30.0, images.pair_images(node, node.topics_by_uid[1], MOVED))
    node.apply(out)
    other = fresh()  # the new home's owner: its ShardIn, then a snapshot of the new home
    other.apply(R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, out.images))
    snap = images.bundle_snapshot(other, NEW, BUNDLES)
    node.apply(snap)
    t = node.topics_by_uid[1]
    assert t.away.get(MOVED) == out, "the hand-over out of the old home is still to finish"
    with pytest.raises(Unavailable):
        node.log_of(R.Publish(1, MOVED, 5, 2000, 1, 0, b""), BUNDLES)
    node.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))
    assert not t.away and node.log_of(R.Publish(1, MOVED, 5, 2000, 1, 0, b""), BUNDLES) == NEW
