"""Queue-server operations (the pigeon.v1.Queue service), executed: the checks and records are broker.queue's;
every change is committed and answered once durable."""

from __future__ import annotations

from pigeon.broker import queue
from pigeon.core import limits
from pigeon.storage import records as R


class QueueOps:
    def __init__(self, engine):
        self.engine = engine

    def _sub(self, name: str):
        return self.engine.live_sub(name)

    def _locked(self, s, ack_ids) -> list[int]:
        return queue.locked(s, ack_ids, self.engine.clock.now())

    async def take(self, name: str, max_messages: int, lock_s: float) -> list[bytes]:
        s = self._sub(name)
        queue.check_take(max_messages, lock_s)
        s.last_activity = self.engine.clock.now()
        lock_s = lock_s or s.ack_deadline_s
        until = self.engine.clock.now() + lock_s
        out = self.engine.delivery.deliver(s, max_messages, limits.response_bytes_max, None, lock_s)
        if out:
            await self.engine.delivery.recorded(s)  # (in a cluster: the locks replicated before they go out)
            if not self.engine.delivery.lease_left(until, lock_s):
                return []  # (they are taken again once their locks run out)
            if s.transforms:  # the subscription's message transforms, as on any delivery (node.transforms)
                out = await self.engine.transforms.deliver(self.engine.delivery, s, out)
        return out

    async def ack(self, name: str, ack_ids) -> int:
        s = self._sub(name)
        nums = self._locked(s, ack_ids)
        self.engine.delivery.ack(s, nums)
        await self.engine.durable(log_id=s.log_id)  # (in a cluster: replicated)
        return len(set(nums))

    async def reschedule(self, name: str, ack_ids, activate_ms: int) -> int:
        s = self._sub(name)
        activate_ms = max(0, activate_ms)
        await self.engine.change(R.Park(s.uid, activate_ms, self._locked(s, ack_ids)))
        return activate_ms

    async def bury(self, name: str, ack_ids) -> int:
        s = self._sub(name)
        nums = self._locked(s, ack_ids)
        await self.engine.change(R.Park(s.uid, -1, nums))
        return len(nums)

    async def kick(self, name: str, max_messages: int) -> int:
        s = self._sub(name)
        buried = sorted(s.buried())
        if max_messages > 0:
            buried = buried[:max_messages]
        if buried:
            await self.engine.change(R.Kick(s.uid, buried))
        return len(buried)

    async def update(self, name: str, ack_id: str, data: bytes, attributes: dict, keep_attributes: bool) -> None:
        s = self._sub(name)
        (num,) = self._locked(s, [ack_id])
        ((body, _tail),) = await self.engine.delivery.read(s, [num])
        await self.engine.change(R.Update(s.uid, num, queue.updated_message(body, data, attributes,
                                                                             keep_attributes)))

    async def peek(self, name: str, message_id: str) -> tuple[bytes, str, int, int]:
        """(PubsubMessage bytes, state, deliveries so far, activation ms or 0)."""
        s = self.engine.state.sub(name)
        num = queue.num_of(s, message_id)
        ((body, tail),) = await self.engine.delivery.read(s, [num])
        state, attempts, at = queue.peek_state(s, num, self.engine.clock.now() * 1000)
        return body + tail, state, attempts, at

    async def delete(self, name: str, message_ids) -> int:
        s = self._sub(name)
        nums = [queue.num_of(s, m) for m in message_ids]
        deleted = len({n for n in nums if not s.is_acked(n)})
        self.engine.delivery.ack(s, nums)
        await self.engine.durable(log_id=s.log_id)  # (in a cluster: replicated)
        return deleted
