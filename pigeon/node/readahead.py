"""Warming the page cache ahead of the journal's reader: the thread that performs storage.readahead's plan.

Delivery reads the journal front to back (subscriptions hand new messages out in log order), but a record at a
time, between which the loop does ~5 ms of other work: the kernel's read-ahead keeps up only partly. Draining 2M
cold 1 KiB messages here, the loop waited in preads 2.2 s without help, 1.1 s with POSIX_FADV_WILLNEED hints
(each hint itself blocks the loop ~1 ms) and 0.5 s with this thread. The thread reads and throws away; pread
releases the GIL, so the loop pays only a GIL hand-over now and then. It opens segment files itself (a segment
deleted under it is skipped), so it shares no state with the loop but the window under a lock and the list of
segment starts (copied)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from pigeon.core import limits
from pigeon.storage import readahead as plan

log = logging.getLogger("pigeon.readahead")


class ReadAhead:
    def __init__(self, starts: list[int], durable: Callable[[], int], path_of: Callable[[int], str]):
        self._starts = starts  # the journal's segment starts (the loop thread appends and removes)
        self._durable = durable
        self._path_of = path_of  # a segment's file, by its start
        self._cv = threading.Condition()
        self._window = plan.Window(limits.read_ahead_bytes)  # guarded by _cv
        self._closing = False
        self._thread: threading.Thread | None = None
        self._fds: dict[int, int] = {}  # segment start → a file the thread reads (its own)
        self.warmed = 0  # the position read up to (statistics)
        self.fetched = 0  # bytes read in all (statistics)

    def ahead_of(self, pos: int) -> None:
        """The reader is at `pos` (loop thread). Cheap when the window already covers it."""
        if self._window.settled(pos):
            return
        with self._cv:
            self._window.reader_at(pos)
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
        view = memoryview(bytearray(limits.read_ahead_chunk_bytes))
        done = 0
        try:
            while True:
                with self._cv:
                    while True:
                        if self._closing:
                            return
                        new, seg, offset, n = self._window.next_read(done, self._durable(), list(self._starts))
                        moved, done = new != done, new
                        if n:
                            break
                        if moved:  # started over, or skipped what was deleted: look again at once
                            continue
                        if self._window.caught_up(done):  # no file held open while idle (a segment deleted
                            self._close_files()  # meanwhile would keep its disk space)
                        self._cv.wait(limits.read_ahead_idle_s if not self._window.caught_up(done) else None)
                if n:
                    done = self._read(seg, offset, view[:n], done)
                    self.warmed = done
        except Exception:  # noqa: BLE001 — only a speed-up: the loop's reads work without it
            log.exception("read-ahead stopped")
        finally:
            self._close_files()

    def _close_files(self, before: int | None = None) -> None:
        for seg in [s for s in self._fds if before is None or s < before]:
            os.close(self._fds.pop(seg))

    def _read(self, seg: int, offset: int, view: memoryview, done: int) -> int:
        """Read one chunk of segment `seg`; returns where the next one starts."""
        fd = self._fds.get(seg)
        if fd is None:
            self._close_files(before=seg)  # segments behind the reader are not read again
            try:
                fd = self._fds[seg] = os.open(self._path_of(seg), os.O_RDONLY)
            except FileNotFoundError:  # deleted (acked and compacted) under us: go on after it
                nxt = [s for s in list(self._starts) if s > seg]
                return nxt[0] if nxt else done + len(view)
        got = os.preadv(fd, [view], offset)
        self.fetched += max(got, 0)
        return done + got if got > 0 else done + len(view)
