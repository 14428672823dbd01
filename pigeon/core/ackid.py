"""Ack ids. Owns the rules: an ack id is "subscription uid.message number.delivery version"; an ack id of
another subscription is ignored, a malformed one is INVALID_ARGUMENT; and an ack id handed out before the
subscription's latest seek is ignored too (its messages were made unacked again: a late ack of an earlier delivery
must not ack them once more). For that the version field carries the subscription's seek generation above
GENERATION_SHIFT bits: `version | generation << GENERATION_SHIFT` — the same ids as ever until a first seek. A
generation is a shard's (a spread topic's shards are sought one by one, each in its own log)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from pigeon.core import limits
from pigeon.core.errors import InvalidArgument

FORMAT = b"%d.%d.%d"  # (subscription uid, message number, delivery version); bytes formatting on the hot path
GENERATION_SHIFT = 32  # a delivery version (a delivery count) stays below this many bits


def make(sub_uid: int, num: int, version: int, generation: int = 0) -> str:
    return f"{sub_uid}.{num}.{version | generation << GENERATION_SHIFT}"


def parse(sub_uid: int, ack_id: str, generations: Sequence[int] = (0,)) -> tuple[int, int] | None:
    """(message number, version); None when the ack id belongs to another subscription, or was handed out before
    its shard's seek generation (`generations[shard]`; 0 for a shard beyond them) began."""
    try:
        uid, num, version = ack_id.split(".")
        uid, num, version = int(uid), int(num), int(version)
    except ValueError:
        version = -1
    if version < 0:
        raise InvalidArgument(f"You have passed an invalid ack ID to the service (ack_id={ack_id[:64]}).")
    shard = num & _SHARD_MASK
    if uid != sub_uid or version >> GENERATION_SHIFT != (generations[shard] if shard < len(generations) else 0):
        return None
    return num, version & _VERSION_MASK


_VERSION_MASK = (1 << GENERATION_SHIFT) - 1
_SHARD_MASK = (1 << limits.shard_bits) - 1


def common(generations: Sequence[int]) -> int:
    """The seek generation every shard is at, or -1 when they differ (which no ack id carries)."""
    first = generations[0] if generations else 0
    return first if all(g == first for g in generations) else -1


def parse_many(sub_uid: int, ack_ids: list[str], generation: int = 0) -> list[int] | None:
    """Message numbers of a batch of ack ids in a few C-level passes (the stream-ack hot path), or None
    unless every one is "uid.number.version" of this subscription in plain ASCII digits, of seek generation
    `generation`: the caller then takes `parse` id by id, which sorts out other subscriptions', earlier
    generations' and malformed ids. (`pigeon.core.hot.ack_numbers` runs its compiled twin when built.)"""
    if not ack_ids:
        return []
    if list(map(str.count, ack_ids, repeat("."))) != [2] * len(ack_ids):  # else "7.1", "7.7.2.1" would pass
        return None
    parts = ".".join(ack_ids).split(".")
    uids, nums, versions = parts[0::3], parts[1::3], parts[2::3]
    if uids.count(str(sub_uid)) != len(uids) or "" in nums or "" in versions:
        return None
    joined = "".join(nums) + "".join(versions)
    if not (joined.isascii() and joined.isdigit()):
        return None
    if generation == 0:  # (below 10^9: below 2^32, no generation)
        if max(map(len, versions)) > 9:
            return None
    elif {int(v) >> GENERATION_SHIFT for v in versions} != {generation}:
        return None
    return list(map(int, nums))
