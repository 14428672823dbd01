"""Topic shards as compact indexes. Owns the rule: offsets are dense and monotonic per shard, and a
message is visible to subscribers only once it is durable (offset < shard.visible, which is shard.durable but in a
replicated log: see ShardIndex).

No per-message Python object: a shard keeps four arrays with one entry per published *batch*
(base offset, WAL position of the batch's record, publish time in ms, ordering-key hash). A batch is
one Publish request, and one request carries one ordering key, so the key is a property of the batch."""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections import deque
from array import array

import crc32c

from pigeon.broker.schedule import Schedule
from pigeon.core import limits

SCHEDULED = -1  # key-array marker of a batch whose messages wait for their activation times

SHARD_MASK = (1 << limits.shard_bits) - 1


def msgnum(offset: int, shard: int) -> int:
    return (offset << limits.shard_bits) | shard


def key_hash(ordering_key: str) -> int:
    """A stable, non-zero 63-bit hash of an ordering key (0 means "no key"). Two keys sharing a hash
    would only be serialized together: stricter, never looser, ordering."""
    if not ordering_key:
        return 0
    h = int.from_bytes(hashlib.blake2b(ordering_key.encode(), digest_size=8).digest(), "little")
    return (h >> 1) or 1


def split_msgnum(num: int) -> tuple[int, int]:
    """message number → (offset, shard)"""
    return num >> limits.shard_bits, num & SHARD_MASK


class ShardIndex:
    __slots__ = ("next", "durable", "visible", "base", "pos", "ms", "keys", "bytes", "held")

    def __init__(self, start: int = 0):
        self.next = start  # next offset to assign
        self.durable = start  # offsets below are on disk (in a cluster: held by the log's ack quorum)
        # offsets below may be handed out (dispatch reads this mark, nothing else): `durable`, or — for a log
        # whose deliveries go out only once their Deliver record is replicated — every batch committed, since that
        # record, later in the same log, is replicated only after the batch is (node.delivery.show_when_durable)
        self.visible = start
        self.base = array("q")  # first offset of each batch
        self.pos = array("q")  # WAL position of each batch's record
        self.ms = array("q")  # publish time of each batch (ms, non-decreasing)
        self.keys = array("q")  # ordering-key hash of each batch (0: none)
        self.bytes = 0  # payload bytes retained (approximate, for metrics)
        # a copy of another region's shard (core.regions) while that region serves it: `visible` stays where it
        # is, so nothing of it is handed out here (TopicState.serve_copies lets it go)
        self.held = False

    def append(self, count: int, pos: int, publish_ms: int, key: int = 0) -> int:
        assert count > 0
        if self.ms and publish_ms < self.ms[-1]:
            publish_ms = self.ms[-1]  # keep time monotonic per shard for seek-by-time bisection
        base = self.next
        self.base.append(base)
        self.pos.append(pos)
        self.ms.append(publish_ms)
        self.keys.append(key)
        self.next = base + count
        return base

    def settle(self) -> None:
        """Everything indexed is durable (its log was read back): it may be handed out, but a copy held back."""
        self.durable = self.next
        if not self.held:
            self.visible = self.next

    def first(self) -> int:
        """The oldest offset still indexed."""
        return self.base[0] if self.base else self.next

    def batch_of(self, offset: int) -> int:
        """Index of the batch holding `offset` (which must be retained)."""
        i = bisect.bisect_right(self.base, offset) - 1
        assert i >= 0 and offset < self.next, (offset, self.first(), self.next)
        return i

    def batch_end(self, i: int) -> int:
        return self.base[i + 1] if i + 1 < len(self.base) else self.next

    def batch_around(self, offset: int) -> tuple[int, int]:
        """(log position, end offset) of the batch holding `offset`: new messages go out in log order. An
        offset below the index (trimmed away) comes first, up to the oldest batch kept."""
        i = bisect.bisect_right(self.base, offset) - 1
        if i < 0:
            return -1, self.base[0] if self.base else self.next
        return self.pos[i], self.batch_end(i)

    def offset_at_ms(self, ms: int) -> int:
        """First offset published at or after `ms` (self.next when none)."""
        i = bisect.bisect_left(self.ms, ms)
        return self.base[i] if i < len(self.base) else self.next

    def publish_ms(self, offset: int) -> int:
        return self.ms[self.batch_of(offset)]

    def trim_before(self, offset: int) -> list[int]:
        """Forget batches that end at or before `offset`; return their addresses."""
        if offset >= self.next:
            i = len(self.base)
        else:
            i = bisect.bisect_right(self.base, offset) - 1  # the batch holding `offset` stays
        if i <= 0:
            return []
        gone = self.pos[:i].tolist()
        del self.base[:i], self.pos[:i], self.ms[:i], self.keys[:i]
        return gone

    def key_of(self, offset: int) -> int:
        return self.keys[self.batch_of(offset)]

    def export(self) -> tuple[int, bytes, bytes, bytes, bytes]:
        return self.next, self.base.tobytes(), self.pos.tobytes(), self.ms.tobytes(), self.keys.tobytes()

    @classmethod
    def restore(cls, next_offset: int, base: bytes, pos: bytes, ms: bytes, keys: bytes) -> "ShardIndex":
        s = cls(next_offset)  # (durable and visible: what an image holds was durable when it was written)
        s.base.frombytes(base)
        s.pos.frombytes(pos)
        s.ms.frombytes(ms)
        s.keys.frombytes(keys)
        return s


class IdempotencyWindow:
    """broker.dedup: a (topic, idempotency key) is accepted once inside the window; a repeat gets the
    original message id. Keys are the client's, never derived from its address."""

    __slots__ = ("ids", "order")

    def __init__(self):
        self.ids: dict[str, tuple[str, int]] = {}  # key → (message id, publish ms)
        self.order: deque[tuple[int, str]] = deque()  # (publish ms, key), oldest first

    def get(self, key: str) -> str | None:
        hit = self.ids.get(key)
        return hit[0] if hit else None

    def add(self, key: str, message_id: str, publish_ms: int) -> None:
        self.ids[key] = (message_id, publish_ms)
        self.order.append((publish_ms, key))

    def expire(self, before_ms: int) -> None:
        order, ids = self.order, self.ids
        while order and order[0][0] < before_ms:
            ms, key = order.popleft()
            hit = ids.get(key)
            if hit is not None and hit[1] == ms:
                del ids[key]

    def export(self) -> list[list]:
        return [[k, mid, ms] for k, (mid, ms) in self.ids.items()]



class ShardWindows:
    """A topic's idempotency windows, one a shard (a key is remembered by the shard that stored its message, so a
    shard's window is that shard's state alone: docs/cluster.md, invariant T3), read as one: a key is a repeat
    when any shard's window holds it (the newest, should a key reused after its window have passed be in two)."""

    __slots__ = ("windows",)

    def __init__(self, shards: int):
        self.windows = [IdempotencyWindow() for _ in range(shards)]

    def get(self, key: str) -> str | None:
        if len(self.windows) == 1:
            return self.windows[0].get(key)
        hits = [hit for w in self.windows if (hit := w.ids.get(key)) is not None]
        return max(hits, key=lambda h: h[1])[0] if hits else None

    def add(self, key: str, message_id: str, publish_ms: int) -> None:
        self.windows[int(message_id) & SHARD_MASK].add(key, message_id, publish_ms)

    def expire(self, before_ms: int) -> None:
        for w in self.windows:
            w.expire(before_ms)

    def export(self) -> list[list]:
        return [entry for w in self.windows for entry in w.export()]

    def drop_shards(self, shards: set[int]) -> None:
        """Forget what `shards` remembered (their logs are applied again)."""
        for k in shards:
            self.windows[k] = IdempotencyWindow()


class TopicState:
    """A topic: its configuration (the Topic proto), shard indexes, and attached subscriptions."""

    def __init__(self, uid: int, name: str, config, shard_count: int, spread: bool = False,
                 local: range | None = None, copies: frozenset[int] = frozenset(), copied_away: bool = False):
        assert 1 <= shard_count <= limits.shards_per_topic_max
        self.uid = uid
        self.name = name
        self.config = config
        self.layout_spread = spread  # each shard in a bundle of its own (core.bundles.shard_log), fixed at creation
        self.homes: dict[int, int] = {}  # shard → its log, for a shard handed over (ShardHome: docs/cluster.md 4.3)
        self.away: dict = {}  # shard → its ShardOut: handed out of this log, not homed elsewhere yet (refused here)
        self.gens: dict[int, int] = {}  # shard → the number of its latest hand-over this state applied (homes)
        self.meta_gens: dict[int, int] = {}  # shard → … of its latest hand-over the metadata log's ShardHome homed
        # shard → (log, gen, home before, gen before): homed in `log` by a record of that log only (a ShardIn, a
        # snapshot's ShardHome) that this node does not know to be in the log: not confirmed by the log's quorum
        # yet, not read back from its ledgers, not homed by the metadata log's ShardHome. Such a record may never
        # reach the log (committed by an owner that lost the log, replayed from its journal): a Reset of the log
        # undoes its homing with the log's other state (broker.log_state.reset). One known durable in the log stays
        # (`log_state.confirm_landings`): every later owner of the log reads it back.
        self.landed: dict[int, tuple[int, int, int | None, int | None]] = {}
        # the shards this node's region stores (core.regions): all but in a deployment of regions
        self.local = range(shard_count) if local is None else local
        # its records go to several logs (cut by shard): spread, a shard handed over, or shards in other regions
        self.spread = spread or len(self.local) < shard_count
        # other regions' shards stored here as copies (core.regions.copy_shards): the copier's publishes only …
        self.copies = copies
        self.held = set(copies)  # … and not handed out while their region serves them (serve_copies)
        # a topic this region's shards of are copied to another region: per shard, the offset below which the
        # copy has them (its reads say so; 0 until one did: nothing is dropped before the copy has it)
        self.copied: list[int] | None = [0] * shard_count if copied_away else None
        self.shards = [self.new_index(k) for k in range(shard_count)]
        self.subscriptions: set[int] = set()
        self.deleted = False
        self.log_id: int | tuple | None = None  # the log its records go to (BrokerState.log_of); spread: its shards'

        self.shard_logs: list[int] | None = None  # … and each shard's, spread
        self.idempotency = ShardWindows(shard_count)
        self.schedule = Schedule()
        self._rr = itertools.cycle(self.local)
        self.publish_requests = 0  # statistics since start (Cloud Monitoring's topic send_request_count, …)
        self.published = 0
        self.published_bytes = 0

    def home(self, shard: int, log: int, gen: int) -> None:
        """Shard `shard`'s records go to `log` from its `gen`-th hand-over on (a ShardIn, a ShardHome)."""
        self.homes[shard] = log
        self.gens[shard] = gen
        self.away.pop(shard, None)
        self.spread = True
        self.shard_logs = None
        self.log_id = None

    def clear_data(self, shards: set[int] | None = None) -> None:
        """Back to no messages in `shards` (all by default: their logs are applied again from the start);
        configuration stays."""
        if shards is None or len(shards) == len(self.shards):
            self.shards = [self.new_index(k) for k in range(len(self.shards))]
            self.idempotency = ShardWindows(len(self.shards))
            self.schedule = Schedule()
            return
        for k in shards:
            self.shards[k] = self.new_index(k)
        self.idempotency.drop_shards(shards)
        self.schedule.drop(lambda num: num & SHARD_MASK in shards)

    def new_index(self, shard: int, index: ShardIndex | None = None) -> ShardIndex:
        """Shard `shard`'s index (a fresh one by default), held back while it is a copy its region serves."""
        ix = ShardIndex() if index is None else index
        ix.held = shard in self.held
        if ix.held:
            ix.visible = 0
        return ix

    def serve_copies(self, shards) -> list[int]:
        """Copy shards whose region was declared lost (docs/regions.md) are served here from now on: what they
        hold may be handed out. Returns those that were held."""
        let = [k for k in shards if k in self.held]
        for k in let:
            self.held.discard(k)
            ix = self.shards[k]
            ix.held = False
            ix.visible = max(ix.visible, ix.durable)
        return let

    def publishable(self, shards: list[int]) -> list[int]:
        """Those of `shards` a publish may go to: all but copies (only the copier writes them: node.copies)."""
        return [k for k in shards if k not in self.copies] if self.copies else shards

    def copy_gap(self, shard: int, offset: int) -> bool:
        """A copy shard whose region no longer held the messages before `offset` when the copy got there (nobody
        needed them): holding none of its own either, the copy starts over at `offset` (each subscription passes
        what lies below). False: not a copy, or not empty — the offsets must follow on."""
        ix = self.shards[shard]
        if shard not in self.copies or ix.base:
            return False
        ix.next = ix.durable = offset
        if not ix.held:
            ix.visible = offset
        return True

    def shard_for(self, ordering_key: str, among: list[int] | None = None) -> int:
        """Per-key order is shard order: a key always maps to the same shard of its region (stable hash). A message
        without a key goes to the region's shards in turn — to those `among` (a spread topic's that this node
        owns), when given."""
        if ordering_key:
            local = self.local
            return local.start + crc32c.crc32c(ordering_key.encode()) % len(local)
        turn = next(self._rr)
        return turn if among is None else among[turn % len(among)]

    def message_id(self, offset: int, shard: int) -> str:
        return str(self.id_base() | (offset << limits.shard_bits) | shard)

    def id_base(self) -> int:
        """A message's id is this | its message number (offset << shard_bits | shard)."""
        return self.uid << (limits.topic_offset_bits + limits.shard_bits)

    def backlog_end(self) -> list[int]:
        return [s.next for s in self.shards]


def parse_message_id(message_id: str) -> tuple[int, int, int]:
    """message id → (topic uid, offset, shard)"""
    n = int(message_id)
    shard = n & SHARD_MASK
    n >>= limits.shard_bits
    return n >> limits.topic_offset_bits, n & ((1 << limits.topic_offset_bits) - 1), shard
