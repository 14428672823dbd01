"""Subscription delivery state. Owns the rule: each message of a subscription is in exactly one state —
not yet delivered (offset >= cursor), locked (in `leases`), waiting for redelivery (in `redeliver`),
or acked (offset < floor, or in `acked`).

Compact by construction: per shard an ack floor, a cursor and a set of acks above the floor;
per-message entries exist only for messages that were handed out and are not acked yet.
Pure: every method takes `now` (seconds) and does no I/O."""

from __future__ import annotations

import heapq
from collections import deque

from pigeon.core import limits
from pigeon.broker.topic import SHARD_MASK, TopicState

_BITS = limits.shard_bits


class SubShard:
    __slots__ = ("floor", "acked", "cursor")

    def __init__(self, floor: int):
        self.floor = floor  # every offset below is acked
        self.acked: set[int] = set()  # acked offsets >= floor
        self.cursor = floor  # offsets >= cursor were never handed out since the last reset

    def mark(self, offset: int) -> bool:
        """Ack one offset; True when it was not acked before."""
        if offset < self.floor or offset in self.acked:
            return False
        if offset == self.floor:
            floor = offset + 1
            acked = self.acked
            while floor in acked:
                acked.discard(floor)
                floor += 1
            self.floor = floor
            if self.cursor < floor:
                self.cursor = floor
        else:
            self.acked.add(offset)
        return True

    def is_acked(self, offset: int) -> bool:
        return offset < self.floor or offset in self.acked

    def drop_before(self, offset: int) -> None:
        """Treat everything below `offset` as gone (retention, seek)."""
        if offset <= self.floor:
            return
        self.acked = {o for o in self.acked if o >= offset}
        self.floor = offset
        while self.floor in self.acked:
            self.acked.discard(self.floor)
            self.floor += 1
        if self.cursor < self.floor:
            self.cursor = self.floor


Delivery = tuple[int, int]  # (message number = offset << shard_bits | shard, delivery version)


class SubscriptionState:
    def __init__(self, uid: int, name: str, topic: TopicState | None, config):
        self.uid = uid
        self.name = name
        self.topic = topic
        self.config = config
        start = topic.backlog_end() if topic else []
        self.shards = [SubShard(o) for o in start]
        self.leases: dict[int, tuple[float, int, object]] = {}  # num → (deadline, version, owner)
        # lease deadlines, one entry per batch handed out or extended: (deadline, seq, message numbers);
        # an entry only prompts a look at its messages' leases, which hold the authoritative deadline
        self._heap: list[tuple[float, int, list[int]]] = []
        self._seq = 0
        self.redeliver: deque[int] = deque()
        self.versions: dict[int, int] = {}  # num → deliveries so far, for messages waiting in `redeliver`
        self.detached = False
        self.last_activity = 0.0

    # --- configuration -----------------------------------------------------------------------
    @property
    def ack_deadline_s(self) -> int:
        return self.config.ack_deadline_seconds or limits.ack_deadline_s_default

    # --- delivery ----------------------------------------------------------------------------
    def has_ready(self, now: float) -> bool:
        if self.redeliver:
            return True
        if self._heap and self._heap[0][0] <= now:
            return True
        if self.topic is not None:
            for s, ix in zip(self.shards, self.topic.shards):
                if s.cursor < ix.durable:
                    return True
        return False

    def next_deadline(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def expire(self, now: float) -> int:
        """Move locked messages whose lease ran out to the redelivery queue."""
        heap, leases = self._heap, self.leases
        n = 0
        while heap and heap[0][0] <= now:
            for num in heapq.heappop(heap)[2]:
                lease = leases.get(num)
                if lease is not None and lease[0] <= now:
                    del leases[num]
                    if lease[2] is not None:
                        lease[2].release(num)
                    self.versions[num] = lease[1]
                    self.redeliver.append(num)
                    n += 1
        return n

    def _schedule(self, deadline: float, nums: list[int]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, nums))

    def take(self, max_messages: int, now: float, deadline_s: float, owner=None) -> list[Delivery]:
        """Lock up to `max_messages` messages: redeliveries first, then new ones in shard order.
        `owner` (a stream, or None) is told `release(num)` when a lease ends for any reason."""
        self.expire(now)
        out: list[Delivery] = []
        leases, versions = self.leases, self.versions
        deadline = now + deadline_s
        shards = self.shards
        redeliver = self.redeliver
        while redeliver and len(out) < max_messages:
            num = redeliver.popleft()
            if num in leases or shards[num & SHARD_MASK].is_acked(num >> _BITS):
                continue
            version = versions.pop(num, 0) + 1
            leases[num] = (deadline, version, owner)
            out.append((num, version))
        if self.topic is not None and len(out) < max_messages:
            for shard_no, (s, ix) in enumerate(zip(shards, self.topic.shards)):
                end = ix.durable
                cursor = s.cursor
                if cursor >= end:
                    continue
                acked = s.acked
                while cursor < end and len(out) < max_messages:
                    if cursor not in acked:
                        num = (cursor << _BITS) | shard_no
                        leases[num] = (deadline, 1, owner)
                        out.append((num, 1))
                    cursor += 1
                s.cursor = cursor
                if len(out) >= max_messages:
                    break
        if out:
            self._schedule(deadline, [num for num, _ in out])
            self.last_activity = now
        return out

    def ack(self, nums: list[int]) -> list[int]:
        """Acknowledge message numbers; return those that changed state (to be logged)."""
        changed = []
        shards, leases, versions = self.shards, self.leases, self.versions
        n_shards = len(shards)
        for num in nums:
            shard = num & SHARD_MASK
            if shard >= n_shards:
                continue
            if shards[shard].mark(num >> _BITS):
                changed.append(num)
                lease = leases.pop(num, None)
                if lease is not None and lease[2] is not None:
                    lease[2].release(num)
                versions.pop(num, None)
        return changed

    def modify_deadlines(self, items: list[Delivery], seconds: float, now: float) -> int:
        """Extend (or, with 0, release: a nack) the leases of (num, version) pairs. A version of 0 matches
        any delivery; a stale version or an unknown message is ignored. Returns how many applied."""
        leases = self.leases
        applied = []
        for num, version in items:
            lease = leases.get(num)
            if lease is None or (version and lease[1] != version):
                continue
            if seconds <= 0:
                del leases[num]
                if lease[2] is not None:
                    lease[2].release(num)
                self.versions[num] = lease[1]
                self.redeliver.append(num)
            else:
                leases[num] = (now + seconds, lease[1], lease[2])
            applied.append(num)
        if seconds > 0 and applied:
            self._schedule(now + seconds, applied)
        return len(applied)

    def modify_deadline(self, num: int, version: int, seconds: float, now: float) -> bool:
        return self.modify_deadlines([(num, version)], seconds, now) == 1

    # --- resets ------------------------------------------------------------------------------
    def reset(self, floors: list[int], acked: list[list[int]]) -> None:
        """Replace the ack state (seek, snapshot restore, recovery). Outstanding leases are dropped."""
        self.shards = []
        for floor, above in zip(floors, acked):
            s = SubShard(floor)
            for o in above:
                s.mark(o)
            self.shards.append(s)
        self._release_all()
        self.leases.clear()
        self._heap.clear()
        self.redeliver.clear()
        self.versions.clear()

    def untake(self, deliveries: list[Delivery]) -> None:
        """Undo the most recent take of these (e.g. they did not fit in a response): they go back to the
        front of the queue with their delivery version unchanged."""
        for num, version in reversed(deliveries):
            lease = self.leases.pop(num, None)
            if lease is None:
                continue
            if lease[2] is not None:
                lease[2].release(num)
            if version > 1:
                self.versions[num] = version - 1
            self.redeliver.appendleft(num)

    def _release_all(self) -> None:
        for num, lease in self.leases.items():
            if lease[2] is not None:
                lease[2].release(num)

    def rewind_unacked(self) -> None:
        """After a restart nothing is locked: every unacked message is delivered again."""
        for s in self.shards:
            s.cursor = s.floor

    def export_state(self) -> tuple[list[int], list[list[int]]]:
        return [s.floor for s in self.shards], [sorted(s.acked) for s in self.shards]

    def drop_before(self, shard: int, offset: int) -> None:
        self.shards[shard].drop_before(offset)
        # leases and redeliveries below the floor are now acked; ack() of them is a no-op
        stale = [n for n in self.leases if n & SHARD_MASK == shard and n >> _BITS < offset]
        for n in stale:
            lease = self.leases.pop(n)
            if lease[2] is not None:
                lease[2].release(n)
        for n in [n for n in self.versions if n & SHARD_MASK == shard and n >> _BITS < offset]:
            del self.versions[n]

    def backlog(self) -> int:
        """Unacked messages (approximate: counts acks above the floor exactly)."""
        if self.topic is None:
            return 0
        return sum(max(0, ix.durable - s.floor - len(s.acked)) for s, ix in zip(self.shards, self.topic.shards))
