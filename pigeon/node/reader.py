"""Reading stored messages back. Owns the rules: message bytes are read from the record that stored them
(or the cache of recent records) and never re-encoded; the server-set fields (message id, publish time)
are appended as protobuf fields when a message is handed out. A batch named by a journal position is read from
the node's journal, at once; one named by a log address (core.bundles: a cluster bundle's batch stored before
this node took the bundle over) is served from the cache only — a read that finds it missing raises NotCached,
and the caller gives back what it took, has it fetched from the ledger that holds it (`fetch`, awaited: the read
itself never waits) and tries again."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from pigeon.broker.topic import SHARD_MASK, TopicState
from pigeon.core import ackid, hot, limits, rawproto, wire
from pigeon.core.bundles import LOG_ADDRESS
from pigeon.core.errors import Unavailable
from pigeon.storage import record
from pigeon.storage.records import Publish, RecordType



# One stored publish batch, split: (the messages, the encoded publish_time field they share, record bytes).
# A plain tuple of bytes and ints on purpose: the garbage collector stops tracking such tuples, so a cache
# of many batches adds nothing to the full collections that would otherwise pause the event loop.
Batch = tuple[tuple[bytes, ...], bytes, int]


def make_batch(messages: list[bytes], publish_ms: int, nbytes: int) -> Batch:
    time_field = wire.length_delimited(4, wire.timestamp(publish_ms // 1000, (publish_ms % 1000) * 1_000_000))
    return tuple(messages), time_field, nbytes


def batch_of_entry(body: bytes | memoryview) -> Batch:
    """The batch a Publish record's body (a log entry, as a ledger holds it) stores."""
    _, _, _, ms, count, _ = Publish.head(body)
    _, messages = rawproto.split_publish(Publish.request_of(body))
    assert len(messages) == count, (len(messages), count)
    return make_batch(messages, ms, len(body))


class NotCached(Exception):
    """The batch at log address `address` is not in the cache: `fetch` it, then read again."""

    def __init__(self, address: int):
        super().__init__(f"the batch at log address {address:#x} is not cached")
        self.address = address


@dataclass(frozen=True, slots=True)
class ReaderStats:
    disk_reads: int  # stored batches read from the journal (the rest came from the cache)
    cached_batches: int
    cached_bytes: int


class MessageReader:
    def __init__(self, journal, cache_bytes_max: int, fetcher=None):
        """`fetcher`: an async callable that reads the batch at a log address (and the ones after it) from its
        ledger into this reader's cache — a cluster node's bundle logs (node.bundle_logs); none on one node."""
        self.journal = journal  # node.journal_writer.JournalWriter: read, read_into, read_ahead
        self.fetcher = fetcher
        # log address → what to call once a reader gets to that batch (the fetcher reads the next range ahead)
        self.ahead: dict[int, Callable[[], None]] = {}
        self.cache_bytes_max = cache_bytes_max
        self._cache: OrderedDict[int, Batch] = OrderedDict()  # record position → batch
        self._cache_bytes = 0
        self.disk_reads = 0
        self.fetched_batches = 0  # fetches of batches named by log addresses (statistics)
        self._buf = bytearray()  # reused for every record read from the log

    def statistics(self) -> ReaderStats:
        return ReaderStats(self.disk_reads, len(self._cache), self._cache_bytes)

    def remember(self, pos: int, batch: Batch) -> None:
        old = self._cache.pop(pos, None)  # (a batch fetched again: counted once, and now the newest)
        if old is not None:
            self._cache_bytes -= old[2]
        self._cache[pos] = batch
        self._cache_bytes += batch[2]
        while self._cache_bytes > self.cache_bytes_max and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= old[2]

    def forget(self, positions) -> None:
        """Drop the batches at `positions` from the cache (every subscription is past them)."""
        for pos in positions:
            old = self._cache.pop(pos, None)
            if old is not None:
                self._cache_bytes -= old[2]
            if self.ahead:
                self.ahead.pop(pos, None)

    def cached(self, pos: int) -> bool:
        return pos in self._cache

    def remember_published(self, pos: int, request: bytes | memoryview, publish_ms: int, nbytes: int) -> None:
        """Keep a batch just published (its record at `pos`, `nbytes` long) for a subscriber about to read it."""
        self.remember(pos, make_batch(rawproto.split_publish(request)[1], publish_ms, nbytes))

    def batch(self, pos: int) -> Batch:
        b = self._cache.get(pos)
        if b is not None:
            if pos >= LOG_ADDRESS and self.ahead:
                go = self.ahead.pop(pos, None)
                if go is not None:
                    go()
            return b
        if pos >= LOG_ADDRESS or pos >= self.journal.durable:  # (a batch handed out as it was committed, in a
            raise NotCached(pos)                                # replicated log, and dropped from the cache since)
        self.disk_reads += 1
        self.journal.read_ahead(pos)
        size = record.size_from_prefix(self.journal.read(pos, record.PREFIX_BYTES))
        if len(self._buf) < size:  # a new buffer, never a resize: a view of the old one may live on
            self._buf = bytearray(max(size, 2 * len(self._buf)))
        view = memoryview(self._buf)[:size]
        got = self.journal.read_into(pos, view)
        rtype, payload, _ = record.decode_at(view[:got], 0, got)
        assert rtype == RecordType.PUBLISH
        payload = record.split_entry(payload)[3]
        _, _, _, ms, count, _ = Publish.head(payload)
        _, messages = rawproto.split_publish(Publish.request_of(payload))  # parsed without a copy of the request
        assert len(messages) == count, (len(messages), count)
        b = make_batch(messages, ms, size)  # the messages are copies: the buffer is free
        self.remember(pos, b)
        return b

    async def fetch(self, address: int) -> None:
        """Have the batch at log `address` read into the cache (from the ledger that holds it) — or, at a journal
        position, wait until the journal is durable past it (then `batch` reads it there)."""
        if address < LOG_ADDRESS:
            await self.journal.wait_durable(address + 1)
            return
        if self.fetcher is None:
            raise Unavailable("A message of this node's log is not held here; retry.")
        self.fetched_batches += 1
        await self.fetcher(address)

    async def batch_when_read(self, pos: int) -> Batch:
        """`batch`, fetching it first when it must be (a cache too small for what is being read at once may drop
        it again before it is read: a few tries, then Unavailable)."""
        for _ in range(limits.fetch_tries):
            try:
                return self.batch(pos)
            except NotCached as e:
                await self.fetch(e.address)
        raise Unavailable("Messages could not be read back from the ledgers that hold them; retry.")

    async def messages_when_read(self, topic: TopicState, nums: list[int],
                                 overrides: dict[int, bytes] | None = None) -> list[tuple[bytes, bytes]]:
        """`messages`, fetching what must be first (see batch_when_read)."""
        for _ in range(limits.fetch_tries):
            try:
                return self.messages(topic, nums, overrides)
            except NotCached as e:
                await self.fetch(e.address)
        raise Unavailable("Messages could not be read back from the ledgers that hold them; retry.")

    def _locate(self, topic: TopicState, num: int) -> tuple[int, int, int, tuple[bytes, ...], bytes]:
        """The stored batch holding message number `num` (offset << shard_bits | shard): (shard, its first
        offset, its end offset, its messages, their encoded publish_time field). Callers keep the answer
        while the next numbers fall in the same range (one lookup per batch, not per message)."""
        shard, offset = num & SHARD_MASK, num >> limits.shard_bits
        ix = topic.shards[shard]
        i = ix.batch_of(offset)
        messages, time_field, _ = self.batch(ix.pos[i])
        return shard, ix.base[i], ix.batch_end(i), messages, time_field

    def messages(self, topic: TopicState, nums: list[int],
                 overrides: dict[int, bytes] | None = None) -> list[tuple[bytes, bytes]]:
        """(stored message bytes, server-field tail) for message numbers; the PubsubMessage handed out is
        the concatenation of the two. A message updated in place (`overrides`) reads as updated."""
        out = []
        bits, id_base = limits.shard_bits, topic.id_base()
        shard = lo = hi = -1
        messages: tuple[bytes, ...] = ()
        time_field = b""
        for num in nums:
            offset = num >> bits
            if num & SHARD_MASK != shard or not lo <= offset < hi:
                shard, lo, hi, messages, time_field = self._locate(topic, num)
            body = messages[offset - lo]
            if overrides:
                body = overrides.get(num, body)
            mid = b"%d" % (id_base | num)
            out.append((body, b"\x1a%c%b%b" % (len(mid), mid, time_field)))
        return out

    def received(self, topic: TopicState, taken, sub_uid: int, show_attempt: bool, max_bytes: int,
                 overrides: dict[int, bytes], generations=(0,)) -> tuple[list[bytes], list[int]]:
        """Encoded `received_messages` entries (field 1 of PullResponse and StreamingPullResponse alike) for
        leased (number, version) pairs, as many as fit in `max_bytes` (at least one), and each message's size:
        the hot path of delivery (`pigeon.core.hot.received_entries`); `overrides` are messages updated in
        place; the ack ids carry their shard's seek generation (`generations`, by shard)."""
        gen = ackid.common(generations)
        if gen >= 0:
            return hot.received_entries(self._locate, topic, taken, sub_uid, show_attempt, max_bytes, overrides,
                                        topic.id_base(), limits.shard_bits, gen)
        # shards sought apart (a spread topic): each run of one generation encoded on its own, in one budget
        of = lambda num: generations[num & SHARD_MASK] if num & SHARD_MASK < len(generations) else 0  # noqa: E731
        out: list[bytes] = []
        sizes: list[int] = []
        total, i = 0, 0
        while i < len(taken):
            g = of(taken[i][0])
            j = i + 1
            while j < len(taken) and of(taken[j][0]) == g:
                j += 1
            part, part_sizes = hot.received_entries(self._locate, topic, taken[i:j], sub_uid, show_attempt,
                                                    max_bytes - total, overrides, topic.id_base(),
                                                    limits.shard_bits, g)
            if out and total + part_sizes[0] > max_bytes:
                break
            out += part
            sizes += part_sizes
            total += sum(part_sizes)
            if len(part) < j - i:
                break
            i = j
        return out, sizes
