"""The journal writer on a disk that fills up (a simulated disk with a space budget, the real writer thread):
what did not fit is cut back — no partly written entry stays — and kept; nobody waiting is answered; publishes
are refused; when space returns the writer goes on by itself and every entry is on disk, in order."""

from __future__ import annotations

import asyncio

import pytest

from pigeon.core import limits
from pigeon.core.errors import ResourceExhausted
from pigeon.node.journal_writer import JournalWriter
from pigeon.storage.records import TopicDel
from pigeon.testing.simdisk import SimDisk


async def _until(cond, seconds: float) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not cond() and loop.time() < end:
        await asyncio.sleep(0.02)
    return cond()


@pytest.mark.parametrize("policy", ["always", "batch"])
def test_a_full_disk_keeps_what_it_could_not_write_and_goes_on_when_space_returns(monkeypatch, policy):
    monkeypatch.setattr(limits, "disk_full_retry_s", 0.05)
    monkeypatch.setattr(limits, "disk_free_check_s", 0.0)

    async def go():
        disk = SimDisk()
        disk.makedirs("/wal")
        w = JournalWriter("/wal", policy, 1 << 12, disk=disk)  # 4 KiB segments: the fill crosses several
        w.open(0, {})
        first = w.append(0, 1, TopicDel.TYPE, TopicDel(0).parts())[1]
        await w.wait_durable(w.tail)
        disk.space = 5_000 + 37  # an entry is cut in the middle when the space runs out
        ends = []
        for i in range(1, 200):
            w.append(0, 1, TopicDel.TYPE, TopicDel(i).parts())
            ends.append(w.tail)
        waiting = w.wait_durable(ends[-1])
        assert await _until(lambda: w.statistics().enospc > 0, 5)
        assert not waiting.done()
        assert w.durable < ends[-1]
        with pytest.raises(ResourceExhausted, match="disk of /wal is full"):
            w.check_publish()
        on_disk = sum(len(f.data) for f in disk.files.values())
        assert on_disk == w.durable - first  # cut back to what was acknowledged: no partial entry
        disk.space = None  # space returns
        await asyncio.wait_for(waiting, 10)
        assert w.durable == w.tail
        offsets = [e.offset for e in w.journal.entries(0, 0, 1000)]
        assert offsets == list(range(200))  # every entry, once, in order
        w.check_publish()  # accepted again
        stats = w.statistics()
        assert stats.space.refused == 1 and stats.failed == ""
        await w.close()

    asyncio.run(go())


def test_a_full_disk_at_fdatasync_keeps_each_entry_once(monkeypatch):
    """fdatasync may fail with ENOSPC after the write went through (delayed allocation): the batch is then both
    written and among those kept since the last answer, and must be written again once, not twice."""
    monkeypatch.setattr(limits, "disk_full_retry_s", 0.05)

    async def go():
        disk = SimDisk()
        disk.makedirs("/wal")
        w = JournalWriter("/wal", "always", 1 << 20, disk=disk)
        w.open(0, {})
        await w.wait_durable(w.append(0, 1, TopicDel.TYPE, TopicDel(0).parts())[1])
        disk.fail["sync"] = 28  # ENOSPC, once
        for i in range(1, 6):
            w.append(0, 1, TopicDel.TYPE, TopicDel(i).parts())
        await asyncio.wait_for(w.wait_durable(w.tail), 10)
        assert w.statistics().enospc == 1
        assert [e.offset for e in w.journal.entries(0, 0, 100)] == list(range(6))
        await w.close()  # (which cuts the space reserved ahead of the writer off)
        assert sum(len(f.data) for f in disk.files.values()) == w.tail  # nothing written twice

    asyncio.run(go())
