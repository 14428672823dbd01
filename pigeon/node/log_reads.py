"""Message batches a cluster bundle's owner names by log address (core.bundles): the batches it took over with the
bundle, which stay in the ledgers that hold them (docs/cluster.md, "Scale-out"). Owns the rules:

  * a batch is read from a member of the ledger holding it — this node's own copy first — into the reader's cache,
    with the entries after it (about limits.fetch_bytes), when a delivery finds it missing (node.reader.NotCached);
  * once a reader gets to a range read, the next limits.fetch_ahead ranges are read at once, in the background,
    bounded so that what is read ahead stays in the cache until it is delivered; a read under way that covers a
    batch asked for is waited for instead of made again;
  * a snapshot the owner writes names every batch by log address: the batches of its own term (named by node
    journal positions) are translated through the (position, log offset) pairs noted as they were appended, and
    the pairs before a cut are forgotten.

Performed over node.bundle_logs (the owned logs, their ledger lists, the members' reads)."""

from __future__ import annotations

import asyncio
import bisect
import logging
from array import array

from pigeon.cluster.ledgers import holding
from pigeon.core import limits
from pigeon.core.bundles import is_log_address, log_address, split_log_address
from pigeon.core.errors import Unavailable
from pigeon.node.reader import batch_of_entry
from pigeon.storage import records as R

log = logging.getLogger("pigeon.ledgers")


class Unnamed(Exception):
    """A batch of the index has no log address this owner knows."""


class LogReads:
    def __init__(self, bundles):
        self.bundles = bundles  # node.bundle_logs.BundleLogs

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
        way that covers the batch is waited for instead of read again."""
        log_id, offset = split_log_address(address)
        ol = self.bundles.logs.get(log_id)
        if ol is None:
            raise Unavailable("The topic's bundle moved to another node; retry.")
        for lo, hi, task in list(ol.reading_ahead):
            if lo <= offset < hi:
                await asyncio.wait([task])
                if self.bundles.cluster.engine.reader.cached(address):
                    return
        first, after = await self._fetch_range(ol, offset, limits.fetch_bytes)
        self._mark(ol, first, after)

    def _mark(self, ol, first: int | None, after: int) -> None:
        """Read on from `after` once a reader gets to the batch at log address `first`."""
        if first is not None and after < ol.taken_at and self.bundles.logs.get(ol.log_id) is ol:
            self.bundles.cluster.engine.reader.ahead[first] = lambda: self._read_ahead(ol, after)

    async def _fetch_range(self, ol, offset: int, nbytes_max: int, end: int | None = None
                           ) -> tuple[int | None, int]:
        """Read entries from `offset` on (about `nbytes_max`, not past the ledger holding `offset`, nor `end`)
        into the reader's cache: (the log address of the first publish batch read, the offset after them)."""
        log_id = ol.log_id
        lg = holding(ol.ledgers, offset)
        if lg is None or lg.end is None:
            raise Unavailable(f"Log {log_id} holds no closed ledger with entry {offset}; retry.")
        step = limits.log_read_first_entries if not ol.entry_bytes else nbytes_max // ol.entry_bytes
        count = max(1, min(limits.log_read_entries_max, step, lg.end - offset, (end or lg.end) - offset))
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
        if self.bundles.logs.get(ol.log_id) is not ol or any(lo <= offset < hi for lo, hi, _ in ol.reading_ahead):
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
