"""Subscription delivery state. Owns the rules:
- each message of a subscription is in exactly one state — not yet delivered (offset >= cursor), locked
  (in `leases`), waiting for redelivery (in `redeliver`, `_delayed` or a key's `redo`), waiting behind
  its ordering key (in a key's `pending`), or acked (offset < floor, or in `acked`);
- retry backoff: a nacked or expired message waits min(maximum, minimum · 2^(attempts-1)) before it is
  handed out again;
- dead-lettering: a message already delivered max_delivery_attempts times is not handed out again but
  listed in `dead_letters` for the engine to forward;
- ordering (broker.ordering): per key, publish order and at most one outstanding batch; a failed message
  sends every later message of its batch back with it, acked or not; keys are independent.

Compact by construction: per shard an ack floor, a cursor and a set of acks above the floor; per-message
entries exist only for messages that were handed out and are not acked yet, and per-key entries only
for keys with work in flight. Pure: every method takes `now` (seconds) and does no I/O."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from operator import itemgetter

from pigeon.core import limits
from pigeon.broker.filter import compile_filter
from pigeon.broker.schedule import Schedule
from pigeon.broker.topic import SCHEDULED, SHARD_MASK, TopicState

_BITS = limits.shard_bits

Delivery = tuple[int, int]  # (message number = offset << shard_bits | shard, delivery version)
_SCHED_START = (-(1 << 62), -1)
Lease = tuple[float, int, object, int]  # (deadline, version, owner, ordering-key hash or 0)


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
            self._raise_floor(offset + 1)
        else:
            self.acked.add(offset)
        return True

    def mark_unacked(self, offsets: list[int]) -> None:
        """Ack distinct offsets known to be unacked (leased ones): in-order acks just move the floor."""
        lo = min(offsets)
        scan = 4 * len(offsets)  # what a look over the whole acked set may cost, against this batch's size
        if lo == self.floor and max(offsets) - lo + 1 == len(offsets):  # distinct, so exactly [floor, floor + n)
            self._raise_floor(lo + len(offsets), scan)
        else:
            self.acked.update(offsets)
            self._raise_floor(self.floor, scan)

    def _raise_floor(self, floor: int, scan: int = 0) -> None:
        """Everything below `floor` is acked: absorb the acks that arrived earlier just above it. With `scan`,
        an acked set of at most that size is checked at once for being one run (another stream's batch)."""
        acked = self.acked
        if floor in acked:
            if len(acked) <= scan and max(acked) - floor + 1 == len(acked):  # all >= floor, distinct: one run
                floor += len(acked)
                acked.clear()
            while floor in acked:
                acked.discard(floor)
                floor += 1
        self.floor = floor
        if self.cursor < floor:
            self.cursor = floor

    def is_acked(self, offset: int) -> bool:
        return offset < self.floor or offset in self.acked

    def drop_before(self, offset: int) -> None:
        """Treat everything below `offset` as gone (retention, seek)."""
        if offset <= self.floor:
            return
        self.acked = {o for o in self.acked if o >= offset}
        self._raise_floor(offset)


class KeyState:
    """One ordering key with work in flight."""

    __slots__ = ("batch", "live", "redo", "pending", "delayed")

    def __init__(self):
        self.batch: list[int] = []  # the outstanding batch, in order
        self.live: set[int] = set()  # members of `batch` still leased
        self.redo: list[int] = []  # to hand out again first, in order (acked members included)
        self.pending: deque[list[int]] = deque()  # [shard, lo, hi): not yet handed out, in order
        self.delayed = False  # waiting out a retry backoff

    def idle(self) -> bool:
        return not (self.live or self.redo or self.pending or self.delayed)


class SubscriptionState:
    def __init__(self, uid: int, name: str, topic: TopicState | None, config):
        self.uid = uid
        self.name = name
        self.topic = topic
        start = topic.backlog_end() if topic else []
        self.shards = [SubShard(o) for o in start]
        self.start = list(start)  # where the subscription began: seeks without topic retention stop here
        self.leases: dict[int, Lease] = {}
        # lease deadlines, one entry per batch handed out or extended: (deadline, seq, message numbers);
        # an entry only prompts a look at its messages' leases, which hold the authoritative deadline. Entries
        # are tuples of numbers only: the collector stops tracking those, and a stream's deadline keeps a minute
        # of them (at 1,000 msg/s some 60,000) out of the full collections that pause the event loop.
        self._heap: list[tuple[float, int, tuple[int, ...]]] = []
        self._seq = 0
        self.redeliver: deque[int] = deque()  # ready to hand out again now
        self._delayed: list[tuple[float, int, list[int], int]] = []  # (ready at, seq, nums, key) in backoff
        self.versions: dict[int, int] = {}  # num → deliveries so far, for unacked messages not leased now
        self.keys: dict[int, KeyState] = {}
        self.ready_keys: deque[int] = deque()  # keys whose next batch may go out
        self.dead_letters: list[int] = []  # to forward to the dead-letter topic (drained by the engine)
        self.sched_mark: tuple[int, int] = _SCHED_START  # how far the topic's activation index was walked
        # queue extensions: parked messages (rescheduled to an activation ms, or buried: -1) are skipped by
        # every path until due or kicked; overrides replace a message's stored bytes for this subscription
        self.parked: dict[int, int] = {}
        self.overrides: dict[int, bytes] = {}
        self.late: list[tuple[int, int]] = []  # (activate ms, num) added behind the mark: a heap
        self.detached = False
        self.last_activity = 0.0
        self.configure(config)

    # --- configuration -----------------------------------------------------------------------
    def configure(self, config) -> None:
        self.config = config
        self.ordered = bool(config.enable_message_ordering)
        if getattr(self, "filter_text", None) != config.filter:
            self.filter_text = config.filter
            self.filter = compile_filter(config.filter)  # None: every message matches
        dlp = config.dead_letter_policy
        self.max_attempts = (dlp.max_delivery_attempts or 5) if dlp.dead_letter_topic else 0
        if config.HasField("retry_policy"):
            rp = config.retry_policy
            lo = rp.minimum_backoff.seconds + rp.minimum_backoff.nanos / 1e9 if rp.HasField("minimum_backoff") else 10.0
            hi = rp.maximum_backoff.seconds + rp.maximum_backoff.nanos / 1e9 if rp.HasField("maximum_backoff") else 600.0
            self.backoff: tuple[float, float] | None = (lo, max(lo, hi))
        else:
            self.backoff = None  # redeliver as soon as possible

    @property
    def ack_deadline_s(self) -> int:
        return self.config.ack_deadline_seconds or limits.ack_deadline_s_default

    def backoff_s(self, attempts: int) -> float:
        if self.backoff is None:
            return 0.0
        lo, hi = self.backoff
        return min(hi, lo * (2 ** max(0, min(attempts - 1, 30))))

    # --- what is ready -----------------------------------------------------------------------
    def has_ready(self, now: float) -> bool:
        if self.redeliver or self.ready_keys:
            return True
        if self._heap and self._heap[0][0] <= now:
            return True
        if self._delayed and self._delayed[0][0] <= now:
            return True
        if self.topic is not None:
            for s, ix in zip(self.shards, self.topic.shards):
                if s.cursor < ix.durable:
                    return True
        return False

    def next_deadline(self) -> float | None:
        """The earliest time something may change by itself (a lease running out, a backoff ending)."""
        times = []
        if self._heap:
            times.append(self._heap[0][0])
        if self._delayed:
            times.append(self._delayed[0][0])
        if self.late:
            times.append(self.late[0][0] / 1000)
        if self.topic is not None and self.topic.schedule.count:
            due = self.topic.schedule.next_due_ms(self.sched_mark)
            if due is not None:
                times.append(due / 1000)
        return min(times) if times else None

    # --- leases ending -----------------------------------------------------------------------
    def expire(self, now: float) -> int:
        """Leases that ran out end as failures (redelivery after backoff)."""
        heap, leases = self._heap, self.leases
        n = 0
        while heap and heap[0][0] <= now:
            for num in heapq.heappop(heap)[2]:
                lease = leases.get(num)
                if lease is not None and lease[0] <= now:
                    self._fail(num, lease, now)
                    n += 1
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, _, nums, key = heapq.heappop(delayed)
            if key:
                ks = self.keys.get(key)
                if ks is not None:
                    ks.delayed = False
                    self._key_settled(key, ks)
            else:
                parked = self.parked
                for num in nums:
                    if parked.get(num, -1) >= 0:  # a rescheduled message whose time has come
                        del parked[num]
                self.redeliver.extend(nums)
        return n

    def disown(self, owner, nums) -> None:
        """`owner` (a stream) is gone: its leases among `nums` stay until their deadline, owned by nobody, and
        then run out into redelivery like any other (the client may still ack or nack them meanwhile)."""
        leases = self.leases
        for num in nums:
            lease = leases.get(num)
            if lease is not None and lease[2] is owner:
                leases[num] = (lease[0], lease[1], None, lease[3])

    def _end_lease(self, num: int, lease: Lease) -> None:
        del self.leases[num]
        if lease[2] is not None:
            lease[2].release(num)

    def _fail(self, num: int, lease: Lease, now: float) -> None:
        """A nack or an expired lease: the message goes back, after the retry backoff."""
        self._end_lease(num, lease)
        self.versions[num] = lease[1]
        key = lease[3]
        if not key:
            wait = self.backoff_s(lease[1])
            if wait <= 0:
                self.redeliver.append(num)
            else:
                self._seq += 1
                heapq.heappush(self._delayed, (now + wait, self._seq, [num], 0))
            return
        ks = self.keys[key]
        # this message and every later one of its batch go back, acked or not
        i = ks.batch.index(num)
        back = ks.batch[i:]
        del ks.batch[i:]
        ks.live.discard(num)
        for m in back[1:]:
            other = self.leases.get(m)
            if other is not None:
                self._end_lease(m, other)
                self.versions[m] = other[1]
                ks.live.discard(m)
        ks.redo = sorted(set(ks.redo).union(back))
        wait = self.backoff_s(lease[1])
        if wait > 0 and not ks.delayed:
            ks.delayed = True
            self._seq += 1
            heapq.heappush(self._delayed, (now + wait, self._seq, [], key))
        self._key_settled(key, ks)

    def _key_settled(self, key: int, ks: KeyState) -> None:
        """Called when a key's outstanding batch may have ended: queue its next batch, or forget it."""
        if ks.live or ks.delayed:
            return
        ks.batch = []
        if ks.redo or ks.pending:
            if key not in self.ready_keys:
                self.ready_keys.append(key)
        else:
            del self.keys[key]

    # --- handing out -------------------------------------------------------------------------
    def take(self, max_messages: int, now: float, deadline_s: float, owner=None, per_key_max: int = 0) -> list[Delivery]:
        """Lock up to `max_messages` messages: redeliveries first, then ready keys, then new messages in
        log order (ordered and scheduled ones shard by shard). `owner` (a stream, or None) is told
        `release(num)` when a lease ends for any reason (`release_all(nums)` for a batch of acks).
        `per_key_max` caps an ordered key's batch (push: 1)."""
        self.expire(now)
        out: list[Delivery] = []
        leases, versions = self.leases, self.versions
        deadline = now + deadline_s
        shards = self.shards
        max_attempts = self.max_attempts
        redeliver = self.redeliver
        while redeliver and len(out) < max_messages:
            num = redeliver.popleft()
            if num in leases or shards[num & SHARD_MASK].is_acked(num >> _BITS) or num in self.parked:
                continue
            version = versions.pop(num, 0) + 1
            if max_attempts and version > max_attempts:
                self._to_dead_letter(num, version - 1, deadline)
                continue
            leases[num] = (deadline, version, owner, 0)
            out.append((num, version))
        if self.topic is not None and self.topic.schedule.count and len(out) < max_messages:
            self._take_scheduled(out, max_messages, now, deadline, owner)
        if self.ordered:
            self._take_ready_keys(out, max_messages, deadline, owner, per_key_max)
        if self.topic is not None and len(out) < max_messages:
            if self.ordered or self.topic.schedule.count:
                for shard_no, (s, ix) in enumerate(zip(shards, self.topic.shards)):
                    if s.cursor < ix.durable:
                        self._take_ordered_shard(shard_no, s, ix, out, max_messages, deadline, owner, per_key_max)
                        if len(out) >= max_messages:
                            break
            else:
                self._take_in_log_order(out, max_messages, deadline, owner)
        if out:
            self._schedule(deadline, tuple(map(itemgetter(0), out)))
            self.last_activity = now
        return out

    def _take_in_log_order(self, out, max_messages, deadline, owner) -> None:
        """New messages of all shards in the order they were logged, a stored batch at a time: the oldest go out
        first, and a backlog is read from disk front to back (shard after shard read every n-th record of the
        log, which no read-ahead serves)."""
        shards, ixs = self.shards, self.topic.shards
        while len(out) < max_messages:
            first = None
            for shard_no, (s, ix) in enumerate(zip(shards, ixs)):
                if s.cursor < ix.durable:
                    pos, end = ix.batch_around(s.cursor)
                    if first is None or pos < first[0]:
                        first = (pos, shard_no, min(end, ix.durable))
            if first is None:
                return
            _, shard_no, end = first
            self._take_shard(shard_no, shards[shard_no], end, out, max_messages, deadline, owner)

    def _take_shard(self, shard_no, s: SubShard, end, out, max_messages, deadline, owner) -> None:
        leases, versions, acked = self.leases, self.versions, s.acked
        max_attempts = self.max_attempts
        cursor = s.cursor
        parked = self.parked
        n = min(end - cursor, max_messages - len(out))
        if n > 0 and not parked and not versions and (not acked or acked.isdisjoint(range(cursor, cursor + n))):
            # first deliveries of a plain run (acks of other streams sit below the cursor): no per-message checks
            nums = range((cursor << _BITS) | shard_no, ((cursor + n) << _BITS) | shard_no, 1 << _BITS)
            leases.update(dict.fromkeys(nums, (deadline, 1, owner, 0)))
            out.extend(zip(nums, itertools.repeat(1)))
            s.cursor = cursor + n
            return
        while cursor < end and len(out) < max_messages:
            if cursor not in acked:
                num = (cursor << _BITS) | shard_no
                if parked and num in parked:
                    cursor += 1
                    continue
                version = versions.pop(num, 0) + 1 if versions else 1
                if max_attempts and version > max_attempts:
                    self._to_dead_letter(num, version - 1, deadline)
                else:
                    leases[num] = (deadline, version, owner, 0)
                    out.append((num, version))
            cursor += 1
        s.cursor = cursor

    def _take_scheduled(self, out, max_messages, now, deadline, owner) -> None:
        """Messages whose activation time has come, in activation order: first those added behind this
        subscription's mark, then the topic's index from the mark on."""
        now_ms = int(now * 1000)
        late = self.late
        shards = self.topic.shards
        while late and late[0][0] <= now_ms and len(out) < max_messages:
            num = late[0][1]
            if num >> _BITS >= shards[num & SHARD_MASK].durable:
                break  # not on disk yet
            heapq.heappop(late)
            self._take_one(num, out, deadline, owner)
        if len(out) >= max_messages:
            return
        for _, num, mark in self.topic.schedule.walk(self.sched_mark, now_ms):
            if num >> _BITS >= shards[num & SHARD_MASK].durable:
                return  # not on disk yet: the walk resumes here
            self.sched_mark = mark
            self._take_one(num, out, deadline, owner)
            if len(out) >= max_messages:
                return

    def _take_one(self, num: int, out, deadline, owner) -> None:
        if num in self.leases or self.is_acked(num) or num in self.parked:
            return
        version = self.versions.pop(num, 0) + 1
        if self.max_attempts and version > self.max_attempts:
            self._to_dead_letter(num, version - 1, deadline)
            return
        self.leases[num] = (deadline, version, owner, 0)
        out.append((num, version))

    def scheduled(self, activate_ms: int, num: int) -> None:
        """The topic indexed a message: if this subscription's walk has passed its place, take it directly."""
        if Schedule.position(activate_ms, num) <= self.sched_mark:
            heapq.heappush(self.late, (activate_ms, num))

    def _take_ordered_shard(self, shard_no, s: SubShard, ix, out, max_messages, deadline, owner, per_key_max) -> None:
        """Walk new messages batch by batch: scheduled batches are skipped (the activation index hands
        them out); keyless ones go out freely; with ordering, a key that is idle starts a batch and a busy
        key parks the range in its `pending` queue (no scanning later: ready keys are queued when their
        batch ends)."""
        end = ix.durable
        cursor = s.cursor
        i = bisect.bisect_right(ix.base, cursor) - 1
        while cursor < end and len(out) < max_messages:
            hi = min(ix.batch_end(i), end)
            key = ix.keys[i]
            if key == SCHEDULED:
                cursor = s.cursor = hi
            elif not key or not self.ordered:
                self._take_shard(shard_no, s, hi, out, max_messages, deadline, owner)
                cursor = s.cursor
            else:
                ks = self.keys.get(key)
                if ks is None:
                    ks = self.keys[key] = KeyState()
                if ks.idle():
                    ks.pending.append([shard_no, cursor, hi])
                    self._take_key(key, ks, out, max_messages, deadline, owner, per_key_max)
                elif ks.pending and ks.pending[-1][0] == shard_no and ks.pending[-1][2] == cursor:
                    ks.pending[-1][2] = hi  # extend the parked range
                else:
                    ks.pending.append([shard_no, cursor, hi])
                cursor = hi
                s.cursor = cursor
            if cursor >= ix.batch_end(i):
                i += 1

    def _take_ready_keys(self, out, max_messages, deadline, owner, per_key_max) -> None:
        ready = self.ready_keys
        while ready and len(out) < max_messages:  # every _take_key consumes work, so this ends
            key = ready.popleft()
            ks = self.keys.get(key)
            if ks is None or ks.live or ks.delayed:
                continue
            self._take_key(key, ks, out, max_messages, deadline, owner, per_key_max)

    def _take_key(self, key, ks: KeyState, out, max_messages, deadline, owner, per_key_max) -> None:
        """Hand out the key's next batch: its redo list, else the head of its pending ranges."""
        room = max_messages - len(out)
        if per_key_max:
            room = min(room, per_key_max)
        batch: list[int] = []
        leases, versions = self.leases, self.versions
        max_attempts = self.max_attempts
        if ks.redo:
            todo, ks.redo = ks.redo[:room], ks.redo[room:]
        else:
            todo = []
            while ks.pending and len(todo) < room:
                rng = ks.pending[0]
                shard_no, lo, hi = rng
                acked = self.shards[shard_no]
                while lo < hi and len(todo) < room:
                    if not acked.is_acked(lo):
                        todo.append((lo << _BITS) | shard_no)
                    lo += 1
                rng[1] = lo
                if lo >= hi:
                    ks.pending.popleft()
        for num in todo:
            ss = self.shards[num & SHARD_MASK]
            if num in self.parked:
                continue
            if ss.is_acked(num >> _BITS):
                if num >> _BITS in ss.acked:  # redelivered with its batch though acked (still retained): no lease
                    out.append((num, versions.get(num, 1)))
                    batch.append(num)
                continue
            version = versions.pop(num, 0) + 1
            if max_attempts and version > max_attempts:
                self._to_dead_letter(num, version - 1, deadline)  # and the key moves on
                continue
            leases[num] = (deadline, version, owner, key)
            ks.live.add(num)
            batch.append(num)
            out.append((num, version))
        ks.batch = batch
        self._key_settled(key, ks)

    def _to_dead_letter(self, num: int, attempts: int, deadline: float) -> None:
        """Hold the message (keyless lease, no owner) while the engine forwards it; if forwarding fails the
        lease runs out and it comes back here."""
        self.leases[num] = (deadline, attempts, None, 0)
        self.dead_letters.append(num)

    def _schedule(self, deadline: float, nums: tuple[int, ...]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, nums))

    # --- answers from clients ----------------------------------------------------------------
    def ack(self, nums: list[int]) -> list[int]:
        """Acknowledge message numbers; return those that changed state (to be logged). Lease owners are
        told once per batch (`release_all`)."""
        if not self.keys:
            changed = self._ack_leased(nums)
            if changed is not None:
                return changed
        changed = []
        shards, leases_pop = self.shards, self.leases.pop
        n_shards = len(shards)
        owners: dict = {}
        for num in nums:
            shard = num & SHARD_MASK
            if shard >= n_shards or not shards[shard].mark(num >> _BITS):
                continue
            changed.append(num)
            lease = leases_pop(num, None)
            if lease is not None:
                if lease[2] is not None:
                    mine = owners.get(lease[2])
                    if mine is None:
                        owners[lease[2]] = [num]
                    else:
                        mine.append(num)
                if lease[3]:
                    ks = self.keys.get(lease[3])
                    if ks is not None:
                        ks.live.discard(num)
                        self._key_settled(lease[3], ks)
        for owner, mine in owners.items():
            owner.release_all(mine)
        self._forget(changed)
        return changed

    def _ack_leased(self, nums: list[int]) -> list[int] | None:
        """`ack` for the common batch, in C-level passes: distinct numbers of one shard, every one leased (so
        none acked before) and no ordering key in flight. None, having changed nothing, for any other batch."""
        shard_nos = set(map(SHARD_MASK.__and__, nums))
        if len(shard_nos) != 1 or (shard_no := shard_nos.pop()) >= len(self.shards):
            return None
        leases = self.leases
        popped = list(map(leases.pop, nums, itertools.repeat(None)))
        if None in popped:  # one was not leased, or came twice: put the leases back, take the careful path
            leases.update((num, lease) for num, lease in zip(nums, popped) if lease is not None)
            return None
        self.shards[shard_no].mark_unacked(list(map(_BITS.__rrshift__, nums)))
        owners = set(map(itemgetter(2), popped))  # None: a lease without an owner (Pull, dead-lettering)
        if len(owners) == 1:
            owner = owners.pop()
            if owner is not None:
                owner.release_all(nums)
        else:
            owners.discard(None)
            for owner in owners:
                owner.release_all([num for num, lease in zip(nums, popped) if lease[2] is owner])
        self._forget(nums)
        return nums

    def _forget(self, acked: list[int]) -> None:
        """Drop what acked messages no longer need: delivery counts, parking, in-place updates."""
        for side in (self.versions, self.parked, self.overrides):
            if side:
                for num in acked:
                    side.pop(num, None)

    # --- queue extensions ----------------------------------------------------------------------
    def park(self, nums: list[int], activate_ms: int) -> None:
        """End these messages' locks without acking them: they wait until `activate_ms` (reschedule), or
        until kicked when it is -1 (bury). The delivery counter is kept."""
        for num in nums:
            if self.is_acked(num):
                continue
            lease = self.leases.get(num)
            if lease is not None:
                self._end_lease(num, lease)
                self.versions[num] = lease[1]
                if lease[3] and lease[3] in self.keys:
                    ks = self.keys[lease[3]]
                    ks.live.discard(num)
                    if num in ks.batch:
                        ks.batch.remove(num)
                    self._key_settled(lease[3], ks)
            self.parked[num] = activate_ms
        if activate_ms >= 0 and nums:
            self._seq += 1
            heapq.heappush(self._delayed, (activate_ms / 1000, self._seq, list(nums), 0))

    def kick(self, nums: list[int]) -> None:
        """Buried messages go back to the queue."""
        for num in nums:
            if self.parked.get(num) == -1:
                del self.parked[num]
                self.redeliver.append(num)

    def buried(self) -> list[int]:
        return [n for n, at in self.parked.items() if at == -1]

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
                self._fail(num, lease, now)
            else:
                leases[num] = (now + seconds, lease[1], lease[2], lease[3])
            applied.append(num)
        if seconds > 0 and applied:
            self._schedule(now + seconds, tuple(applied))
        return len(applied)

    def modify_deadline(self, num: int, version: int, seconds: float, now: float) -> bool:
        return self.modify_deadlines([(num, version)], seconds, now) == 1

    def untake(self, deliveries: list[Delivery]) -> None:
        """Undo the most recent take of these (they did not fit in a response): they go back to the front
        of the queue with their delivery version unchanged."""
        for num, version in reversed(deliveries):
            lease = self.leases.get(num)
            if lease is None:
                continue
            self._end_lease(num, lease)
            if version > 1:
                self.versions[num] = version - 1
            key = lease[3]
            if key:
                ks = self.keys[key]
                ks.live.discard(num)
                if num in ks.batch:
                    ks.batch.remove(num)
                ks.redo.insert(0, num)
                self._key_settled(key, ks)
            else:
                self.redeliver.appendleft(num)

    # --- resets ------------------------------------------------------------------------------
    def reset(self, floors: list[int], acked: list[list[int]]) -> None:
        """Replace the ack state (seek, snapshot restore, recovery). Outstanding leases are dropped."""
        self.shards = []
        for floor, above in zip(floors, acked):
            s = SubShard(floor)
            for o in above:
                s.mark(o)
            self.shards.append(s)
        for num, lease in self.leases.items():
            if lease[2] is not None:
                lease[2].release(num)
        self.leases.clear()
        self._heap.clear()
        self._delayed.clear()
        self.redeliver.clear()
        self.versions.clear()
        self.keys.clear()
        self.ready_keys.clear()
        self.dead_letters.clear()
        self.sched_mark = _SCHED_START
        self.late.clear()
        self.parked.clear()

    def rewind_unacked(self) -> None:
        """After a restart nothing is locked: every unacked message is delivered again."""
        for s in self.shards:
            s.cursor = s.floor
        self.sched_mark = _SCHED_START
        for num, at in self.parked.items():
            if at >= 0:
                self._seq += 1
                heapq.heappush(self._delayed, (at / 1000, self._seq, [num], 0))

    def export_state(self) -> tuple[list[int], list[list[int]]]:
        return [s.floor for s in self.shards], [sorted(s.acked) for s in self.shards]

    def export_attempts(self) -> list[list[int]]:
        """[num, deliveries] of unacked messages, when deliveries are counted (dead-letter policy)."""
        if not self.max_attempts:
            return []
        out = dict(self.versions)
        for num, lease in self.leases.items():
            out[num] = lease[1]
        return [[n, c] for n, c in out.items()]

    def count_deliveries(self, nums) -> None:
        """Replay of a DELIVER record: these were handed out once more."""
        for num in nums:
            shard = num & SHARD_MASK
            if shard < len(self.shards) and not self.shards[shard].is_acked(num >> _BITS):
                self.versions[num] = self.versions.get(num, 0) + 1

    def drop_before(self, shard: int, offset: int) -> None:
        self.shards[shard].drop_before(offset)
        # leases and redeliveries below the floor are now acked; ack() of them is a no-op
        for n in [n for n in self.leases if n & SHARD_MASK == shard and n >> _BITS < offset]:
            lease = self.leases[n]
            self._end_lease(n, lease)
            if lease[3] and lease[3] in self.keys:
                ks = self.keys[lease[3]]
                ks.live.discard(n)
                self._key_settled(lease[3], ks)
        for n in [n for n in self.versions if n & SHARD_MASK == shard and n >> _BITS < offset]:
            del self.versions[n]

    def hot_keys(self, top: int = 10) -> list[tuple[int, int, int]]:
        """The ordering keys with the most messages waiting: (key hash, waiting messages, publish ms of the
        oldest waiting one), largest first — a hot key shows here before it shows as latency."""
        rows = []
        for key, ks in self.keys.items():
            waiting = len(ks.live) + len(ks.redo) + sum(hi - lo for _, lo, hi in ks.pending)
            firsts = [n for n in list(ks.live) + ks.redo] + [(lo << _BITS) | sh for sh, lo, _ in ks.pending]
            oldest = min(firsts, key=lambda n: n >> _BITS, default=None)
            ms = 0
            if oldest is not None and self.topic is not None:
                ix = self.topic.shards[oldest & SHARD_MASK]
                if ix.first() <= oldest >> _BITS < ix.next:
                    ms = ix.publish_ms(oldest >> _BITS)
            rows.append((key, waiting, ms))
        rows.sort(key=lambda r: -r[1])
        return rows[:top]

    def is_acked(self, num: int) -> bool:
        shard = num & SHARD_MASK
        return shard < len(self.shards) and self.shards[shard].is_acked(num >> _BITS)

    def backlog(self) -> int:
        """Unacked messages (approximate: counts acks above the floor exactly)."""
        if self.topic is None:
            return 0
        return sum(max(0, ix.durable - s.floor - len(s.acked)) for s, ix in zip(self.shards, self.topic.shards))
