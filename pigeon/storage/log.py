"""The Log contract. Owns the interface every log of Pigeon offers — the broker's executor writes through it
today, a replicated log (the cluster's ledgers) will offer the same — and its one implementation on the node's
journal. The rules behind it are storage.journal's: (epoch, offset) dense and monotonic per log, a fenced epoch
appends nothing, acknowledged ⇒ covered by fdatasync.

| call                          | what it promises |
|-------------------------------|------------------|
| append(epoch, rtype, parts)   | the entry's (offset, location); offsets go 0, 1, 2, … with no gap; Fenced below the fence |
| end()                         | the offset the next append gets |
| durable()                     | every entry below this offset survives a crash |
| on_durable(offset, callback)  | callback(None) once the entry at `offset` is durable; callback(exc) if it never will be |
| read(start, end)              | the durable entries in [start, end), in offset order |
| truncate(after)               | entries above `after` are gone for every reader; the next append gets after + 1 |
| fence(epoch)                  | appends from a lower epoch are refused from now on; returns end() |
| statistics()                  | a LogStats: plain values |

The simulated log (pigeon.testing.simlog.SimLog) offers the same with faults on demand; tests/unit/
test_log_contract.py runs one suite against both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

from pigeon.storage.journal import Entry, Fenced, Journal

__all__ = ["Entry", "Fenced", "Log", "LogStats", "JournalLog"]


@dataclass(frozen=True, slots=True)
class LogStats:
    log_id: int
    epoch: int  # of the last append
    fenced: int
    end: int  # next offset
    durable: int  # entries below are durable
    entries: int  # appended since start
    bytes: int


class Log(Protocol):
    log_id: int

    def append(self, epoch: int, rtype: int, parts: list[bytes]) -> tuple[int, int]: ...

    def end(self) -> int: ...

    def durable(self) -> int: ...

    def on_durable(self, offset: int, callback) -> None: ...

    def read(self, start: int, end: int) -> Iterator[Entry]: ...

    def truncate(self, after: int) -> None: ...

    def fence(self, epoch: int) -> int: ...

    def statistics(self) -> LogStats: ...


class JournalLog:
    """One log of a journal that many logs share (one group commit serves them all)."""

    def __init__(self, journal: Journal, log_id: int):
        self.journal = journal
        self.log_id = log_id
        self._st = journal.log(log_id)

    def append(self, epoch: int, rtype: int, parts: list[bytes]) -> tuple[int, int]:
        return self.journal.append(self.log_id, epoch, rtype, parts)

    def end(self) -> int:
        return self._st.next

    def durable(self) -> int:
        return self._st.durable_next

    def on_durable(self, offset: int, callback) -> None:
        st = self._st
        if offset < st.durable_next:
            callback(None)
            return
        for o, end in st.unsynced:
            if o == offset:
                self.journal.on_durable(end, callback)
                return
        raise ValueError(f"log {self.log_id} has no entry {offset} (next is {st.next})")

    def read(self, start: int, end: int) -> Iterator[Entry]:
        return self.journal.entries(self.log_id, start, end)

    def truncate(self, after: int) -> None:
        self.journal.truncate(self.log_id, after)

    def fence(self, epoch: int) -> int:
        return self.journal.fence(self.log_id, epoch)

    def statistics(self) -> LogStats:
        st = self._st
        return LogStats(self.log_id, st.epoch, st.fenced, st.next, st.durable_next, st.entries, st.bytes)
