"""The storage role's ledger store (pigeon.node.ledger_store) on real files: entries answered once durable and
read back in order, also after a restart; dense entries (a gap refused, a retry answered); a fence that is durable,
survives a restart and refuses the old writer while recovery's copies are still taken; the node's own
journal is a different one, which lends the owner's copies of its own ledgers."""

from __future__ import annotations

import asyncio
import os

import pytest

from pigeon.cluster.ledgers import ledger_id
from pigeon.core import limits
from pigeon.core.errors import FailedPrecondition, PigeonError
from pigeon.node.disk import OsDisk
from pigeon.node.journal_writer import FsyncPolicy, JournalWriter
from pigeon.node import ledger_store
from pigeon.node.ledger_store import FENCE_EPOCH, LedgerStore
from pigeon.storage import record
from pigeon.storage import recovery as storage_recovery


def run(coro):
    return asyncio.run(coro)


def test_entries_come_back_in_order_across_ledgers_and_a_restart(tmp_path):
    async def write():
        s = LedgerStore(str(tmp_path), segment_bytes=4096)  # small segments: ledgers span several files
        await s.open()
        for i in range(40):
            for ledger in (7, 8):
                await s.append(ledger, 1, i, 3, b"L%d-e%d" % (ledger, i) * 20)
        assert [e.body for e in s.read(7, 5, 8)] == [b"L7-e%d" % i * 20 for i in range(5, 8)]
        await s.close()

    async def reread():
        s = LedgerStore(str(tmp_path))
        await s.open()
        assert s.held(7) == s.held(8) == 40
        got = s.read(8, 0, 40)
        assert [e.offset for e in got] == list(range(40)) and got[39].body == b"L8-e39" * 20
        assert {e.rtype for e in got} == {3}
        st = s.statistics()
        assert (st.ledgers, st.entries, st.fenced) == (2, 80, 0)
        await s.close()

    run(write())
    assert len(os.listdir(tmp_path / "ledgers" / "wal")) > 2
    run(reread())


def test_entries_are_dense_and_a_retry_is_answered_again(tmp_path):
    async def go():
        s = LedgerStore(str(tmp_path))
        await s.open()
        await s.append(1, 1, 0, 3, b"a")
        with pytest.raises(FailedPrecondition, match="entry 2 would leave a gap"):
            await s.append(1, 1, 2, 3, b"c")
        await s.append(1, 1, 0, 3, b"a")  # the writer did not hear the answer and sends again
        assert [e.body for e in s.read(1, 0, 10)] == [b"a"]
        await s.close()

    run(go())


def test_a_fence_is_durable_refuses_the_old_writer_and_takes_recoverys_copies(tmp_path):
    async def fence():
        s = LedgerStore(str(tmp_path))
        await s.open()
        for i in range(3):
            await s.append(5, 1, i, 3, b"e%d" % i)
        assert await s.fence(5) == 3
        with pytest.raises(FailedPrecondition, match="ledger 5 is fenced"):
            await s.append(5, 1, 3, 3, b"late")
        with pytest.raises(FailedPrecondition, match="ledger 5 is fenced"):
            await s.append(5, 1, 2, 3, b"e2")  # a retry too: the writer was replaced
        await s.append(6, 1, 0, 3, b"other ledgers go on")
        await s.append(5, FENCE_EPOCH, 3, 3, b"copied by recovery")
        await s.close()

    async def after_restart():
        s = LedgerStore(str(tmp_path))
        await s.open()
        assert s.fenced(5) and not s.fenced(6)
        with pytest.raises(FailedPrecondition, match="fenced"):
            await s.append(5, 1, 4, 3, b"still late")
        assert [e.body for e in s.read(5, 0, 10)] == [b"e0", b"e1", b"e2", b"copied by recovery"]
        assert await s.fence(5) == 4, "fencing again answers what is held"
        await s.close()

    run(fence())
    run(after_restart())
    assert not os.path.exists(tmp_path / "wal"), "the node's own journal is another one"


def test_deleted_ledgers_are_gone_for_good_and_their_segments_with_them(tmp_path):
    """A log cut past its first ledgers: they read as empty, refuse appends and fences (a replaced writer stays
    out), also after a restart; the journal segments that held only them are removed, and no segment a kept
    ledger needs — a fence of a ledger with no entry is written again rather than kept where it lay."""
    def segments() -> list[str]:
        return sorted(os.listdir(tmp_path / "ledgers" / "wal"))

    async def write():
        s = LedgerStore(str(tmp_path), segment_bytes=4096)
        await s.open()
        for i in range(40):
            await s.append(1, 1, i, 3, b"old-%d" % i * 20)  # ledger 1: several segments of its own
        await s.fence(1)
        for i in range(40):
            await s.append(2, 2, i, 3, b"new-%d" % i * 20)
        await s.fence(3)  # a kept ledger with a fence and no entry: its fence is written again at the end …
        before = segments()
        removed = await s.delete([1])
        assert removed > 0 and len(segments()) == len(before) - removed, "… so it holds no segment before it"
        assert s.fenced(3)
        assert s.read(1, 0, 40) == [] and s.held(1) == 0 and 1 not in s.writer.journal.logs
        with pytest.raises(FailedPrecondition, match="ledger 1 was deleted"):
            s.submit(1, 1, 0, 3, b"late")
        with pytest.raises(FailedPrecondition, match="deleted"):
            await s.fence(1)
        assert [e.body for e in s.read(2, 0, 40)] == [b"new-%d" % i * 20 for i in range(40)]
        await s.close()

    async def reread():
        s = LedgerStore(str(tmp_path), segment_bytes=4096)
        await s.open()
        assert s.held(1) == 0 and s.read(1, 0, 40) == []
        with pytest.raises(FailedPrecondition, match="ledger 1 was deleted"):
            s.submit(1, 1, 0, 3, b"late")
        assert [e.body for e in s.read(2, 0, 40)] == [b"new-%d" % i * 20 for i in range(40)]
        assert s.statistics().ledgers == 1
        assert s.fenced(3), "the fence rewritten survives the segments removed"
        with pytest.raises(FailedPrecondition, match="fenced"):
            await s.append(3, 1, 0, 3, b"a replaced writer")
        await s.close()

    run(write())
    run(reread())


# --- entries borrowed from the node journal (the owner's own copy of its own ledgers) ----------------------

class _Nothing:
    """The node journal's state is not this test's: recovery only finds where its valid records end."""

    def load(self, header, meta, images) -> None:
        pass

    def apply(self, rtype: int, body, at: int) -> None:
        pass


async def _node_journal(path) -> JournalWriter:
    for sub in ("wal", "checkpoints"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    found = storage_recovery.recover(OsDisk(), str(path), _Nothing, repair=True)
    w = JournalWriter(os.path.join(path, "wal"), FsyncPolicy.always, 64 * 1024)
    w.open(found.tail, found.logs)
    return w


def _commit(node: JournalWriter, log: int, rtype: int, body: bytes) -> tuple[int, int, int, int]:
    """Write a record of `log` to the node journal as the engine does; where it lies."""
    offset, at = node.append(log, 1, rtype, [body])
    return log, offset, at, node.tail


def _ledger_bytes(tmp_path) -> int:
    wal = tmp_path / "ledgers" / "wal"
    return sum(record.valid_end((wal / f).read_bytes(), limits.record_bytes_max) for f in os.listdir(wal))


def test_deletes_at_once_are_all_durable(tmp_path):
    """Deletes asked at the same time (an owner's own cut and other owners' Delete calls): each one's ledgers are
    forgotten durably — before, both wrote the same temporary file, one failed and its ledgers came back after a
    restart."""
    async def write():
        s = LedgerStore(str(tmp_path))
        await s.open()
        for ledger in range(1, 9):
            await s.append(ledger, 1, 0, 3, b"entry")
        await asyncio.gather(*(s.delete([ledger]) for ledger in range(1, 8)))
        await s.close()

    async def reread():
        s = LedgerStore(str(tmp_path))
        await s.open()
        try:
            return [lid for lid in range(1, 9) if lid in s.deleted], [s.held(ledger) for ledger in range(1, 9)]
        finally:
            await s.close()

    run(write())
    assert run(reread()) == (list(range(1, 8)), [0] * 7 + [1])


def test_the_owners_copy_is_borrowed_from_the_node_journal_and_reads_back_after_a_restart(tmp_path):
    """Entries the node journal holds are kept here as where they lie (a ledger's first entry whole): read back
    as they were — before and after both journals restart — the node journal is kept from the first one while
    the ledger is, and no longer once it is deleted."""
    bodies = [b"%03d" % i * 3000 for i in range(20)]  # 9 KB each

    async def write():
        node = await _node_journal(tmp_path)
        s = LedgerStore(str(tmp_path), node=node)
        assert s.journal_floor() == 0, "before it opened, the whole node journal is kept"
        await s.open()
        assert s.journal_floor() is None
        _commit(node, 2, 1, b"a record of another log")
        wheres = []
        for i, body in enumerate(bodies):
            wheres.append(_commit(node, 9, 1 + i % 3, body))
            await s.submit(9, 1, i, 1 + i % 3, body, where=wheres[-1])
        assert _ledger_bytes(tmp_path) < len(bodies[0]) + 20 * 100, "one whole copy; the rest, where they lie"
        assert s.journal_floor() == wheres[1][2], "kept from the first borrowed entry (the first is whole)"
        got = s.read(9, 0, 20)
        assert [(e.offset, e.rtype, e.body) for e in got] == [(i, 1 + i % 3, b) for i, b in enumerate(bodies)]
        await s.close()
        await node.close()

    async def reread():
        node = await _node_journal(tmp_path)
        s = LedgerStore(str(tmp_path), node=node)
        await s.open()
        assert s.held(9) == 20 and [e.body for e in s.read(9, 0, 20)] == bodies
        assert await s.fence(9) == 20
        first = s.journal_floor()
        assert first is not None and first > 0
        await s.delete([9])
        assert s.journal_floor() is None, "a deleted ledger keeps nothing of the node journal"
        await s.close()
        await node.close()

    run(write())
    run(reread())


def test_the_owners_copy_asks_the_node_journal_for_what_it_borrows(tmp_path, monkeypatch):
    """An owner answers a replicated record once Qa members hold it, without waiting for its own journal (node.logs):
    nobody else asks the node journal for the record then, so the own store does when it is asked for its entry —
    not the journal's lazy flush, seconds later here."""
    monkeypatch.setattr(limits, "lazy_write_s", 60.0)
    monkeypatch.setattr(limits, "lazy_flush_s", 60.0)

    async def go():
        node = await _node_journal(tmp_path)
        s = LedgerStore(str(tmp_path), node=node)
        await s.open()
        await s.submit(9, 1, 0, 1, b"the first entry: a whole copy", where=_commit(node, 9, 1, b"the first entry: "
                                                                                        b"a whole copy"))
        where = _commit(node, 9, 1, b"a record the executor waits for at Qa only")
        done = s.submit(9, 1, 1, 1, b"a record the executor waits for at Qa only", now=False, where=where)
        s.flush()  # the ledger's writer: somebody waits for the entry
        await asyncio.wait_for(done, 5)
        assert node.durable >= where[3]
        where = _commit(node, 9, 1, b"asked for at once")
        await asyncio.wait_for(s.submit(9, 1, 2, 1, b"asked for at once", where=where), 5)
        await s.close()
        await node.close()

    run(go())


def test_borrowed_entries_the_node_journal_lost_in_a_crash_are_dropped(tmp_path):
    """A crash can leave a borrowed entry's record durable here while the node journal lost its own (never
    answered: the answer waits for both): at the restart the ledger ends before the first such entry, for
    good — a later record at that position of the node journal is not taken for it."""
    bodies = [b"%03d" % i * 500 for i in range(10)]

    async def write() -> int:
        node = await _node_journal(tmp_path)
        s = LedgerStore(str(tmp_path), node=node)
        await s.open()
        cut = 0
        for i, body in enumerate(bodies):
            where = _commit(node, 4, 1, body)
            await s.submit(4, 1, i, 1, body, where=where)
            if i == 6:
                cut = where[2]  # entry 6's record: the node journal loses it and everything after
        await s.close()
        await node.close()
        return cut

    async def after_the_crash():
        node = await _node_journal(tmp_path)
        assert node.opened_at == cut
        _commit(node, 4, 1, b"x" * 3500)  # the node journal's next record lands where entry 6's was
        s = LedgerStore(str(tmp_path), node=node)
        await s.open()
        assert s.held(4) == 6 and [e.body for e in s.read(4, 0, 10)] == bodies[:6]
        await s.close()
        s = LedgerStore(str(tmp_path), node=node)
        await s.open()
        assert s.held(4) == 6, "the drop is durable"
        await s.close()
        await node.close()

    cut = run(write())
    wal = tmp_path / "wal"
    (segment,) = [wal / f for f in os.listdir(wal) if f.endswith(".wal")]
    os.truncate(segment, cut - int(os.path.basename(segment).split(".")[0]) + 5)  # a torn record at entry 6
    run(after_the_crash())


def test_a_borrowed_entry_whose_record_is_another_is_an_error_not_other_bytes(tmp_path):
    async def go():
        node = await _node_journal(tmp_path)
        s = LedgerStore(str(tmp_path), node=node)
        await s.open()
        await s.submit(3, 1, 0, 1, b"first, whole", where=_commit(node, 5, 1, b"first, whole"))
        log, offset, at, end = _commit(node, 5, 1, b"log 5's entry 1")
        with pytest.raises(FailedPrecondition, match="entry 1 is log 5's record at offset 1 in the node journal, "
                                                     "not log 5's at 2"):
            s.submit(3, 1, 1, 1, b"log 5's entry 1", where=(log, offset + 1, at, end))
        assert s.held(3) == 1, "refused: nothing taken"
        await s.submit(3, 1, 1, 1, b"log 5's entry 1", where=(log, offset, at + 1, end))  # inside the record
        with pytest.raises(PigeonError, match="record at %d cannot be read" % (at + 1)):
            s.read(3, 0, 2)
        await s.close()
        await node.close()

    run(go())


def _cached_pages(path: str) -> int:
    """How many of the file's pages are in the page cache (mincore(2) over a private mapping of it)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # copy-on-write: maps the cached pages, reads none
    try:
        vec = (ctypes.c_ubyte * pages)()
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0, os.strerror(ctypes.get_errno())
        return sum(v & 1 for v in vec)
    finally:
        del addr
        m.close()


def test_a_members_ledgers_leave_the_page_cache_once_synced(tmp_path):
    """A member's ledgers are read back only to recover or repair one: once durable their pages are dropped (every
    limits.drop_pages_bytes written, and when the store closes), so they do not fill memory; the node's own journal, which
    deliveries read, keeps its pages."""

    def wal_pages(d):
        return sum(_cached_pages(os.path.join(p, f)) for p, _, fs in os.walk(d) for f in fs if f.endswith(".wal"))

    entry = 256 * 1024
    n = (limits.drop_pages_bytes * 3 // 2) // entry  # one and a half times limits.drop_pages_bytes

    async def go():
        s = LedgerStore(str(tmp_path / "store"), segment_bytes=64 << 20)
        await s.open()
        node = JournalWriter(str(tmp_path / "node"), FsyncPolicy.always, 64 << 20)
        node.open(0, {})
        for i in range(n):
            await s.append(9, 1, i, 3, os.urandom(entry))
            node.append(1, 1, 3, [os.urandom(entry)])
        await node.wait_durable(node.tail)
        kept, node_kept = wal_pages(tmp_path / "store"), wal_pages(tmp_path / "node")
        await node.close()
        await s.close()
        return kept, node_kept

    kept, node_kept = run(go())
    written = n * entry // 4096
    if node_kept == 0:
        pytest.skip("this filesystem keeps no written pages cached at all (nothing to compare with)")
    assert node_kept >= written * 9 // 10  # the node journal's stay
    assert kept <= written * 2 // 3  # at least the first limits.drop_pages_bytes went while the store was written
    assert wal_pages(tmp_path / "store") <= 2  # and the rest when it closed (but a partial last page)


def test_a_delete_before_the_store_opened_is_refused_and_forgets_nothing(tmp_path):
    """A node just restarted, its store not open yet, is asked to delete a ledger (a peer's cut): refused — writing
    the deleted ledgers then would write over the ones deleted in its earlier life, and their entries, whose
    segments were removed, would make the next start fail."""
    async def first_life():
        s = LedgerStore(str(tmp_path), segment_bytes=4096)
        await s.open()
        await s.append(ledger_id(4, 1), 1, 0, 3, b"kept")
        await s.delete([ledger_id(4, 0), ledger_id(1, 0)])
        await s.close()

    async def second_life():
        s = LedgerStore(str(tmp_path), segment_bytes=4096)
        with pytest.raises(FailedPrecondition, match="not open"):
            await s.delete([ledger_id(1, 1)])
        await s.open()
        try:
            return [lid for lid in (ledger_id(4, 0), ledger_id(1, 0), ledger_id(1, 1)) if lid in s.deleted]
        finally:
            await s.close()

    run(first_life())
    assert run(second_life()) == [ledger_id(4, 0), ledger_id(1, 0)]


def test_a_store_written_before_reads_its_borrowed_entries_as_they_were(tmp_path):
    """Stores written before kept a BORROWED record of each entry the node journal held: they still read back, and
    those whose node journal record a crash lost (past the end it recovered: never answered) are dropped."""
    bodies = [b"%03d" % i * 300 for i in range(8)]

    async def write_as_before() -> int:
        node = await _node_journal(tmp_path)
        s = LedgerStore(str(tmp_path), node=node)
        await s.open()
        await s.submit(4, 1, 0, 1, bodies[0])  # (the first entry, whole)
        cut = 0
        for i, body in enumerate(bodies[1:], 1):
            log, offset, at, end = _commit(node, 4, 1, body)
            ref = ledger_store.BORROWED_WHERE.pack(4, i, at, end - at, log, offset)
            s.writer.append(4, 1, ledger_store.BORROWED, [ref])
            cut = cut or (at if i == 6 else 0)
        await node.wait_durable(node.tail)
        await s.writer.wait_durable(s.writer.tail)
        await s.close()
        await node.close()
        return cut

    async def reread():
        node = await _node_journal(tmp_path)
        s = LedgerStore(str(tmp_path), node=node)
        await s.open()
        assert s.held(4) == 6 and [e.body for e in s.read(4, 0, 8)] == bodies[:6]
        assert s.journal_floor() is not None
        await s.close()
        await node.close()

    cut = run(write_as_before())
    wal = tmp_path / "wal"
    (segment,) = [wal / f for f in os.listdir(wal) if f.endswith(".wal")]
    os.truncate(segment, cut - int(os.path.basename(segment).split(".")[0]) + 5)  # a torn record at entry 6
    run(reread())
