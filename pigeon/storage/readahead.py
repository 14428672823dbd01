"""Read-ahead planning. Owns the rule: when a reader reads the journal from disk, the next limits.read_ahead_bytes
after it are fetched ahead of it — never past what is durable, never past the window, starting over only where the
reader jumped (a seek, another subscription far behind), not for a read a little behind (another shard's batch,
whose pages came with the window). The node's read-ahead thread performs the reads (node.readahead)."""

from __future__ import annotations

import bisect

from pigeon.core import limits


class Window:
    """[lo, hi) of the journal kept ahead of the reader; `jumped` until the reader's side has started over."""

    __slots__ = ("lo", "hi", "jumped", "ahead")

    def __init__(self, ahead: int = limits.read_ahead_bytes):
        self.lo = self.hi = 0
        self.jumped = False
        self.ahead = ahead

    def settled(self, pos: int) -> bool:
        """Whether a reader at `pos` needs nothing new (cheap: checked without the thread's lock)."""
        return self.lo - self.ahead <= pos < self.hi - self.ahead // 2

    def reader_at(self, pos: int) -> None:
        """The reader is at `pos`: keep [pos, pos + ahead) fetched; a jump starts the window over at `pos`."""
        if not self.lo - self.ahead <= pos <= self.hi:
            self.lo, self.jumped = pos, True
        self.hi = pos + self.ahead

    def next_read(self, done: int, durable: int, starts: list[int]) -> tuple[int, int, int, int]:
        """Where the thread reads next, having read up to `done`: (new done, segment start, offset in it, length);
        length 0 when there is nothing to read yet (caught up, or not durable yet). A segment that is gone (trimmed
        under the reader) is skipped: the answer then starts at the next one."""
        if self.jumped or not self.lo <= done <= self.hi:
            done, self.jumped = self.lo, False
        stop = min(self.hi, durable)
        if done >= stop:
            return done, -1, 0, 0
        i = bisect.bisect_right(starts, done) - 1
        if i < 0:  # before the oldest segment (deleted meanwhile): go on from there
            return (starts[0] if starts else stop), -1, 0, 0
        seg = starts[i]
        end = min(stop, starts[i + 1]) if i + 1 < len(starts) else stop
        return done, seg, done - seg, min(limits.read_ahead_chunk_bytes, end - done)

    def caught_up(self, done: int) -> bool:
        return done >= self.hi
