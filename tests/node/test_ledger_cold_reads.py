"""Reading a ledger whose pages are not in memory (pigeon.node.ledger_store.read_warm) on real files: what the page
cache lacks is read into it by a thread, never by the event loop — a member's ledger files leave the cache once
synced, and an owner delivers a backlog it took over from them, so a read from the disk on the loop held up every
stream and append of the node. The entries come back as a plain read gives them: whole copies and those borrowed
from the node journal, within a byte budget, and also when what was warmed leaves the cache again at once."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from pigeon.node.disk import OsDisk
from pigeon.node.ledger_store import LedgerStore
from tests.node.test_ledger_store import _commit, _node_journal

BODIES = [b"%04d" % i * 2500 for i in range(60)]  # 10 KB each, 600 KB a ledger


def _evict(root) -> None:
    """Let the page cache go of every file under `root` (clean pages: the files were synced)."""
    for d, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


async def _stores(tmp_path):
    """A store with ledger 7 (whole copies, another owner's) and ledger 9 (the owner's own: borrowed after its
    first entry), every page of both journals evicted."""
    node = await _node_journal(tmp_path)
    s = LedgerStore(str(tmp_path), node=node)
    await s.open()
    for i, body in enumerate(BODIES):
        await s.append(7, 1, i, 3, body)
        await s.submit(9, 1, i, 3, body, where=_commit(node, 4, 3, body))
    await node.wait_durable(node.tail)
    if not _evicts(tmp_path):
        await s.close()
        await node.close()
        pytest.skip("this filesystem keeps a file's pages when asked to drop them (tmpfs): nothing is ever cold")
    _evict(tmp_path)
    return node, s


def _evicts(tmp_path) -> bool:
    """Whether the filesystem lets a synced file's pages go when asked (tmpfs does not). Asked of a file of its own:
    a read that does not wait may still start the kernel's read-ahead, which could fill the pages of the files
    under test after they were evicted."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * 65536)
    fd, disk = os.open(probe, os.O_RDONLY), OsDisk()
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return disk.pread_into(str(probe), 0, memoryview(bytearray(65536)), nowait=True) < 65536
    finally:
        os.close(fd)
        disk.close_all()
        probe.unlink()


@pytest.fixture
def reads(monkeypatch):
    """Every disk read the store makes, as (thread, nowait, path) — and the warms, as (thread, "warm", path)."""
    seen = []
    pread, warm = OsDisk.pread_into, OsDisk.warm

    def recorded_pread(self, path, offset, buf, nowait=False):
        seen.append((threading.current_thread(), nowait, path))
        return pread(self, path, offset, buf, nowait)

    def recorded_warm(self, path, offset, n):
        seen.append((threading.current_thread(), "warm", path))
        return warm(self, path, offset, n)
    monkeypatch.setattr(OsDisk, "pread_into", recorded_pread)
    monkeypatch.setattr(OsDisk, "warm", recorded_warm)
    return seen


def test_cold_entries_are_read_into_the_cache_by_a_thread_never_by_the_loop(tmp_path, reads):
    async def go():
        node, s = await _stores(tmp_path)
        try:
            loop_thread = threading.current_thread()
            reads.clear()
            got = {ledger: await s.read_warm(ledger, 0, len(BODIES)) for ledger in (7, 9)}
            assert all([e.body for e in entries] == BODIES for entries in got.values())
            assert [e.offset for e in got[9]] == list(range(len(BODIES)))
            on_loop = [r for r in reads if r[0] is loop_thread]
            assert on_loop and all(nowait is True for _, nowait, _ in on_loop), "the loop never waits for the disk"
            warmed = {os.path.dirname(p) for t, what, p in reads if what == "warm" and t is not loop_thread}
            assert warmed == {str(tmp_path / "ledgers" / "wal"), str(tmp_path / "wal")}, \
                "both journals' cold pages (the whole copies', the borrowed entries') were warmed by a thread"
            assert s.read(7, 0, len(BODIES), nowait=True) == got[7], "warm now: read without waiting"
            assert s.cold_reads == sum(1 for _, what, _ in reads if what == "warm") and \
                s.cold_read_bytes >= len(BODIES[0]) * 2, "counted for the metrics"
        finally:
            await s.close()
            await node.close()

    asyncio.run(go())


def test_a_cold_read_keeps_to_its_byte_budget(tmp_path):
    """As a member's Read answers and an owner's slices of a read: no more than fit besides what the caller holds,
    one at least — also when the entries come in over several warms."""
    async def go():
        node, s = await _stores(tmp_path)
        try:
            got = await s.read_warm(7, 0, len(BODIES), nbytes_max=len(BODIES[0]) * 25 + 1)
            assert [e.body for e in got] == BODIES[:25]
            _evict(tmp_path)
            one = await s.read_warm(9, 3, len(BODIES), nbytes_max=1)
            assert [e.body for e in one] == [BODIES[3]], "one at least, though larger than the budget"
            assert s.read(9, 4, len(BODIES), nbytes_max=len(BODIES[0]) * 2, held=len(BODIES[0])) == \
                s.read(9, 4, 5), "what the caller holds counts against the budget"
        finally:
            await s.close()
            await node.close()

    asyncio.run(go())


def test_entries_that_leave_the_cache_as_soon_as_they_are_warmed_are_still_read(tmp_path, monkeypatch):
    """Memory so short that what a thread warmed is gone before the loop reads it: the read waits for the disk
    for one entry at a time rather than warming for ever."""
    async def go():
        node, s = await _stores(tmp_path)
        try:
            warms = []

            def warm_that_does_not_stay(self, path, offset, n):
                warms.append(offset)
                _evict(tmp_path)
                return n
            monkeypatch.setattr(OsDisk, "warm", warm_that_does_not_stay)
            got = await s.read_warm(9, 0, len(BODIES))
            assert [e.body for e in got] == BODIES
            assert 0 < len(warms) <= 2 * len(BODIES)
        finally:
            await s.close()
            await node.close()

    asyncio.run(go())
