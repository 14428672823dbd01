"""The real files behind storage.disk.Disk. Read handles are cached per file (a segment is read many times);
`remove` closes them, so a deleted segment gives its space back at once.

`OsDisk(drop_synced=True)` is for files written and read back seldom or much later — a storage member's ledgers,
read when an owner recovers or repairs a ledger, or delivers a backlog it took over: once synced, their pages leave
the page cache (POSIX_FADV_DONTNEED; clean after the fdatasync, so dropping them is free of I/O), as a BookKeeper
bookie drops its journal's. (Their readers ask not to wait for the disk — `pread_into(nowait)`, RWF_NOWAIT — and
have a thread `warm` what the cache lacks: node.ledger_store.read_warm.) Kept, they
would fill memory with copies few read, and every write would then first have to win a page back (a
member's CPU per message replicated, and the cluster's publish rate, in docs/cluster.md). They are dropped
once limits.drop_pages_bytes were written since the last time (and when the file is closed), so the call is rare
at low rates: it sits after a group commit's fdatasync, once the loop has been told.

A journal's group commit (`OsDisk.commit`) writes, syncs and tells the event loop in one call: compiled
(`pigeon.node._commit`, built by the package's install: setup.py) it takes the GIL back only once all three are
done, so a loop kept busy by other work hears of the durable batch as soon as the disk has it; the Python twin
(`_py_commit`, where no C compiler was found) does the same steps with the GIL taken back after each.
tests/unit/test_commit_io.py holds the two side by side."""

from __future__ import annotations

import errno
import os
import threading
import time

from pigeon.core import limits

_IOV_MAX = os.sysconf("SC_IOV_MAX")  # buffers per writev
_DROP = getattr(os, "POSIX_FADV_DONTNEED", None)  # (not on every OS: there the pages stay)
_NOWAIT = getattr(os, "RWF_NOWAIT", None)  # a read that takes only what the page cache holds (Linux 4.14+)


class _PyPost:
    """`pigeon.node._commit.Post`'s twin: how far the journal is written (synced, under fsync=always), the group
    commits told of and the fdatasyncs among them, then a wake-up on the eventfd `fd` the loop watches;
    `synced_ns` is when the last fdatasync returned."""

    def __init__(self, fd: int):
        self.fd, self.end, self.synced_ns, self.told, self.syncs, self.asked, self.seen = fd, 0, 0, 0, 0, 0, 0

    def tell(self, end: int, synced: bool, synced_ns: int = 0) -> None:
        self.end = max(self.end, end)
        self.told += 1
        if synced:
            self.syncs += 1
            self.synced_ns = synced_ns
        os.eventfd_write(self.fd, 1)


def _writev_all(handle: int, chunks: list) -> None:
    for i in range(0, len(chunks), _IOV_MAX):
        group = chunks[i:i + _IOV_MAX]
        n = os.writev(handle, group)
        if n < sum(map(len, group)):
            rest = memoryview(b"".join(group))[n:]
            while rest:
                rest = rest[os.write(handle, rest):]


def _py_commit(handle: int, chunks: list, sync: bool, post: _PyPost | None, end: int) -> int:
    _writev_all(handle, chunks)
    took = synced_at = 0
    if sync:
        t0 = time.monotonic_ns()
        os.fdatasync(handle)
        synced_at = time.monotonic_ns()
        took = synced_at - t0
    if post is not None:
        if sync:
            post.synced_ns = synced_at
        if post.asked - post.seen < limits.commit_tell_asks:
            post.tell(end, sync, synced_at)
    return took


try:
    from pigeon.node import _commit

    Post, _commit_io, COMPILED = _commit.Post, _commit.commit, True
    Lane = _commit.Lane  # a writer thread that takes placed batches without the GIL (node.journal_writer)
    LANE_STOPPED, LANE_PYTHON, LANE_FAILED = _commit.STOPPED, _commit.PYTHON, _commit.FAILED  # why Lane.run returned
except ImportError:  # no C compiler where Pigeon was installed
    Post, _commit_io, COMPILED = _PyPost, _py_commit, False
    Lane = LANE_STOPPED = LANE_PYTHON = LANE_FAILED = None


class OsDisk:
    def __init__(self, drop_synced: bool = False):
        self.drop_synced = drop_synced and _DROP is not None
        self._undropped: dict[int, int] = {}  # handle → bytes written through it since its pages were dropped
        self._read_fds: dict[str, int] = {}
        self._nowait = _NOWAIT is not None  # reads can be asked not to wait for the disk
        self._lock = threading.Lock()  # the read cache is shared by the loop and the read-ahead thread

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path) if os.path.isdir(path) else []

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def _fd(self, path: str) -> int:
        fd = self._read_fds.get(path)
        if fd is None:
            with self._lock:
                fd = self._read_fds.get(path)
                if fd is None:
                    fd = self._read_fds[path] = os.open(path, os.O_RDONLY)
        return fd

    def pread_into(self, path: str, offset: int, buf: memoryview, nowait: bool = False) -> int:
        if nowait and self._nowait:
            try:
                return os.preadv(self._fd(path), [buf], offset, _NOWAIT)
            except BlockingIOError:  # none of it cached
                return 0
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                self._nowait = False  # a filesystem that cannot tell: its reads wait, as they did before
        return os.preadv(self._fd(path), [buf], offset)

    def warm(self, path: str, offset: int, n: int) -> int:
        """With a file of its own (the loop's may be closed meanwhile: a segment deleted), read and thrown away."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            view, done = memoryview(bytearray(min(n, limits.read_ahead_chunk_bytes))), 0
            while done < n:
                got = os.preadv(fd, [view[:n - done]], offset + done)
                if got <= 0:
                    break
                done += got
            return done
        finally:
            os.close(fd)

    def create(self, path: str) -> None:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        self.sync_dir(os.path.dirname(path))

    def open_write(self, path: str, at: int) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.lseek(fd, at, os.SEEK_SET)
        return fd

    def reserve(self, handle: int, size: int) -> None:
        """posix_fallocate (a filesystem without fallocate has it emulated by glibc, writing zeros)."""
        length = size - os.fstat(handle).st_size
        if length > 0:
            os.posix_fallocate(handle, size - length, length)

    def writev(self, handle: int, chunks: list[bytes]) -> None:
        """writev gathers the chunks in the kernel, so no joined copy is made while holding the GIL (which the
        event loop's thread waits for); a partial write is finished byte-exactly."""
        _writev_all(handle, chunks)
        if self.drop_synced:
            self._undropped[handle] = self._undropped.get(handle, 0) + sum(map(len, chunks))

    def commit(self, handle: int, chunks: list, sync: bool, post: Post | None, end: int) -> float:
        """A group commit: write `chunks` (as `writev`), fdatasync if `sync`, then tell `post` (if given) that the
        journal is written up to `end` — the loop hears it before this thread has the GIL back, unless it has
        asked for more limits.commit_tell_asks times or more meanwhile (the caller tells then: pigeon.node._commit).
        Returns the
        fdatasync's seconds (0 without). Raises OSError, having told nobody, when a write or the sync fails."""
        took = _commit_io(handle, chunks, sync, post, end) / 1e9
        if self.drop_synced:
            self._undropped[handle] = self._undropped.get(handle, 0) + sum(map(len, chunks))
            if sync and self._undropped[handle] >= limits.drop_pages_bytes:
                self._drop(handle)
        return took

    def sync(self, handle: int) -> None:
        os.fdatasync(handle)
        if self.drop_synced and self._undropped.get(handle, 0) >= limits.drop_pages_bytes:
            self._drop(handle)

    def _drop(self, handle: int) -> None:
        """The whole file: only what was written since the last drop is still cached (and clean once synced)."""
        self._undropped[handle] = 0
        os.posix_fadvise(handle, 0, 0, _DROP)

    def close(self, handle: int) -> None:
        # (a segment is synced before it is closed; what a journal's lane wrote is not counted in _undropped)
        if self._undropped.pop(handle, 0) or self.drop_synced:
            os.posix_fadvise(handle, 0, 0, _DROP)
        os.close(handle)

    def truncate(self, path: str, size: int) -> None:
        with open(path, "r+b") as f:
            f.truncate(size)
            os.fsync(f.fileno())

    def remove(self, path: str) -> None:
        with self._lock:
            fd = self._read_fds.pop(path, None)
        if fd is not None:
            os.close(fd)
        os.unlink(path)

    def write_durably(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError:  # a full disk: the partial file goes, the previous one stays
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        os.rename(tmp, path)
        self.sync_dir(os.path.dirname(path))

    def free_space(self, path: str) -> tuple[int, int]:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close_all(self) -> None:
        with self._lock:
            fds, self._read_fds = list(self._read_fds.values()), {}
        for fd in fds:
            os.close(fd)
