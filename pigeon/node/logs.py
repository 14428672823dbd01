"""The logs the executor writes: every log in the node's journal (storage.log's contract over one group commit), and
on a cluster node the data logs of the bundles it owns replicated besides to the ensemble of each log's open ledger
(node.bundle_logs). Owns the rule: an entry is durable once the journal holds it durable or, for a replicated log,
once Qa members do — the executor appends, waits and hears through here and cannot tell a replicated log from a local
one. A replicated entry is not waited for in the journal: the owner's copy there is its working copy, dropped when
the node starts again (the ledgers are the log), and when the owner's own ledger store is one of the Qa it answers
only once the journal holds the record durable (it borrows it from there). A log that moved to another node fails
its waiters with Unavailable (its next owner has every entry ever confirmed)."""

from __future__ import annotations

import asyncio

from pigeon.core import limits
from pigeon.core.bundles import META_LOG
from pigeon.storage import records as R


class NodeLogs:
    def __init__(self, journal):
        self.journal = journal  # node.journal_writer.JournalWriter
        self.replicas = None  # a cluster node's bundle logs, once it joined
        self._latest: dict[int, asyncio.Future] = {}  # replicated log → the replication of its latest entry
        self._local_end = 0  # the journal position past the latest entry only the journal holds
        self._to_flush: set[int] = set()  # replicated logs whose lingering entries go out at the flush queued
        self._last_round = float("-inf")  # (loop time) when the last flush went out
        self._round: list[asyncio.Future] = []  # … and the replication of the latest entry of each log it sent
        self._round_overlapped = False  # … and whether it was asked for while the one before was still out
        self._asking_overlapped = False  # (the same of the flush queued)
        self._waiting: asyncio.TimerHandle | None = None  # the flush queued, when it waits for the last round

    def replicate_with(self, replicas) -> None:
        """From now on the data logs are replicated by `replicas` (node.bundle_logs.BundleLogs)."""
        self.replicas = replicas

    def fence(self, log_id: int, epoch: int) -> int:
        return self.journal.fence(log_id, epoch)

    def append(self, log_id: int, epoch: int, rtype: int, parts: list) -> tuple[int, int]:
        """Append an entry: (its offset in its log, its journal position)."""
        offset, at = self.journal.append(log_id, epoch, rtype, parts)
        if self.replicas is not None and log_id != META_LOG and (rtype < R.RecordType.RESET or  # (Reset, Snapshot:
                                                                  rtype > R.RecordType.SNAPSHOT):
            self._latest[log_id] = self.replicas.append(  # the node's own copy starting over, not log entries)
                log_id, rtype, b"".join(parts), (log_id, offset, at, self.journal.tail))
        else:
            self._local_end = self.journal.tail
        return offset, at

    def _replication(self, log_id: int | tuple | None) -> asyncio.Future | None:
        """The replication of the log's latest entry, asked to go out when it lingers (entries nobody waited for
        ride with the next one somebody does). `log_id` may name the logs of a spread topic's shards: then
        of each of them that this node writes, all together."""
        if type(log_id) is tuple:
            futs = [f for f in map(self._replication, log_id) if f is not None]
            if not futs:
                return None
            return futs[0] if len(futs) == 1 else asyncio.gather(*map(asyncio.shield, futs))
        fut = self._latest.get(log_id) if log_id is not None else None
        if fut is not None and not fut.done():
            self._flush_soon(log_id)
        return fut

    def _flush_soon(self, log_id: int) -> None:
        """Send the log's lingering entries once the callbacks readied so far have run, not now, so that what they
        append goes in the same request: above all the lease a publish's subscriber takes when the publish wakes
        it (its Deliver record rides with the batch: one round trip for both, not two in a row). Under load, once
        the last round is held by Qa members, and no later than limits.replication_round_s after it went, so that a
        round carries the records of several publishes: every request costs a member a wake-up of its loop and of
        its journal's writer, and the owner a send and an answer, and a round for every publish keeps a loaded
        owner's loop at its capacity, where each step of each publish waits for the turns ahead of it. "Under
        load": the last round is not yet held and was itself asked for while the one before it was still out —
        two rounds out at once, the most that is worth having. Not a fixed wait: when the owner keeps up, its last
        round is held within a round trip, and a publish then waits for that, not for the spacing. A burst's second
        round still goes at once, beside the first (its publish's lease then rides with it), and a cluster whose
        rounds are answered before the next is asked for waits for nothing."""
        if not self._to_flush:
            loop = asyncio.get_running_loop()
            out = [f for f in self._round if not f.done()]
            wait = self._last_round + limits.replication_round_s - loop.time()
            if out and self._round_overlapped and wait > 0:
                self._flush_after(out, wait)
            else:
                loop.call_soon(self._flush)
            self._asking_overlapped = bool(out)
        self._to_flush.add(log_id)

    def _flush_after(self, out: list[asyncio.Future], wait: float) -> None:
        """Flush once the last round is held (each of `out` done) or `wait` seconds from now, whichever comes first."""
        loop = asyncio.get_running_loop()
        timer = self._waiting = loop.call_later(wait, self._flush)

        def held(_) -> None:
            if self._waiting is timer and all(f.done() for f in out):
                timer.cancel()
                self._waiting = None
                loop.call_soon(self._flush)
        for f in out:
            f.add_done_callback(held)

    def _flush(self) -> None:
        self._waiting = None
        self._last_round = asyncio.get_running_loop().time()
        self._round_overlapped = self._asking_overlapped
        logs, self._to_flush = self._to_flush, set()
        self._round = [f for f in map(self._latest.get, logs) if f is not None]
        for log_id in logs:
            self.replicas.flush(log_id)

    def replicates(self, log_id: int) -> bool:
        """Whether `log_id`'s entries are replicated (its durability is Qa members', not the journal's)."""
        return self.replicas is not None and log_id in self._latest

    async def durable(self, end: int | None = None, log_id: int | tuple | None = None) -> None:
        """Until everything appended so far (or up to journal position `end`) is durable in the journal — and
        everything appended to `log_id` (or to each of a tuple of logs) is held by Qa members when it is
        replicated."""
        replicated = self._replication(log_id)
        end = self.journal.tail if end is None else end
        mine = None
        if replicated is not None:  # the journal only for what only it holds (the ledgers hold the rest)
            end = min(end, self._local_end)
            if not replicated.done() and type(log_id) is int:  # (a turn sooner than through the record's future)
                mine = self.replicas.when_confirmed(log_id)
        if self.journal.durable < end:
            await self.journal.wait_durable(end)
        if mine is not None:
            await mine
        elif replicated is not None:
            await asyncio.shield(replicated)  # (many wait for it: a waiter cancelled must not cancel it)

    async def replicated(self, log_id: int | tuple) -> None:
        """Until everything appended so far to `log_id` is held by Qa members (at once for a log not replicated)."""
        replicated = self._replication(log_id)
        if replicated is not None:
            await asyncio.shield(replicated)

    def recording(self, log_id: int | tuple) -> asyncio.Future | None:
        """What `replicated` waits for, as a future to await (shielded) or look at later; None when the log is not
        replicated (nothing to wait for)."""
        return self._replication(log_id) if self.replicas is not None else None

    def on_durable(self, end: int, log_id: int, callback) -> None:
        """`callback()` once what was appended to `log_id` so far is durable as `durable` says (up to journal
        position `end`); never, if that fails (the log's next owner takes over from there)."""
        replicated = self._latest.get(log_id) if self.replicas is not None else None
        if replicated is not None:
            end = min(end, self._local_end)

        def on_journal(exc) -> None:
            if exc is not None:
                return
            if replicated is None:
                callback()
            else:
                replicated.add_done_callback(lambda f: f.cancelled() or f.exception() is not None or callback())

        self.journal.on_durable(end, on_journal)

    def moved(self, log_id: int) -> None:
        """The log is another node's now: nothing of it is waited for here any more."""
        self._latest.pop(log_id, None)
