"""Subscription state. Owns the rules:
- each message of a subscription is in exactly one state — not yet delivered (offset >= cursor), locked
  (in `leases`), waiting for redelivery (in `redeliver`, `_delayed` or a key's `redo`), waiting behind
  its ordering key (in a key's `pending`), parked (rescheduled or buried), or acked (offset < floor, or in
  `acked`) — but for a rescheduled message retention passed: unacked below the floor (in `kept`);
- retention counts from the publish, and for a rescheduled message from its latest reschedule's activation when
  that is later, so a periodic job lives as long as it is rescheduled: a Trim record drops everything of a shard
  below an offset but the rescheduled messages (they stay, in `kept`), an Ack record those whose activation is
  past retention (commands.retention). `parked` keeps every unacked message ever rescheduled or buried with its
  latest activation until it is acked or dropped — also once its activation came (it is active then);
- the durable state — ack floors and sets, leases (deadline, delivery version, ordering key), delivery counts
  of unleased messages, parked messages (and `kept`, derived from them), in-place updates — changes only
  through the methods that apply records (`lease`, `ack`, `modify_deadlines`, `reset`, `drop_before`, `park`,
  `kick`, `update`; broker.state calls them), live, in recovery and on a replica alike.

The dispatch state — cursors, the redelivery queue, backoff and deadline heaps, ordering keys' batches — is
soft: broker.dispatch (mixed in) moves it to choose what to hand out, and `rebuild` derives it from the durable
state after recovery. While `dispatching` is off (recovery, a replica) the apply methods leave it alone.

Compact by construction: per shard an ack floor, a cursor and a set of acks above the floor; per-message
entries exist only for messages that were handed out and are not acked yet, and per-key entries only
for keys with work in flight. Pure: every method takes `now` (seconds) and does no I/O."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from operator import itemgetter

from pigeon.core import limits
from pigeon.broker.dispatch import BURIED, Delivery, Dispatch, KeyState, Lease, activation_of, is_waiting
from pigeon.broker.filter import compile_filter
from pigeon.broker.resources import active_transforms
from pigeon.broker.topic import SHARD_MASK, TopicState
from pigeon.storage.records import Deliver

_BITS = limits.shard_bits
_SCHED_START = (-(1 << 62), -1)


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    name: str
    undelivered: int  # num_undelivered_messages: unacked (delivered or not)
    outstanding: int  # num_outstanding_messages: locked now
    waiting: int  # delivered before, waiting for redelivery
    parked: int  # rescheduled and waiting for its activation, or buried
    oldest_unacked_age_s: float  # oldest_unacked_message_age
    delivered: int  # counters since start
    acked: int
    expired: int  # expired_ack_deadlines
    dead_lettered: int  # dead_letter_message


class SubShard:
    __slots__ = ("floor", "acked", "cursor")

    def __init__(self, floor: int):
        self.floor = floor  # every offset below is acked
        self.acked: set[int] = set()  # acked offsets >= floor
        self.cursor = floor  # offsets >= cursor were never handed out since the last reset (dispatch)

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

class SubscriptionState(Dispatch):
    def __init__(self, uid: int, name: str, topic: TopicState | None, config):
        self.uid = uid
        self.name = name
        self.topic = topic
        start = topic.backlog_end() if topic else []
        self.shards = [SubShard(o) for o in start]
        self.start = list(start)  # where the subscription began: seeks without topic retention stop here
        # --- durable: changed only by the apply methods
        self.leases: dict[int, Lease] = {}
        self.versions: dict[int, int] = {}  # num → deliveries so far, for unacked messages not leased now
        # seeks of each shard so far: an ack id handed out before its shard's latest seek acks nothing (core.ackid)
        self.generations = [0] * len(start)
        # queue extensions: parked messages (rescheduled to an activation ms, or buried: see `activation_of`)
        # are skipped by every path until due or kicked, and then go out through the redelivery queue only; they
        # stay here (active) until acked or dropped. Overrides replace a message's stored bytes for this
        # subscription.
        self.parked: dict[int, int] = {}
        self.kept: set[int] = set()  # parked messages below their shard's floor: unacked (derived from `parked`)
        self.overrides: dict[int, bytes] = {}
        # --- dispatch: soft, derived from the durable state by `rebuild`
        self.dispatching = True
        # lease deadlines, one entry per batch handed out or extended: (deadline, seq, message numbers);
        # an entry only prompts a look at its messages' leases, which hold the authoritative deadline. Entries
        # are tuples of numbers only: the collector stops tracking those, and a stream's deadline keeps a minute
        # of them (at 1,000 msg/s some 60,000) out of the full collections that pause the event loop.
        self._heap: list[tuple[float, int, tuple[int, ...]]] = []
        self._seq = 0
        self.redeliver: deque[int] = deque()  # ready to hand out again now
        self._delayed: list[tuple[float, int, list[int], int]] = []  # (ready at, seq, nums, key) in backoff
        self.keys: dict[int, KeyState] = {}
        self.ready_keys: deque[int] = deque()  # keys whose next batch may go out
        self.dead_letters: list[int] = []  # to forward to the dead-letter topic (drained by the executor)
        self.dead_letter_open = False  # the dead-letter topic exists (kept by BrokerState)
        self.sched_mark: tuple[int, int] = _SCHED_START  # how far the topic's activation index was walked
        self.late: list[tuple[int, int]] = []  # (activate ms, num) added behind the mark: a heap
        self.ahead: set[int] = set()  # leased or queued numbers at or past their shard's cursor (after rebuild)
        self.detached = False
        # counters since start (statistics; not durable): deliveries leased, acks that changed something, leases
        # that ran out, messages taken out for dead-lettering
        self.delivered = self.acked_count = self.expired = self.dead_lettered = 0
        # the log its records go to (BrokerState.log_of); a spread topic's: its shards' logs, which durability waits on
        self.log_id: int | tuple | None = None
        self.last_activity = 0.0
        self.configure(config)

    # --- configuration -----------------------------------------------------------------------
    def configure(self, config) -> None:
        self.config = config
        self.ordered = bool(config.enable_message_ordering)
        self.transforms = active_transforms(config.message_transforms)  # JavaScript UDFs run at delivery
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
    def _end_lease(self, num: int, lease: Lease) -> None:
        del self.leases[num]
        if lease[2] is not None:
            lease[2].release(num)
    # --- applying records (durable state; the dispatch state follows while dispatching) -------------
    def lease(self, rec: Deliver, owner=None) -> None:
        """Apply a Deliver record: its messages are locked until its deadline for `owner` (a stream or a push
        worker, told `release(num)` when a lease ends; None on recovery or for a Pull); messages taken out for
        dead-lettering are held for nobody until then."""
        leases, versions, deadline = self.leases, self.versions, rec.deadline
        nums = rec.nums
        self.delivered += len(nums)
        if rec.versions is None and rec.keys is None:  # first deliveries: one C-level pass
            leases.update(dict.fromkeys(nums, (deadline, 1, owner, 0)))
            if versions:
                for num in nums:
                    versions.pop(num, None)
        else:
            keys = rec.keys or itertools.repeat(0)
            vers = rec.versions or itertools.repeat(1)
            for num, version, key in zip(nums, vers, keys):
                if self.is_acked(num):  # an acked member of an ordered batch resent: no lease
                    continue
                versions.pop(num, None)
                leases[num] = (deadline, version, owner, key)
        if rec.dead:
            self.dead_lettered += len(rec.dead)
            for num, attempts in rec.dead:
                versions.pop(num, None)
                leases[num] = (deadline, attempts, None, 0)
            if self.dispatching:
                self.dead_letters.extend(n for n, _ in rec.dead)
        if self.dispatching:
            held = tuple(nums) if not rec.dead else tuple(nums) + tuple(n for n, _ in rec.dead)
            if held:
                self._schedule(deadline, held)

    def _schedule(self, deadline: float, nums: tuple[int, ...]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, nums))

    def ack(self, nums) -> list[int]:
        """Apply an Ack record; return the numbers that changed state. Lease owners are told once per batch
        (`release_all`)."""
        if not self.keys:
            changed = self._ack_leased(nums)
            if changed is not None:
                return changed
        changed = []
        shards, leases_pop, kept = self.shards, self.leases.pop, self.kept
        n_shards = len(shards)
        owners: dict = {}
        ends = self.topic.backlog_end() if self.topic is not None else [s.floor for s in shards]
        for num in nums:
            shard = num & SHARD_MASK
            # an ack id can name a message the log no longer holds (cut by recovery): it must not ack the
            # message that gets its offset next
            if shard >= n_shards or num >> _BITS >= ends[shard]:
                continue
            if not shards[shard].mark(num >> _BITS):
                if not (kept and num in kept):
                    continue
                kept.discard(num)  # a rescheduled message retention passed: below the floor, acked now
                del self.parked[num]
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
                    self._key_lost(num, lease[3])
        for owner, mine in owners.items():
            owner.release_all(mine)
        self._forget(changed)
        self.acked_count += len(changed)
        return changed

    def _ack_leased(self, nums) -> list[int] | None:
        """`ack` for the common batch, in C-level passes: distinct numbers of one shard, every one leased (so
        none acked before) and no ordering key in flight. None, having changed nothing, for any other batch."""
        shard_nos = set(map(SHARD_MASK.__and__, nums))
        if len(shard_nos) != 1 or (shard_no := shard_nos.pop()) >= len(self.shards):
            return None
        if self.kept and min(nums) >> _BITS < self.shards[shard_no].floor:
            return None  # a rescheduled message below the floor (kept): the careful path
        leases = self.leases
        popped = list(map(leases.pop, nums, itertools.repeat(None)))
        if None in popped:  # one was not leased, or came twice: put the leases back, take the careful path
            leases.update((num, lease) for num, lease in zip(nums, popped) if lease is not None)
            return None
        nums = list(nums)
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
        self.acked_count += len(nums)
        return nums

    def _forget(self, acked: list[int]) -> None:
        """Drop what acked messages no longer need: delivery counts, parking, in-place updates."""
        for side in (self.versions, self.parked, self.overrides):
            if side:
                for num in acked:
                    side.pop(num, None)
        if self.kept:
            self.kept.difference_update(acked)

    def modify_deadlines(self, items: list[Delivery], seconds: float, now: float) -> int:
        """Apply a Modack record: extend (or, with 0, release: a nack) the leases of (num, version) pairs. A
        version of 0 matches any delivery; a stale version or an unknown message is ignored, and so is an
        extension of a lease that ran out by `now` — whether `expire` has seen it yet or not, so that applying
        the log decides as the live path did; a nack of such a lease ends it alone, as its expiry does, while a
        nack of a running one takes the later leased members of its key's batch with it (`_fail`). Returns how
        many applied."""
        leases = self.leases
        applied = []
        for num, version in items:
            lease = leases.get(num)
            if lease is None or (version and lease[1] != version) or (seconds > 0 and lease[0] <= now):
                continue
            if seconds <= 0:
                self._fail(num, lease, now)
            else:
                leases[num] = (now + seconds, lease[1], lease[2], lease[3])
            applied.append(num)
        if seconds > 0 and applied and self.dispatching:
            self._schedule(now + seconds, tuple(applied))
        return len(applied)

    def disown(self, owner, nums) -> None:
        """`owner` (a stream) is gone: its leases among `nums` stay until their deadline, owned by nobody, and
        then run out into redelivery like any other (the client may still ack or nack them meanwhile)."""
        leases = self.leases
        for num in nums:
            lease = leases.get(num)
            if lease is not None and lease[2] is owner:
                leases[num] = (lease[0], lease[1], None, lease[3])

    def park(self, nums: list[int], activate_ms: int) -> None:
        """Apply a Park record: end these messages' locks without acking them; they wait until `activate_ms`
        (reschedule), or until kicked when it is -1 (bury). The delivery counter is kept, and so is the latest
        reschedule's activation of a message buried (retention counts from it: `activation_of`)."""
        parked = self.parked
        for num in nums:
            if self.is_acked(num):
                continue
            lease = self.leases.get(num)
            if lease is not None:
                self._end_lease(num, lease)
                self.versions[num] = lease[1]
                if lease[3]:
                    ks = self.keys.get(lease[3]) if self.dispatching else None
                    if ks is not None and num in ks.batch:
                        ks.batch.remove(num)
                    self._key_lost(num, lease[3])
            if activate_ms < 0 and (before := activation_of(parked.get(num, BURIED))) is not None:
                parked[num] = -2 - before
            else:
                parked[num] = activate_ms
        if activate_ms >= 0 and nums and self.dispatching:
            self._seq += 1
            heapq.heappush(self._delayed, (activate_ms / 1000, self._seq, list(nums), 0))

    def kick(self, nums) -> None:
        """Apply a Kick record: buried messages go back to the queue (one rescheduled before keeps its latest
        activation, now past: retention still counts from it)."""
        parked = self.parked
        for num in nums:
            at = parked.get(num)
            if at is not None and at < 0:
                if at == BURIED:
                    del parked[num]
                else:
                    parked[num] = activation_of(at)
                if self.dispatching:
                    self.redeliver.append(num)

    def buried(self) -> list[int]:
        return [n for n, at in self.parked.items() if at < 0]

    def update(self, num: int, message: bytes) -> None:
        """Apply an Update record: the message reads as `message` for this subscription from now on."""
        if not self.is_acked(num):
            self.overrides[num] = message

    def reset(self, floors: list[int], acked: list[list[int]]) -> None:
        """Apply a Seek record: replace the ack state (seek, snapshot restore, a cursor moved). Outstanding
        leases are dropped."""
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
        self.versions.clear()
        self.parked.clear()
        self.kept.clear()
        self._clear_dispatch()

    def generation_of(self, num: int) -> int:
        """The seek generation of a message's shard (its ack ids carry it: core.ackid)."""
        shard = num & SHARD_MASK
        return self.generations[shard] if shard < len(self.generations) else 0

    def reset_shard(self, shard: int, floor: int, acked: list[int]) -> None:
        """Apply a Seek record of one shard (a spread topic: each shard's log has its own): replace that shard's
        ack state and drop what the subscription holds of its messages; the other shards' stay as they are, and
        the dispatch state is derived again (while dispatching)."""
        self.load_shard(shard, floor, acked)
        self._drop_shard(shard)
        self._clear_dispatch()
        if self.dispatching:
            self._derive_dispatch()

    def load_shard(self, shard: int, floor: int, acked: list[int]) -> None:
        """One shard's ack state from an image (a bundle snapshot of a spread topic), after `clear_data`."""
        s = self.shards[shard] = SubShard(floor)
        for o in acked:
            s.mark(o)

    def _drop_shard(self, shard: int) -> None:
        ours = lambda n: n & SHARD_MASK == shard  # noqa: E731
        for n in [n for n in self.leases if ours(n)]:
            lease = self.leases.pop(n)
            if lease[2] is not None:
                lease[2].release(n)
        for side in (self.versions, self.parked):
            for n in [n for n in side if ours(n)]:
                del side[n]
        self.kept = {n for n in self.kept if not ours(n)}

    def clear_data(self, shards: set[int] | None = None) -> None:
        """Back to its state as created in `shards` (all by default: their logs are applied again from the
        start)."""
        if shards is None or len(shards) == len(self.shards):
            self.reset(self.start, [[] for _ in self.start])
            self.overrides.clear()
            self.generations = [0] * len(self.start)
            return
        for k in shards:
            self.shards[k] = SubShard(self.start[k])
            self._drop_shard(k)
            self.generations[k] = 0
        self.overrides = {n: m for n, m in self.overrides.items() if n & SHARD_MASK not in shards}
        self._clear_dispatch()

    def _clear_dispatch(self) -> None:
        self._heap.clear()
        self._delayed.clear()
        self.redeliver.clear()
        self.keys.clear()
        self.ready_keys.clear()
        self.dead_letters.clear()
        self.sched_mark = _SCHED_START
        self.late.clear()
        self.ahead.clear()

    def drop_before(self, shard: int, offset: int, keep_rescheduled: bool = False) -> None:
        """Apply a Trim record: retention passed everything of `shard` below `offset` — but, with
        `keep_rescheduled`, rescheduled messages, whose retention counts from their latest activation: they stay,
        unacked below the floor, in `kept` (with their lease, delivery count and update) until acked, or dropped
        by retention with an Ack record."""
        self.shards[shard].drop_before(offset)
        below = lambda n: n & SHARD_MASK == shard and n >> _BITS < offset  # noqa: E731
        kept = self.kept
        if self.parked and keep_rescheduled:
            kept.update(n for n, at in self.parked.items() if below(n) and activation_of(at) is not None)
        # leases and redeliveries below the floor are now acked; ack() of them is a no-op
        for n in [n for n in self.leases if below(n) and n not in kept]:
            lease = self.leases[n]
            self._end_lease(n, lease)
            if lease[3]:
                self._key_lost(n, lease[3])
        for side in (self.versions, self.parked, self.overrides):
            for n in [n for n in side if below(n) and n not in kept]:
                del side[n]
        if self.ahead:
            self.ahead = {n for n in self.ahead if not (n & SHARD_MASK == shard and n >> _BITS < offset)}

    # --- recovery --------------------------------------------------------------------------------
    def rebuild(self, now: float) -> None:
        """Derive the dispatch state from the durable state (after recovery, or when taking a subscription over)
        and start dispatching. Every cursor goes back to its floor: what is unacked and not locked goes out again
        (with its delivery count); locked messages stay locked until their deadline, and an ordering key with
        locked messages has them as its outstanding batch, so nothing later of the key goes out before they end
        — and what of the key is unacked and unlocked before them (it ran out while they ran on) goes out again
        first once they end. Changes no durable state (only records do)."""
        self._clear_dispatch()
        self.dispatching = True
        self._derive_dispatch()
        self.expire(now)

    def _derive_dispatch(self) -> None:
        """The dispatch state of the durable state (`_clear_dispatch` before)."""
        for s in self.shards:
            s.cursor = s.floor
        for num, lease in sorted(self.leases.items()):
            key = lease[3]
            if key and self.ordered:
                ks = self.keys.get(key)
                if ks is None:
                    ks = self.keys[key] = KeyState()
                ks.live.add(num)
                ks.batch.append(num)
            elif num not in self.kept:  # (a kept one lies below the floor: the walk never reaches it)
                self.ahead.add(num)  # the walk from the floor must not hand it out again
        if self.keys and self.topic is not None:
            self._derive_redo()
        by_deadline: dict[float, list[int]] = {}
        for num, lease in self.leases.items():
            by_deadline.setdefault(lease[0], []).append(num)
        for deadline, nums in sorted(by_deadline.items()):
            self._schedule(deadline, tuple(nums))
        for num, at in self.parked.items():
            if at >= 0:
                self._seq += 1
                heapq.heappush(self._delayed, (at / 1000, self._seq, [num], 0))

    def export_state(self) -> tuple[list[int], list[list[int]]]:
        return [s.floor for s in self.shards], [sorted(s.acked) for s in self.shards]

    def export_leases(self) -> list[tuple[int, float, int, int]]:
        """(num, deadline, version, key) of every lease: the durable part (owners are not)."""
        return [(n, lease[0], lease[1], lease[3]) for n, lease in self.leases.items()]

    def restore_leases(self, rows) -> None:
        for n, deadline, version, key in rows:
            self.leases[n] = (deadline, version, None, key)

    def restore_parked(self, rows) -> None:
        """Load parked messages (num, value) after the ack state (`reset`): those below their shard's floor are
        the rescheduled ones retention passed (`kept`)."""
        self.parked.update(rows)
        shards = self.shards
        self.kept.update(n for n, _ in rows
                         if (n & SHARD_MASK) < len(shards) and n >> _BITS < shards[n & SHARD_MASK].floor)

    def expired_reschedules(self, floors: list[int], cutoff_ms: int) -> list[int]:
        """Rescheduled messages below `floors` (the floors once retention's Trim records are applied) whose
        latest activation is older than `cutoff_ms`: retention drops them too (commands.retention)."""
        parked = self.parked
        if not parked:
            return []
        moved = any(f > sh.floor for f, sh in zip(floors, self.shards))
        out = []
        for n in (parked if moved else self.kept):
            at = activation_of(parked[n])
            if at is not None and at < cutoff_ms and n >> _BITS < floors[n & SHARD_MASK]:
                out.append(n)
        return sorted(out)

    # --- reading ---------------------------------------------------------------------------------
    def statistics(self, now: float) -> "SubscriptionStats":
        """Plain values for metrics (named after Cloud Monitoring's Pub/Sub subscription metrics)."""
        oldest_ms = None
        if self.topic is not None:
            for s, ix in zip(self.shards, self.topic.shards):
                if s.floor < ix.durable and ix.base and not ix.held:
                    ms = ix.publish_ms(max(s.floor, ix.first()))
                    oldest_ms = ms if oldest_ms is None else min(oldest_ms, ms)
            for n in self.kept:
                ix = self.topic.shards[n & SHARD_MASK]
                if ix.base and ix.first() <= n >> _BITS < ix.next:
                    ms = ix.publish_ms(n >> _BITS)
                    oldest_ms = ms if oldest_ms is None else min(oldest_ms, ms)
        now_ms = now * 1000
        waiting = sum(1 for at in self.parked.values() if is_waiting(at, now_ms)) if self.parked else 0
        return SubscriptionStats(
            self.name, self.backlog(), len(self.leases), len(self.versions), waiting,
            max(0.0, now - oldest_ms / 1000) if oldest_ms is not None else 0.0,
            self.delivered, self.acked_count, self.expired, self.dead_lettered)

    def is_acked(self, num: int) -> bool:
        shard = num & SHARD_MASK
        return (shard < len(self.shards) and self.shards[shard].is_acked(num >> _BITS)
                and not (self.kept and num in self.kept))

    def backlog(self) -> int:
        """Unacked messages (approximate: counts acks above the floor exactly), but in copies their region serves
        (core.regions: counted there)."""
        if self.topic is None:
            return 0
        return len(self.kept) + sum(max(0, ix.durable - s.floor - len(s.acked))
                                    for s, ix in zip(self.shards, self.topic.shards) if not ix.held)
