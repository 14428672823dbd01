"""The storage role (docs/cluster.md): ledgers of other owners' logs, kept in a journal of their own under
`<data dir>/ledgers` — one journal log per ledger (its id), entries numbered from 0 within the ledger — so their
appends share one group commit and one fdatasync, as a BookKeeper bookie's journal does. Owns the rules:

  * an entry is answered once durable; entries of a ledger are dense (an append that would leave a gap is
    refused, one already held is answered again once durable: a writer's retry is harmless);
  * a fence is durable before it is answered, survives restarts, and from then on the ledger refuses its writer's
    appends; recovery's copies (at the fence epoch) are still taken;
  * this journal is never `apply`d and never cut below a ledger that has not been deleted: start-up scans it
    whole to find every ledger's entries (no checkpoints here);
  * a deleted ledger (its log was cut past it: node.bundle_logs) is forgotten for good — its id is kept in
    `deleted` (written durably before the delete is answered), it reads as empty and refuses appends and fences
    — and the journal segments below the first entry of every ledger still kept are removed. A kept ledger that
    holds a fence but no entry stops the removal (where its fence lies is not known; losing it could let a
    replaced writer in again).

The node's own logs and state are untouched by it: a separate journal, separate files."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass

from pigeon.core.errors import FailedPrecondition
from pigeon.node.disk import OsDisk
from pigeon.node.journal import FsyncPolicy, JournalWriter
from pigeon.storage import recovery
from pigeon.storage.journal import Entry

FENCE_EPOCH = 0xFFFF_FFFF  # above every writer's epoch (epochs are 32-bit): recovery writes at it


class _NotApplied:
    """Recovery's target for stored ledgers: nothing is applied, the scan's index is what is wanted."""

    def load(self, header, meta, images) -> None:
        raise ValueError("the ledger journal has no checkpoints")

    def apply(self, rtype: int, body, at: int) -> None:
        pass


@dataclass(frozen=True)
class LedgerStats:
    ledgers: int
    entries: int
    fenced: int


class LedgerStore:
    def __init__(self, data_dir: str, policy: FsyncPolicy | str = FsyncPolicy.always,
                 segment_bytes: int = 64 * 1024 * 1024):
        self.dir = os.path.join(data_dir, "ledgers")
        self.policy, self.segment_bytes = FsyncPolicy(policy), segment_bytes
        self.writer: JournalWriter | None = None
        self.deleted: set[int] = set()
        self.append_requests = {"channel": 0, "grpc": 0}  # Append requests taken, by the way they came (statistics)
        self._disk = OsDisk()

    @property
    def _deleted_path(self) -> str:
        return os.path.join(self.dir, "deleted")

    async def open(self) -> None:
        for sub in ("wal", "checkpoints"):  # (recovery looks in both; this journal never writes a checkpoint)
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        disk = OsDisk()
        if os.path.exists(self._deleted_path):
            self.deleted = set(json.loads(self._disk.read_file(self._deleted_path)))
        gone = frozenset(self.deleted)
        found = await asyncio.get_running_loop().run_in_executor(
            None, lambda: recovery.recover(disk, self.dir, _NotApplied, repair=True, forgotten=gone))
        logs = {lid: st for lid, st in found.logs.items() if lid not in self.deleted}
        self.writer = JournalWriter(os.path.join(self.dir, "wal"), self.policy, self.segment_bytes, disk)
        self.writer.open(found.tail, logs)

    async def close(self) -> None:
        if self.writer is not None:
            await self.writer.close()
            self.writer = None

    def held(self, ledger: int) -> int:
        """How many entries of `ledger` this node holds (appended; durable once answered)."""
        st = self.writer.journal.logs.get(ledger)
        return st.next if st is not None and ledger not in self.deleted else 0

    def _refuse_deleted(self, ledger: int) -> None:
        if ledger in self.deleted:
            raise FailedPrecondition(f"ledger {ledger} was deleted: its log was cut past it")

    def submit(self, ledger: int, epoch: int, index: int, rtype: int, body: bytes, now: bool = True) -> asyncio.Future:
        """Store entry `index` of `ledger` from a writer at `epoch`: a future done once it is durable (entries
        submitted together share a group commit). FailedPrecondition at once for a gap or a fenced ledger. With
        `now` false the entry rides with the next group commit somebody asks for (`flush`), or the journal's
        lazy flush at the latest."""
        self._submit(ledger, epoch, index, rtype, body)
        return self.writer.wait_durable(self.writer.tail, ask=now)

    def flush(self) -> None:
        """Make everything submitted so far durable now: somebody waits for it."""
        self.writer.flush_soon()

    def _submit(self, ledger: int, epoch: int, index: int, rtype: int, body) -> None:
        self._refuse_deleted(ledger)
        st = self.writer.journal.logs.get(ledger)
        if st is not None and epoch < st.fenced:  # also a retry: the writer was replaced, recovery decides
            raise FailedPrecondition(f"ledger {ledger} is fenced: its writer was replaced")
        held = self.held(ledger)
        if index > held:
            raise FailedPrecondition(f"ledger {ledger}: entry {index} would leave a gap (entries below {held} held)")
        if index == held:
            self.writer.append(ledger, epoch, rtype, [body])

    def submit_many(self, ledger: int, epoch: int, index: int, types: list[int], bodies: list) -> tuple[int, asyncio.Future]:
        """`submit` for entries `index`, `index + 1`, … at once: (the last one's index, a future done once all
        are durable). FailedPrecondition as `submit` (the entries before the refused one are taken)."""
        for i, (rtype, body) in enumerate(zip(types, bodies)):
            self._submit(ledger, epoch, index + i, rtype, body)
        return index + len(bodies) - 1, self.writer.wait_durable(self.writer.tail)

    async def append(self, ledger: int, epoch: int, index: int, rtype: int, body: bytes) -> None:
        await self.submit(ledger, epoch, index, rtype, body)

    async def fence(self, ledger: int) -> int:
        """Refuse the ledger's writer from now on (durably); the number of entries held."""
        self._refuse_deleted(ledger)
        end = self.writer.fence(ledger, FENCE_EPOCH)
        await self.writer.wait_durable(self.writer.tail)
        return end

    def fenced(self, ledger: int) -> bool:
        st = self.writer.journal.logs.get(ledger)
        return st is not None and st.fenced >= FENCE_EPOCH

    def read(self, ledger: int, start: int, end: int) -> list[Entry]:
        """The durable entries of `ledger` in [start, end), in order."""
        if ledger in self.deleted:
            return []
        return list(self.writer.journal.entries(ledger, start, end))

    async def delete(self, ledgers) -> int:
        """Forget `ledgers` for good (durably, before answering) and remove the journal segments no kept ledger
        needs; how many segments went."""
        new = set(ledgers) - self.deleted
        if new:
            keep = sorted(self.deleted | new)
            await asyncio.get_running_loop().run_in_executor(
                None, self._disk.write_durably, self._deleted_path, json.dumps(keep).encode())
            self.deleted.update(new)
        return len(self.collect())

    def collect(self) -> list[int]:
        """Remove the journal segments wholly below the first entry of every kept ledger (none while a kept
        ledger has a fence but no entry); the segments removed."""
        low = self.writer.tail
        for lid, st in self.writer.journal.logs.items():
            if lid in self.deleted:
                continue
            if not st.samples:
                if st.fenced or st.next:
                    return []
                continue
            low = min(low, st.samples[0][1])
        return self.writer.delete_before(low)

    def statistics(self) -> LedgerStats:
        logs = [st for lid, st in self.writer.journal.logs.items() if lid not in self.deleted]
        return LedgerStats(sum(1 for st in logs if st.next), sum(st.next for st in logs),
                           sum(1 for st in logs if st.fenced >= FENCE_EPOCH))
