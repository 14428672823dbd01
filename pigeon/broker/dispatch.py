"""Dispatch: choosing what a subscription hands out next. Owns the rules of the soft state — cursors, the
redelivery queue, backoff, lease deadlines as they run out, ordering keys' batches:
- retry backoff: a nacked or expired message waits min(maximum, minimum · 2^(attempts-1)) before it is
  handed out again;
- dead-lettering: a message already delivered max_delivery_attempts times is not handed out again but
  taken out for the dead-letter topic;
- ordering (broker.ordering): per key, publish order and at most one outstanding batch; a failed message
  sends every later message of its batch back with it, acked or not (a nack at once; after an expiry, a later
  one whose lease the client extended when that lease ends: `_fail`); keys are independent.

`Dispatch` is the half of SubscriptionState that moves this state (broker.subscription holds the durable half and
the record-applying methods): `take` chooses and leases nothing — the executor logs the picks as a Deliver record
and applies it —, `untake` gives back what did not fit, `expire` ends leases that ran out. Pure: time comes in
as `now` (seconds)."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from operator import itemgetter

from pigeon.core import limits
from pigeon.broker.schedule import Schedule
from pigeon.broker.topic import SCHEDULED, SHARD_MASK
from pigeon.storage.records import Deliver

_BITS = limits.shard_bits
Delivery = tuple[int, int]  # (message number = offset << shard_bits | shard, delivery version)
Lease = tuple[float, int, object, int]  # (deadline, version, owner, ordering-key hash or 0)
BURIED = -1  # `parked` value (num → int) of a buried message never rescheduled


def activation_of(at: int) -> int | None:
    """The latest reschedule's activation ms of a `parked` value, None when it was never rescheduled. A value
    >= 0 is that activation (waiting until then, active after it); -1 is buried; below -1, buried after a
    reschedule to -2 - value (retention still counts from that activation, and a kick restores it)."""
    if at >= 0:
        return at
    return -2 - at if at < BURIED else None


def is_waiting(at: int, now_ms: float) -> bool:
    """Whether a `parked` value keeps its message out of delivery at `now_ms`: buried, or before its activation."""
    return at < 0 or at > now_ms


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


class Picks:
    """What one `take` chose: `out` the (num, version) pairs to hand out in order (an ordered batch resent
    whole may hold members acked meanwhile: they go out without a lease), their ordering-key hashes (`keys`,
    ordered subscriptions), `fresh` when every one is a first delivery without a key (the common case:
    leased in one C-level pass), and `dead`: (num, deliveries so far) to forward to the dead-letter topic."""

    __slots__ = ("out", "keys", "fresh", "dead")

    def __init__(self, keyed: bool):
        self.out: list[Delivery] = []
        self.keys: list[int] | None = [] if keyed else None
        self.fresh = True
        self.dead: list[tuple[int, int]] = []

    def __bool__(self) -> bool:
        return bool(self.out or self.dead)

    def __len__(self) -> int:
        return len(self.out)

    def record(self, sub_uid: int, deadline: float) -> Deliver:
        """The Deliver record that leases these (what `lease` applies)."""
        nums = list(map(itemgetter(0), self.out))
        versions = None if self.fresh else list(map(itemgetter(1), self.out))
        return Deliver(sub_uid, deadline, nums, versions, self.keys, self.dead or None)

class Dispatch:
    """Mixed into SubscriptionState: the attributes it uses are that class's."""

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
                if s.cursor < ix.visible:
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

    # --- leases ending (dispatch) ---------------------------------------------------------------
    def expire(self, now: float) -> int:
        """Leases that ran out end as failures (redelivery after backoff), each at its own deadline and no
        other lease with it (`_fail`). Time decides this, not a record: a later Deliver record carries the next
        version explicitly, so applying the log without these expiries leads to the same durable state."""
        heap, leases = self._heap, self.leases
        n = 0
        while heap and heap[0][0] <= now:
            for num in heapq.heappop(heap)[2]:
                lease = leases.get(num)
                if lease is not None and lease[0] <= now:
                    self._fail(num, lease, now)
                    n += 1
        self.expired += n
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, _, nums, key = heapq.heappop(delayed)
            if key:
                ks = self.keys.get(key)
                if ks is not None:
                    ks.delayed = False
                    self._key_settled(key, ks)
            else:
                # a rescheduled message whose time has come goes out through this queue (it stays in `parked`
                # with its activation, now past, until acked: retention counts from it)
                self.redeliver.extend(nums)
        return n

    def _fail(self, num: int, lease: Lease, now: float) -> None:
        """A nack or an expired lease: the message goes back, after the retry backoff. A keyed message sends the
        later members of its key's outstanding batch back with it, acked or not.

        Only a nack — a record, with its time — ends their leases with its own: the leased later messages of
        its key, which is how the rule reads without the dispatch state (recovery, a replica). A lease that ran
        out by `now` (an expiry, or a nack of a lease `expire` has not seen yet) ends alone, and a later member
        whose lease still runs (the client extended it) keeps it until its own deadline, ack or nack; the batch
        goes out again once none of it is leased. Time then ends a lease at its own deadline only, which is all
        a replay can know: it cannot tell whether an Ack record (it carries no time) came before or after an
        earlier member's deadline."""
        self._end_lease(num, lease)
        self.versions[num] = lease[1]
        key = lease[3]
        nack = lease[0] > now  # (else it ran out: an expiry)
        if not self.dispatching:
            if key and nack:
                for m in [m for m, other in self.leases.items() if other[3] == key and m > num]:  # same key: same shard
                    other = self.leases[m]
                    self._end_lease(m, other)
                    self.versions[m] = other[1]
            return
        if not key:
            wait = self.backoff_s(lease[1])
            if wait <= 0:
                self.redeliver.append(num)
            else:
                self._seq += 1
                heapq.heappush(self._delayed, (now + wait, self._seq, [num], 0))
            return
        ks = self.keys[key]
        # this message and every later one of its batch go back, acked or not (those still leased after an
        # expiry once their leases end: they stay in the batch until then, so a nack of one finds its place)
        i = ks.batch.index(num)
        back = ks.batch[i:]
        ks.live.discard(num)
        if nack:
            del ks.batch[i:]
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

    def _key_lost(self, num: int, key: int) -> None:
        """A keyed message left its batch without failing it (acked, parked, dropped)."""
        ks = self.keys.get(key) if self.dispatching else None
        if ks is not None:
            ks.live.discard(num)
            self._key_settled(key, ks)

    def _derive_redo(self) -> None:
        """For the dispatch state derived from the durable state (`_derive_dispatch`, once each key got its
        leased messages as its batch): a key with leased messages may have unacked ones before them, neither
        leased nor parked — members of its batch whose leases ran out while a later member's ran on (the client
        extended it: see `_fail`). They go out again before anything later of the key, as the start of its redo
        list: found in the topic's index between the shard's floor and the key's last leased message (a key is
        one shard's)."""
        ends: dict[int, int] = {}  # shard → the offset after the last leased message of a key in it
        for ks in self.keys.values():
            last = ks.batch[-1]
            shard = last & SHARD_MASK
            ends[shard] = max(ends.get(shard, 0), (last >> _BITS) + 1)
        for shard, end in ends.items():
            ix, acked = self.topic.shards[shard], self.shards[shard]
            floor = acked.floor
            i = max(0, bisect.bisect_right(ix.base, floor) - 1)
            while i < len(ix.base) and ix.base[i] < end:
                ks = self.keys.get(ix.keys[i])
                if ks is not None and ks.batch[-1] & SHARD_MASK == shard:
                    top = ks.batch[-1] >> _BITS
                    for o in range(max(ix.base[i], floor), min(ix.batch_end(i), top)):
                        num = (o << _BITS) | shard
                        if not acked.is_acked(o) and num not in self.leases and num not in self.parked:
                            ks.redo.append(num)
                i += 1

    # --- choosing what to hand out (dispatch) ---------------------------------------------------
    def take(self, max_messages: int, now: float, per_key_max: int = 0) -> Picks:
        """Choose up to `max_messages` messages: redeliveries first, then ready keys, then new messages in log
        order (ordered and scheduled ones shard by shard). Moves the dispatch state only: the caller leases
        the picks by applying their Deliver record (`lease`), or gives them back (`untake`).
        `per_key_max` caps an ordered key's batch (push: 1).

        Nothing while dispatch is off: a bundle log of the topic being applied again (a take-over, until
        `resume_log`) cleared the dispatch state of every shard — the ordering keys' batches and pending ranges
        too — while the cursors of the node's other shards stayed where they were, so a key with leased or waiting
        messages would look idle and its next new message go out ahead of them (sim-cluster seed 7011)."""
        if not self.dispatching:
            return Picks(self.ordered)
        self.expire(now)
        picks = Picks(self.ordered)
        out = picks.out
        redeliver = self.redeliver
        if redeliver:
            leases, versions, shards, parked = self.leases, self.versions, self.shards, self.parked
            now_ms = now * 1000
            chosen: set[int] = set()  # a number may sit in the queue twice (kicked while queued)
            while redeliver and len(out) < max_messages:
                num = redeliver.popleft()
                if num in leases or num in chosen:
                    continue
                at = parked.get(num) if parked else None
                if at is None:
                    if shards[num & SHARD_MASK].is_acked(num >> _BITS):
                        continue
                elif is_waiting(at, now_ms):
                    continue  # (parked, hence unacked — below the floor too, when retention kept it)
                chosen.add(num)
                self._pick(picks, num, versions.get(num, 0) + 1, 0)
        if self.topic is not None and self.topic.schedule.count and len(out) < max_messages:
            self._take_scheduled(picks, max_messages, now)
        if self.ordered:
            self._take_ready_keys(picks, max_messages, per_key_max)
        if self.topic is not None and len(out) < max_messages:
            if self.ordered or self.topic.schedule.count:
                for shard_no, (s, ix) in enumerate(zip(self.shards, self.topic.shards)):
                    if s.cursor < ix.visible:
                        self._take_ordered_shard(shard_no, s, ix, picks, max_messages, per_key_max)
                        if len(out) >= max_messages:
                            break
            else:
                self._take_in_log_order(picks, max_messages)
        if picks:
            self.last_activity = now
        return picks

    def _pick(self, picks: Picks, num: int, version: int, key: int) -> None:
        if self.max_attempts and version > self.max_attempts and self.dead_letter_open:
            picks.dead.append((num, version - 1))
            return
        picks.out.append((num, version))
        if picks.keys is not None:
            picks.keys.append(key)
        if version != 1 or key:
            picks.fresh = False

    def _take_in_log_order(self, picks: Picks, max_messages: int) -> None:
        """New messages of all shards in the order they were logged, a stored batch at a time: the oldest go out
        first, and a backlog is read from disk front to back (shard after shard read every n-th record of the
        log, which no read-ahead serves)."""
        shards, ixs = self.shards, self.topic.shards
        out = picks.out
        while len(out) < max_messages:
            first = None
            for shard_no, (s, ix) in enumerate(zip(shards, ixs)):
                if s.cursor < ix.visible:
                    pos, end = ix.batch_around(s.cursor)
                    if first is None or pos < first[0]:
                        first = (pos, shard_no, min(end, ix.visible))
            if first is None:
                return
            _, shard_no, end = first
            self._take_shard(shard_no, shards[shard_no], end, picks, max_messages)

    def _take_shard(self, shard_no, s, end, picks: Picks, max_messages: int) -> None:
        versions, acked, parked, ahead = self.versions, s.acked, self.parked, self.ahead
        out = picks.out
        cursor = s.cursor
        n = min(end - cursor, max_messages - len(out))
        if n > 0 and not parked and not versions and not ahead and (
                not acked or acked.isdisjoint(range(cursor, cursor + n))):
            # first deliveries of a plain run (acks of other streams sit below the cursor): no per-message checks
            nums = range((cursor << _BITS) | shard_no, ((cursor + n) << _BITS) | shard_no, 1 << _BITS)
            out.extend(zip(nums, itertools.repeat(1)))
            if picks.keys is not None:  # keyless messages of an ordered subscription
                picks.keys.extend(itertools.repeat(0, n))
            s.cursor = cursor + n
            return
        while cursor < end and len(out) < max_messages:
            if cursor not in acked:
                num = (cursor << _BITS) | shard_no
                if ahead and num in ahead:
                    ahead.discard(num)  # leased or queued before the cursor was rewound: not new
                elif not (parked and num in parked):  # (a parked one goes out by the redelivery queue when due)
                    self._pick(picks, num, versions.get(num, 0) + 1 if versions else 1, 0)
            cursor += 1
        s.cursor = cursor

    def _take_scheduled(self, picks: Picks, max_messages: int, now: float) -> None:
        """Messages whose activation time has come, in activation order: first those added behind this
        subscription's mark, then the topic's index from the mark on."""
        now_ms = int(now * 1000)
        late = self.late
        shards = self.topic.shards
        out = picks.out
        while late and late[0][0] <= now_ms and len(out) < max_messages:
            num = late[0][1]
            if num >> _BITS >= shards[num & SHARD_MASK].visible:
                break  # not visible yet
            heapq.heappop(late)
            self._take_one(num, picks)
        if len(out) >= max_messages:
            return
        for _, num, mark in self.topic.schedule.walk(self.sched_mark, now_ms):
            if num >> _BITS >= shards[num & SHARD_MASK].visible:
                return  # not visible yet: the walk resumes here
            self.sched_mark = mark
            self._take_one(num, picks)
            if len(out) >= max_messages:
                return

    def _take_one(self, num: int, picks: Picks) -> None:
        if num in self.leases or self.is_acked(num) or num in self.parked:
            return
        if self.ahead and num in self.ahead:
            self.ahead.discard(num)  # locked when the walk was rewound: it comes back through the queue
            return
        self._pick(picks, num, self.versions.get(num, 0) + 1, 0)

    def scheduled(self, activate_ms: int, num: int) -> None:
        """The topic indexed a message: if this subscription's walk has passed its place, take it directly."""
        if Schedule.position(activate_ms, num) <= self.sched_mark:
            heapq.heappush(self.late, (activate_ms, num))

    def _take_ordered_shard(self, shard_no, s, ix, picks, max_messages, per_key_max) -> None:
        """Walk new messages batch by batch: scheduled batches are skipped (the activation index hands
        them out); keyless ones go out freely; with ordering, a key that is idle starts a batch and a busy
        key parks the range in its `pending` queue (no scanning later: ready keys are queued when their
        batch ends)."""
        end = ix.visible
        cursor = s.cursor
        i = bisect.bisect_right(ix.base, cursor) - 1
        out = picks.out
        while cursor < end and len(out) < max_messages:
            hi = min(ix.batch_end(i), end)
            key = ix.keys[i]
            if key == SCHEDULED:
                cursor = s.cursor = hi
            elif not key or not self.ordered:
                self._take_shard(shard_no, s, hi, picks, max_messages)
                cursor = s.cursor
            else:
                ks = self.keys.get(key)
                if ks is None:
                    ks = self.keys[key] = KeyState()
                if ks.idle():
                    ks.pending.append([shard_no, cursor, hi])
                    self._take_key(key, ks, picks, max_messages, per_key_max)
                elif ks.pending and ks.pending[-1][0] == shard_no and ks.pending[-1][2] == cursor:
                    ks.pending[-1][2] = hi  # extend the parked range
                else:
                    ks.pending.append([shard_no, cursor, hi])
                cursor = hi
                s.cursor = cursor
            if cursor >= ix.batch_end(i):
                i += 1

    def _take_ready_keys(self, picks, max_messages, per_key_max) -> None:
        ready = self.ready_keys
        while ready and len(picks.out) < max_messages:  # every _take_key consumes work, so this ends
            key = ready.popleft()
            ks = self.keys.get(key)
            if ks is None or ks.live or ks.delayed:
                continue
            self._take_key(key, ks, picks, max_messages, per_key_max)

    def _take_key(self, key, ks: KeyState, picks: Picks, max_messages, per_key_max) -> None:
        """Hand out the key's next batch: its redo list, else the head of its pending ranges."""
        room = max_messages - len(picks.out)
        if per_key_max:
            room = min(room, per_key_max)
        batch: list[int] = []
        versions = self.versions
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
        dead = len(picks.dead)
        indexes = self.topic.shards if self.topic is not None else None
        for num in todo:
            ss = self.shards[num & SHARD_MASK]
            if num in self.parked:
                continue
            if ss.is_acked(num >> _BITS):
                # resent with its batch though acked (no lease) while the log holds it — also once the ack floor
                # has passed it: a resend cut short by flow control leaves the key's last messages waiting here,
                # and the first delivery's acks of them may come in meanwhile
                if indexes is not None and num >> _BITS >= indexes[num & SHARD_MASK].first():
                    picks.out.append((num, versions.get(num, 1)))
                    picks.keys.append(key)
                    picks.fresh = False
                    batch.append(num)
                continue
            self._pick(picks, num, versions.get(num, 0) + 1, key)
            if len(picks.dead) > dead:  # taken out for dead-lettering: the key moves on
                dead = len(picks.dead)
                continue
            ks.live.add(num)
            batch.append(num)
        ks.batch = batch
        self._key_settled(key, ks)

    def untake(self, picks: Picks, keep: int, dead: bool = False) -> None:
        """Give back the picks after the first `keep` before they are leased (they did not fit in a response):
        they go back to the front of the queue with their delivery count unchanged — with `dead`, the ones taken
        out for dead-lettering too (their Deliver record was refused: nothing else would ever hand them out)."""
        if dead:
            for num, _ in reversed(picks.dead):  # (unkeyed, as when their dead-letter lease runs out)
                self.redeliver.appendleft(num)
            picks.dead.clear()
        rest = picks.out[keep:]
        keys = picks.keys[keep:] if picks.keys is not None else None
        del picks.out[keep:]
        if picks.keys is not None:
            del picks.keys[keep:]
        for i in range(len(rest) - 1, -1, -1):
            num = rest[i][0]
            key = keys[i] if keys else 0
            if not key:
                self.redeliver.appendleft(num)
            elif not self.is_acked(num):  # an acked member resent with its batch has nothing to give back
                ks = self.keys[key]
                ks.live.discard(num)
                if num in ks.batch:
                    ks.batch.remove(num)
                ks.redo.insert(0, num)
                self._key_settled(key, ks)
    def hot_keys(self, top: int = 10) -> list[tuple[int, int, int]]:
        """The ordering keys with the most messages waiting: (key hash, waiting messages, publish ms of the
        oldest waiting one), largest first — a hot key shows here before it shows as latency."""
        rows = []
        for key, ks in self.keys.items():
            waiting = len(ks.live.union(ks.redo)) + sum(hi - lo for _, lo, hi in ks.pending)
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
