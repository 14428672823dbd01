"""Ack ids. Owns the rule: an ack id is "subscription uid.message number.delivery version"; an ack id of
another subscription is ignored, a malformed one is INVALID_ARGUMENT."""

from __future__ import annotations

from itertools import repeat

from pigeon.core.errors import InvalidArgument

FORMAT = b"%d.%d.%d"  # (subscription uid, message number, delivery version); bytes formatting on the hot path


def make(sub_uid: int, num: int, version: int) -> str:
    return f"{sub_uid}.{num}.{version}"


def parse(sub_uid: int, ack_id: str) -> tuple[int, int] | None:
    """(message number, version); None when the ack id belongs to another subscription."""
    try:
        uid, num, version = ack_id.split(".")
        if int(uid) != sub_uid:
            return None
        return int(num), int(version)
    except ValueError:
        raise InvalidArgument(f"You have passed an invalid ack ID to the service (ack_id={ack_id[:64]}).") from None


def parse_many(sub_uid: int, ack_ids: list[str]) -> list[int] | None:
    """Message numbers of a batch of ack ids in a few C-level passes (the stream-ack hot path), or None
    unless every one is "uid.number.version" of this subscription in plain ASCII digits: the caller then takes
    `parse` id by id, which sorts out other subscriptions' and malformed ids. (`pigeon.core.hot.ack_numbers`
    runs its compiled twin when built.)"""
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
    return list(map(int, nums))
