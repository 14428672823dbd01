"""Message batches a cluster bundle's owner names by log address (core.bundles): the batches it took over with the
bundle, which stay in the ledgers that hold them (docs/cluster.md, "Scale-out"). Owns the rules:

  * a batch is read from a member of the ledger holding it — this node's own copy first — into the reader's cache,
    with the entries after it (about limits.fetch_bytes), when a delivery finds it missing (node.reader.NotCached);
  * once a reader gets to a range read, the next limits.fetch_ahead ranges are read at once, in the background,
    bounded so that what is read ahead stays in the cache until it is delivered; a read under way that covers a
    batch asked for is waited for instead of made again;
  * a snapshot the owner writes names every batch by log address: the batches of its own term (named by node
    journal positions) are translated through the (position, log offset) pairs noted as they were appended, and
    the pairs before a cut are forgotten;
  * a batch of a log this node does not own (a pair handed over here names its older batches in the logs it came
    from: docs/cluster.md, "Scale-out" 4.3) is read the same way, from that log's ledger list as last read from
    etcd — read again when no ledger of it holds the batch, or the one that does is open, or a read failed (a
    repair may have moved a copy). An open ledger is its owner's, still written: only what is durable on a quorum
    is read of it — entries up to the highest batch of that log an index here names (the ShardOut that named it
    was confirmed after it, and a ledger is confirmed in order), so that nothing a recovery could still drop, and
    a later owner write again at the same offset, enters the cache; the reads ahead keep to its closed ledgers.

Performed over node.bundle_logs (the owned logs, their ledger lists, the members' reads)."""

from __future__ import annotations

import asyncio
import bisect
import logging
from array import array
from dataclasses import dataclass, field

from pigeon.broker import images
from pigeon.cluster.ledgers import holding
from pigeon.core import limits
from pigeon.core.bundles import is_log_address, log_address, split_log_address
from pigeon.core.errors import Unavailable
from pigeon.node.reader import batch_of_entry
from pigeon.storage import records as R

log = logging.getLogger("pigeon.ledgers")


class Unnamed(Exception):
    """A batch of the index has no log address this owner knows."""


@dataclass
class ForeignLog:
    """A log this node reads batches of without owning it: what `_fetch_range` and the reads ahead need of it."""
    log_id: int
    ledgers: list = field(default_factory=list)  # its ledger list as last read from etcd
    entry_bytes: int = 0  # the average size of the entries last fetched (how many to ask for next)
    taken_at: int = 0  # reads ahead stop here: the end of the list's closed ledgers (an open one is still written)
    reading_ahead: list = field(default_factory=list)  # (first offset, end, task) of the reads ahead under way
    durable_to: int = 0  # its entries below this are durable on a quorum: read of its open ledger up to here


class LogReads:
    def __init__(self, bundles):
        self.bundles = bundles  # node.bundle_logs.BundleLogs
        self.foreign: dict[int, ForeignLog] = {}  # the logs not owned here that batches were read of
        # (log, topic uid, shard) of the pairs a hand-over out of an owned log lent the log's ledgers to and whose
        # ShardOut the state has not applied yet (node.ledger_upkeep.lend): their `lent/` key stays
        self.lending: set[tuple[int, int, int]] = set()

    def noted(self, ol, rtype: int, where: tuple | None) -> None:
        """A record was appended to owned log `ol` at its next offset (`where`: its node journal record)."""
        if rtype == R.RecordType.PUBLISH and where is not None:
            ol.own_at.append(where[2])
            ol.own_offset.append(ol.next_offset)

    def log_offset(self, ol, address: int) -> int:
        """The log offset of the batch at `address` (a log address, or the node journal position of a batch this
        owner wrote in its term); 0 for a position it does not know (nothing is cut for it)."""
        if is_log_address(address):
            return split_log_address(address)[1]
        i = bisect.bisect_left(ol.own_at, address)
        return ol.own_offset[i] if i < len(ol.own_at) and ol.own_at[i] == address else 0

    def log_addresses(self, ol, pos: array) -> array:
        """An index's batch positions as log addresses (what a snapshot in the log names them by); Unnamed when
        one is a journal position this owner did not note (then no snapshot can name it: none is written)."""
        out = array("q", pos)
        own_at, own_offset, log_id = ol.own_at, ol.own_offset, ol.log_id
        for i, a in enumerate(out):
            if not is_log_address(a):
                j = bisect.bisect_left(own_at, a)
                if j == len(own_at) or own_at[j] != a:
                    raise Unnamed(f"log {log_id}: no batch of this owner's term is at journal position {a}")
                out[i] = log_address(log_id, own_offset[j])
        return out

    def forget_before(self, ol, offset: int) -> None:
        """The log was cut: the batches of this term before `offset` are no longer named by any index."""
        i = bisect.bisect_left(ol.own_offset, offset)
        if i:
            del ol.own_at[:i], ol.own_offset[:i]

    async def fetch(self, address: int) -> None:
        """Read the batch at log `address`, and the entries after it (about limits.fetch_bytes), from a member of
        the ledger holding it — this node's own copy first — into the reader's cache; and once a reader gets to
        it, the next limits.fetch_ahead ranges at once, in the background (a member's read takes longer than
        delivering what it read: reads in a row would leave the subscribers waiting between them). A read under
        way that covers the batch is waited for instead of read again. A batch of a log this node does not own is
        read from that log's ledgers as well (see the module's rules)."""
        log_id, offset = split_log_address(address)
        ol = self.bundles.logs.get(log_id)
        if ol is None:
            ol = self.foreign.get(log_id)
            if ol is None:
                ol = self.foreign[log_id] = ForeignLog(log_id)
        for lo, hi, task in list(ol.reading_ahead):
            if lo <= offset < hi:
                await asyncio.wait([task])
                if self.bundles.cluster.engine.reader.cached(address):
                    return
        end = await self._foreign_end(ol, offset) if isinstance(ol, ForeignLog) else None
        try:
            first, after = await self._fetch_range(ol, offset, limits.fetch_bytes, end)
        except Exception:
            if isinstance(ol, ForeignLog):  # (its list may have changed since it was read: a repair moved a copy)
                ol.ledgers = []
            raise
        self._mark(ol, first, after)

    async def _foreign_end(self, fl: ForeignLog, offset: int) -> int | None:
        """Where a read of foreign log `fl` from `offset` must end: None when a closed ledger holds `offset` (at its
        end), else the end of what is durable of the open ledger holding it. The list is read again from etcd when
        no ledger of it holds `offset`, or an open one does (it may be closed by now)."""
        lg = holding(fl.ledgers, offset)
        if lg is None or lg.end is None:
            _, fl.ledgers = await self.bundles.read_ledgers(fl.log_id)
            fl.taken_at = max([x.end for x in fl.ledgers if x.end is not None], default=0)
            lg = holding(fl.ledgers, offset)
        if lg is None:
            raise Unavailable(f"Log {fl.log_id} holds no ledger with entry {offset} any more; retry.")
        if lg.end is not None:
            return None
        if offset >= fl.durable_to:  # (the batch asked for is named by an index here, so it is durable itself)
            config, state = self.bundles.cluster.config, self.bundles.cluster.engine.state
            top = max((images.named_top(state, log_id, config.bundles, fl.log_id) for log_id in self.bundles.logs),
                      default=-1)
            fl.durable_to = max(fl.durable_to, offset + 1, top + 1)
        return fl.durable_to

    def _current(self, ol) -> bool:
        """Whether `ol` is the record this node reads its log by (not one of a log released, or taken since)."""
        return self.bundles.logs.get(ol.log_id) is ol or self.foreign.get(ol.log_id) is ol

    def _mark(self, ol, first: int | None, after: int) -> None:
        """Read on from `after` once a reader gets to the batch at log address `first`."""
        if first is not None and after < ol.taken_at and self._current(ol):
            self.bundles.cluster.engine.reader.ahead[first] = lambda: self._read_ahead(ol, after)

    async def _fetch_range(self, ol, offset: int, nbytes_max: int, end: int | None = None
                           ) -> tuple[int | None, int]:
        """Read entries from `offset` on (about `nbytes_max`, not past the ledger holding `offset`, nor `end`)
        into the reader's cache: (the log address of the first publish batch read, the offset after them). An open
        ledger is read only with an `end` (a foreign log's: what is durable of it), and as far as the member asked
        holds entries durable (a prefix: all of them up to `end`, when it is one of the quorum that holds them)."""
        log_id = ol.log_id
        lg = holding(ol.ledgers, offset)
        stop = None if lg is None else lg.end if lg.end is not None else end
        if stop is None:
            raise Unavailable(f"Log {log_id} holds no closed ledger with entry {offset}; retry.")
        step = limits.log_read_first_entries if not ol.entry_bytes else nbytes_max // ol.entry_bytes
        count = max(1, min(limits.log_read_entries_max, step, stop - offset, (end or stop) - offset))
        start = offset - lg.first
        got = await self.bundles.read_range(lg, start, start + count)
        remember = self.bundles.cluster.engine.reader.remember
        nbytes, first, parsed = 0, None, 0
        for i, (rtype, body) in enumerate(got):
            nbytes += len(body)
            if rtype == R.RecordType.PUBLISH:
                address = log_address(log_id, offset + i)
                remember(address, batch_of_entry(body))
                first = address if first is None else first
                parsed += len(body)
                if parsed >= limits.loop_slice_bytes:  # (the loop serves the subscribers between)
                    parsed = 0
                    await asyncio.sleep(0)
        ol.entry_bytes = max(1, nbytes // len(got))
        return first, offset + len(got)

    def stop(self, ol) -> None:
        """The log is no longer served here: its reads ahead stop, and nothing reads on from its batches."""
        for _, _, task in ol.reading_ahead:
            task.cancel()
        ahead = self.bundles.cluster.engine.reader.ahead
        for a in [a for a in ahead if split_log_address(a)[0] == ol.log_id]:
            del ahead[a]

    def _read_ahead(self, ol, offset: int) -> None:
        """Read limits.fetch_ahead ranges from `offset` on, at once; mark the first batch of the first of them to
        read on from after the last."""
        if not self._current(ol) or any(lo <= offset < hi for lo, hi, _ in ol.reading_ahead):
            return
        size = max(1, limits.fetch_bytes // max(ol.entry_bytes, 1))
        ranges, lo = [], offset
        while len(ranges) < limits.fetch_ahead and lo < ol.taken_at:
            lg = holding(ol.ledgers, lo)
            if lg is None or lg.end is None:
                break
            hi = min(lo + size, lg.end, ol.taken_at)
            ranges.append((lo, hi))
            lo = hi
        if not ranges:
            return
        loop = asyncio.get_running_loop()

        async def read(lo: int, hi: int) -> tuple[int | None, int]:
            return await self._fetch_range(ol, lo, limits.fetch_bytes, end=hi)

        tasks = [(lo, hi, loop.create_task(read(lo, hi))) for lo, hi in ranges]
        ol.reading_ahead.extend(tasks)

        def done(t: asyncio.Task) -> None:
            ol.reading_ahead[:] = [r for r in ol.reading_ahead if r[2] is not t]
            if t.cancelled() or t.exception() is not None:  # (a delivery that needs it fetches it itself)
                if not t.cancelled():
                    log.debug("reading log %d ahead: %s", ol.log_id, t.exception())
                return
            if t is tasks[0][2]:
                self._mark(ol, t.result()[0], ranges[-1][1])
        for _, _, t in tasks:
            t.add_done_callback(done)
