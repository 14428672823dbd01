"""Placement: which node owns each bundle. Owns the rules: bundles are assigned by consistent hashing with bounded
loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2018) — every node carries at
most ⌈balance × bundles / nodes⌉ bundles, and a node joining or leaving moves few of them; over that, the planner's
moves bound each node's measured *load* (`shed`, `replan`: the fewest bundles move, none while the busiest node is
within bound), and every node lays the same moves over the same hash (`place`).

Each node stands on a ring at `points` places (a hash of its id and the place's number); each bundle has a place on
the ring too. Bundles are placed one after another in a fixed order (by their own hash): a bundle goes to the first
node clockwise from its place that still has room. The answer depends only on the set of nodes, never on the order
they are given or on an earlier answer, so every node that reads the same membership computes the same map.

`balance` trades the two aims: close to 1, loads are even and more bundles move on a change; larger, fewer move
and loads spread wider. Pure: no I/O, no clock, no randomness."""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
from collections import Counter
from typing import Iterable, Mapping

POINTS = 64  # places on the ring per node
BALANCE = 1.25  # no node carries more than this times the average (rounded up)


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "big")


def capacity(bundles: int, nodes: int, balance: float = BALANCE) -> int:
    """The most bundles one node may carry."""
    if nodes <= 0:
        raise ValueError("placement needs at least one node")
    return max(1, math.ceil(balance * bundles / nodes))


def assign(bundles: int, nodes: Iterable[str], balance: float = BALANCE, points: int = POINTS) -> dict[int, str]:
    """Bundle number (0 … bundles-1) → the node that owns it."""
    if balance < 1.0:
        raise ValueError(f"balance must be at least 1 (got {balance})")
    return dict(_assign(bundles, tuple(sorted(set(nodes))), balance, points))


@functools.lru_cache(maxsize=64)  # every node computes it on every placement pass, mostly for the same nodes
def _assign(bundles: int, ids: tuple[str, ...], balance: float, points: int) -> dict[int, str]:
    cap = capacity(bundles, len(ids), balance)
    ring = sorted((_h("node", n, i), n) for n in ids for i in range(points))
    keys = [k for k, _ in ring]
    load: Counter = Counter()
    out: dict[int, str] = {}
    for b in sorted(range(bundles), key=lambda b: (_h("order", b), b)):
        i = bisect.bisect_left(keys, _h("bundle", b))
        for step in range(len(ring)):
            node = ring[(i + step) % len(ring)][1]
            if load[node] < cap:
                load[node] += 1
                out[b] = node
                break
    return out


def moves(before: Mapping[int, str], after: Mapping[int, str]) -> list[int]:
    """The bundles whose owner differs between two assignments."""
    return sorted(b for b in after if before.get(b) != after[b])


def loads(assignment: Mapping[int, str]) -> Counter:
    return Counter(assignment.values())


# --- load (docs/cluster.md, "Scale-out" step 4) ----------------------------------------------------------------
def place(bundles: int, nodes: Iterable[str], moved: Mapping[int, str] | None = None) -> dict[int, str]:
    """`assign`, with the planner's moves laid over it: a move to a node among `nodes` stands, one to any other
    node is ignored (the hash places that bundle). Every node that reads the same members and moves computes the
    same map (docs/cluster.md, invariant P1)."""
    live = set(nodes)
    out = assign(bundles, live)
    if moved:
        for b, node in moved.items():
            if b in out and node in live:
                out[b] = node
    return out


def node_loads(assignment: Mapping[int, str], load: Mapping[int, float], nodes: Iterable[str]) -> dict[str, float]:
    """Each node's load: the sum of its bundles' (a node with none carries 0)."""
    out = {n: 0.0 for n in nodes}
    for b, n in assignment.items():
        if n in out:
            out[n] += load.get(b, 0.0)
    return out


def shed(assignment: Mapping[int, str], load: Mapping[int, float], nodes: Iterable[str], *, balance: float,
         floor: float, most: int) -> tuple[list[tuple[int, str]], list[int]]:
    """The moves (bundle, to node) that bring the busiest node toward `balance` × the average load, at most `most`
    of them, and the bundles too hot for that (each alone above the bound: only a split helps them).

    Nothing moves while the busiest node is within the bound or carries less than `floor`, nor a hot bundle
    whose move would lower the busier node by less than `floor`. Each move takes a
    bundle of the busiest node to the least busy one, the bundle that lowers the busier of the two the most (its
    load nearest half their gap), and only one that leaves the target below where the source was — so each move
    lowers the loads, busiest first, and plans made period after period from the same loads settle rather than
    swap bundles back and forth. Pure and deterministic: ties go by name and number, never by the maps' order."""
    nodes = sorted(set(nodes))
    if not nodes:
        return [], []
    carried = node_loads(assignment, load, nodes)
    bound = balance * sum(carried.values()) / len(nodes)
    hot = sorted(b for b, n in assignment.items() if n in carried and load.get(b, 0.0) > max(bound, floor))
    hot_set = set(hot)
    where = {b: n for b, n in assignment.items() if n in carried}
    out: list[tuple[int, str]] = []
    while len(out) < most:
        busiest = max(nodes, key=lambda n: (carried[n], n))
        if carried[busiest] <= bound or carried[busiest] < floor:
            break
        idlest = min(nodes, key=lambda n: (carried[n], n))
        gap = carried[busiest] - carried[idlest]
        # (a hot bundle moves only where that lowers the busier of the two nodes by `floor` at least: off a node
        # otherwise idle it would carry the hot spot elsewhere, no cooler, and its split in progress with it)
        fits = [b for b, n in where.items() if n == busiest and 0.0 < load.get(b, 0.0) < gap
                and (b not in hot_set or min(load[b], gap - load[b]) >= floor)]
        if not fits:
            break
        b = min(fits, key=lambda b: (abs(load[b] - gap / 2), b))
        out.append((b, idlest))
        where[b] = idlest
        carried[busiest] -= load[b]
        carried[idlest] += load[b]
    return out, hot


def replan(bundles: int, nodes: Iterable[str], moved: Mapping[int, str], load: Mapping[int, float], *,
           balance: float, floor: float, most: int) -> tuple[dict[int, str], list[int]]:
    """The planner's next moves from the current ones and the bundles' loads: the moves that still stand (to a node
    among `nodes`, and not where the hash puts the bundle anyway), with `shed`'s laid over them; and the hot
    bundles. The same moves back when nothing needs to change."""
    nodes = sorted(set(nodes))
    base = assign(bundles, nodes) if nodes else {}
    keep = {b: n for b, n in moved.items() if b in base and n in nodes and base[b] != n}
    now = {**base, **keep}
    more, hot = shed(now, load, nodes, balance=balance, floor=floor, most=most)
    for b, n in more:
        if base[b] == n:
            keep.pop(b, None)
        else:
            keep[b] = n
    return keep, hot


def split(shards: Iterable[int], carried: Mapping[str, float], owner_of: Mapping[int, str], source: int
          ) -> dict[int, int]:
    """A hot bundle's split (docs/cluster.md, "Scale-out" 4.3): of the shards a busy topic has in bundle `source`,
    the upper half (rounded up: the lower ones stay) each to a bundle of another node — the least busy nodes
    first, in turn, each node's lowest bundle — as {shard: bundle}. Nothing for a topic with one shard there (only
    more shards would help it) or a cluster of one node. Pure and deterministic."""
    shards = sorted(set(shards))
    me = owner_of.get(source)
    nodes = sorted({n for n in owner_of.values() if n != me}, key=lambda n: (carried.get(n, 0.0), n))
    if len(shards) < 2 or not nodes:
        return {}
    lowest = {n: min(b for b, o in owner_of.items() if o == n) for n in nodes}
    return {k: lowest[nodes[i % len(nodes)]] for i, k in enumerate(shards[len(shards) // 2:])}


def encode_moves(moved: Mapping[int, str], hot: Iterable[int] = ()) -> bytes:
    """The `placement` key: the moves, and the bundles the planner found too hot to move (their owners split them:
    node.balancer)."""
    return json.dumps({"moves": {str(b): n for b, n in sorted(moved.items())}, "hot": sorted(hot)},
                      separators=(",", ":")).encode()


def decode_hot(raw: bytes | None) -> list[int]:
    """The hot bundles a `placement` key names (none for an absent or unreadable key)."""
    try:
        return sorted(int(b) for b in json.loads(raw)["hot"]) if raw else []
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def encode_homes(homes: Mapping[str, Mapping[int, int]]) -> bytes:
    """The `homes` key: topic name → {shard: the bundle it should be in}."""
    return json.dumps({"pairs": {t: {str(k): b for k, b in sorted(s.items())} for t, s in sorted(homes.items()) if s}},
                      separators=(",", ":")).encode()


def decode_homes(raw: bytes | None) -> dict[str, dict[int, int]]:
    """What a `homes` key asks for (nothing for an absent key, or one this release cannot read)."""
    if not raw:
        return {}
    try:
        return {str(t): {int(k): int(b) for k, b in s.items()} for t, s in json.loads(raw)["pairs"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def decode_moves(raw: bytes | None) -> dict[int, str]:
    """The moves a `placement` key holds (none for an absent key, or one this release cannot read: the hash alone
    then places every bundle — safe, if not balanced)."""
    if not raw:
        return {}
    try:
        return {int(b): str(n) for b, n in json.loads(raw)["moves"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
