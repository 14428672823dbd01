"""The storage role (docs/cluster.md): ledgers of other owners' logs, kept in a journal of their own under
`<data dir>/ledgers` — one journal log per ledger (its id), entries numbered from 0 within the ledger — so their
appends share one group commit and one fdatasync, as a BookKeeper bookie's journal does. Owns the rules:

  * an entry is answered once durable; entries of a ledger are dense (an append that would leave a gap is
    refused, one already held is answered again once durable: a writer's retry is harmless);
  * a fence is durable before it is answered, survives restarts, and from then on the ledger refuses its writer's
    appends; recovery's copies (at the fence epoch) are still taken;
  * this journal is never `apply`d and never cut below a ledger that has not been deleted: start-up scans it
    whole to find every ledger's entries (no checkpoints here).

The node's own logs and state are untouched by it: a separate journal, separate files."""

from __future__ import annotations

import asyncio
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

    async def open(self) -> None:
        for sub in ("wal", "checkpoints"):  # (recovery looks in both; this journal never writes a checkpoint)
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        disk = OsDisk()
        found = await asyncio.get_running_loop().run_in_executor(
            None, lambda: recovery.recover(disk, self.dir, _NotApplied, repair=True))
        self.writer = JournalWriter(os.path.join(self.dir, "wal"), self.policy, self.segment_bytes, disk)
        self.writer.open(found.tail, found.logs)

    async def close(self) -> None:
        if self.writer is not None:
            await self.writer.close()
            self.writer = None

    def held(self, ledger: int) -> int:
        """How many entries of `ledger` this node holds (appended; durable once answered)."""
        st = self.writer.journal.logs.get(ledger)
        return st.next if st is not None else 0

    def submit(self, ledger: int, epoch: int, index: int, rtype: int, body: bytes) -> asyncio.Future:
        """Store entry `index` of `ledger` from a writer at `epoch`: a future done once it is durable (entries
        submitted together share a group commit). FailedPrecondition at once for a gap or a fenced ledger."""
        st = self.writer.journal.logs.get(ledger)
        if st is not None and epoch < st.fenced:  # also a retry: the writer was replaced, recovery decides
            raise FailedPrecondition(f"ledger {ledger} is fenced: its writer was replaced")
        held = self.held(ledger)
        if index > held:
            raise FailedPrecondition(f"ledger {ledger}: entry {index} would leave a gap (entries below {held} held)")
        if index == held:
            self.writer.append(ledger, epoch, rtype, [body])
        return self.writer.wait_durable(self.writer.tail)

    async def append(self, ledger: int, epoch: int, index: int, rtype: int, body: bytes) -> None:
        await self.submit(ledger, epoch, index, rtype, body)

    async def fence(self, ledger: int) -> int:
        """Refuse the ledger's writer from now on (durably); the number of entries held."""
        end = self.writer.fence(ledger, FENCE_EPOCH)
        await self.writer.wait_durable(self.writer.tail)
        return end

    def fenced(self, ledger: int) -> bool:
        st = self.writer.journal.logs.get(ledger)
        return st is not None and st.fenced >= FENCE_EPOCH

    def read(self, ledger: int, start: int, end: int) -> list[Entry]:
        """The durable entries of `ledger` in [start, end), in order."""
        return list(self.writer.journal.entries(ledger, start, end))

    def statistics(self) -> LedgerStats:
        logs = self.writer.journal.logs.values()
        return LedgerStats(sum(1 for st in logs if st.next), sum(st.next for st in logs),
                           sum(1 for st in logs if st.fenced >= FENCE_EPOCH))
