"""Queue-server operations beside the Pub/Sub surface (the pigeon.v1.Queue service). Owns the rule: an
operation on a locked message must name its current ack id, so of two racing operations the first wins and
the second fails with FAILED_PRECONDITION — nothing takes effect twice. Every change is logged and answered
once durable."""

from __future__ import annotations

import base64

from google.pubsub_v1 import types

from pigeon.broker.topic import parse_message_id, split_msgnum
from pigeon.core import ackid, limits
from pigeon.core.errors import FailedPrecondition, InvalidArgument, NotFound

_PubsubMessage = types.PubsubMessage.pb()


class QueueOps:
    def __init__(self, engine):
        self.engine = engine

    def _sub(self, name: str):
        return self.engine._live_sub(name)

    def _locked(self, s, ack_ids) -> list[int]:
        """Message numbers of ack ids that are the current locks; FAILED_PRECONDITION naming the others."""
        if not ack_ids:
            raise InvalidArgument("ack_ids must not be empty.")
        s.expire(self.engine.clock.now())
        nums, stale = [], []
        for a in ack_ids:
            p = ackid.parse(s.uid, a)
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

    async def take(self, name: str, max_messages: int, lock_s: float) -> list[bytes]:
        s = self._sub(name)
        if not 0 < max_messages <= limits.pull_messages_max:
            raise InvalidArgument(f"max_messages must be between 1 and {limits.pull_messages_max}.")
        if lock_s < 0 or lock_s > limits.lock_s_max:
            raise InvalidArgument(f"lock_seconds must be between 0 and {limits.lock_s_max:g} (31 days).")
        s.last_activity = self.engine.clock.now()
        return self.engine.deliver(s, max_messages, limits.response_bytes_max, None, lock_s or s.ack_deadline_s)

    async def ack(self, name: str, ack_ids) -> int:
        s = self._sub(name)
        nums = self._locked(s, ack_ids)
        changed = self.engine.ack_logged(s, nums)
        await self.engine.wal.wait_durable(self.engine.wal.tail)
        return len(changed)

    async def reschedule(self, name: str, ack_ids, activate_ms: int) -> int:
        s = self._sub(name)
        nums = self._locked(s, ack_ids)
        activate_ms = max(0, activate_ms)
        await self.engine._log_change({"op": "q.park", "uid": s.uid, "nums": nums, "at": activate_ms})
        self.engine.signal(s.uid).notify()
        return activate_ms

    async def bury(self, name: str, ack_ids) -> int:
        s = self._sub(name)
        nums = self._locked(s, ack_ids)
        await self.engine._log_change({"op": "q.park", "uid": s.uid, "nums": nums, "at": -1})
        return len(nums)

    async def kick(self, name: str, max_messages: int) -> int:
        s = self._sub(name)
        buried = sorted(s.buried())
        if max_messages > 0:
            buried = buried[:max_messages]
        if buried:
            await self.engine._log_change({"op": "q.kick", "uid": s.uid, "nums": buried})
            self.engine.signal(s.uid).notify()
        return len(buried)

    async def update(self, name: str, ack_id: str, data: bytes, attributes: dict, keep_attributes: bool) -> None:
        s = self._sub(name)
        (num,) = self._locked(s, [ack_id])
        ((body, _tail),) = self.engine.read(s, [num])
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
        await self.engine._log_change({"op": "q.update", "uid": s.uid, "num": num,
                                       "pb": base64.b64encode(raw).decode()})

    def _num_of(self, s, message_id: str) -> int:
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

    def peek(self, name: str, message_id: str) -> tuple[bytes, str, int, int]:
        """(PubsubMessage bytes, state, deliveries so far, activation ms or 0)."""
        s = self.engine.registry.sub(name)
        num = self._num_of(s, message_id)
        ((body, tail),) = self.engine.read(s, [num])
        lease = s.leases.get(num)
        attempts = lease[1] if lease else s.versions.get(num, 0)
        at = s.parked.get(num)
        if s.is_acked(num):
            state = "acked"
        elif lease is not None:
            state = "locked"
        elif at == -1:
            state = "buried"
        elif at is not None and at > self.engine.clock.now() * 1000:
            state = "scheduled"
        else:
            state = "active"
            offset, shard = split_msgnum(num)
            if s.topic.shards[shard].keys[s.topic.shards[shard].batch_of(offset)] < 0:  # a scheduled batch
                for sec, arr in s.topic.schedule.buckets.items():
                    for e in arr:
                        if e & ((1 << 54) - 1) == num:
                            at = sec * 1000 + (e >> 54)
                if at is not None and at > self.engine.clock.now() * 1000:
                    state = "scheduled"
        return body + tail, state, attempts, (at or 0) if state == "scheduled" else 0

    async def delete(self, name: str, message_ids) -> int:
        s = self._sub(name)
        nums = [self._num_of(s, m) for m in message_ids]
        changed = self.engine.ack_logged(s, nums)
        await self.engine.wal.wait_durable(self.engine.wal.tail)
        return len(changed)
