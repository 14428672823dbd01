"""A ShardIn that never became durable in its log: a reset of the log undoes the pair's homing there (cluster
simulator seed 3763: the new home's owner committed a ShardIn, crashed before its log held it, replayed it from
its journal, took the log back without it, counted the pair's empty index as the log's and deleted the pair's
`lent/` key of its old log, whose owner then cut the batches the hand-over's image names)."""

from __future__ import annotations

from pigeon.broker import images
from pigeon.core.errors import Unavailable
from pigeon.storage import checkpoint as CK
from pigeon.storage import records as R
from pigeon.testing.shard_check import restarted

import pytest

from tests.unit.test_shard_handover import BUNDLES, HOME, MOVED, NEW, before, fresh


def _landed_not_durable():
    """A node that never owned the old home applies the ShardIn it committed to the new home (the state, the
    ShardIn)."""
    old = fresh()
    for at, rec in enumerate(before(), start=100):
        old.apply(rec, at)
    out = R.ShardOut(1, MOVED, HOME, NEW, 1, 30.0, images.pair_images(old, old.topics_by_uid[1], MOVED))
    node = fresh()
    shard_in = R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, out.images)
    node.apply(shard_in)
    assert node.shard_logs(node.topics_by_uid[1], BUNDLES)[MOVED] == NEW
    return node, shard_in


def test_a_reset_of_the_new_home_undoes_a_homing_only_its_shard_in_made():
    node, _ = _landed_not_durable()
    node.apply(R.Reset(NEW, BUNDLES))  # it lost the log (or takes it back, reading it from its ledgers)
    t = node.topics_by_uid[1]
    assert node.shard_logs(t, BUNDLES)[MOVED] == HOME and not t.gens.get(MOVED)
    assert MOVED not in node.shards_in(t, NEW, BUNDLES), "not the new home's pair: no lent key of it is its"


def test_the_log_read_back_homes_the_pair_again_and_the_metadata_logs_home_stays():
    node, shard_in = _landed_not_durable()
    node.apply(R.Reset(NEW, BUNDLES))
    node.apply_in_log(shard_in, NEW, BUNDLES, 500)  # the log holds it after all
    assert node.shard_logs(node.topics_by_uid[1], BUNDLES)[MOVED] == NEW
    node.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))  # the metadata log homes it: no reset undoes that
    node.apply(R.Reset(NEW, BUNDLES))
    assert node.shard_logs(node.topics_by_uid[1], BUNDLES)[MOVED] == NEW


def test_a_checkpoint_does_not_turn_such_a_homing_into_a_shard_home():
    node, _ = _landed_not_durable()
    homes = [r for r in images.meta_records(node) if isinstance(r, R.ShardHome)]
    assert not homes


def test_a_homing_the_logs_quorum_confirmed_stays_on_a_reset_of_the_log():
    node, _ = _landed_not_durable()
    node.confirm_landings(NEW, (1, MOVED, 1))  # (node.handover: the ShardIn's append is held by the log's quorum)
    node.apply(R.Reset(NEW, BUNDLES))  # it gives the log up: the log's next owner reads the ShardIn back
    assert node.shard_logs(node.topics_by_uid[1], BUNDLES)[MOVED] == NEW
    assert [(r.shard, r.log) for r in images.meta_records(node) if isinstance(r, R.ShardHome)] == [(MOVED, NEW)]


def test_a_homing_read_back_from_the_log_stays_on_a_later_reset():
    node, shard_in = _landed_not_durable()
    node.apply(R.Reset(NEW, BUNDLES))
    node.apply_in_log(shard_in, NEW, BUNDLES, 500)
    node.confirm_landings(NEW)  # (node.engine.load_log: the log was read back from its ledgers)
    node.apply(R.Reset(NEW, BUNDLES))
    assert node.shard_logs(node.topics_by_uid[1], BUNDLES)[MOVED] == NEW


def test_a_confirmation_of_another_hand_over_leaves_the_homing_undoable():
    node, _ = _landed_not_durable()
    node.confirm_landings(NEW, (1, MOVED, 2))
    node.apply(R.Reset(NEW, BUNDLES))
    assert node.shard_logs(node.topics_by_uid[1], BUNDLES)[MOVED] == HOME


def test_a_pair_a_reset_put_back_has_its_subscriptions_dispatch_again_when_the_log_resumes():
    """The reset turns off the dispatch of the subscriptions of the log's pairs until `resume_log`; a pair it put
    back in its old home is not among the log's pairs then — its subscription stayed off for good (cluster
    simulator seeds 3608, 3700, 3752: an ordering key's next messages never delivered)."""
    node, _ = _landed_not_durable()
    node.rebuild(0.0)
    s = node.subs_by_uid[2]
    assert s.dispatching
    node.apply(R.Reset(NEW, BUNDLES))  # (node.engine.forget_log: the node gives the log up)
    assert not s.dispatching
    node.resume_log(NEW, BUNDLES, 1.0)
    assert s.dispatching


def test_no_checkpoint_while_a_homing_is_not_held_by_its_logs_quorum():
    """Taken then, a checkpoint holds the pair's index as the ShardIn made it but its home as before it (above),
    while the ShardIn lies before the checkpoint: replayed on it, the hand-over's ShardHome finds the pair never
    handed in and drops its index — and the node's next start failed on the pair's next Publish (cluster simulator
    seed 8869, with a checkpoint every 15 s: "publish at offset 32 but shard 0 of topic 2 is at 0"). Checkpoints
    wait (`node.maintenance.checkpoint`) until the log's quorum holds the homing."""
    from pigeon.broker import log_state

    node, _ = _landed_not_durable()
    index = node.topics_by_uid[1].shards[MOVED]
    assert index.next > 0 and log_state.landings_pending(node)
    again = restarted(node)
    again.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))  # the hand-over's ShardHome, after the checkpoint
    assert again.topics_by_uid[1].shards[MOVED].next == 0, "(the hazard: the pair's messages forgotten)"
    node.confirm_landings(NEW, (1, MOVED, 1))  # the log's quorum holds the ShardIn
    assert log_state.landings_pending(node), "still: the metadata log has not homed it (below)"
    node.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))
    assert not log_state.landings_pending(node)
    again = restarted(node)
    again.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))  # (replayed again: changes nothing)
    assert again.topics_by_uid[1].shards[MOVED].next == index.next


def _owner_of_both_logs():
    """The hand-over's old home's owner hands the pair out and gives its logs up before the metadata log's
    ShardHome; a node takes the new home first — applying the ShardIn, confirmed: read back from the log —, then
    the old home, reading the ShardOut back. (the node, the old home's owner's state, the ShardOut)"""
    old = fresh()
    for at, rec in enumerate(before(), start=100):
        old.apply(rec, at)
    out = R.ShardOut(1, MOVED, HOME, NEW, 1, 30.0, images.pair_images(old, old.topics_by_uid[1], MOVED))
    old.apply(out)
    node = fresh()
    node.apply_in_log(R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, out.images), NEW, BUNDLES)
    node.confirm_landings(NEW)
    node.apply(R.Reset(HOME, BUNDLES))
    for at, rec in enumerate(before(), start=100):
        node.apply_in_log(rec, HOME, BUNDLES, at)
    node.apply_in_log(out, HOME, BUNDLES)
    return node, old, out


def test_a_shard_out_read_back_after_its_shard_in_stays_pending_until_the_metadata_log_homes_the_pair():
    """Cluster simulator seed 23105: dropped there, no node committed the hand-over's ShardHome, and the old
    home's snapshot carried neither it nor the pair; the log's next owner — its metadata log without the
    ShardHome — counted the pair as the log's with an empty index, handed it over again with that and lent the
    old home only from its end: the old home was cut under the batches the first hand-over's image names."""
    node, old, out = _owner_of_both_logs()
    t = node.topics_by_uid[1]
    assert t.away.get(MOVED) == out, "pending: this node's handover commits the ShardHome (HandOvers.resume)"
    assert node.shard_logs(t, BUNDLES)[MOVED] == NEW
    assert t.shards[MOVED].next == 5, "the new home's state (the image: 5 messages), kept"
    with pytest.raises(Unavailable):
        node.log_of(R.Publish(1, MOVED, 3, 3000, 1, 0, b""), BUNDLES)  # (refused until then, as a ShardIn leaves it)
    carried = [i for i in CK.decode_images(images.bundle_snapshot(node, HOME, BUNDLES).images)
               if isinstance(i, R.ShardOut)]
    assert carried == [out], "the old home's snapshot carries it"
    nxt = fresh()  # the old home's next owner, from that snapshot, its metadata log without the ShardHome
    nxt.apply(images.bundle_snapshot(node, HOME, BUNDLES))
    assert nxt.topics_by_uid[1].away.get(MOVED) == out, "it refuses the pair's records, and finishes the hand-over"
    with pytest.raises(Unavailable):
        nxt.log_of(R.Publish(1, MOVED, 3, 3000, 1, 0, b""), BUNDLES)
    for st in (node, nxt):
        st.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))
        assert not st.topics_by_uid[1].away and st.shard_logs(st.topics_by_uid[1], BUNDLES)[MOVED] == NEW
    assert node.topics_by_uid[1].shards[MOVED].next == 5


def test_a_shard_out_the_metadata_log_homed_changes_nothing_read_back():
    node, _, out = _owner_of_both_logs()
    node.apply(R.ShardHome(1, MOVED, NEW, 1, 40.0))
    node.apply(R.Reset(HOME, BUNDLES))
    node.apply_in_log(out, HOME, BUNDLES)
    t = node.topics_by_uid[1]
    assert not t.away and t.shards[MOVED].next == 5
