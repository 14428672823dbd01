"""Warming the page cache ahead of the log's reader. Owns the rule: when delivery reads a backlog from disk, a
thread of its own reads the log ahead of it, so the event loop's reads find their pages in memory instead of
waiting for the disk.

Delivery reads the log front to back (SubscriptionState hands new messages out in log order), but a record at a
time, between which the loop does ~5 ms of other work: the kernel's read-ahead keeps up only partly. Draining 2M
cold 1 KiB messages here, the loop waited in preads 2.2 s without help, 1.1 s with POSIX_FADV_WILLNEED hints
(each hint itself blocks the loop ~1 ms) and 0.5 s with this thread. The thread reads and throws away; pread
releases the GIL, so the loop pays only a GIL hand-over now and then. It never reads past what the writer has
made durable, and it opens segment files itself (a segment deleted under it is skipped), so it shares no state
with the loop but two numbers under a lock and the list of segment starts (copied)."""

from __future__ import annotations

import bisect
import logging
import os
import threading
from typing import Callable

log = logging.getLogger("pigeon.readahead")

AHEAD_BYTES = 32 * 1024 * 1024  # how far ahead of the reader the pages are fetched
_CHUNK = 1024 * 1024  # one pread
_IDLE_S = 0.05  # with nothing readable yet (not durable), look again after this


class ReadAhead:
    """One window of the log, [lo, hi), kept ahead of the reader; `warmed` is how far the thread has read."""

    def __init__(self, starts: list[int], durable: Callable[[], int], path_of: Callable[[int], str]):
        self._starts = starts  # the log's segment starts (the loop thread appends and removes)
        self._durable = durable
        self._path_of = path_of  # a segment's file, by its start
        self._cv = threading.Condition()
        self._lo = self._hi = 0  # guarded by _cv
        self._jumped = False  # guarded by _cv: start over at _lo
        self._closing = False
        self._thread: threading.Thread | None = None
        self._fds: dict[int, int] = {}  # segment start → a file the thread reads (its own)
        self.warmed = 0  # the position read up to (statistics)
        self.fetched = 0  # bytes read in all (statistics)

    def ahead_of(self, pos: int) -> None:
        """The reader is at `pos` (loop thread): keep the next AHEAD_BYTES fetched. Cheap when already done.
        A position a little behind the window is another shard's batch, whose pages came with the window; only
        a jump (a seek, another subscription far behind) starts the window over."""
        if self._lo - AHEAD_BYTES <= pos < self._hi - AHEAD_BYTES // 2:
            return
        with self._cv:
            if not self._lo - AHEAD_BYTES <= pos <= self._hi:
                self._lo, self._jumped = pos, True
            self._hi = pos + AHEAD_BYTES
            self._cv.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pigeon-read-ahead", daemon=True)
            self._thread.start()

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        view = memoryview(bytearray(_CHUNK))
        done = 0
        try:
            while True:
                with self._cv:
                    while True:
                        if self._closing:
                            return
                        if self._jumped or not self._lo <= done <= self._hi:
                            done, self._jumped = self._lo, False
                        stop = min(self._hi, self._durable())
                        if done < stop:
                            break
                        if done >= self._hi:  # caught up: no file held open while idle (a segment deleted
                            self._close_files()  # meanwhile would keep its disk space)
                        self._cv.wait(_IDLE_S if done < self._hi else None)
                done = self._read(done, stop, view)
                self.warmed = done
        except Exception:  # noqa: BLE001 — only a speed-up: the loop's reads work without it
            log.exception("read-ahead stopped")
        finally:
            self._close_files()

    def _close_files(self, before: int | None = None) -> None:
        for seg in [s for s in self._fds if before is None or s < before]:
            os.close(self._fds.pop(seg))

    def _read(self, pos: int, stop: int, view: memoryview) -> int:
        """Read one chunk from `pos` (not past `stop` nor its segment's end); returns where the next one starts."""
        starts = list(self._starts)  # one consistent copy: the loop thread appends and removes meanwhile
        i = bisect.bisect_right(starts, pos) - 1
        if i < 0:  # before the oldest segment (deleted meanwhile): go on from there
            return starts[0] if starts else stop
        seg = starts[i]
        end = min(stop, starts[i + 1]) if i + 1 < len(starts) else stop
        fd = self._fds.get(seg)
        if fd is None:
            self._close_files(before=seg)  # segments behind the reader are not read again
            try:
                fd = self._fds[seg] = os.open(self._path_of(seg), os.O_RDONLY)
            except FileNotFoundError:  # deleted (acked and compacted) under us: nothing to warm there
                return end
        got = os.preadv(fd, [view[: min(_CHUNK, end - pos)]], pos - seg)
        self.fetched += max(got, 0)
        return pos + got if got > 0 else end
