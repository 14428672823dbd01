"""cluster.quorum: replication settings, ensemble choice, the last-add-confirmed position and the recovery quorum —
whatever members answer a recovery, the ledger closes at or past every entry a client was answered for."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.cluster.quorum import (Replication, choose_ensemble, ensemble_size, last_add_confirmed, machines,
                                   recovered_end)


def test_settings_are_checked():
    assert Replication().recovery_quorum == 2
    with pytest.raises(ValueError, match="ack quorum ≤ write quorum"):
        Replication(3, 3, 4)
    with pytest.raises(ValueError, match="majority"):
        Replication(4, 4, 2)
    with pytest.raises(ValueError, match="striping"):
        Replication(5, 3, 2)
    assert Replication(1, 1, 1).recovery_quorum == 1
    assert Replication(5, 5, 3).fenced_enough(3) and not Replication(5, 5, 3).fenced_enough(2)


@settings(max_examples=300, deadline=None)
@given(e=st.integers(1, 7), data=st.data())
def test_any_recovery_quorum_sees_every_acknowledged_entry(e, data):
    """Each member holds a prefix of the ledger (entries reach it in order); an entry was acknowledged once Qa
    members held it. Every set of `recovery_quorum` members includes one that holds the last acknowledged
    entry, so the recovered end is never below it."""
    a = data.draw(st.integers(e // 2 + 1, e))
    rep = Replication(e, e, a)
    ends = data.draw(st.lists(st.integers(0, 20), min_size=e, max_size=e))
    acknowledged = max((x for x in range(21) if sum(end >= x for end in ends) >= a), default=0)
    for members in itertools.combinations(range(e), rep.recovery_quorum):
        assert recovered_end(0, [ends[m] for m in members]) >= acknowledged


def test_last_add_confirmed_stops_at_the_first_entry_short_of_the_quorum():
    assert last_add_confirmed(10, {10: 3, 11: 2, 12: 1, 13: 3}, 2) == 12
    assert last_add_confirmed(10, {}, 2) == 10


def test_ensembles_are_distinct_deterministic_and_span_zones():
    nodes = {f"n{i}": f"z{i % 3}" for i in range(9)}
    for ledger in range(50):
        ens = choose_ensemble(ledger, nodes, 3)
        assert len(set(ens)) == 3
        assert {nodes[n] for n in ens} == {"z0", "z1", "z2"}
        assert ens == choose_ensemble(ledger, dict(reversed(list(nodes.items()))), 3)
        assert "n4" not in choose_ensemble(ledger, nodes, 3, exclude=["n4"])
    spread = {n for ledger in range(200) for n in choose_ensemble(ledger, nodes, 3)}
    assert spread == set(nodes), "ledgers spread over every node"
    with pytest.raises(ValueError, match="needs 3 live storage nodes on as many machines, there are 2"):
        choose_ensemble(1, {"a": "", "b": ""}, 3)


def test_an_ensemble_never_holds_two_nodes_of_one_machine():
    """The workers of `pigeon serve --workers N` in a cluster are nodes on one machine's disk: two copies there are
    one copy, so an ensemble takes one of them at most (a node without a machine is a machine of its own)."""
    nodes = {"a.w0": "", "a.w1": "", "a.w2": "", "b.w0": "", "b.w1": "", "c": ""}
    machine_of = {"a.w0": "a", "a.w1": "a", "a.w2": "a", "b.w0": "b", "b.w1": "b"}
    assert machines(nodes, machine_of) == 3 and machines(nodes) == 6
    for ledger in range(100):
        ens = choose_ensemble(ledger, nodes, 3, machine_of=machine_of)
        assert sorted(machine_of.get(n, n) for n in ens) == ["a", "b", "c"]
    picked = {n for ledger in range(100) for n in choose_ensemble(ledger, nodes, 3, machine_of=machine_of)}
    assert picked == set(nodes), "every worker of a machine takes its turn"
    with pytest.raises(ValueError, match="on as many machines, there are 2"):
        choose_ensemble(1, {"a.w0": "", "a.w1": "", "b.w0": ""}, 3, machine_of=machine_of)
    assert len(choose_ensemble(1, {"a.w0": "", "a.w1": ""}, 2)) == 2, "without machines every node is its own"
    # a new ledger's size (and the size an open ledger is widened to) counts machines, not nodes: the workers of
    # one machine up beside one other node make an ensemble of two, and widening it again would only roll it
    assert ensemble_size(["a.w0", "a.w1", "b.w0"], machine_of, 3) == 2
    assert ensemble_size(["a.w0", "a.w1", "b.w0", "c"], machine_of, 3) == 3
    assert ensemble_size(["a.w0", "a.w1", "b.w0", "c"], None, 3) == 3 and ensemble_size(["x"], None, 3) == 1
