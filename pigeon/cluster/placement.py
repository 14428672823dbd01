"""Placement: which node owns each bundle. Owns the rule: bundles are assigned by consistent hashing with bounded
loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2018) — every node carries at
most ⌈balance × bundles / nodes⌉ bundles, and a node joining or leaving moves few of them.

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
