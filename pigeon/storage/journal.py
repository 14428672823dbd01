"""The journal: the entries of many logs in one series of segment files, with one group commit. Owns the rules
(DESIGN: storage log / group commit):
- every entry carries (log, epoch, offset); offsets are dense and monotonic per log;
- a log fenced at epoch e refuses appends from epochs below e (Fenced); the fence is an entry of the journal,
  so it holds across restarts;
- acknowledged ⇒ covered by fdatasync: the durable position moves only in `synced`, which the writer calls
  after a sync that covers it; one sync serves every log and every waiter;
- segments are files named by the journal position of their first byte, so a position maps to a file by
  bisection and a segment's end is the next one's start; segments are deleted whole, never the active one;
- small group commits write into space reserved ahead of them (limits.segment_reserve_bytes of allocated zeros,
  Disk.reserve): their fdatasync then records data only, not a new file length too. Big ones append as before:
  their fdatasync gains little, and converting reserved blocks is kernel work per commit that made reserving for
  every write slower. A segment is cut back to its records when the writer leaves it
  (rotation, a clean close) and by recovery, which reads zeros to a file's end as the end of its records, not as a
  broken one.

A truncation of a log (`truncate`) is a marker entry too: the entries it drops stay in the files until their
segment is deleted, and every reader (`entries`, recovery) skips them.

Not thread-aware: the node's writer thread calls `take_pending`, `write` and `synced`-side methods and serializes
them with `append` (the event loop's) under its own lock. All I/O goes through a storage.disk.Disk."""

from __future__ import annotations

import bisect
import errno
import struct
from collections import deque
from dataclasses import dataclass, field

from pigeon.core import limits
from pigeon.storage import record
from pigeon.storage.disk import Disk, join

SUFFIX = ".wal"
FENCE, TRUNCATE = 30, 31  # marker entries: journal-level, never a broker record
MARKERS = (FENCE, TRUNCATE)
_MARK = struct.Struct("<Q")


class Fenced(Exception):
    """An append from an epoch below the log's fence: another owner took the log over."""

    def __init__(self, log: int, epoch: int, fenced: int):
        super().__init__(f"log {log} is fenced at epoch {fenced}; an append from epoch {epoch} is refused")
        self.log, self.epoch, self.fenced = log, epoch, fenced


class Cold(Exception):
    """A read asked not to wait for the disk found the bytes at `offset` of the file at `path` outside the page
    cache: `disk.warm` brings them in (on another thread), then the read is made again. `got`: what the reader
    that raised it had read before (its caller's to keep)."""

    def __init__(self, disk: Disk, path: str, offset: int):
        super().__init__(f"{path} at {offset} is not in the page cache")
        self.disk, self.path, self.offset = disk, path, offset
        self.got: list = []


def segment_name(start: int) -> str:
    return f"{start:020d}{SUFFIX}"


def list_segments(disk: Disk, directory: str) -> list[int]:
    return sorted(int(f[:-len(SUFFIX)]) for f in disk.listdir(directory)
                  if f.endswith(SUFFIX) and f[:-len(SUFFIX)].isdigit())


@dataclass(frozen=True, slots=True)
class Entry:
    epoch: int
    offset: int
    rtype: int
    body: bytes
    at: int  # journal position of its record


@dataclass(slots=True)
class LogState:
    """One log's bookkeeping: what recovery found, then what appends and syncs changed."""

    log_id: int
    next: int = 0  # offset of the next entry
    epoch: int = 0  # epoch of the last append
    fenced: int = 0  # appends from a lower epoch are refused
    durable_next: int = 0  # entries below this offset are durable
    unsynced: deque = field(default_factory=deque)  # (offset, end position) appended, not yet durable
    samples: list = field(default_factory=list)  # (offset, position): the first entry in each segment
    truncations: list = field(default_factory=list)  # (marker position, last offset kept)
    entries: int = 0  # appended since start (statistics)
    bytes: int = 0

    def dropped(self, at: int, offset: int) -> bool:
        """Whether the entry at journal position `at` with `offset` was dropped by a later truncation."""
        return any(p > at and after < offset for p, after in self.truncations)


class Journal:
    def __init__(self, disk: Disk, directory: str, segment_bytes: int):
        self.disk = disk
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.starts: list[int] = []  # segment starts, ascending
        self.tail = 0  # position after the last appended record
        self.durable = 0  # position up to which records are durable
        self.logs: dict[int, LogState] = {}
        self._pending: list[tuple[int, bytes]] = []  # (segment start, record) appended, not yet written
        self._pending_bytes = 0
        self._waiters: list[tuple[int, object]] = []  # (end position, callback(exc | None))
        self.flushes = 0  # group commits that made records durable (statistics)
        self.synced_bytes = 0
        self._resume: tuple[int, int, int] | None = None  # (log, offset, position) where a range read stopped
        self._paths: dict[int, str] = {}  # segment start → its file

    def path(self, start: int) -> str:
        p = self._paths.get(start)
        if p is None:  # (every read locates its segment: a takeover's or a repair's reads are many)
            if len(self._paths) > 4096:
                self._paths.clear()
            p = self._paths[start] = join(self.dir, segment_name(start))
        return p

    # --- opening -------------------------------------------------------------------------------------
    def open(self, tail: int, logs: dict[int, LogState]) -> int:
        """Start appending at `tail` (recovery cut the files there). Returns the start of the active segment."""
        self.disk.makedirs(self.dir)
        self.starts = list_segments(self.disk, self.dir)
        assert not self.starts or self.starts[-1] <= tail, "recovery must remove segments past the tail"
        last_end = self.starts[-1] + self.disk.size(self.path(self.starts[-1])) if self.starts else None
        if last_end != tail:  # an empty journal, or a checkpoint past the files' end: a fresh segment there
            self.disk.create(self.path(tail))
            self.starts.append(tail)
        self.tail = self.durable = tail
        self.logs = logs
        for st in logs.values():
            st.durable_next = st.next
        return self.starts[-1]

    def cursor(self, sync: bool) -> "WriteCursor":
        """The writer's cursor at the tail of the active segment (right after `open`)."""
        start = self.starts[-1]
        at = self.tail - start
        return WriteCursor(start, self.disk.open_write(self.path(start), at), sync, at, at)

    def log(self, log_id: int) -> LogState:
        st = self.logs.get(log_id)
        if st is None:
            st = self.logs[log_id] = LogState(log_id)
        return st

    # --- appending -----------------------------------------------------------------------------------
    def append(self, log_id: int, epoch: int, rtype: int, parts: list[bytes]) -> tuple[int, int]:
        """Queue one entry of `log_id`; (its offset, its journal position). Durable once `durable` passes the
        position after it (`self.tail` right after this call)."""
        st = self.logs.get(log_id) or self.log(log_id)
        if epoch < st.fenced:
            raise Fenced(log_id, epoch, st.fenced)
        offset = st.next
        body = sum(map(len, parts))
        if body >= limits.gather_bytes_min and all(type(p) is bytes or (type(p) is memoryview and p.readonly)
                                            for p in parts):
            data = record.entry_buffers(rtype, log_id, epoch, offset, parts)
            size = record.HEADER_BYTES + record.ENTRY_BYTES + body
        else:
            data = record.encode_entry(rtype, log_id, epoch, offset, parts)
            size = len(data)
        pos = self._add(data, size)
        st.next = offset + 1
        st.epoch = epoch
        st.unsynced.append((offset, self.tail))
        if not st.samples or st.samples[-1][1] < self.starts[-1]:
            st.samples.append((offset, pos))
        st.entries += 1
        st.bytes += size
        return offset, pos

    def _add(self, data, size: int | None = None) -> int:
        """Queue a record — bytes, or a tuple of buffers written one after the other — of `size` bytes."""
        size = len(data) if size is None else size
        pos = self.tail
        seg = self.starts[-1]
        if pos - seg + size > self.segment_bytes and pos > seg:
            self.starts.append(pos)  # rotate: the writer opens a new file at this position
            seg = pos
        self.tail = pos + size
        self._pending.append((seg, data))
        self._pending_bytes += size
        return pos

    def _marker(self, st: LogState, kind: int, epoch: int, value: int) -> int:
        data = record.encode_entry(kind, st.log_id, epoch, st.next, [_MARK.pack(value)])
        return self._add(data)

    def fence(self, log_id: int, epoch: int) -> int:
        """From now on refuse appends to `log_id` from epochs below `epoch`; returns the log's next offset. The
        fence is durable with the next group commit (wait for `tail` to rely on it after a crash)."""
        st = self.log(log_id)
        if epoch > st.fenced:
            st.fenced = epoch
            self._marker(st, FENCE, epoch, epoch)
        return st.next

    def mark(self, log_id: int) -> int:
        """Append an entry that changes nothing — a fence at the log's current fence — and return its position:
        a position of its own for a checkpoint when no other entry moved the journal."""
        st = self.log(log_id)
        return self._marker(st, FENCE, st.fenced, st.fenced)

    def truncate(self, log_id: int, after: int) -> None:
        """Drop the entries of `log_id` with an offset above `after`; the next append gets offset after + 1."""
        st = self.log(log_id)
        if after + 1 >= st.next:
            return
        pos = self._marker(st, TRUNCATE, st.epoch, after)
        st.truncations.append((pos, after))
        st.next = after + 1
        st.durable_next = min(st.durable_next, st.next)
        st.unsynced = deque((o, e) for o, e in st.unsynced if o <= after)

    def advance(self, log_id: int, nxt: int) -> None:
        """Number the log's next entry `nxt`, past its end: the entries between are kept elsewhere (a ledger store's
        own copy, node.own_copy). A truncation marker past the end says so, replayed as any truncation is."""
        st = self.log(log_id)
        if nxt <= st.next:
            return
        pos = self._marker(st, TRUNCATE, st.epoch, nxt - 1)
        st.truncations.append((pos, nxt - 1))
        st.next = nxt

    # --- the writer's side -----------------------------------------------------------------------------
    def pending(self) -> bool:
        return bool(self._pending)

    def take_pending(self) -> tuple[list[tuple[int, bytes]], int]:
        batch, self._pending = self._pending, []
        nbytes, self._pending_bytes = self._pending_bytes, 0
        return batch, nbytes

    def write(self, cursor: "WriteCursor", batch: list[tuple[int, bytes]]) -> None:
        """Write a batch in order (writev, no joined copy), opening each new segment as the batch reaches it:
        the one before is synced, cut back to its records and closed first, the new name made durable."""
        chunks = self.place(cursor, batch)
        if chunks:
            self.disk.writev(cursor.handle, chunks)

    def place(self, cursor: "WriteCursor", batch: list[tuple[int, bytes]]) -> list:
        """`write` but for its last step: the chunks of the batch that go to the cursor's segment, reserved there
        and not yet written — the caller writes them at `cursor.handle` (a group commit's one writev, with its
        sync: Disk.commit). What goes to segments before it is written here."""
        chunks: list[bytes] = []
        size = 0
        disk = self.disk
        for seg, data in batch:
            if seg != cursor.start:
                self._put(cursor, chunks, size)
                chunks, size = [], 0
                self.leave(cursor)
                cursor.start, cursor.at, cursor.reserved = seg, 0, 0
                cursor.handle = disk.open_write(self.path(seg), 0)
                disk.sync_dir(self.dir)
            if type(data) is tuple:  # a record in buffers (entry_buffers)
                chunks.extend(data)
                size += sum(map(len, data))
            else:
                chunks.append(data)
                size += len(data)
        self._reserve(cursor, size)
        cursor.at += size
        return chunks

    def _put(self, cursor: "WriteCursor", chunks: list, size: int) -> None:
        if not chunks:
            return
        self._reserve(cursor, size)
        self.disk.writev(cursor.handle, chunks)
        cursor.at += size

    def placeable(self, cursor: "WriteCursor") -> bool:
        """Whether what is pending goes to the cursor's segment: `place_in` can place it (no new file to open)."""
        return not self._pending or self._pending[-1][0] == cursor.start  # (their segments ascend)

    def place_in(self, cursor: "WriteCursor", batch: list[tuple[int, bytes]]) -> tuple[list, int]:
        """`place` for a batch that goes to the cursor's segment (`placeable`), without any I/O: its chunks, and
        how far the segment is to be reserved before they are written (0: no need) — for a writer that reserves
        and writes them itself (pigeon.node._commit.Lane)."""
        chunks: list[bytes] = []
        size = 0
        for _, data in batch:
            if type(data) is tuple:
                chunks.extend(data)
                size += sum(map(len, data))
            else:
                chunks.append(data)
                size += len(data)
        want = self._reservation(cursor, size)
        if want:
            cursor.reserved = want
        cursor.at += size
        return chunks, want

    def _reservation(self, cursor: "WriteCursor", size: int) -> int:
        """How far to allocate the segment ahead of a write of `size` bytes at the cursor
        (limits.segment_reserve_bytes at a time); 0: not now."""
        end = cursor.at + size
        if size and end > cursor.reserved and cursor.reserving and size <= limits.reserved_write_bytes_max:
            return max(end, min(cursor.at + limits.segment_reserve_bytes, self.segment_bytes))
        return 0

    def _reserve(self, cursor: "WriteCursor", size: int) -> None:
        """Allocate the segment ahead of a write of `size` bytes at the cursor."""
        want = self._reservation(cursor, size)
        if want:
            try:
                self.disk.reserve(cursor.handle, want)
            except OSError as e:  # no room for it (the write may still fit) or no such call: write without
                cursor.reserving = e.errno == errno.ENOSPC
            cursor.reserved = want  # (a failed reserve may have grown the file part of the way)

    def leave(self, cursor: "WriteCursor") -> None:
        """Done with the cursor's segment: synced (unless fsync=never), cut back to its records, closed."""
        if cursor.sync:
            self.disk.sync(cursor.handle)
        if cursor.reserved > cursor.at:
            self.disk.truncate(self.path(cursor.start), cursor.at)
        self.disk.close(cursor.handle)

    def rewind(self, cursor: "WriteCursor", to: int) -> "WriteCursor":
        """After a write or sync failed (a full disk): cut the files back to journal position `to` — what was
        acknowledged as written — so no partly written entry stays, and return a cursor appending there. The
        segments past it go (their names stay in `starts`: the entries placed in them are written again)."""
        try:
            self.disk.close(cursor.handle)
        except OSError:
            pass
        i = bisect.bisect_right(self.starts, to) - 1
        for start in self.starts[i + 1:]:
            if self.disk.exists(self.path(start)):
                self.disk.remove(self.path(start))
        at = to - self.starts[i]
        self.disk.truncate(self.path(self.starts[i]), at)
        return WriteCursor(self.starts[i], self.disk.open_write(self.path(self.starts[i]), at), cursor.sync, at, at)

    def requeue(self, batches: list[list[tuple[int, bytes]]]) -> None:
        """Put entries taken for writing back in front of the pending ones, in order (to write them again)."""
        again = [e for batch in batches for e in batch]
        self._pending[:0] = again
        self._pending_bytes += sum(sum(map(len, d)) if type(d) is tuple else len(d) for _, d in again)

    def on_durable(self, end: int, callback) -> None:
        """Call `callback(None)` once the journal is durable up to `end` (at once when it is), or
        `callback(exc)` if the writer fails first."""
        if self.durable >= end:
            callback(None)
        else:
            self._waiters.append((end, callback))

    def synced(self, end: int) -> None:
        """The writer made everything below `end` durable: move the durable positions, answer the waiters."""
        if end <= self.durable:
            return
        self.synced_bytes += end - self.durable
        self.durable = end
        for st in self.logs.values():
            q = st.unsynced
            while q and q[0][1] <= end:
                st.durable_next = q.popleft()[0] + 1
        keep = []
        for w in self._waiters:
            if w[0] <= end:
                w[1](None)
            else:
                keep.append(w)
        self._waiters = keep

    def failed(self, exc: BaseException) -> None:
        """The writer cannot go on: every waiter hears why."""
        waiters, self._waiters = self._waiters, []
        for _, callback in waiters:
            callback(exc)

    # --- reading ---------------------------------------------------------------------------------------
    def locate(self, pos: int) -> tuple[str, int]:
        """(segment file, offset in it) of journal position `pos`."""
        i = bisect.bisect_right(self.starts, pos) - 1
        assert i >= 0, pos
        return self.path(self.starts[i]), pos - self.starts[i]

    def read_into(self, pos: int, buf: memoryview) -> int:
        """Fill `buf` from journal position `pos` (it must be written); fewer bytes only at a segment's end."""
        path, offset = self.locate(pos)
        return self.disk.pread_into(path, offset, buf)

    def read(self, pos: int, n: int, nowait: bool = False) -> bytes:
        """The bytes at `pos`: n of them (fewer only at a segment's end). With `nowait` they must be written whole
        (a record's) and Cold is raised unless the page cache holds them all."""
        buf = bytearray(n)
        path, offset = self.locate(pos)
        got = self.disk.pread_into(path, offset, memoryview(buf), nowait)
        if nowait and got < n:
            raise Cold(self.disk, path, offset + got)
        return bytes(buf[:got])

    def read_record(self, pos: int, nowait: bool = False) -> tuple[int, memoryview]:
        """(type, payload) of the record at `pos`, checked; with `nowait`, Cold unless the page cache holds it."""
        size = record.size_from_prefix(self.read(pos, record.PREFIX_BYTES, nowait))
        buf = self.read(pos, size, nowait)
        rtype, payload, _ = record.decode_at(buf, 0, size)
        return rtype, payload

    def entries(self, log_id: int, start: int, end: int):
        """The durable entries of `log_id` with start <= offset < end (read back from the files), in order; a
        truncated entry is skipped, an entry the truncation replaced is read instead. The scan ends at the first
        entry of the log past `end` written after its last truncation (from there on its offsets only grow): it
        once read every record to the journal's end, so reading a ledger back in chunks took time quadratic in
        the journal's size (a takeover read 2 GB in 8 MB chunks for over 50 s, holding the event loop)."""
        st = self.logs.get(log_id)
        if st is None or start >= end:
            return
        if not st.samples:
            return
        r = self._resume
        if r is not None and r[:2] == (log_id, start) and not st.truncations and r[2] >= self.starts[0]:
            pos = r[2]  # the next range of a log read in order: on from where the last one stopped, not from the
        else:       # log's first entry in the segment (a takeover's reads went over a segment again for every range)
            i = bisect.bisect_right([o for o, _ in st.samples], start) - 1
            pos = st.samples[max(i, 0) if not st.truncations else 0][1]  # offsets repeat after a truncation
        last_cut = st.truncations[-1][0] if st.truncations else -1  # (appended in journal order)
        found: dict[int, Entry] = {}
        while pos < self.durable:  # durable: written whole
            rtype, payload = self.read_record(pos)
            size = record.PREFIX_BYTES + 1 + len(payload)
            log, epoch, offset, body = record.split_entry(payload)
            if log == log_id and rtype not in MARKERS:
                if offset >= end and pos > last_cut:
                    self._resume = (log_id, offset, pos)
                    break
                if start <= offset < end and not st.dropped(pos, offset):
                    found[offset] = Entry(epoch, offset, rtype, bytes(body), pos)
            pos += size
        for offset in sorted(found):
            yield found[offset]

    # --- trimming ----------------------------------------------------------------------------------------
    def deletable(self, pos: int) -> int:
        """How many segments `delete_before(pos)` would remove."""
        return sum(1 for s in self.starts[1:] if s <= pos)

    def delete_before(self, pos: int) -> list[int]:
        """Remove whole segments that end at or before `pos` (never the active one)."""
        removed = self.drop_before(pos)
        self.remove_files(removed)
        return removed

    def drop_before(self, pos: int) -> list[int]:
        """`delete_before`'s first half: the segments are no longer the journal's (nothing reads or keeps them from
        now on); their files are `remove_files`' to remove — which may come later, from another thread: a file
        left by a crash meanwhile is one the next deletion removes, as if the crash had come a moment sooner."""
        removed = []
        while len(self.starts) > 1 and self.starts[1] <= pos:
            removed.append(self.starts.pop(0))
        if removed:
            first = self.starts[0]
            for st in self.logs.values():
                st.samples = [s for s in st.samples if s[1] >= first]
                st.truncations = [t for t in st.truncations if t[0] >= first]
        return removed

    def remove_files(self, starts: list[int]) -> None:
        """The files of segments `drop_before` dropped, removed for good (their directory synced)."""
        for start in starts:
            self.disk.remove(self.path(start))
        if starts:
            self.disk.sync_dir(self.dir)

    def statistics(self) -> "JournalStats":
        return JournalStats(len(self.starts), self.tail - (self.starts[0] if self.starts else 0), self.tail,
                            self.durable, self.tail - self.durable, self.flushes, self.synced_bytes, len(self.logs))


@dataclass(slots=True)
class WriteCursor:
    """The writer's open segment."""

    start: int
    handle: object
    sync: bool  # sync a segment before moving to the next one (not under fsync=never)
    at: int = 0  # bytes of the segment written
    reserved: int = 0  # the file's length as reserved (at least `at`)
    reserving: bool = True  # false once the disk said it cannot reserve (any error but ENOSPC)


@dataclass(frozen=True, slots=True)
class JournalStats:
    segments: int
    bytes: int  # on disk, over every segment
    tail: int
    durable: int
    unsynced_bytes: int
    flushes: int
    synced_bytes: int
    logs: int
