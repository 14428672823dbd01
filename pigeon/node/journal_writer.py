"""The journal's writer: the thread and the event-loop plumbing around storage.journal.Journal, which owns the
rules (entries, offsets, fencing, acknowledged ⇒ covered by fdatasync). Entries get their position when
appended (on the event loop's thread); one writer thread writes everything pending with one writev and one
fdatasync, then wakes every waiter whose entry is covered. Under fsync=always on real files the loop hands it each
batch placed (pigeon.node._commit.Lane): from its wake-up to the loop's it needs no GIL, which a busy loop held
for a millisecond and more; its own Python turns open new segments and ride out a full disk. The writer is woken
when someone waits for an entry (a publish, a unary ack); an entry nobody waits for (an ack sent on a stream, a
delivery) goes with the next one somebody waits for, or limits.lazy_write_s after it at the latest, and is
fdatasync'd limits.lazy_flush_s after it at the latest — not a wake-up of the writer and a disk flush of its own
(a process killed within limits.lazy_write_s of it loses it, which changes no answer given: its message is
delivered again, as after any lost lease)."""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import partial

from pigeon.core import limits
from pigeon.node import hops
from pigeon.core.histogram import Histogram, HistogramStats
from pigeon.core.errors import ResourceExhausted, Unavailable
from pigeon.node.disk import LANE_FAILED, LANE_STOPPED, Lane, OsDisk, Post
from pigeon.node.readahead import ReadAhead
from pigeon.storage.journal import Journal, JournalStats, LogState, WriteCursor
from pigeon.storage.log import JournalLog, LogStats
from pigeon.storage.space import SpaceStats, SpaceWatch

log = logging.getLogger("pigeon.journal")


class FsyncPolicy(str, enum.Enum):
    always = "always"  # fdatasync before any reply: nothing acknowledged is lost on power failure
    batch = "batch"  # reply after write(); fdatasync every few ms: a power failure may lose the last ms
    never = "never"  # leave it to the OS: a crash of the machine may lose recent acknowledged data


SYNC_BUCKETS_MS = (0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000)  # fdatasync latency histogram bounds
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)  # entries per group commit


@dataclass(frozen=True, slots=True)
class WriterStats:
    journal: JournalStats
    logs: tuple[LogStats, ...]
    syncs: int  # fdatasync calls
    sync_seconds: float  # their total time
    sync_max_seconds: float
    sync_buckets: tuple[int, ...]  # calls at or under each of SYNC_BUCKETS_MS (cumulative, as Prometheus wants)
    group_commits: int  # batches written
    group_commit_entries: int  # entries in them, in all
    group_commit_bytes: int
    group_commit_sizes: HistogramStats  # entries per group commit
    failed: str  # why the writer stopped ("" while it works)
    space: SpaceStats  # free space, the reserve, whether publishes are refused
    enospc: int  # writes or syncs that failed with a full disk (each kept and tried again)


class JournalWriter:
    """The journal of one node, written by a thread of its own. Call append/wait_durable on the loop thread."""

    def __init__(self, directory: str, policy: FsyncPolicy, segment_bytes: int, disk: OsDisk | None = None):
        self.disk = disk or OsDisk()
        self.journal = Journal(self.disk, directory, segment_bytes)
        self.policy = FsyncPolicy(policy)
        self._want = 0  # position the writer has been asked to make durable (guarded by _cv)
        self._lazy_timer: asyncio.TimerHandle | None = None  # fdatasync what nobody waits for
        self._write_timer: asyncio.TimerHandle | None = None  # hand the writer what nobody waits for
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._read_ahead: ReadAhead | None = None
        self._post: Post | None = None  # where the writer tells how far the journal is written (synced: always)
        self._told = 0  # … the last of it the loop took
        self._post_open = False
        self._lane: Lane | None = None  # fsync=always on real files: the loop hands the writer placed batches
        self._cursor: WriteCursor | None = None  # the lane's: placed by the loop, but in the writer's Python turn
        self._py_turn = False
        self._unposted: deque = deque()  # (end, batch) written or handed to the lane, not yet told of
        self._logs: dict[int, JournalLog] = {}
        self.opened_at = 0
        # statistics, written by the writer thread only (with a lane: under _cv, by both)
        self._syncs = 0
        self._sync_s = self._sync_max_s = 0.0
        self._sync_hist = [0] * len(SYNC_BUCKETS_MS)
        self._batch_sizes = Histogram(BATCH_BOUNDS)  # entries per group commit
        self._batches = self._batch_entries = self._batch_bytes = 0
        self._enospc = 0  # writes or syncs that failed with a full disk (writer thread)
        self._stuck = False  # the last write failed with a full disk and nothing was written since (loop thread)
        self.space = SpaceWatch(self.disk, directory)

    # --- lifecycle -------------------------------------------------------------------------------
    def open(self, tail: int, logs: dict[int, LogState]) -> None:
        """Start appending at `tail` (recovery cut the files there), with the logs' states recovery found."""
        self.journal.open(tail, logs)
        cursor = self.journal.cursor(sync=self.policy is not FsyncPolicy.never)
        self.opened_at = tail  # the end of what the journal held when it opened (all of it durable)
        self._read_ahead = ReadAhead(self.journal.starts, lambda: self.journal.durable, self.journal.path)
        self._loop = asyncio.get_running_loop()
        self._post = Post(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
        self._told = tail
        self._post_open = True
        self._loop.add_reader(self._post.fd, self._on_post)
        if Lane is not None and self.policy is FsyncPolicy.always and type(self.disk).commit is OsDisk.commit:
            self._lane = Lane(self._post, SYNC_BUCKETS_MS)
            self._lane.fd = cursor.handle
            if self.disk.drop_synced:
                self._lane.drop_bytes = limits.drop_pages_bytes
            rounds = self._lane_writer
        else:
            rounds = partial(self._writer, cursor, tail)
        # the writer's starting point is fixed here: appends may run before the thread gets going
        self._cursor = cursor
        self._thread = threading.Thread(target=self._writer_thread, args=(rounds,), name="pigeon-journal-writer",
                                        daemon=True)
        self._thread.start()

    async def close(self) -> None:
        for timer in (self._lazy_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._lazy_timer = self._write_timer = None
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._lane is not None:
            self._lane.stop()
        loop = asyncio.get_running_loop()
        if self._thread is not None:
            await loop.run_in_executor(None, self._thread.join)
        if self._post is not None and self._post_open:
            loop.remove_reader(self._post.fd)
            self._on_post()  # what the writer told last, if the loop had not read it yet
            os.close(self._post.fd)
            self._post_open = False
        if self._read_ahead is not None:
            await loop.run_in_executor(None, self._read_ahead.close)
        self.disk.close_all()

    def log(self, log_id: int) -> JournalLog:
        """The Log contract over one of the journal's logs."""
        lg = self._logs.get(log_id)
        if lg is None:
            lg = self._logs[log_id] = JournalLog(self.journal, log_id)
        return lg

    # --- appending (loop thread) -----------------------------------------------------------------
    @property
    def tail(self) -> int:
        return self.journal.tail

    @property
    def durable(self) -> int:
        return self.journal.durable

    @property
    def flushes(self) -> int:
        return self.journal.flushes

    def append(self, log_id: int, epoch: int, rtype: int, parts: list[bytes]) -> tuple[int, int]:
        """Queue one entry; (its offset in its log, its journal position). Durable once `durable` passes the
        position after it (`tail` right after the call)."""
        if self._failed is not None:
            raise self._error()
        with self._cv:  # the writer is not woken: a waiter (flush_soon) or the write timer does that
            out = self.journal.append(log_id, epoch, rtype, parts)
        if self._write_timer is None:
            self._write_timer = self._loop.call_later(limits.lazy_write_s, self._hand_over)
        if self._lazy_timer is None and self.policy is FsyncPolicy.always:
            self._lazy_timer = self._loop.call_later(limits.lazy_flush_s, self.flush_soon)
        return out

    def _hand_over(self) -> None:
        """Wake the writer for what was appended (it writes without fdatasync when nobody waits)."""
        self._write_timer = None
        with self._cv:
            self._hand(False)

    def _marker(self, change, *args):
        """A journal marker (a fence, a truncation, a move of a log's numbering, a mark: storage.journal.Journal's
        methods of those names), durable with the next group commit; what `change` returns."""
        with self._cv:
            out = change(*args)
            self._hand(False)
        return out

    def fence(self, log_id: int, epoch: int) -> int:
        return self._marker(self.journal.fence, log_id, epoch)

    def truncate(self, log_id: int, after: int) -> None:
        self._marker(self.journal.truncate, log_id, after)

    def advance(self, log_id: int, nxt: int) -> None:
        self._marker(self.journal.advance, log_id, nxt)

    def mark(self, log_id: int) -> int:  # (its journal position)
        return self._marker(self.journal.mark, log_id)

    def _hand(self, sync: bool) -> None:
        """(Holding _cv.) Wake the writer for what was appended — with a lane, hand it over placed: the writer
        starts on it without waiting for the GIL this thread holds. `sync`: somebody waits for it."""
        if self._lane is None or self._py_turn:
            self._cv.notify()
            return
        journal = self.journal
        if not journal.placeable(self._cursor):  # a new segment to open: the writer's Python side does it
            self._py_turn = True
            self._lane.python()
            return
        batch, nbytes = journal.take_pending()
        if not batch and not sync:
            return
        chunks, reserve = journal.place_in(self._cursor, batch)
        end = journal.tail
        self._lane.push(chunks, sync, end, reserve)
        if batch:
            self._unposted.append((end, batch))
            self._count_batch(batch, nbytes)

    def _count_batch(self, batch: list, nbytes: int) -> None:
        self._batches, self._batch_entries, self._batch_bytes = (self._batches + 1, self._batch_entries + len(batch),
                                                                 self._batch_bytes + nbytes)
        self._batch_sizes.observe(len(batch))

    def flush_soon(self) -> None:
        """Ask the writer for everything appended so far."""
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        if self._want < self.journal.tail:
            if self._write_timer is not None:  # the writer takes everything appended so far now
                self._write_timer.cancel()
                self._write_timer = None
            if hops.ON:
                hops.mark("asked")
            with self._cv:
                self._want = self.journal.tail
                self._post.asked += 1
                self._hand(True)

    def wait_durable(self, end: int, ask: bool = True, also: tuple["JournalWriter", int] | None = None) \
            -> asyncio.Future:
        """A future done once the journal is durable up to `end` — and, with `also` = (another writer, a position
        in it), that one too (never asked: an entry borrowed from the node's journal is made durable by whoever
        wrote it). With `ask` false the writer is not asked for it: it rides with the next group commit somebody
        asks for, or limits.lazy_flush_s (fsync=always) at the latest. (One future, settled by the journals'
        own callbacks: a replica's every entry waits this way.)"""
        if also is not None:
            return self._wait_both(end, ask, also)
        fut = self._loop.create_future()
        if self.journal.durable >= end:
            fut.set_result(None)
        elif self._failed is not None:
            fut.set_exception(self._error())
        else:
            self.journal.on_durable(end, lambda exc: _settle(fut, exc, self._error))
            if ask and self._want < end:
                self.flush_soon()
        return fut

    def _wait_both(self, end: int, ask: bool, also: tuple["JournalWriter", int]) -> asyncio.Future:
        fut = self._loop.create_future()
        writers = [(self, end), also]
        failed = next((w.failure() for w, _ in writers if w.failure() is not None), None)
        waits = [(w, e) for w, e in writers if w.journal.durable < e]
        if failed is not None:
            fut.set_exception(failed)
        elif not waits:
            fut.set_result(None)
        else:
            left = [len(waits)]

            def one(exc, writer: JournalWriter) -> None:
                if fut.done():
                    return
                if exc is not None:
                    fut.set_exception(writer.failure() or exc)
                    return
                left[0] -= 1
                if not left[0]:
                    fut.set_result(None)
            for w, e in waits:
                w.journal.on_durable(e, lambda exc, w=w: one(exc, w))
            if ask and self.journal.durable < end and self._want < end:
                self.flush_soon()
        return fut

    def on_durable(self, end: int, callback) -> None:
        """Call `callback(None)` on the loop thread once the journal is durable up to `end` — before the futures of
        `wait_durable` for the same position resume their waiters — or `callback(exc)` if the writer fails."""
        if self._failed is not None:
            callback(self._failed)
        else:
            self.journal.on_durable(end, callback)

    def failure(self) -> BaseException | None:
        """What this writer failed with (ENOSPC as the error callers see), or None."""
        return None if self._failed is None else self._error()

    def _error(self):
        exc = self._failed
        if isinstance(exc, OSError) and exc.errno == 28:
            return ResourceExhausted("The server's disk is full.")
        return Unavailable(f"The log is not writable: {exc}")

    def _on_failed(self, exc: BaseException) -> None:
        self._failed = exc
        self.journal.failed(exc)

    # --- the writer thread -----------------------------------------------------------------------
    def _writer(self, cursor: WriteCursor, written: int) -> None:
        disk, journal = self.disk, self.journal
        always, batch_policy = self.policy is FsyncPolicy.always, self.policy is FsyncPolicy.batch
        synced, last_sync = written, time.monotonic()  # synced: what fdatasync covers
        posted = written  # what the loop was told is written (always: durable); never cut back below it
        kept: list = []  # batches written since `posted`: written again if the disk fills up before their sync
        while True:
            batch = None
            idle_sync = False
            try:
                with self._cv:
                    # asked for: durable (always), else written — under batch a waiter is answered once its
                    # entry is written, and waiting for the sync here would spin until limits.batch_sync_s passed
                    while not (journal.pending() or self._closing or self._want > (synced if always else written)):
                        if batch_policy and written > synced:  # sync soon after the last write, even when idle
                            self._cv.wait(limits.batch_sync_s)
                            if not (journal.pending() or self._closing):
                                idle_sync = True  # … outside the lock: appends go on meanwhile
                                break
                        else:
                            self._cv.wait()
                    if not idle_sync:
                        if not journal.pending() and self._closing:
                            break
                        batch, nbytes = journal.take_pending()
                        self._post.seen = self._post.asked
                        if hops.ON:
                            hops.mark("taken")
                        want = self._want
                if idle_sync:
                    self._sync(cursor.handle)
                    synced, last_sync = written, time.monotonic()
                    continue
                chunks = journal.place(cursor, batch)
                written += nbytes
                self._count_batch(batch, nbytes)
                if always:
                    kept.append(batch)
                    sync = tell = want > synced  # else written for nobody waiting: the next sync covers it
                else:
                    sync, tell = batch_policy and time.monotonic() - last_sync >= limits.batch_sync_s, True
                if sync and hops.ON:
                    hops.mark("syncing")
                # write, sync, and tell the loop: one call, which has the GIL back only once all are done
                told = self._post.told
                took = disk.commit(cursor.handle, chunks, sync, self._post if tell else None, written)
                if tell and self._post.told == told:  # more asked for meanwhile: tell, then take it at once
                    self._post.tell(written, sync, self._post.synced_ns)
                if sync:
                    self._sync_took(took)  # (counted by the post, before the loop was told)
                    synced = written
                    last_sync = time.monotonic()
                elif not (always or batch_policy):
                    synced = written  # never: the OS decides
                if not tell:
                    continue
                posted = written
                kept.clear()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                # the disk is full: cut the files back to what the loop was told, keep every entry since
                # (nothing is lost, nobody waiting is answered yet) and try again in a moment
                if batch is not None and not (kept and kept[-1] is batch):  # (else fdatasync failed after it)
                    kept.append(batch)
                with self._cv:
                    journal.requeue(kept)
                kept = []
                cursor = self._cursor = journal.rewind(cursor, posted)
                written = synced = posted
                self._enospc += 1
                self._loop.call_soon_threadsafe(self._disk_full, exc)
                with self._cv:
                    if not self._closing:
                        self._cv.wait(limits.disk_full_retry_s)
        journal.leave(cursor)  # synced, cut back to its records, closed
        self._cursor = None

    def _writer_thread(self, rounds) -> None:
        """The writer thread: `rounds()` until the writer closes. An I/O error fails every waiter and refuses new
        appends."""
        try:
            rounds()
        except BaseException as exc:
            log.error("journal writer failed: %s", exc)
            try:
                self._loop.call_soon_threadsafe(self._on_failed, exc)
            except RuntimeError:
                pass
        finally:
            if self._cursor is not None:
                try:
                    self.disk.close(self._cursor.handle)
                except OSError:
                    pass

    def _lane_writer(self) -> None:
        """The writer's rounds with a lane: the lane's, and its own Python turns in between."""
        lane = self._lane
        while True:
            why = lane.run()
            if why == LANE_STOPPED:
                break
            if why == LANE_FAILED:
                exc = OSError(lane.errno_failed, os.strerror(lane.errno_failed))
                if exc.errno != errno.ENOSPC:
                    raise exc
                self._disk_filled(exc)
            self._python_rounds()
        self._python_rounds(closing=True)  # what was appended and never handed over
        self.journal.leave(self._cursor)  # synced, cut back to its records, closed
        self._cursor = None

    def _python_rounds(self, closing: bool = False) -> None:
        """The lane's writer on its own, holding the GIL between system calls: group commits that open a new
        segment, and every one after a full disk, until nothing is pending or asked for; then the lane again."""
        journal, post = self.journal, self._post
        while True:
            with self._cv:
                posted = max(post.end, self.opened_at)
                if not journal.pending() and self._want <= posted:
                    if not closing:
                        self._lane.fd = self._cursor.handle
                        self._py_turn = False
                    return
                batch, nbytes = journal.take_pending()
                end, sync = journal.tail, self._want > posted
                post.seen = post.asked
                if batch:
                    self._unposted.append((end, batch))
                    self._count_batch(batch, nbytes)
            try:
                chunks = journal.place(self._cursor, batch)  # the new segment opened here
                told = post.told
                took = self.disk.commit(self._cursor.handle, chunks, sync, post if sync else None, end)
                if sync:
                    if post.told == told:  # (more asked for meanwhile: pigeon.node._commit)
                        post.tell(end, True, post.synced_ns)
                    self._sync_took(took)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                self._disk_filled(exc)

    def _disk_filled(self, exc: OSError) -> None:
        """With a lane: a write or a sync failed for a full disk. Cut the files back to what the loop was told, keep
        every entry since (nobody waiting for one is answered yet) and try again in a moment, on the writer's
        Python side: the loop hands the lane nothing meanwhile."""
        with self._cv:
            self._py_turn = True
            self._lane.clear()
            posted = max(self._post.end, self.opened_at)
            self.journal.requeue([batch for end, batch in self._unposted if end > posted])
            self._unposted.clear()
        self._cursor = self.journal.rewind(self._cursor, posted)
        self._enospc += 1
        self._loop.call_soon_threadsafe(self._disk_full, exc)
        with self._cv:
            if not self._closing:
                self._cv.wait(limits.disk_full_retry_s)

    # --- the writer's news (loop thread) --------------------------------------------------------
    def _on_post(self) -> None:
        try:
            os.eventfd_read(self._post.fd)
        except BlockingIOError:  # (read already, with an earlier wake-up)
            pass
        post = self._post
        self.journal.flushes = post.told
        end = post.end
        lane = self._lane
        if lane is not None:
            lane.reap()
            with self._cv:
                q = self._unposted
                while q and q[0][0] <= end:
                    q.popleft()
                if lane.reserve_errno:  # (as Journal._reserve: no such call here, so stop asking; a full disk: again)
                    if lane.reserve_errno != errno.ENOSPC and not self._py_turn:
                        self._cursor.reserving = False
                    lane.reserve_errno = 0
        if end > self._told:
            self._told = end
            if hops.ON and self._post.synced_ns:
                if lane is not None:
                    hops.mark_at(lane.taken_ns, "taken")
                    hops.mark_at(lane.syncing_ns, "syncing")
                hops.mark_at(self._post.synced_ns, "synced")
            self._written(end)

    def _written(self, end: int) -> None:
        if hops.ON:
            hops.mark("posted")
        if self._stuck:
            self._stuck = False
            log.warning("journal: writing again after the disk was full (%d attempts failed with ENOSPC)",
                        self._enospc)
        self.journal.synced(end)

    def _disk_full(self, exc: OSError) -> None:
        if not self._stuck:
            self._stuck = True
            log.error("journal: the disk is full (%s); keeping what is not written and trying again every %g s",
                      exc, limits.disk_full_retry_s)
        self.space.stale()  # the next publish looks again

    def check_publish(self) -> None:
        """Refuse a publish (ResourceExhausted) while the disk is at its high-water mark."""
        change = self.space.look(time.monotonic(), self.journal.tail)
        if change is not None:
            sp = self.space
            if change:
                log.error("disk of %s is full: %d bytes free, %d in reserve; refusing publishes", sp.dir, sp.free,
                          sp.reserve)
            else:
                log.warning("disk of %s has room again (%d bytes free): publishes are accepted", sp.dir, sp.free)
        if self._stuck:
            self.space.refused += 1
            raise ResourceExhausted(f"The disk of {self.space.dir} is full: the journal cannot be written now "
                                    "(it tries again every moment); publishing resumes when space is freed.")
        self.space.check_publish(self.journal.tail)

    def _sync(self, handle) -> None:
        """An fdatasync of what was written and told already (fsync=batch, once the writes stop)."""
        t0 = time.monotonic()
        self.disk.sync(handle)
        self._syncs += 1
        self._sync_took(time.monotonic() - t0)

    def _sync_took(self, dt: float) -> None:
        self._sync_s += dt
        self._sync_max_s = max(self._sync_max_s, dt)
        ms = dt * 1000
        for i, bound in enumerate(SYNC_BUCKETS_MS):
            if ms <= bound:
                self._sync_hist[i] += 1

    def statistics(self) -> WriterStats:
        """Plain values for metrics; read from the loop thread while the writer counts (a moment's skew only)."""
        syncs = self._syncs + (self._post.syncs if self._post is not None else 0)
        sync_s, sync_max_s, hist, lane = self._sync_s, self._sync_max_s, tuple(self._sync_hist), self._lane
        if lane is not None:
            sync_s, sync_max_s = sync_s + lane.sync_ns / 1e9, max(sync_max_s, lane.sync_ns_max / 1e9)
            hist = tuple(a + b for a, b in zip(hist, lane.sync_histogram()))
        return WriterStats(self.journal.statistics(), tuple(self.log(i).statistics() for i in sorted(self.journal.logs)),
                           syncs, sync_s, sync_max_s, hist, self._batches,
                           self._batch_entries, self._batch_bytes, self._batch_sizes.snapshot(),
                           "" if self._failed is None else str(self._failed), self.space.statistics(),
                           self._enospc)

    # --- reading ---------------------------------------------------------------------------------
    def read(self, pos: int, n: int) -> bytes:
        return self.journal.read(pos, n)

    def read_into(self, pos: int, buf: memoryview) -> int:
        """Fill `buf` with the bytes at journal position `pos`; how many were read (fewer only at the end of a
        segment). No allocation: a reader that reuses its buffer spares the allocator and the page faults."""
        return self.journal.read_into(pos, buf)

    def read_ahead(self, pos: int) -> None:
        """A reader is reading the journal from disk at `pos`: have the pages after it fetched ahead of it."""
        if self._read_ahead is not None:
            self._read_ahead.ahead_of(pos)

    async def delete_before(self, pos: int) -> list[int]:
        """Remove whole segments that end at or before `pos` (never the active one); the files go in a thread: the
        unlink of a 64 MB segment takes the filesystem ~17 ms here, and the loop did it for each, then synced the
        directory, while every stream and publish of the node waited."""
        removed = self.journal.drop_before(pos)
        if removed:
            await asyncio.get_running_loop().run_in_executor(None, self.journal.remove_files, removed)
        return removed


def _settle(fut: asyncio.Future, exc: BaseException | None, error) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(error())
