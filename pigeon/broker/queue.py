"""Queue-server operations beside the Pub/Sub surface (the pigeon.v1.Queue service): their checks and records.
Owns the rule: an operation on a locked message must name its current ack id, so of two racing operations the
first wins and the second fails with FAILED_PRECONDITION — nothing takes effect twice. Pure, like
broker.commands: the executor (node.queue_ops) appends and applies what these return."""

from __future__ import annotations

from pigeon.core.pubsub_types import types

from pigeon.broker import commands
from pigeon.broker.subscription import SubscriptionState
from pigeon.broker.topic import parse_message_id, split_msgnum
from pigeon.core import ackid, limits
from pigeon.core.errors import FailedPrecondition, InvalidArgument, NotFound

_PubsubMessage = types.PubsubMessage.pb()


def check_take(max_messages: int, lock_s: float) -> None:
    if not 0 < max_messages <= limits.pull_messages_max:
        raise InvalidArgument(f"max_messages must be between 1 and {limits.pull_messages_max}.")
    if lock_s < 0 or lock_s > limits.lock_s_max:
        raise InvalidArgument(f"lock_seconds must be between 0 and {limits.lock_s_max:g} (31 days).")


def locked(s: SubscriptionState, ack_ids, now: float) -> list[int]:
    """Message numbers of ack ids that are the current locks; FAILED_PRECONDITION naming the others. Locks
    that ran out are expired first (`now`)."""
    commands.require_ack_ids(ack_ids)
    s.expire(now)
    nums, stale = [], []
    for a in ack_ids:
        p = ackid.parse(s.uid, a, s.generations)
        lease = s.leases.get(p[0]) if p else None
        if lease is None or lease[1] != p[1]:
            stale.append(a)
        else:
            nums.append(p[0])
    if stale:
        raise FailedPrecondition(
            f"{len(stale)} ack id(s) are not the current lock of their message (acked, rescheduled, buried, "
            f"or the lock expired): {', '.join(stale[:5])}"
        )
    return nums


def updated_message(body: bytes, data: bytes, attributes: dict, keep_attributes: bool) -> bytes:
    """A stored message with new data (and attributes unless kept), checked as a publish would be."""
    m = _PubsubMessage.FromString(body)
    m.data = data
    if not keep_attributes:
        m.attributes.clear()
        m.attributes.update(attributes)
    if not m.data and not m.attributes:
        raise InvalidArgument("A message needs non-empty data or at least one attribute.")
    raw = m.SerializeToString()
    if len(raw) > limits.message_data_bytes_max:
        raise InvalidArgument(f"The message exceeds the limit of {limits.message_data_bytes_max} bytes.")
    return raw


def num_of(s: SubscriptionState, message_id: str) -> int:
    """The message number of a retained message of the subscription's topic."""
    try:
        topic_uid, offset, shard = parse_message_id(message_id)
    except ValueError:
        raise InvalidArgument(f"Invalid message id ({message_id[:64]}).") from None
    if s.topic is None or topic_uid != s.topic.uid or shard >= len(s.topic.shards):
        raise NotFound(f"Message {message_id} is not in the subscription's topic.")
    ix = s.topic.shards[shard]
    if not ix.first() <= offset < ix.durable:
        raise NotFound(f"Message {message_id} is not retained.")
    return (offset << limits.shard_bits) | shard


def peek_state(s: SubscriptionState, num: int, now_ms: float) -> tuple[str, int, int]:
    """(state, deliveries so far, activation ms or 0) of one message for the subscription."""
    lease = s.leases.get(num)
    attempts = lease[1] if lease else s.versions.get(num, 0)
    at = s.parked.get(num)
    if s.is_acked(num):
        state = "acked"
    elif lease is not None:
        state = "locked"
    elif at is not None and at < 0:
        state = "buried"
    elif at is not None and at > now_ms:
        state = "scheduled"
    else:
        state = "active"
        offset, shard = split_msgnum(num)
        ix = s.topic.shards[shard]
        if ix.keys[ix.batch_of(offset)] < 0:  # a scheduled batch
            for sec, arr in s.topic.schedule.buckets.items():
                for e in arr:
                    if e & ((1 << 54) - 1) == num:
                        at = sec * 1000 + (e >> 54)
            if at is not None and at > now_ms:
                state = "scheduled"
    return state, attempts, (at or 0) if state == "scheduled" else 0
