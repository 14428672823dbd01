"""cluster.placement's load planner (docs/cluster.md, "Scale-out" 4.2) and node.bundle_load's meter: moves bring the
busiest node within the bound with few bundles moved and never overload the node a bundle goes to; nothing moves
while the cluster is balanced or idle; a bundle too busy for any node is named, not moved; every node lays the same
moves over the same hash; the meter shares a node's CPU out by its logs' appends."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.cluster import placement
from pigeon.cluster.placement import (assign, decode_moves, encode_moves, node_loads, place, replan, shed)
from pigeon.core import limits
from pigeon.node.bundle_load import LoadMeter, read_report

NODES = ["n1", "n2", "n3"]
PLAN = dict(balance=1.25, floor=0.1, most=2)


def _loads(bundles: int, draw) -> dict[int, float]:
    return {b: draw(st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.2, 0.5, 1.0])) for b in range(bundles)}


@settings(max_examples=200, deadline=None)
@given(bundles=st.integers(1, 64), nodes=st.sets(st.sampled_from([f"n{i}" for i in range(6)]), min_size=1),
       data=st.data())
def test_each_move_lowers_the_busiest_node_and_leaves_its_target_below_it(bundles, nodes, data):
    load = _loads(bundles, data.draw)
    a = assign(bundles, nodes)
    moves, hot = shed(a, load, nodes, **PLAN)
    before = node_loads(a, load, nodes)
    bound = PLAN["balance"] * sum(before.values()) / len(nodes)
    assert len(moves) <= PLAN["most"]
    assert len({b for b, _ in moves}) == len(moves), "a bundle moved twice in one plan"
    after = dict(a)
    for b, to in moves:
        assert to in nodes and after[b] != to
        was = node_loads(after, load, nodes)
        assert was[after[b]] == max(was.values()), "a move from a node that was not the busiest"
        source = was[after[b]]
        after[b] = to
        assert node_loads(after, load, nodes)[to] < source, "a move left its target as busy as its source was"
    if moves:  # each move takes from a busiest node and leaves its target below it: the loads, busiest first, fall
        assert sorted(node_loads(after, load, nodes).values(), reverse=True) < sorted(before.values(), reverse=True)
    else:  # nothing moved: balanced, idle, or nothing that fits
        busiest = max(before.values())
        gap = busiest - min(before.values())
        assert busiest <= bound + 1e-9 or busiest < PLAN["floor"] or all(
            load[b] == 0 or load[b] >= gap for b, n in a.items() if n == max(before, key=lambda n: (before[n], n)))
    assert all(load[b] > bound for b in hot)


def test_a_balanced_or_idle_cluster_moves_nothing():
    a = assign(16, NODES)
    count = {n: sum(1 for x in a.values() if x == n) for n in NODES}
    even = {b: 0.3 / count[a[b]] for b in range(16)}  # each node 0.3 cores, however many bundles it holds
    assert shed(a, even, NODES, **PLAN) == ([], [])
    within = {b: (0.36 if a[b] == "n1" else 0.3) / count[a[b]] for b in range(16)}  # n1 1.125 × the average
    assert shed(a, within, NODES, **PLAN) == ([], [])
    idle = {b: (0.01 if a[b] == "n1" else 0.0) for b in range(16)}  # unbalanced, but n1 carries < the floor
    assert sum(idle.values()) < PLAN["floor"]
    assert shed(a, idle, NODES, **PLAN) == ([], [])


def test_a_move_takes_the_bundle_nearest_half_the_gap_to_the_idlest_node():
    a = {0: "n1", 1: "n1", 2: "n1", 3: "n2", 4: "n3"}
    load = {0: 0.7, 1: 0.3, 2: 0.2, 3: 0.1, 4: 0.2}  # n1 1.2, n2 0.1, n3 0.2: the bound is 0.625
    moves, hot = shed(a, load, NODES, **PLAN)
    # gap 1.1: bundle 0 (0.7) is nearest its half, and goes to n2 (n1 0.5, n2 0.8); then n2 is the busiest, and
    # its 0.1 goes to n3 (gap 0.6: bundle 0 is no less than it)
    assert moves == [(0, "n2"), (3, "n3")]
    assert hot == [0]  # above the bound (0.625) alone


def test_two_equal_hot_bundles_on_one_node_part():
    a = {0: "n1", 1: "n1", 2: "n2", 3: "n3"}
    load = {0: 1.0, 1: 1.0, 2: 0.0, 3: 0.0}  # the bound (0.83) is under each: both hot, yet one moves
    moves, hot = shed(a, load, NODES, **PLAN)
    assert moves == [(0, "n2")] and hot == [0, 1]
    a[0] = "n2"
    assert shed(a, load, NODES, **PLAN) == ([], [0, 1]), "a bundle moved on where it could only swap places"


def test_one_bundle_busier_than_any_node_may_be_is_named_hot_not_moved():
    a = {0: "n1", 1: "n2", 2: "n3"}
    load = {0: 2.0, 1: 0.1, 2: 0.1}
    assert shed(a, load, NODES, **PLAN) == ([], [0])


def test_replan_keeps_moves_that_stand_and_drops_the_rest():
    base = assign(16, NODES)
    b = next(b for b in range(16) if base[b] == "n1")
    stays = {b: "n2"}
    idle = {x: 0.0 for x in range(16)}
    assert replan(16, NODES, stays, idle, **PLAN)[0] == stays, "a move stood although nothing asked to change"
    gone = {b: "n9"}  # a node that left: the hash places the bundle again
    assert replan(16, NODES, gone, idle, **PLAN)[0] == {}
    same = {b: "n1"}  # where the hash puts it anyway: no move to keep
    assert replan(16, NODES, same, idle, **PLAN)[0] == {}


def test_replan_balances_from_the_placement_it_finds():
    base = assign(16, NODES)
    load = {b: (0.2 if base[b] == "n1" else 0.0) for b in range(16)}
    moved = {}
    for _ in range(10):  # the planner, period after period, with loads that move with their bundles
        moved, _ = replan(16, NODES, moved, load, **PLAN)
    carried = node_loads(place(16, NODES, moved), load, NODES)
    assert max(carried.values()) <= PLAN["balance"] * sum(carried.values()) / 3 + 1e-9
    assert replan(16, NODES, moved, load, **PLAN)[0] == moved, "a balanced placement kept moving"


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.sampled_from([f"n{i}" for i in range(5)]), min_size=1, unique=True), data=st.data())
def test_every_node_lays_the_same_moves_over_the_same_hash(nodes, data):
    moved = {b: data.draw(st.sampled_from(["n0", "n1", "n2", "n7"])) for b in
             data.draw(st.sets(st.integers(0, 15), max_size=6))}
    mine = place(16, nodes, moved)
    theirs = place(16, list(reversed(nodes)), dict(reversed(list(moved.items()))))
    assert mine == theirs
    for b, n in mine.items():
        assert n in nodes, "a bundle placed on a node that is not live"
        assert n == (moved[b] if moved.get(b) in nodes else assign(16, nodes)[b])


def test_moves_round_trip_and_a_key_this_release_cannot_read_means_none():
    assert decode_moves(encode_moves({3: "n2", 11: "n1"})) == {3: "n2", 11: "n1"}
    for raw in (None, b"", b"{", b'{"moves": 3}', b'[1]', json.dumps({"other": {}}).encode()):
        assert decode_moves(raw) == {}


def test_the_meter_shares_the_cpu_out_by_appends():
    counts = {2: (0, 0), 3: (0, 0)}
    now, cpu = [0.0], [0.0]
    meter = LoadMeter(lambda: counts, half_life_s=1e-9, cpu=lambda: cpu[0], clock=lambda: now[0])
    meter.sample()
    counts = {2: (10_000, 10_000 * 8192), 3: (10_000, 0)}  # the same entries; log 2's carry 8 KiB each
    now[0], cpu[0] = 10.0, 5.0  # half a core over 10 s
    meter.sample()
    e2, b2, c2 = meter.rates[2]
    e3, b3, c3 = meter.rates[3]
    assert (e2, b2, e3, b3) == (1000.0, 8192000.0, 1000.0, 0.0)
    units2 = limits.load_entry_units + 8 * limits.load_kib_units
    assert abs(c2 + c3 - 0.5) < 1e-9 and abs(c2 / c3 - units2 / limits.load_entry_units) < 1e-9
    cores, bundles = read_report(meter.report([2, 3, 4]))
    assert abs(cores - 0.5) < 1e-6 and set(bundles) == {1, 2, 3}
    assert bundles[3] == (0.0, 0.0, 0.0)  # a log with nothing measured yet reports no load
    assert read_report(b"not json") == (0.0, {})


def test_cpu_that_a_few_appends_cannot_account_for_is_the_nodes_own():
    counts = {2: (0, 0)}
    now, cpu = [0.0], [0.0]
    meter = LoadMeter(lambda: counts, half_life_s=1e-9, cpu=lambda: cpu[0], clock=lambda: now[0])
    meter.sample()
    counts, now[0], cpu[0] = {2: (2, 0)}, 1.0, 0.9  # a starting node: busy, and two entries appended meanwhile
    meter.sample()
    assert abs(meter.rates[2][2] - 2 * limits.load_entry_units * limits.load_unit_s_max) < 1e-9
    assert meter.rates[2][2] < limits.load_floor_cores


def test_the_meter_averages_and_forgets():
    counts = {2: (0, 0)}
    now, cpu = [0.0], [0.0]
    meter = LoadMeter(lambda: counts, half_life_s=10.0, cpu=lambda: cpu[0], clock=lambda: now[0])
    meter.sample()
    counts, now[0], cpu[0] = {2: (10_000, 0)}, 10.0, 10.0  # one core, one half-life: halfway there
    meter.sample()
    assert abs(meter.rates[2][2] - 0.5) < 1e-9 and abs(meter.cores - 0.5) < 1e-9
    now[0] = 20.0  # an idle half-life (the log's entries did not grow): halfway back
    meter.sample()
    assert abs(meter.rates[2][2] - 0.25) < 1e-9
    counts, now[0] = {}, 30.0  # the log is gone (the bundle moved away): its rate fades, and goes
    for i in range(60):
        now[0] += 10.0
        meter.sample()
    assert 2 not in meter.rates


def test_a_hot_bundle_splits_half_its_busiest_topics_shards_over_the_least_busy_other_nodes():
    owner_of = {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}
    carried = {"a": 1.5, "b": 0.4, "c": 0.1}
    assert placement.split([0, 1, 2, 3], carried, owner_of, 0) == {2: 2, 3: 1}  # c then b, each its lowest bundle
    assert placement.split([5, 1, 3], carried, owner_of, 3) == {3: 2, 5: 1}  # the upper half, rounded up
    assert placement.split([2], carried, owner_of, 0) == {}, "one shard there: only more shards would help"
    assert placement.split([0, 1], carried, {0: "a", 3: "a"}, 0) == {}, "no other node"
    again = placement.split([0, 1, 2, 3], dict(reversed(list(carried.items()))), dict(reversed(owner_of.items())), 0)
    assert again == {2: 2, 3: 1}, "not the maps' order"


@given(st.dictionaries(st.integers(0, 15), st.sampled_from("abcd"), min_size=1),
       st.dictionaries(st.sampled_from("abcd"), st.floats(0, 4)), st.lists(st.integers(0, 63), unique=True))
def test_a_split_moves_some_shards_off_the_hot_bundles_node_and_keeps_the_lower_half(owner_of, carried, shards):
    source = min(owner_of)
    plan = placement.split(shards, carried, owner_of, source)
    others = {n for n in owner_of.values() if n != owner_of[source]}
    if len(shards) < 2 or not others:
        assert plan == {}
        return
    assert sorted(plan) == sorted(shards)[len(shards) // 2:]
    assert all(owner_of[b] in others for b in plan.values())


def test_the_placement_key_carries_the_hot_bundles_and_an_older_one_reads_as_none():
    raw = placement.encode_moves({3: "b"}, [7, 2])
    assert placement.decode_moves(raw) == {3: "b"} and placement.decode_hot(raw) == [2, 7]
    assert placement.decode_hot(b'{"moves":{"3":"b"}}') == [] and placement.decode_hot(None) == []


def test_a_hot_bundle_with_a_trickle_beside_it_is_not_carried_to_an_idle_node():
    """Moving it would lower its node by the trickle alone and make the idle node the hot one (a placement
    planner did that while the bundle's owner split it: the split's hand-overs then ran on the moved bundle's new
    owner)."""
    a = {0: "n1", 1: "n1", 2: "n2", 3: "n3"}
    load = {0: 0.1199, 1: 0.0002, 2: 0.0, 3: 0.0}
    moves, hot = shed(a, load, NODES, **PLAN)
    assert hot == [0] and 0 not in dict(moves)
