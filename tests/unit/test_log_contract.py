"""The Log contract (storage.log), one suite against every implementation: the simulated log, a log of the
journal over the simulated disk (crashes lose what was not synced), and a log of the journal over real files."""

from __future__ import annotations

import random

import pytest

from pigeon.node.disk import OsDisk
from pigeon.storage.log import Fenced
from pigeon.testing.sync_journal import SyncJournal
from pigeon.testing.simdisk import SimDisk
from pigeon.testing.simlog import SimLog

T = 7  # a record type (any byte the broker does not care about here)


class SimHarness:
    def __init__(self, tmp_path):
        self.log = SimLog(3)

    def sync(self):
        self.log.sync()

    def restart(self, crash: bool):
        if crash:
            self.log.crash()
        else:
            self.log.sync()


class JournalHarness:
    def __init__(self, disk, directory):
        self.disk = disk
        self.sj = SyncJournal(disk, directory)
        self.log = self.sj.log(3)
        self.other = self.sj.log(4)  # a second log sharing the journal

    def sync(self):
        self.sj.commit()

    def restart(self, crash: bool):
        if crash and isinstance(self.disk, SimDisk):
            self.sj.write()  # written, not synced: what a crash of the machine takes
            self.disk.crash(random.Random(1))
        elif crash:  # real files: a killed process (what was written stays, the rest never came)
            self.sj.write()
        else:
            self.sj.commit()
        self.sj = self.sj.reopen()
        self.log, self.other = self.sj.log(3), self.sj.log(4)


@pytest.fixture(params=["sim", "journal-simdisk", "journal-files"])
def h(request, tmp_path):
    if request.param == "sim":
        return SimHarness(tmp_path)
    if request.param == "journal-simdisk":
        return JournalHarness(SimDisk(), "/data")
    return JournalHarness(OsDisk(), str(tmp_path))


def bodies(log, start=0, end=1 << 30):
    return [(e.offset, e.epoch, e.body) for e in log.read(start, end)]


def test_offsets_are_dense_from_zero_and_reads_see_only_durable_entries(h):
    assert [h.log.append(1, T, [b"e%d" % i])[0] for i in range(3)] == [0, 1, 2]
    assert h.log.end() == 3 and h.log.durable() == 0
    assert bodies(h.log) == []
    h.sync()
    assert h.log.durable() == 3
    assert bodies(h.log) == [(0, 1, b"e0"), (1, 1, b"e1"), (2, 1, b"e2")]
    assert bodies(h.log, 1, 2) == [(1, 1, b"e1")]


def test_on_durable_answers_once_the_entry_is_covered(h):
    heard = []
    off, _ = h.log.append(1, T, [b"x"])
    h.log.on_durable(off, heard.append)
    assert heard == []
    h.sync()
    assert heard == [None]
    h.log.on_durable(off, heard.append)  # already durable: at once
    assert heard == [None, None]
    with pytest.raises(ValueError):
        h.log.on_durable(99, heard.append)


def test_a_fenced_epoch_appends_nothing(h):
    h.log.append(1, T, [b"a"])
    assert h.log.fence(2) == 1
    with pytest.raises(Fenced):
        h.log.append(1, T, [b"late"])
    assert h.log.append(2, T, [b"b"])[0] == 1
    assert h.log.append(3, T, [b"c"])[0] == 2
    h.sync()
    assert [b for _, _, b in bodies(h.log)] == [b"a", b"b", b"c"]


def test_truncate_drops_entries_for_every_reader_and_offsets_go_on_from_there(h):
    for i in range(4):
        h.log.append(1, T, [b"old%d" % i])
    h.sync()
    h.log.truncate(1)
    assert h.log.end() == 2 and h.log.durable() == 2
    assert h.log.append(1, T, [b"new2"])[0] == 2
    h.sync()
    assert bodies(h.log) == [(0, 1, b"old0"), (1, 1, b"old1"), (2, 1, b"new2")]


def test_statistics_are_plain_values(h):
    h.log.append(5, T, [b"abc"])
    h.sync()
    st = h.log.statistics()
    assert (st.log_id, st.epoch, st.end, st.durable, st.entries) == (3, 5, 1, 1, 1)
    assert st.bytes >= 3


@pytest.mark.parametrize("crash", [False, True])
def test_after_a_restart_the_durable_entries_and_the_fence_remain(h, crash):
    h.log.append(1, T, [b"kept"])
    h.log.fence(2)
    h.sync()
    h.log.append(2, T, [b"maybe"])
    h.restart(crash)
    got = [b for _, _, b in bodies(h.log)]
    assert got[:1] == [b"kept"]
    assert got in ([b"kept"], [b"kept", b"maybe"])
    if crash and isinstance(h, JournalHarness) and isinstance(h.disk, SimDisk):
        assert got == [b"kept"]  # not synced: the crash took it
    assert h.log.end() == len(got)
    with pytest.raises(Fenced):
        h.log.append(1, T, [b"zombie"])


def test_logs_of_one_journal_keep_their_own_offsets(h):
    if not isinstance(h, JournalHarness):
        pytest.skip("one log only")
    h.log.append(1, T, [b"a"])
    h.other.append(1, T, [b"x"])
    h.log.append(1, T, [b"b"])
    h.sync()
    assert bodies(h.log) == [(0, 1, b"a"), (1, 1, b"b")]
    assert bodies(h.other) == [(0, 1, b"x")]
    h.restart(crash=False)
    assert (h.log.end(), h.other.end()) == (2, 1)
