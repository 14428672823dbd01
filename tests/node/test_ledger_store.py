"""The storage role's ledger store (pigeon.node.ledger_store) on real files: entries answered once durable and
read back in order, also after a restart; dense entries (a gap refused, a retry answered); a fence that is durable,
survives a restart and refuses the old writer while recovery's copies are still taken; the node's own
journal is a different one; and the owner's own entries are references into that journal, checked when read."""

from __future__ import annotations

import asyncio
import os

import pytest

from pigeon.core.errors import FailedPrecondition
from pigeon.node.disk import OsDisk
from pigeon.node.journal import FsyncPolicy, JournalWriter
from pigeon.node.ledger_store import FENCE_EPOCH, BrokenReference, LedgerStore
from pigeon.node.replication import LocalAppend
from pigeon.storage import recovery


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
    ledger needs."""
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
        await s.fence(3)  # a kept ledger with a fence and no entry: where its fence lies is not known …
        before = segments()
        assert await s.delete([1]) == 0 and segments() == before, "… so nothing is removed while it is kept"
        removed = await s.delete([3])
        assert removed > 0 and len(segments()) == len(before) - removed
        assert s.read(1, 0, 40) == [] and s.held(1) == 0
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
        await s.close()

    run(write())
    run(reread())


# --- the owner's own entries: references into its node journal ----------------------------------------------
class _Nothing:
    def load(self, header, meta, images) -> None:
        raise ValueError("no checkpoints here")

    def apply(self, rtype, body, at) -> None:
        pass


async def _open_main(path) -> JournalWriter:
    """A node journal as the engine opens it: recovered, then appended to."""
    for sub in ("wal", "checkpoints"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    found = recovery.recover(OsDisk(), str(path), _Nothing, repair=True)
    w = JournalWriter(os.path.join(path, "wal"), FsyncPolicy.always, 4096)
    w.open(found.tail, found.logs)
    return w


async def _record(main: JournalWriter, body: bytes, rtype: int = 1) -> tuple[int, int]:
    """Append a record to the node journal as the engine does; (position, end) once durable."""
    at = main.append(3, 1, rtype, [body])[1]
    end = main.tail
    await main.wait_durable(end)
    return at, end


def test_the_owners_own_entries_are_references_read_from_its_journal_also_after_a_restart(tmp_path):
    bodies = [b"record-%d " % i * 200 for i in range(30)]

    async def write():
        main = await _open_main(tmp_path / "node")
        s = LedgerStore(str(tmp_path))
        await s.open(main)
        refs = [await _record(main, b, rtype=1 + i % 2) for i, b in enumerate(bodies)]
        for i, (at, _) in enumerate(refs):
            await s.submit_ref(9, 1, i, 1 + i % 2, at)
        await s.append(9, 1, len(bodies), 4, b"a copy, not a reference")  # both kinds in one ledger
        got = s.read(9, 0, 40)
        assert [e.body for e in got] == bodies + [b"a copy, not a reference"]
        assert [e.rtype for e in got] == [1 + i % 2 for i in range(30)] + [4]
        assert s.needed_from() == refs[0][0]
        ledger_bytes = sum(os.path.getsize(tmp_path / "ledgers" / "wal" / f)
                           for f in os.listdir(tmp_path / "ledgers" / "wal"))
        assert ledger_bytes < sum(map(len, bodies)) // 10, "a reference is not the record's bytes again"
        assert await s.fence(9) == 31
        await s.close()
        await main.close()
        return refs[0][0]

    async def reread(first: int):
        main = await _open_main(tmp_path / "node")
        s = LedgerStore(str(tmp_path))
        await s.open(main)
        assert s.held(9) == 31 and s.fenced(9)
        assert [e.body for e in s.read(9, 5, 8)] == bodies[5:8]
        assert s.needed_from() == first, "where the node journal must be kept from survives a restart"
        await s.delete([9])
        assert s.needed_from() is None and s.read(9, 0, 40) == []
        await s.close()
        await main.close()

    run(reread(run(write())))


def test_a_reference_to_a_record_no_longer_there_is_not_served(tmp_path):
    async def go():
        main = await _open_main(tmp_path / "node")
        s = LedgerStore(str(tmp_path))
        await s.open(main)
        at, _ = await _record(main, b"x" * 3000)
        await s.submit_ref(4, 1, 0, 1, at)
        assert s.read(4, 0, 1)[0].body == b"x" * 3000
        with open(main.journal.locate(at)[0], "r+b") as f:  # the record damaged in place
            f.seek(main.journal.locate(at)[1] + 100)
            f.write(b"y")
        with pytest.raises(BrokenReference, match="entry 0 of ledger 4"):
            s.read(4, 0, 1)
        with pytest.raises(FailedPrecondition, match="takes no references"):
            LedgerStore(str(tmp_path / "other")).submit_ref(4, 1, 1, 1, at)
        await s.close()
        await main.close()

    run(go())


def test_the_local_member_stores_references_in_order_once_the_journal_has_the_records(tmp_path):
    """LocalAppend: an entry with its record in the node journal is stored as a reference once that record is
    durable; an entry without one (a snapshot the owner writes only to its ledger) waits behind it, so the ledger
    stays dense; the answers come in order."""
    async def go():
        main = await _open_main(tmp_path / "node")
        s = LedgerStore(str(tmp_path))
        await s.open(main)
        local = LocalAppend(s)
        at = main.append(3, 1, 1, [b"first"])[1]  # not yet durable when sent
        local.send(6, 1, 0, 1, b"first", (at, main.tail))
        local.send(6, 1, 1, 11, b"a snapshot, stored whole")
        at2 = main.append(3, 1, 2, [b"third"])[1]
        local.send(6, 1, 2, 2, b"third", (at2, main.tail))
        answers = local.answers()
        assert [await anext(answers) for _ in range(3)] == [(0, ""), (1, ""), (2, "")]
        assert [(e.rtype, e.body) for e in s.read(6, 0, 3)] == [
            (1, b"first"), (11, b"a snapshot, stored whole"), (2, b"third")]
        await s.fence(6)
        at3 = main.append(3, 1, 1, [b"late"])[1]
        local.send(6, 1, 3, 1, b"late", (at3, main.tail))
        assert (await anext(answers))[1].startswith("ledger 6 is fenced")
        local.close()
        await s.close()
        await main.close()

    run(go())
