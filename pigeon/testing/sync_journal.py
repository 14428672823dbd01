"""A journal driven synchronously, for tests and the simulator: `commit()` is one group commit (write everything
pending, sync, report durable) performed at the moment the test chooses, on a real Journal over any Disk —
the same code the node's writer thread runs, minus the thread. `reopen()` recovers the directory as start-up
does and opens a new journal at the recovered tail."""

from __future__ import annotations

import errno

from pigeon.storage import recovery
from pigeon.storage.journal import Journal
from pigeon.storage.log import JournalLog


class _Collect:
    """A recovery target that keeps the entries it is given: (journal position, type, body)."""

    def __init__(self):
        self.entries: list[tuple[int, int, bytes]] = []

    def load(self, header, meta, images) -> None:
        raise ValueError("this journal has no checkpoints")

    def apply(self, rtype: int, body, at: int) -> None:
        self.entries.append((at, rtype, bytes(body)))


class SyncJournal:
    def __init__(self, disk, data_dir: str, segment_bytes: int = 1 << 20, new_target=_Collect, type_name=str):
        """`new_target` is what recovery rebuilds (storage.recovery.Target); the default keeps the entries."""
        self.disk, self.data_dir, self.segment_bytes = disk, data_dir, segment_bytes
        self.new_target, self.type_name = new_target, type_name
        self.recovered = recovery.recover(disk, data_dir, new_target, repair=True, type_name=type_name)
        self.journal = Journal(disk, data_dir + "/wal", segment_bytes)
        self.journal.open(self.recovered.tail, self.recovered.logs)
        self.cursor = self.journal.cursor(sync=True)
        self.kept: list = []  # batches written since the last sync: written again if the disk fills up first

    def fence(self, log_id: int, epoch: int) -> int:
        return self.journal.fence(log_id, epoch)

    def append(self, log_id: int, epoch: int, rtype: int, parts: list[bytes]) -> tuple[int, int]:
        return self.journal.append(log_id, epoch, rtype, parts)

    @property
    def durable(self) -> int:
        """The journal position up to which records are durable (what a reader may read back)."""
        return self.journal.durable

    def read(self, pos: int, n: int) -> bytes:
        return self.journal.read(pos, n)

    def read_into(self, pos: int, buf) -> int:
        return self.journal.read_into(pos, buf)

    def read_ahead(self, pos: int) -> None:
        """No thread here: reads go to the (simulated) files directly."""

    def log(self, log_id: int) -> JournalLog:
        return JournalLog(self.journal, log_id)

    def write(self) -> bool:
        """Write what is pending without syncing it (a crash may lose it). On a full disk, as the node's writer:
        cut the files back to what is durable, keep every entry since for the next try, return False."""
        batch, _ = self.journal.take_pending()
        try:
            self.journal.write(self.cursor, batch)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            self.journal.requeue(self.kept + [batch])
            self.kept = []
            self.cursor = self.journal.rewind(self.cursor, self.journal.durable)
            return False
        self.kept.append(batch)
        return True

    def commit(self) -> bool:
        """One group commit: everything appended so far becomes durable (False: the disk was full, nothing
        more is durable, and everything is kept for the next commit)."""
        if not self.write():
            return False
        self.disk.sync(self.cursor.handle)
        self.kept = []
        self.journal.synced(self.journal.tail)
        return True

    def reopen(self) -> "SyncJournal":
        self.disk.close(self.cursor.handle)
        return SyncJournal(self.disk, self.data_dir, self.segment_bytes, self.new_target, self.type_name)
