"""The fault runs' history check (pigeon.testing.history.check): a delivery after its message's ack returned is an
ack undone when it is of a later lease than the one acknowledged — the server handed the message out again —
and a late copy when it is of that lease or an earlier one: a response already on its way before the ack (a
node paused by SIGSTOP holds what it was sending until it runs again). And a publish sent into a cut of a node from
its peers is flagged when it was acknowledged while etcd still named that node the owner of its shard's bundle
(pigeon.testing.history.acked_while_cut)."""

from __future__ import annotations

from pigeon.core import limits
from pigeon.core.bundles import shard_log
from pigeon.testing.history import BUNDLES, History, acked_while_cut, check, lease_of

SUB = "projects/p/subscriptions/s-plain"


def _history(again: str) -> History:
    h = History(start=0.0)
    h.published["m1"] = "0:k:1"
    h.deliveries[SUB] = [("m1", 1.0), ("m1", 3.0)]
    h.versions[(SUB, "m1", 1.0)] = lease_of("7.16.1")
    h.versions[(SUB, "m1", 3.0)] = lease_of(again)
    h.acked[SUB] = {"m1": 2.0}
    h.acked_versions[SUB] = {"m1": lease_of("7.16.1")}
    return h


def test_a_delivery_of_a_later_lease_after_the_ack_is_an_ack_undone():
    lost, undone, disorder, late = check(_history("7.16.2"), {SUB: 0})
    assert (lost, disorder, late) == ([], [], []) and len(undone) == 1 and "after its ack returned" in undone[0]


def test_a_copy_of_the_acked_lease_arriving_late_is_not_an_ack_undone():
    lost, undone, disorder, late = check(_history("7.16.1"), {SUB: 0})
    assert (lost, undone, disorder) == ([], [], []) and len(late) == 1 and "under lease 1 (acked: 1)" in late[0]


def test_without_the_leases_noted_every_delivery_after_the_ack_is_an_ack_undone():
    h = _history("7.16.1")
    h.versions.clear()
    assert len(check(h, {SUB: 0})[1]) == 1


def _id(number: int, shard: int) -> str:
    return str(number << limits.shard_bits | shard)  # a message id names its shard in its low bits


def test_a_publish_acked_while_its_shard_s_bundle_was_the_cut_node_s_is_flagged():
    # a topic spread over 16 bundles: shard k's bundle is k on from the topic's own; the cut node owned shard 0's
    # bundle until 7 s into the cut (t = 17) and shard 1's until 3 s (t = 13); the cut began at t = 10
    topic = "projects/p/topics/t"
    b0, b1 = (shard_log(topic, k, BUNDLES, True) - 1 for k in (0, 1))
    cut_off = (10.0, {b0: 17.0, b1: 13.0})
    h = History(start=0.0)
    h.publish_times = [
        (0, 9.9, 10.2, _id(0, 0)),   # sent before the cut began: not in it
        (0, 11.0, 16.0, _id(5, 0)),  # shard 0, acked while its bundle was the cut node's: flagged
        (0, 11.0, 18.0, _id(6, 0)),  # shard 0, acked once another node had the bundle
        (0, 11.0, 14.0, _id(7, 1)),  # shard 1, acked after its bundle moved (at 13)
        (0, 11.0, 12.0, _id(8, 2)),  # shard 2: a bundle the cut node did not own
        (1, 11.0, 12.0, _id(9, 0)),  # another topic
    ]
    assert acked_while_cut(h, topic, cut_off, spread=True) == [
        "a publish sent 1.0 s into the cut was acknowledged 5.0 s later"]
    # laid out together, every shard is in the topic's bundle: shard 1's publish acked at 14 < 17 is flagged too
    together = (10.0, {shard_log(topic, 0, BUNDLES, False) - 1: 17.0})
    assert len(acked_while_cut(h, topic, together, spread=False)) == 3
