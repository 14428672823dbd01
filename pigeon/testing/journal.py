"""A journal driven synchronously, for tests and the simulator: `commit()` is one group commit (write everything
pending, sync, report durable) performed at the moment the test chooses, on a real Journal over any Disk —
the same code the node's writer thread runs, minus the thread. `reopen()` recovers the directory as start-up
does and opens a new journal at the recovered tail."""

from __future__ import annotations

from pigeon.storage import recovery
from pigeon.storage.journal import Journal, WriteCursor
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
    def __init__(self, disk, data_dir: str, segment_bytes: int = 1 << 20):
        self.disk, self.data_dir, self.segment_bytes = disk, data_dir, segment_bytes
        self.recovered = recovery.recover(disk, data_dir, _Collect, repair=True)
        self.journal = Journal(disk, data_dir + "/wal", segment_bytes)
        start = self.journal.open(self.recovered.tail, self.recovered.logs)
        self.cursor = WriteCursor(start, disk.open_append(self.journal.path(start)), True)

    def log(self, log_id: int) -> JournalLog:
        return JournalLog(self.journal, log_id)

    def write(self) -> None:
        """Write what is pending without syncing it (a crash may lose it)."""
        batch, _ = self.journal.take_pending()
        self.journal.write(self.cursor, batch)

    def commit(self) -> None:
        """One group commit: everything appended so far becomes durable."""
        self.write()
        self.disk.sync(self.cursor.handle)
        self.journal.synced(self.journal.tail)

    def reopen(self) -> "SyncJournal":
        self.disk.close(self.cursor.handle)
        return SyncJournal(self.disk, self.data_dir, self.segment_bytes)
