"""The fault runs' history check (pigeon.testing.chaos.check): a delivery after its message's ack returned is an
ack undone when it is of a later lease than the one acknowledged — the server handed the message out again —
and a late copy when it is of that lease or an earlier one: a response already on its way before the ack (a
node paused by SIGSTOP holds what it was sending until it runs again)."""

from __future__ import annotations

from pigeon.testing.chaos import History, check, lease_of

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
