"""A log in memory (the storage.log.Log contract) with faults on demand, for tests of what is built on logs — the
broker's executor, and the cluster's replication. `sync()` is the group commit, chosen by the test; `crash()`
loses what was not synced; `fail_appends(exc)` makes appends raise; fencing and truncation follow the contract."""

from __future__ import annotations

from pigeon.storage.journal import Entry, Fenced
from pigeon.storage.log import LogStats


class SimLog:
    def __init__(self, log_id: int = 1):
        self.log_id = log_id
        self._entries: list[Entry] = []
        self._durable = 0  # entries below are durable
        self._fenced = 0
        self._epoch = 0
        self._waiters: list[tuple[int, object]] = []
        self._fail: BaseException | None = None
        self._appended = 0
        self._bytes = 0

    # --- faults ------------------------------------------------------------------------------------------
    def sync(self) -> None:
        self._durable = len(self._entries)
        due = [cb for off, cb in self._waiters if off < self._durable]
        self._waiters = [(off, cb) for off, cb in self._waiters if off >= self._durable]
        for cb in due:
            cb(None)

    def crash(self) -> None:
        """Lose what was not synced; waiters never hear."""
        del self._entries[self._durable:]
        self._waiters = []

    def fail_appends(self, exc: BaseException | None) -> None:
        self._fail = exc

    # --- the contract ------------------------------------------------------------------------------------
    def append(self, epoch: int, rtype: int, parts: list[bytes]) -> tuple[int, int]:
        if self._fail is not None:
            raise self._fail
        if epoch < self._fenced:
            raise Fenced(self.log_id, epoch, self._fenced)
        offset = len(self._entries)
        body = b"".join(parts)
        self._entries.append(Entry(epoch, offset, rtype, body, offset))
        self._epoch = epoch
        self._appended += 1
        self._bytes += len(body)
        return offset, offset

    def end(self) -> int:
        return len(self._entries)

    def durable(self) -> int:
        return self._durable

    def on_durable(self, offset: int, callback) -> None:
        if offset >= len(self._entries):
            raise ValueError(f"log {self.log_id} has no entry {offset}")
        if offset < self._durable:
            callback(None)
        else:
            self._waiters.append((offset, callback))

    def read(self, start: int, end: int):
        return iter(self._entries[max(0, start):min(end, self._durable)])

    def truncate(self, after: int) -> None:
        del self._entries[after + 1:]
        self._durable = min(self._durable, len(self._entries))
        self._waiters = [(o, cb) for o, cb in self._waiters if o <= after]

    def fence(self, epoch: int) -> int:
        self._fenced = max(self._fenced, epoch)
        return len(self._entries)

    def statistics(self) -> LogStats:
        return LogStats(self.log_id, self._epoch, self._fenced, len(self._entries), self._durable, self._appended,
                        self._bytes)
