"""A disk in memory for the simulator and the storage tests (storage.disk.Disk). It keeps what a real disk would
after a power cut — `crash()` undoes every byte written since the file's last sync (bytes written over space the
file already had, reserved zeros among them, go back to what they were; the file shrinks back to its synced
length), and drops the name of a file made since its directory's last sync — and injects faults on demand: a torn
last write (part of what was written since the sync survives), a flipped bit, a failing operation (ENOSPC, EIO).
With `cache_pages` it also models the page cache, for the reads that must not wait for the disk (`nowait`): they
see only the pages written or read since the file's pages were last evicted (`evict`, a crash, or every sync with
`evict_synced`). Deterministic: every choice comes from the `rng` the caller passes."""

from __future__ import annotations

import errno
import posixpath
import random
from dataclasses import dataclass, field

PAGE = 4096  # the page cache's unit, when one is modelled


@dataclass
class _File:
    data: bytearray = field(default_factory=bytearray)
    synced: int = 0  # the length that survives a crash
    named: bool = False  # the directory entry survives a crash
    undo: list = field(default_factory=list)  # (offset, bytes before): writes below `synced` since the last sync
    dirty: int | None = None  # the lowest offset written since the last sync
    dirty_end: int = 0  # … and the end of the highest write since


class SimDisk:
    def __init__(self, cache_pages: bool = False, evict_synced: bool = False):
        self.files: dict[str, _File] = {}
        self.dirs: set[str] = set()
        self._handles: dict[int, str] = {}
        self._next = 1
        self.fail: dict[str, int] = {}  # operation → errno of the next call to it (removed when used)
        self.space: int | None = None  # bytes the disk holds in all (None: unbounded)
        self.syncs = 0
        # the page cache, modelled when `cache_pages`: path → the pages it holds (a write's pages are held; a read
        # that does not wait sees only these; with `evict_synced`, a sync lets go of the file's, as a storage
        # member's ledger files do — node.disk.OsDisk(drop_synced))
        self.pages: dict[str, set[int]] | None = {} if cache_pages else None
        self.evict_synced = evict_synced and cache_pages

    # --- faults ------------------------------------------------------------------------------------------
    def crash(self, rng: random.Random | None = None, torn: bool = False) -> None:
        """A power cut: unsynced bytes are lost (with `torn`, a random part of each file's unsynced tail
        survives), and so are files whose name was never made durable. Open handles are gone."""
        for path in list(self.files):
            f = self.files[path]
            if not f.named:
                del self.files[path]
                continue
            keep = f.synced if f.dirty is None else min(f.dirty, f.synced)  # written whole from here on: lost
            if torn and rng is not None and f.dirty is not None and f.dirty_end > keep:
                keep = rng.randint(keep, f.dirty_end)  # … but for a part of it
            for offset, before in reversed(f.undo):
                if offset + len(before) > keep:
                    start = max(offset, keep)
                    f.data[start:offset + len(before)] = before[start - offset:]
            del f.data[max(keep, f.synced):]
            f.synced, f.undo, f.dirty, f.dirty_end = len(f.data), [], None, 0
        self._handles.clear()
        self.evict()  # (the machine's memory went with it)

    def flip_bit(self, path: str, offset: int, bit: int) -> None:
        f = self.files[path]
        f.data[offset] ^= 1 << bit

    def _check(self, op: str, grow: int = 0) -> None:
        code = self.fail.pop(op, None)
        if code is not None:
            raise OSError(code, f"{errno.errorcode.get(code, code)} (simulated, {op})")
        if grow and self.space is not None and sum(len(f.data) for f in self.files.values()) + grow > self.space:
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")

    # --- the Disk interface --------------------------------------------------------------------------------
    def makedirs(self, path: str) -> None:
        self.dirs.add(path)

    def listdir(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(p[len(prefix):] for p in self.files if p.startswith(prefix) and "/" not in p[len(prefix):])

    def exists(self, path: str) -> bool:
        return path in self.files

    def size(self, path: str) -> int:
        return len(self._file(path).data)

    def _file(self, path: str) -> _File:
        f = self.files.get(path)
        if f is None:
            raise FileNotFoundError(errno.ENOENT, "No such file (simulated)", path)
        return f

    def read_file(self, path: str) -> bytes:
        return bytes(self._file(path).data)

    def pread_into(self, path: str, offset: int, buf: memoryview, nowait: bool = False) -> int:
        f = self._file(path)
        n = max(0, min(len(buf), len(f.data) - offset))
        if self.pages is not None:
            if nowait:
                n = self._cached(path, offset, n)
            else:
                self._cache(path, offset, n)
        buf[:n] = f.data[offset:offset + n]
        return n

    def warm(self, path: str, offset: int, n: int) -> int:
        f = self.files.get(path)
        n = 0 if f is None else max(0, min(n, len(f.data) - offset))
        if self.pages is not None:
            self._cache(path, offset, n)
        return n

    # --- the page cache, when one is modelled (`pages`) -----------------------------------------------------
    def evict(self, path: str | None = None) -> None:
        """The page cache lets go of the file's pages (every file's without a path): memory was short."""
        if self.pages is not None:
            if path is None:
                self.pages.clear()
            else:
                self.pages.pop(path, None)

    def _cache(self, path: str, offset: int, n: int) -> None:
        if n > 0:
            self.pages.setdefault(path, set()).update(range(offset // PAGE, (offset + n - 1) // PAGE + 1))

    def _cached(self, path: str, offset: int, n: int) -> int:
        """How many of the n bytes from `offset` on the cache holds without a gap (a read that does not wait)."""
        held, end, page = self.pages.get(path, ()), offset + n, offset // PAGE
        while page * PAGE < end and page in held:
            page += 1
        return max(0, min(end, page * PAGE) - offset)

    def create(self, path: str) -> None:
        self._check("create")
        self.files.setdefault(path, _File()).named = True

    def open_write(self, path: str, at: int) -> list:
        self._check("open")
        self.files.setdefault(path, _File())
        h = self._next
        self._next += 1
        self._handles[h] = path
        return [h, at]  # (a handle is its number and where the next write goes)

    def writev(self, handle: list, chunks: list[bytes]) -> None:
        """As a real disk: when the space runs out, what fits is written, then ENOSPC."""
        data = b"".join(chunks)
        self._check("write")
        f = self.files[self._handles[handle[0]]]
        at = handle[1]
        if self.space is not None:
            room = max(0, self.space - sum(len(x.data) for x in self.files.values())) + max(0, len(f.data) - at)
            if len(data) > room:
                self._write(f, at, data[:room])
                handle[1] += room
                raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        self._write(f, at, data)
        handle[1] += len(data)
        if self.pages is not None:
            self._cache(self._handles[handle[0]], at, len(data))

    @staticmethod
    def _write(f: _File, at: int, data: bytes) -> None:
        if not data:
            return
        if at < f.synced:
            f.undo.append((at, bytes(f.data[at:min(at + len(data), f.synced)])))
        if at > len(f.data):
            f.data += bytes(at - len(f.data))
        f.data[at:at + len(data)] = data
        f.dirty = at if f.dirty is None else min(f.dirty, at)
        f.dirty_end = max(f.dirty_end, at + len(data))

    def reserve(self, handle: list, size: int) -> None:
        """Zeros up to `size` bytes (space a later write fills without growing the file); as the real disk's, they
        take space now and survive a crash once synced."""
        self._check("reserve", max(0, size - len(self.files[self._handles[handle[0]]].data)))
        f = self.files[self._handles[handle[0]]]
        if size > len(f.data):
            f.data += bytes(size - len(f.data))

    def commit(self, handle: list, chunks: list[bytes], sync: bool, post, end: int) -> float:
        """As OsDisk.commit, step by step: what fails raises before anybody is told."""
        self.writev(handle, chunks)
        if sync:
            self.sync(handle)
        if post is not None:
            post.tell(end, sync)
        return 0.0

    def sync(self, handle: list) -> None:
        self._check("sync")
        f = self.files[self._handles[handle[0]]]
        f.synced, f.undo, f.dirty, f.dirty_end = len(f.data), [], None, 0
        self.syncs += 1
        if self.evict_synced:
            self.evict(self._handles[handle[0]])

    def close(self, handle: list) -> None:
        self._handles.pop(handle[0], None)

    def truncate(self, path: str, size: int) -> None:
        self._check("truncate")
        f = self._file(path)
        del f.data[size:]
        # a truncation is durable (the real disk fsyncs the file)
        f.synced, f.undo, f.dirty, f.dirty_end = len(f.data), [], None, 0

    def remove(self, path: str) -> None:
        self._check("remove")
        self._file(path)
        del self.files[path]
        self.evict(path)

    def write_durably(self, path: str, data: bytes) -> None:
        self._check("write", len(data))
        self.files[path] = _File(bytearray(data), len(data), True)

    def free_space(self, path: str) -> tuple[int, int]:
        if self.space is None:
            return 1 << 50, 1 << 50
        return max(0, self.space - sum(len(f.data) for f in self.files.values())), self.space

    def sync_dir(self, path: str) -> None:
        self._check("sync_dir")
        prefix = path.rstrip("/") + "/"
        for p, f in self.files.items():
            # (a file directly in `path` starts with `prefix` — but for the root: its directory is "" — so only
            # those are looked at further: a journal's every new segment syncs its directory)
            if (prefix == "/" or p.startswith(prefix)) and (posixpath.dirname(p) == path.rstrip("/") or
                                                            p.startswith(prefix) and "/" not in p[len(prefix):]):
                f.named = True

    def close_all(self) -> None:
        self._handles.clear()
