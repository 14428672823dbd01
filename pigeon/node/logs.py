"""The logs the executor writes: every log in the node's journal (storage.log's contract over one group commit), and
on a cluster node the data logs of the bundles it owns replicated besides to the ensemble of each log's open ledger
(node.bundle_logs). Owns the rule: an entry is durable once the journal holds it durable and, for a replicated log,
Qa members do — the executor appends, waits and hears through here and cannot tell a replicated log from a local
one. A log that moved to another node fails its waiters with Unavailable (its next owner has every entry ever
confirmed). And the owner's lease (docs/cluster.md, invariant O3): a delivery of a replicated log goes out before
its Deliver record is held by Qa members only while an append this node made to the log less than
limits.owner_lease_s ago (on its monotonic clock, shortened by limits.clock_rate_error) was confirmed by them —
no other node had fenced the log then; a node that takes a log over answers nothing but publishes on it until
owner_lease_s after its fence, so whatever a former owner handed out on its lease went out before any ack the
new one answers."""

from __future__ import annotations

import asyncio
import functools

from pigeon.core import limits
from pigeon.core.bundles import META_LOG
from pigeon.storage import records as R


class NodeLogs:
    def __init__(self, journal, clock):
        self.journal = journal  # node.journal_writer.JournalWriter
        self.clock = clock  # its monotonic(): the leases' time
        self.replicas = None  # a cluster node's bundle logs, once it joined
        self._latest: dict[int, asyncio.Future] = {}  # replicated log → the replication of its latest entry
        self._lease: dict[int, float] = {}  # replicated log → when its latest append confirmed by Qa was made
        self._taken: dict[int, float] = {}  # replicated log → when this node fenced it (appends before: not ours)

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
            fut = self._latest[log_id] = self.replicas.append(  # the node's own copy starting over, not log entries)
                log_id, rtype, b"".join(parts), (log_id, offset, at, self.journal.tail))
            fut.add_done_callback(functools.partial(self._confirmed, log_id, self.clock.monotonic()))
        return offset, at

    def _confirmed(self, log_id: int, made: float, fut: asyncio.Future) -> None:
        """An append made at `made` was answered: confirmed by Qa members, it renews the lease."""
        if not fut.cancelled() and fut.exception() is None and made > self._lease.get(log_id, -1e18) and \
                made >= self._taken.get(log_id, made) and self.replicas.serving(log_id):  # (else: a former stay's)
            self._lease[log_id] = made

    def taken(self, log_id: int) -> None:
        """This node has just fenced the log to take it over: until owner_lease_s from now it answers nothing on it
        but publishes (`durable(..., publish=False)` waits), and it holds no lease from its appends before."""
        self._taken[log_id] = self.clock.monotonic()
        self._lease.pop(log_id, None)

    def leased(self, log_id: int | tuple) -> bool:
        """Whether a delivery of `log_id` (each of a tuple of logs) may go out before its Deliver record is
        replicated: the log is this node's and its lease runs (an append made less than the lease ago confirmed)."""
        if type(log_id) is tuple:
            return all(map(self.leased, log_id))
        made = self._lease.get(log_id)
        return made is not None and self.clock.monotonic() - made < limits.owner_lease_s * (
            1.0 - limits.clock_rate_error) and self.replicas.serving(log_id)

    async def _settled(self, log_id: int | tuple) -> None:
        """Until no former owner of `log_id` can hand out a delivery on its lease any more."""
        taken = max((self._taken.get(i, -1e18) for i in log_id), default=-1e18) if type(log_id) is tuple else \
            self._taken.get(log_id)
        if taken is not None and (left := taken + limits.owner_lease_s - self.clock.monotonic()) > 0:
            await asyncio.sleep(left)

    def _replication(self, log_id: int | tuple | None) -> asyncio.Future | None:
        """The replication of the log's latest entry, asked to go out now when it lingers (entries nobody waited
        for ride with the next one somebody does). `log_id` may name the logs of a spread topic's shards: then
        of each of them that this node writes, all together."""
        if type(log_id) is tuple:
            futs = [f for f in map(self._replication, log_id) if f is not None]
            if not futs:
                return None
            return futs[0] if len(futs) == 1 else asyncio.gather(*map(asyncio.shield, futs))
        fut = self._latest.get(log_id) if log_id is not None else None
        if fut is not None and not fut.done():
            self.replicas.flush(log_id)
        return fut

    async def durable(self, end: int | None = None, log_id: int | tuple | None = None, publish: bool = False) -> None:
        """Until everything appended so far (or up to journal position `end`) is durable in the journal — and
        everything appended to `log_id` (or to each of a tuple of logs) is held by Qa members when it is
        replicated, and, but for a `publish`'s answer, the log's former owner's lease has run out."""
        replicated = self._replication(log_id)
        await self.journal.wait_durable(self.journal.tail if end is None else end)
        if replicated is not None:
            await asyncio.shield(replicated)  # (many wait for it: a waiter cancelled must not cancel it)
        if not publish and log_id is not None and self._taken:
            await self._settled(log_id)

    async def replicated(self, log_id: int | tuple, unconfirmed: bool = False) -> None:
        """Until a delivery of `log_id` may go out: `recording`'s wait."""
        replicated = self.recording(log_id, unconfirmed)
        if replicated is not None:
            await asyncio.shield(replicated)

    def recording(self, log_id: int | tuple, unconfirmed: bool = False) -> asyncio.Future | None:
        """What a delivery of `log_id` waits for, as a future to await (shielded) or look at later: None when the
        log is not replicated, or this node's lease on it runs and the delivery holds no batch whose publish is
        `unconfirmed` yet; else the replication of the log's latest entry — the delivery's Deliver record, held by
        members only after every batch before it (and, confirmed, it renews the lease)."""
        if self.replicas is None or (not unconfirmed and self.leased(log_id)):
            return None
        return self._replication(log_id)

    def on_durable(self, end: int, log_id: int, callback) -> None:
        """`callback()` once the journal is durable up to `end` and what was appended to `log_id` so far is
        replicated; never, if either fails (the log's next owner takes over from there)."""
        replicated = self._latest.get(log_id) if self.replicas is not None else None

        def on_journal(exc) -> None:
            if exc is not None:
                return
            if replicated is None:
                callback()
            else:
                replicated.add_done_callback(lambda f: f.cancelled() or f.exception() is not None or callback())

        self.journal.on_durable(end, on_journal)

    def moved(self, log_id: int) -> None:
        """The log is another node's now: nothing of it is waited for here any more, and no lease runs."""
        self._latest.pop(log_id, None)
        self._lease.pop(log_id, None)
        self._taken.pop(log_id, None)
