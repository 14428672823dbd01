"""The write-ahead log on disk and its group commit. Owns the rule: acknowledged ⇒ covered by
fdatasync (under the default policy). Records get their global position when appended (on the event
loop thread); one writer thread writes everything pending with one write and one fdatasync, then wakes
every waiter whose record is covered. Every record is written at once (a killed process loses none), but
fdatasync runs only when someone waits for a record (a publish, a unary ack) or LAZY_FLUSH_S after a record
nobody waits for (an ack sent on a stream, a delivery count): those ride along with the next group commit
instead of costing a disk flush of their own.

Segments are files named by the global position of their first byte, so a position maps to a file by
bisection and a segment's end is the next one's start."""

from __future__ import annotations

import asyncio
import bisect
import enum
import functools
import logging
import os
import threading
import time

from pigeon.core.errors import ResourceExhausted, Unavailable
from pigeon.node.readahead import ReadAhead

log = logging.getLogger("pigeon.wal")

SUFFIX = ".wal"
BATCH_SYNC_S = 0.005  # fsync=batch: the longest a written record waits for its fdatasync
_IOV_MAX = os.sysconf("SC_IOV_MAX")  # buffers per writev
LAZY_FLUSH_S = 0.01  # fsync=always: the longest a written record nobody waits for stays without fdatasync


class FsyncPolicy(str, enum.Enum):
    always = "always"  # fdatasync before any reply: nothing acknowledged is lost on power failure
    batch = "batch"  # reply after write(); fdatasync every few ms: a power failure may lose the last ms
    never = "never"  # leave it to the OS: a crash of the machine may lose recent acknowledged data


def segment_name(start: int) -> str:
    return f"{start:020d}{SUFFIX}"


def segment_path(wal_dir: str, start: int) -> str:
    return os.path.join(wal_dir, segment_name(start))


def list_segments(wal_dir: str) -> list[int]:
    out = []
    for f in os.listdir(wal_dir):
        if f.endswith(SUFFIX) and f[: -len(SUFFIX)].isdigit():
            out.append(int(f[: -len(SUFFIX)]))
    return sorted(out)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, chunks: list[bytes]) -> None:
    """Write the records in order with writev: the kernel gathers them, so no joined copy is made while
    holding the GIL (the event loop's thread waits for that); a partial write is finished byte-exactly."""
    for i in range(0, len(chunks), _IOV_MAX):
        group = chunks[i : i + _IOV_MAX]
        n = os.writev(fd, group)
        if n < sum(map(len, group)):
            rest = memoryview(b"".join(group))[n:]
            while rest:
                rest = rest[os.write(fd, rest) :]


class Wal:
    """Append-only log over segment files. Not thread-safe: call append/wait_durable on the loop thread."""

    def __init__(self, wal_dir: str, policy: FsyncPolicy, segment_bytes: int, batch_bytes_max: int):
        self.dir = wal_dir
        self.policy = FsyncPolicy(policy)
        self.segment_bytes = segment_bytes
        self.batch_bytes_max = batch_bytes_max
        self.starts: list[int] = []  # segment start positions, ascending
        self.tail = 0  # position after the last appended record
        self.durable = 0  # position up to which data is durable (per policy)
        self._pending: list[tuple[int, bytes]] = []  # (segment start, data)
        self._pending_bytes = 0
        self._want = 0  # position the writer has been asked to make durable (guarded by _cv)
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._read_fds: dict[int, int] = {}
        self._read_ahead: ReadAhead | None = None
        self.flushes = 0  # statistics: group commits that made records durable

    # --- lifecycle -------------------------------------------------------------------------------
    def open(self, tail: int) -> None:
        """Start appending at `tail` (recovery has truncated the log there)."""
        os.makedirs(self.dir, exist_ok=True)
        self.starts = list_segments(self.dir)
        assert not self.starts or self.starts[-1] <= tail, "recovery must remove segments past the tail"
        last_end = self.starts[-1] + os.path.getsize(segment_path(self.dir, self.starts[-1])) if self.starts else None
        if last_end != tail:  # empty log, or the checkpoint lies past the log's end: start a fresh segment there
            self._create_segment(tail)
            self.starts.append(tail)
        self.tail = self.durable = tail
        self._read_ahead = ReadAhead(self.starts, lambda: self.durable, functools.partial(segment_path, self.dir))
        self._loop = asyncio.get_running_loop()
        # the writer's starting point is fixed here: appends may run before the thread gets going
        self._thread = threading.Thread(
            target=self._writer, args=(self.starts[-1], tail), name="pigeon-wal-writer", daemon=True
        )
        self._thread.start()

    def _create_segment(self, start: int) -> None:
        path = segment_path(self.dir, start)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        fsync_dir(self.dir)

    async def close(self) -> None:
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        if self._read_ahead is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._read_ahead.close)
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    # --- appending (loop thread) -----------------------------------------------------------------
    def append(self, data: bytes) -> int:
        """Queue one encoded record; returns its position. Durable once `durable` passes pos+len."""
        if self._failed is not None:
            raise Unavailable(f"The log is not writable: {self._failed}")
        pos = self.tail
        seg = self.starts[-1]
        if pos - seg + len(data) > self.segment_bytes and pos > seg:
            self.starts.append(pos)  # rotate: the writer opens a new file at this position
            seg = pos
        self.tail = pos + len(data)
        with self._cv:
            self._pending.append((seg, data))
            self._pending_bytes += len(data)
            self._cv.notify()
        if self._lazy_timer is None and self.policy is FsyncPolicy.always:
            self._lazy_timer = self._loop.call_later(LAZY_FLUSH_S, self.flush_soon)
        return pos

    def flush_soon(self) -> None:
        """Ask the writer for everything appended so far."""
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        if self._want < self.tail:
            with self._cv:
                self._want = self.tail
                self._cv.notify()

    def wait_durable(self, end: int) -> asyncio.Future:
        fut = self._loop.create_future()
        if self.durable >= end:
            fut.set_result(None)
        elif self._failed is not None:
            fut.set_exception(Unavailable(f"The log is not writable: {self._failed}"))
        else:
            self._waiters.append((end, fut))
            if self._want < end:
                self.flush_soon()
        return fut

    def _on_durable(self, end: int) -> None:
        self.durable = end
        keep = []
        for w in self._waiters:
            if w[0] <= end:
                if not w[1].done():
                    w[1].set_result(None)
            else:
                keep.append(w)
        self._waiters = keep

    def _on_failed(self, exc: BaseException) -> None:
        self._failed = exc
        for _, fut in self._waiters:
            if not fut.done():
                if isinstance(exc, OSError) and exc.errno == 28:
                    fut.set_exception(ResourceExhausted("The server's disk is full."))
                else:
                    fut.set_exception(Unavailable(f"The log is not writable: {exc}"))
        self._waiters = []

    # --- the writer thread -----------------------------------------------------------------------
    def _writer(self, cur_start: int, written: int) -> None:
        fd = os.open(segment_path(self.dir, cur_start), os.O_WRONLY | os.O_APPEND)
        always, batch_policy = self.policy is FsyncPolicy.always, self.policy is FsyncPolicy.batch
        synced, last_sync = written, time.monotonic()  # synced: what fdatasync covers
        try:
            while True:
                with self._cv:
                    while not (self._pending or self._closing or self._want > synced):
                        if batch_policy and written > synced:  # sync soon after the last write, even when idle
                            self._cv.wait(BATCH_SYNC_S)
                            if not (self._pending or self._closing or self._want > synced):
                                os.fdatasync(fd)
                                synced, last_sync = written, time.monotonic()
                        else:
                            self._cv.wait()
                    if not self._pending and self._closing:
                        break
                    batch, self._pending = self._pending, []
                    nbytes, self._pending_bytes = self._pending_bytes, 0
                    want = self._want
                chunks: list[bytes] = []
                for seg, data in batch:
                    if seg != cur_start:
                        if chunks:
                            _write_all(fd, chunks)
                            chunks = []
                        self._sync(fd)
                        os.close(fd)
                        cur_start = seg
                        path = segment_path(self.dir, seg)
                        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                        fsync_dir(self.dir)
                    chunks.append(data)
                if chunks:
                    _write_all(fd, chunks)
                written += nbytes
                if always:
                    if want <= synced:
                        continue  # written for nobody waiting: the next group commit's fdatasync covers it
                    os.fdatasync(fd)
                    synced = written
                elif batch_policy and time.monotonic() - last_sync >= BATCH_SYNC_S:
                    os.fdatasync(fd)
                    synced, last_sync = written, time.monotonic()
                elif not batch_policy:
                    synced = written  # never: the OS decides
                self.flushes += 1
                self._loop.call_soon_threadsafe(self._on_durable, synced if always else written)
            if written > synced:
                self._sync(fd)
        except BaseException as exc:  # disk full, I/O error: fail every waiter, refuse new appends
            log.error("WAL writer failed: %s", exc)
            try:
                self._loop.call_soon_threadsafe(self._on_failed, exc)
            except RuntimeError:
                pass
        finally:
            try:
                os.close(fd)
            except OSError:
                pass

    def _sync(self, fd: int) -> None:
        if self.policy is not FsyncPolicy.never:
            os.fdatasync(fd)

    # --- reading ---------------------------------------------------------------------------------
    def read(self, pos: int, n: int) -> bytes:
        """Bytes at global position `pos` (must be written already)."""
        fd, offset = self._locate(pos)
        return os.pread(fd, n, offset)

    def read_into(self, pos: int, buf: memoryview) -> int:
        """Fill `buf` with the bytes at global position `pos`; returns how many were read (fewer only at the
        end of a segment). No allocation: a reader that reuses its buffer spares the allocator and the page
        faults of a fresh megabyte per record."""
        fd, offset = self._locate(pos)
        return os.preadv(fd, [buf], offset)

    def read_ahead(self, pos: int) -> None:
        """A reader is reading the log from disk at `pos`: have the pages after it fetched ahead of it."""
        if self._read_ahead is not None:
            self._read_ahead.ahead_of(pos)

    def _locate(self, pos: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.starts, pos) - 1
        assert i >= 0, pos
        start = self.starts[i]
        fd = self._read_fds.get(start)
        if fd is None:
            fd = os.open(segment_path(self.dir, start), os.O_RDONLY)
            self._read_fds[start] = fd
        return fd, pos - start

    def delete_before(self, pos: int) -> list[int]:
        """Remove whole segments that end at or before `pos` (never the active one)."""
        removed = []
        while len(self.starts) > 1 and self.starts[1] <= pos:
            start = self.starts.pop(0)
            fd = self._read_fds.pop(start, None)
            if fd is not None:
                os.close(fd)
            os.unlink(segment_path(self.dir, start))
            removed.append(start)
        if removed:
            fsync_dir(self.dir)
        return removed
