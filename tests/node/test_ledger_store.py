"""The storage role's ledger store (pigeon.node.ledger_store) on real files: entries answered once durable and
read back in order, also after a restart; dense entries (a gap refused, a retry answered); a fence that is durable,
survives a restart and refuses the old writer while recovery's copies are still taken; and the node's own
journal is a different one."""

from __future__ import annotations

import asyncio
import os

import pytest

from pigeon.core.errors import FailedPrecondition
from pigeon.node.ledger_store import FENCE_EPOCH, LedgerStore


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
