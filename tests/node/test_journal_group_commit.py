"""The journal's group commit on real files (fsync=always): the writer writes and fdatasyncs when someone waits for
a record; records nobody waits for ride along with the next group commit, or are written within limits.lazy_write_s and
synced within limits.lazy_flush_s; closing writes everything. Each test runs over the lane, over the compiled group commit
without it and over its Python twin (pigeon.node.disk)."""

from __future__ import annotations

import asyncio
import os

import pytest

from pigeon.core import limits
from pigeon.core.errors import ResourceExhausted
from pigeon.node import disk as disk_mod
from pigeon.node import journal_writer as wal_mod
from pigeon.node.disk import OsDisk
from pigeon.node.journal_writer import JournalWriter
from pigeon.storage import record
from pigeon.storage.records import TopicDel


@pytest.fixture(autouse=True, params=["lane", "compiled", "python"])
def _twin(request, monkeypatch):
    """The writer as a server runs it (fsync=always: the lane, the loop placing each batch; else the compiled
    commit), the writer taking its own batches with the compiled commit, and with its Python twin."""
    if request.param != "lane":
        monkeypatch.setattr(wal_mod, "Lane", None)
    if request.param == "python":
        monkeypatch.setattr(disk_mod, "_commit_io", disk_mod._py_commit)
        monkeypatch.setattr(wal_mod, "Post", disk_mod._PyPost)
    elif not disk_mod.COMPILED:
        pytest.skip("pigeon.node._commit was not built (tests/unit/test_commit_io.py says so)")


def _rec(i: int) -> list[bytes]:
    return TopicDel(i).parts()


def _size(parts: list[bytes]) -> int:
    return record.HEADER_BYTES + record.ENTRY_BYTES + sum(map(len, parts))


class Wal:
    """The writer with one log, as these tests use it: append returns the entry's journal position."""

    def __init__(self, w: JournalWriter):
        self.w = w

    def append(self, parts) -> int:
        return self.w.append(0, 1, TopicDel.TYPE, parts)[1]

    def __getattr__(self, name):
        return getattr(self.w, name)


async def _open(tmp_path, policy: str) -> Wal:
    w = JournalWriter(str(tmp_path / "wal"), policy, 1 << 20)
    w.open(0, {})
    return Wal(w)


def _on_disk(tmp_path) -> int:
    """Bytes of whole records in the journal's files (not the zeros reserved after them)."""
    d = tmp_path / "wal"
    return sum(record.valid_end((d / f).read_bytes(), limits.record_bytes_max) for f in os.listdir(d))


def test_records_nobody_waits_for_join_the_next_group_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "lazy_flush_s", 3600.0)  # no timer within the test

    async def go():
        w = await _open(tmp_path, "always")
        lazy = [_rec(i) for i in range(5)]
        for r in lazy:
            w.append(r)
        await asyncio.sleep(0)
        assert w.flushes == 0  # no fdatasync of their own
        urgent = _rec(99)
        pos = w.append(urgent)
        await w.wait_durable(pos + _size(urgent))
        assert w.flushes == 1 and w.durable == w.tail  # one group commit covered all six
        assert _on_disk(tmp_path) == sum(map(_size, lazy)) + _size(urgent)
        await w.close()

    asyncio.run(go())


def test_a_record_nobody_waits_for_is_synced_soon_anyway(tmp_path):
    async def go():
        w = await _open(tmp_path, "always")
        w.append(_rec(1))
        deadline = asyncio.get_running_loop().time() + 20 * limits.lazy_flush_s + 1.0
        while w.durable < w.tail and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(limits.lazy_flush_s)
        assert w.durable == w.tail and w.flushes == 1
        await w.close()

    asyncio.run(go())


def test_records_nobody_waits_for_reach_the_file_soon_without_fdatasync(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "lazy_flush_s", 3600.0)  # only a waiter could start the fdatasync

    async def go():
        w = await _open(tmp_path, "always")
        for i in range(10):
            w.append(_rec(i))
        for _ in range(200):  # after limits.lazy_write_s a killed process would lose none of them: they are in the file
            if _on_disk(tmp_path) == w.tail:
                break
            await asyncio.sleep(0.01)
        assert _on_disk(tmp_path) == w.tail
        assert w.flushes == 0 and w.durable == 0  # not reported durable: no fdatasync covered them yet
        await w.close()

    asyncio.run(go())


def test_the_writer_thread_is_not_woken_per_record_nobody_waits_for(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "lazy_flush_s", 3600.0)
    monkeypatch.setattr(limits, "lazy_write_s", 3600.0)  # no timer within the test: only a waiter wakes it

    async def go():
        w = await _open(tmp_path, "always")
        first = _rec(0)
        await w.wait_durable(w.append(first) + _size(first))
        await asyncio.sleep(0.05)  # the writer is parked, waiting to be woken
        lazy = [_rec(i) for i in range(1, 11)]
        for r in lazy:
            w.append(r)
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)
        assert _on_disk(tmp_path) == _size(first), "a record nobody waits for woke the writer"
        urgent = _rec(99)
        await w.wait_durable(w.append(urgent) + _size(urgent))
        assert _on_disk(tmp_path) == w.tail == _size(first) + sum(map(_size, lazy)) + _size(urgent)
        assert w.flushes == 2  # the first record's group commit, then one for the other eleven
        await w.close()

    asyncio.run(go())


def test_close_writes_what_is_pending(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "lazy_flush_s", 3600.0)

    async def go():
        w = await _open(tmp_path, "always")
        recs = [_rec(i) for i in range(3)]
        for r in recs:
            w.append(r)
        await w.close()
        assert _on_disk(tmp_path) == sum(map(_size, recs))

    asyncio.run(go())


def test_under_batch_a_waiter_is_answered_once_written_and_the_writer_then_rests(tmp_path, monkeypatch):
    """fsync=batch answers once the entry is written and syncs within limits.batch_sync_s. The writer used to take a
    waiter's position for one to be synced: until the periodic sync it went round empty — thousands of empty
    group commits, each waking the event loop, for every answer."""
    syncs = []
    real = wal_mod.OsDisk.sync
    monkeypatch.setattr(wal_mod.OsDisk, "sync", lambda self, fd: (syncs.append(fd), real(self, fd))[1])

    async def go():
        w = await _open(tmp_path, "batch")
        parts = _rec(1)
        pos = w.append(parts)
        await asyncio.wait_for(w.wait_durable(pos + _size(parts)), 5)
        assert _on_disk(tmp_path) == w.tail, "answered once written"
        await asyncio.sleep(10 * limits.batch_sync_s)
        for _ in range(1000):  # (a loaded machine may run the sync's thread late: wait for it, boundedly)
            if syncs:
                break
            await asyncio.sleep(limits.batch_sync_s)
        assert syncs, "never synced, though nobody waits for that"
        assert w.flushes <= 2, f"{w.flushes} group commits for one entry: the writer went round empty"
        await w.close()

    asyncio.run(go())


def test_a_batch_is_answered_whether_the_loop_is_told_at_once_or_by_the_writer_holding_the_gil(tmp_path,
                                                                                           monkeypatch):
    """With nothing more asked for (or once), the group commit tells the loop itself; when more was asked for
    twice while it wrote, the writer tells once it has the GIL back, then takes the next batch. Either way every
    waiter is answered by the commit that covers it — not by a later one. (The writer taking its own batches: a
    lane is handed them placed and tells after each round.)"""
    import threading

    if wal_mod.Lane is not None:
        pytest.skip("the writer's own group commit, not the lane's")

    gates = [threading.Event(), threading.Event(), threading.Event()]
    entered = [threading.Event(), threading.Event(), threading.Event()]
    calls = []
    real = disk_mod.OsDisk.commit

    def gated(self, handle, chunks, sync, post, end):
        n = len(calls)
        calls.append(None)
        if n < len(gates):
            entered[n].set()
            gates[n].wait(10)
        calls[n] = (post.asked - post.seen, post.told) if post is not None else None  # asks since the take
        return real(self, handle, chunks, sync, post, end)

    monkeypatch.setattr(disk_mod.OsDisk, "commit", gated)

    async def go():
        w = await _open(tmp_path, "always")
        loop = asyncio.get_running_loop()
        r1 = _rec(1)
        first = w.wait_durable(w.append(r1) + _size(r1))
        await loop.run_in_executor(None, entered[0].wait, 10)  # the first batch is in its commit
        r2, r3 = _rec(2), _rec(3)
        second = w.wait_durable(w.append(r2) + _size(r2))  # asked for more meanwhile, twice
        third = w.wait_durable(w.append(r3) + _size(r3))
        gates[0].set()
        await asyncio.wait_for(first, 10)  # told by the writer, before the second commit (held) went anywhere
        await loop.run_in_executor(None, entered[1].wait, 10)
        assert not second.done() and w.durable == _size(r1) and w.flushes == 1
        gates[1].set()
        await asyncio.wait_for(asyncio.gather(second, third), 10)  # nothing more asked: told by the commit
        assert w.durable == w.tail and w.flushes == 2
        assert calls[:2] == [(2, 0), (0, 1)]  # two asks while the first wrote, none while the second did
        gates[2].set()
        await w.close()

    asyncio.run(go())


def test_many_small_segments_waited_for_or_not_every_record_once_in_order(tmp_path, monkeypatch):
    """The writer's own turn opens each new segment (with a lane, the loop then hands it the batches after):
    records waited for and records nobody waits for, across many segments, all on disk once, in order."""
    monkeypatch.setattr(limits, "lazy_flush_s", 3600.0)

    async def go():
        w = Wal(JournalWriter(str(tmp_path / "wal"), "always", 1 << 10, OsDisk()))  # 1 KiB segments
        w.open(0, {})
        waits = []
        for i in range(600):
            r = _rec(i)
            end = w.append(r) + _size(r)
            if i % 7 == 0:
                waits.append(w.wait_durable(end))
            if i % 50 == 0:
                await asyncio.sleep(0)
        waits.append(w.wait_durable(w.tail))
        await asyncio.wait_for(asyncio.gather(*waits), 10)
        assert w.durable == w.tail and len(w.journal.starts) > 10
        assert [e.offset for e in w.journal.entries(0, 0, 1000)] == list(range(600))
        stats = w.statistics()
        assert stats.group_commit_entries == 600 and stats.failed == ""
        await w.close()
        assert _on_disk(tmp_path) == w.tail

    asyncio.run(go())


class _FillingDisk(OsDisk):
    """Real files, whose writes fail with ENOSPC once `fill()` is called — until the writer opens its segment
    again (as after a full disk it does, cutting it back): /dev/full in place of the segment's descriptor."""

    def __init__(self):
        super().__init__()
        self.opened: list[int] = []

    def open_write(self, path: str, at: int) -> int:
        fd = super().open_write(path, at)
        self.opened.append(fd)
        return fd

    def fill(self) -> None:
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, self.opened[-1])
        os.close(full)


def test_a_disk_that_fills_under_the_writer_keeps_every_record_and_goes_on(tmp_path, monkeypatch):
    """The segment's writes fail with ENOSPC: nobody waiting is answered, publishes are refused, and once the
    writer has cut the segment back and opened it again every record is on disk, once, in order."""
    monkeypatch.setattr(limits, "disk_full_retry_s", 0.3)
    monkeypatch.setattr(limits, "disk_free_check_s", 0.0)

    async def go():
        disk = _FillingDisk()
        w = Wal(JournalWriter(str(tmp_path / "wal"), "always", 1 << 20, disk))
        w.open(0, {})
        await w.wait_durable(w.append(_rec(0)) + _size(_rec(0)))
        written = w.durable
        disk.fill()
        ends = [w.append(_rec(i)) + _size(_rec(i)) for i in range(1, 40)]
        waiting = w.wait_durable(ends[-1])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while w.statistics().enospc == 0 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert w.statistics().enospc > 0 and not waiting.done() and w.durable == written
        with pytest.raises(ResourceExhausted, match="is full"):
            w.check_publish()
        await asyncio.wait_for(waiting, 10)
        assert w.durable == w.tail and w.statistics().failed == ""
        assert [e.offset for e in w.journal.entries(0, 0, 1000)] == list(range(40))
        w.check_publish()  # accepted again
        await w.close()
        assert _on_disk(tmp_path) == w.tail  # nothing written twice

    asyncio.run(go())
