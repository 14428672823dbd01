"""The journal's writer (node.journal_writer.JournalWriter) without its thread, for the cluster simulator: the same
appends, fences, waits and callbacks on the event loop, and a group commit that is a timer of the (virtual) loop —
write everything pending, sync it, tell the waiters — taking as long as `latency()` says. A crash of the node is
`crash()` on the writer (nothing more is written) and on the simulated disk (what was not synced is lost)."""

from __future__ import annotations

import asyncio

from pigeon.node.journal_writer import FsyncPolicy, JournalWriter


class _Asks:
    """What JournalWriter's statistics and flush_soon read of the thread's post: nothing is posted here."""
    asked = seen = told = syncs = synced_ns = end = 0


class _NoThread:
    """The writer's condition variable with no thread to guard against or wake (the base class takes it at every
    append, fence and flush)."""
    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        pass

    def notify(self) -> None:
        pass


class SimJournalWriter(JournalWriter):
    def __init__(self, directory: str, policy, segment_bytes: int, disk, latency):
        super().__init__(directory, FsyncPolicy(policy), segment_bytes, disk)
        self._cv = _NoThread()
        self.latency = latency  # () → seconds a group commit takes
        self._cursor = None
        self._commit_timer: asyncio.TimerHandle | None = None
        self.dead = False

    def open(self, tail: int, logs) -> None:
        self.journal.open(tail, logs)
        self._cursor = self.journal.cursor(sync=True)
        self.opened_at = tail
        self._loop = asyncio.get_running_loop()
        self._post = _Asks()
        self._told = tail

    async def close(self) -> None:
        for timer in (self._lazy_timer, self._write_timer, self._commit_timer):
            if timer is not None:
                timer.cancel()
        self._lazy_timer = self._write_timer = self._commit_timer = None
        if not self.dead and self._cursor is not None:
            self._commit()
            self.journal.leave(self._cursor)
            self._cursor = None

    def crash(self) -> None:
        """The process is gone: nothing more is written (the disk's crash decides what survives)."""
        self.dead = True
        for timer in (self._lazy_timer, self._write_timer, self._commit_timer):
            if timer is not None:
                timer.cancel()

    # --- the writer's side: a timer instead of a thread ------------------------------------------------
    def _hand_over(self) -> None:
        """An entry nobody waits for: it waits for the next commit somebody asks for, or the lazy flush."""
        self._write_timer = None

    def flush_soon(self) -> None:
        super().flush_soon()
        self._schedule()

    def fence(self, log_id: int, epoch: int) -> int:
        out = super().fence(log_id, epoch)
        self._schedule()
        return out

    def truncate(self, log_id: int, after: int) -> None:
        super().truncate(log_id, after)
        self._schedule()

    def advance(self, log_id: int, nxt: int) -> None:
        super().advance(log_id, nxt)
        self._schedule()

    def mark(self, log_id: int) -> int:
        out = super().mark(log_id)
        self._schedule()
        return out

    def _schedule(self) -> None:
        if self._commit_timer is None and not self.dead and self._loop is not None:
            self._commit_timer = self._loop.call_later(self.latency(), self._commit)

    def _commit(self) -> None:
        self._commit_timer = None
        if self.dead:
            return
        batch, _ = self.journal.take_pending()
        if batch:
            try:
                self.journal.write(self._cursor, batch)
                self.disk.sync(self._cursor.handle)
            except OSError as e:
                self._on_failed(e)
                return
            self._syncs += 1
        self.journal.synced(self.journal.tail)
        if self.journal.pending():
            self._schedule()
