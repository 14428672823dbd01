"""A big entry is written from its parts (limits.gather_bytes_min, record.entry_buffers), not copied into
one record first: the bytes on disk are exactly the joined record's, recovery reads it back, a full disk keeps and
writes it again, and a part that could still change (a bytearray) is copied at once as before."""

from __future__ import annotations

from pigeon.core import limits
from pigeon.storage import record
from pigeon.testing.sync_journal import SyncJournal
from pigeon.testing.simdisk import SimDisk

BIG = limits.gather_bytes_min + 123


def _files(disk: SimDisk, written: int) -> bytes:
    """The journal's first `written` bytes; only the zeros reserved ahead of the writer may follow them."""
    data = b"".join(bytes(f.data) for p, f in sorted(disk.files.items()) if "/wal/" in p)
    assert not data[written:].strip(b"\0")
    return data[:written]


def test_a_big_entry_written_from_its_parts_is_the_joined_record_byte_for_byte():
    disk = SimDisk()
    sj = SyncJournal(disk, "/data")
    body = bytes(range(256)) * (BIG // 256 + 1)
    view = memoryview(b"head" + body)[4:]  # a read-only view into a request, as the API hands it on
    sj.append(7, 1, 1, [b"small", view])
    sj.append(7, 1, 2, [b"tiny"])
    assert sj.commit()
    want = record.encode_entry(1, 7, 1, 0, [b"small", body]) + record.encode_entry(2, 7, 1, 1, [b"tiny"])
    assert _files(disk, len(want)) == want
    got = sj.reopen().recovered.target.entries
    assert [(t, b) for _, t, b in got] == [(1, b"small" + body), (2, b"tiny")]


def test_a_full_disk_keeps_a_gathered_entry_and_writes_it_again():
    disk = SimDisk()
    sj = SyncJournal(disk, "/data")
    body = b"x" * BIG
    disk.space = sum(len(f.data) for f in disk.files.values()) + BIG // 2  # half of it fits
    sj.append(3, 1, 1, [body])
    assert not sj.commit(), "the disk is full: nothing more is durable"
    disk.space = None
    assert sj.commit()
    assert [(t, b) for _, t, b in sj.reopen().recovered.target.entries] == [(1, body)]


def test_a_part_that_may_change_is_copied_when_appended():
    disk = SimDisk()
    sj = SyncJournal(disk, "/data")
    buf = bytearray(b"a" * BIG)
    sj.append(3, 1, 1, [buf])
    buf[:] = b"b" * BIG  # a caller reusing its buffer before the writer ran
    assert sj.commit()
    assert [b for _, _, b in sj.reopen().recovered.target.entries] == [b"a" * BIG]
