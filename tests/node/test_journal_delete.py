"""Deleting the journal's old segments (pigeon.node.journal_writer.JournalWriter.delete_before) on real files: the
segments stop being the journal's at once, and their files are removed — unlinked, the directory synced — by
a thread, never by the event loop (an unlink of a 64 MB segment took the filesystem ~17 ms here, a stall for every
stream and publish of the node); the files are gone once the call returns."""

from __future__ import annotations

import asyncio
import os
import threading

from pigeon.node.disk import OsDisk
from pigeon.node.journal_writer import JournalWriter


def test_old_segments_are_removed_by_a_thread_and_gone_when_the_call_returns(tmp_path, monkeypatch):
    removed_by = []
    remove = OsDisk.remove

    def recorded(self, path):
        removed_by.append(threading.current_thread())
        return remove(self, path)
    monkeypatch.setattr(OsDisk, "remove", recorded)

    async def go():
        wal = tmp_path / "wal"
        os.makedirs(wal)
        w = JournalWriter(str(wal), "always", 4096)  # 4 KiB segments: the appends cross several
        w.open(0, {})
        for i in range(40):
            w.append(1, 1, 3, [b"%03d" % i * 300])
        await w.wait_durable(w.tail)
        files = sorted(os.listdir(wal))
        assert len(files) > 3
        starts = list(w.journal.starts)
        gone = await w.delete_before(starts[-2])
        assert gone == starts[:-2] and w.journal.starts == starts[-2:]
        assert sorted(os.listdir(wal)) == files[-2:], "the files are gone once the call returned"
        assert removed_by and threading.current_thread() not in removed_by, "removed by a thread, not the loop"
        await w.close()

    asyncio.run(go())
