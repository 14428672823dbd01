"""Reading a range of a log's entries back (storage.journal.Journal.entries) stops once the log is past the range —
instead of reading every record to the journal's end, which made reading a ledger back in chunks take time
quadratic in the journal's size — and still gives the entry a truncation replaced, also after a restart."""

from __future__ import annotations

from pigeon.testing.sync_journal import SyncJournal
from pigeon.testing.simdisk import SimDisk


def _counting(sj: SyncJournal) -> list[int]:
    """Count the records the journal reads from now on."""
    seen: list[int] = []
    read_record = sj.journal.read_record

    def counted(pos):
        seen.append(pos)
        return read_record(pos)

    sj.journal.read_record = counted
    return seen


def test_a_range_is_read_without_the_rest_of_the_journal():
    sj = SyncJournal(SimDisk(), "/data", segment_bytes=1 << 30)
    for i in range(1000):
        sj.append(1, 1, 3, [b"one-%d" % i])
        sj.append(2, 1, 3, [b"two-%d" % i])  # another log interleaved, as ledgers share a member's journal
    assert sj.commit()
    seen = _counting(sj)
    got = list(sj.journal.entries(1, 10, 20))
    assert [e.body for e in got] == [b"one-%d" % i for i in range(10, 20)]
    assert len(seen) <= 2 * 21  # the records up to the first entry of log 1 past the range, not 2,000
    seen.clear()
    assert [e.offset for e in sj.journal.entries(2, 990, 2000)] == list(range(990, 1000))  # to the end


def test_an_entry_a_truncation_replaced_is_read_instead_also_after_a_restart():
    sj = SyncJournal(SimDisk(), "/data")
    for i in range(10):
        sj.append(1, 1, 3, [b"old-%d" % i])
    sj.journal.truncate(1, 4)  # offsets 5..9 dropped; the next appends take them again
    for i in range(5, 8):
        sj.append(1, 1, 3, [b"new-%d" % i])
    assert sj.commit()
    for j in (sj, sj.reopen()):
        assert [e.body for e in j.journal.entries(1, 3, 8)] == [b"old-3", b"old-4", b"new-5", b"new-6", b"new-7"]
        assert [e.body for e in j.journal.entries(1, 6, 7)] == [b"new-6"]
        assert list(j.journal.entries(1, 8, 10)) == []  # dropped, never written again


def test_a_log_read_in_order_range_by_range_reads_each_record_about_once():
    sj = SyncJournal(SimDisk(), "/data", segment_bytes=1 << 30)  # one segment: its first entry is the only sample
    for i in range(1000):
        sj.append(1, 1, 3, [b"one-%d" % i])
        sj.append(2, 1, 3, [b"two-%d" % i])
    assert sj.commit()
    seen = _counting(sj)
    got = [e.body for start in range(0, 1000, 10) for e in sj.journal.entries(1, start, start + 10)]
    assert got == [b"one-%d" % i for i in range(1000)]
    assert len(seen) <= 2 * 1000 + 2 * 100  # each record once, and the one a range stopped at again: not 100,000
    sj.journal.truncate(1, 499)  # after a truncation a range is found from the segment's first entry again
    sj.append(1, 1, 3, [b"again-500"])
    assert sj.commit()
    assert [e.body for e in sj.journal.entries(1, 495, 501)] == [b"one-%d" % i for i in range(495, 500)] + \
        [b"again-500"]
