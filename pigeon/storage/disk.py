"""The files storage works on, as an interface. Owns no rule of its own: it is how storage does I/O without doing
it — the journal, recovery and checkpoints call these methods, pigeon.node passes the real files (node.disk.OsDisk)
and the simulator a disk in memory that loses what was not synced and flips bits (testing.simdisk.SimDisk).

Paths are '/'-joined strings. Every method may raise OSError (ENOSPC, EIO); a handle is what `open_write` gave."""

from __future__ import annotations

import posixpath
from typing import Protocol

join = posixpath.join


class Disk(Protocol):
    def makedirs(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...

    def size(self, path: str) -> int: ...

    def read_file(self, path: str) -> bytes: ...

    def pread_into(self, path: str, offset: int, buf: memoryview, nowait: bool = False) -> int:
        """Fill `buf` from `offset` of the file; how many bytes were read (fewer only at the end). With `nowait`,
        only what the page cache holds from `offset` on (possibly none): the rest is the disk's to fetch, which
        `warm` does on another thread — the event loop never waits for it."""
        ...

    def warm(self, path: str, offset: int, n: int) -> int:
        """Bring bytes [offset, offset + n) of the file into the page cache (blocks on the disk: a thread's call,
        never the event loop's); how many there were (0 for a file gone meanwhile)."""
        ...

    def create(self, path: str) -> None:
        """An empty file whose name is durable (the directory is synced)."""
        ...

    def open_write(self, path: str, at: int):
        """A handle writing `path` (made if missing) from byte `at` on."""
        ...

    def writev(self, handle, chunks: list[bytes]) -> None:
        """Write every byte of `chunks` where the handle is, in order, and move it past them (the OS may take them
        in one call or several)."""
        ...

    def commit(self, handle, chunks: list[bytes], sync: bool, post, end: int) -> float:
        """A journal's group commit: `writev(chunks)`, then `sync` if asked, then `post.tell(end, sync)` if `post` is
        given (the writer thread telling the event loop how far the journal is written), in that order; what
        fails raises before `post` is told. The sync's seconds (0 without)."""
        ...

    def reserve(self, handle, size: int) -> None:
        """Make the file at least `size` bytes long, allocated, the new bytes zeros: writing them later neither
        grows the file nor allocates, so the fdatasync after such a write has no new length or blocks to record.
        Optional to succeed: raises OSError (ENOSPC, EOPNOTSUPP) and a caller goes on writing without it."""
        ...

    def sync(self, handle) -> None:
        """fdatasync: what was written through `handle` survives a crash of the machine."""
        ...

    def close(self, handle) -> None: ...

    def truncate(self, path: str, size: int) -> None:
        """Cut the file to `size` bytes, durably."""
        ...

    def remove(self, path: str) -> None:
        """Delete the file (and let go of any cached handle to it); the caller syncs the directory."""
        ...

    def write_durably(self, path: str, data: bytes) -> None:
        """Write a whole file: tmp → fsync → rename → fsync the directory (all or nothing after a crash)."""
        ...

    def sync_dir(self, path: str) -> None: ...

    def free_space(self, path: str) -> tuple[int, int]:
        """(bytes free for this process, bytes in all) of the filesystem holding `path`."""
        ...
