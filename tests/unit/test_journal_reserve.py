"""The active segment is reserved ahead of its writes (limits.segment_reserve_bytes): zeros after the last record
are where the records end, for recovery and every scanner, never a broken record; a crash undoes the writes into
the reserve that no sync covered (and, torn, keeps part of them); a segment the writer leaves, and every segment
recovery finds, is cut back to its records; a disk without room for a reserve still takes the write."""

from __future__ import annotations

import random

from pigeon.core import limits
from pigeon.storage import record
from pigeon.storage.journal import segment_name
from pigeon.testing.sync_journal import SyncJournal
from pigeon.testing.simdisk import SimDisk

WAL = "/data/wal"


def _wal(disk: SimDisk) -> dict[int, bytes]:
    return {int(p.rsplit("/", 1)[1][:-4]): bytes(f.data) for p, f in sorted(disk.files.items()) if "/wal/" in p}


def _bodies(sj: SyncJournal) -> list[bytes]:
    return [b for _, _, b in sj.recovered.target.entries]


def _one_committed(body: bytes) -> tuple[SimDisk, SyncJournal]:
    disk = SimDisk()
    sj = SyncJournal(disk, "/data")
    sj.append(3, 1, 1, [body])
    assert sj.commit()
    return disk, sj


def test_the_active_segment_is_reserved_and_recovery_cuts_the_zeros_off_without_a_report():
    disk = SimDisk()
    sj = SyncJournal(disk, "/data", segment_bytes=1 << 20)
    for i in range(10):
        sj.append(3, 1, 1, [b"entry %d" % i])
    assert sj.commit()
    (data,) = _wal(disk).values()
    tail = sj.journal.tail
    assert len(data) == 1 << 20 > tail, "reserved up to the segment's size"
    assert not data[tail:].strip(b"\0")
    sj = sj.reopen()
    assert _bodies(sj) == [b"entry %d" % i for i in range(10)]
    assert sj.recovered.report.clean, sj.recovered.report.lines()
    assert sj.recovered.tail == tail
    (data,) = _wal(disk).values()
    assert len(data) == tail, "recovery left only the records"


def test_a_crash_undoes_unsynced_writes_into_the_reserve():
    disk, sj = _one_committed(b"durable")
    durable_tail = sj.journal.tail
    sj.append(3, 1, 1, [b"written, never synced"])
    assert sj.write()
    (data,) = _wal(disk).values()
    assert b"never synced" in data
    disk.crash()
    (data,) = _wal(disk).values()
    assert not data[durable_tail:].strip(b"\0"), "the reserved zeros are back where the unsynced write went"
    sj = SyncJournal(disk, "/data")
    assert _bodies(sj) == [b"durable"]
    assert sj.recovered.report.clean


def test_a_torn_write_into_the_reserve_is_cut_at_the_broken_record_and_counts_only_written_bytes():
    rng = random.Random(5)
    torn = 0
    for _ in range(30):
        disk, sj = _one_committed(b"durable")
        for i in range(3):
            sj.append(3, 1, 1, [b"unsynced %d " % i * 20])
        assert sj.write()
        disk.crash(rng, torn=True)
        sj = SyncJournal(disk, "/data")
        bodies = _bodies(sj)
        assert bodies[0] == b"durable" and bodies[1:] == [b"unsynced %d " % i * 20 for i in range(len(bodies) - 1)]
        one = len(record.encode_entry(1, 3, 1, 0, [b"unsynced 0 " * 20]))
        for path, at, dropped, _ in sj.recovered.report.broken:
            torn += 1
            assert 0 < dropped < one, "the bytes of the torn record, not the reserve after it"
        (data,) = _wal(disk).values()
        assert len(data) == sj.recovered.tail
    assert torn > 10, "most crashes tore a record"


BODIES = [b"%03d" % i + b"x" * 200 for i in range(40)]


def _over_segments() -> tuple[SimDisk, SyncJournal]:
    """Small segments, an entry committed at a time: the writer leaves a segment every ~20 entries."""
    disk = SimDisk()
    sj = SyncJournal(disk, "/data", segment_bytes=4096)
    for body in BODIES:
        sj.append(3, 1, 1, [body])
        assert sj.commit()
    return disk, sj


def test_the_segment_the_writer_leaves_is_cut_back_to_its_records():
    disk, sj = _over_segments()
    files = _wal(disk)
    starts = sorted(files)
    assert len(starts) >= 3
    for start, nxt in zip(starts, starts[1:]):
        assert start + len(files[start]) == nxt, "a left segment ends where the next begins"
    assert len(files[starts[-1]]) > sj.journal.tail - starts[-1], "the active one is reserved"
    assert _bodies(sj.reopen()) == BODIES


def test_recovery_reads_past_a_left_segment_that_kept_its_reserve():
    """A crash between the sync of a segment the writer left and its cut: its zeros end it, the next one goes on."""
    disk, sj = _over_segments()
    first = min(_wal(disk))
    disk.files[f"{WAL}/{segment_name(first)}"].data += bytes(3000)  # as if the cut never happened
    sj = sj.reopen()
    assert _bodies(sj) == BODIES
    assert sj.recovered.report.clean, sj.recovered.report.lines()
    files = _wal(disk)
    starts = sorted(files)
    assert all(s + len(files[s]) == n for s, n in zip(starts, starts[1:])), "cut back by recovery"


def test_a_byte_after_the_zeros_is_a_broken_record_not_reserved_space():
    disk, sj = _one_committed(b"kept")
    tail = sj.journal.tail
    (path,) = [p for p in disk.files if "/wal/" in p]
    disk.files[path].data[tail + 100] = 7
    sj = sj.reopen()
    assert _bodies(sj) == [b"kept"]
    assert [(at, dropped) for _, at, dropped, _ in sj.recovered.report.broken] == [(tail, 101)]


def test_without_room_for_a_reserve_the_write_still_goes_to_disk():
    disk = SimDisk()
    sj = SyncJournal(disk, "/data")
    used = sum(len(f.data) for f in disk.files.values())
    disk.space = used + 1000  # room for the entry, not for a reserve
    sj.append(3, 1, 1, [b"fits" * 10])
    assert sj.commit()
    assert sum(len(f.data) for f in disk.files.values()) < used + 1000
    sj.append(3, 1, 1, [b"fits too"])
    assert sj.commit()
    assert _bodies(sj.reopen()) == [b"fits" * 10, b"fits too"]


def test_every_scanner_reads_zeros_as_the_end():
    enc = record.encode(1, b"payload")
    it = record.scan(enc + bytes(4096), 1 << 20)
    got = []
    try:
        while True:
            got.append(bytes(next(it)[2]))
    except StopIteration as stop:
        assert stop.value == (len(enc), None)
    assert got == [b"payload"]


def test_a_big_write_appends_without_a_reserve():
    """Converting reserved blocks costs the kernel CPU per group commit: big writes, where the fdatasync's length
    update is a small share, append as before."""
    disk, sj = _one_committed(b"b" * (limits.reserved_write_bytes_max + 1))
    (data,) = _wal(disk).values()
    assert len(data) == sj.journal.tail, "nothing reserved"
    sj.append(3, 1, 1, [b"small"])
    assert sj.commit()
    (data,) = _wal(disk).values()
    assert len(data) > sj.journal.tail, "a small write after it is reserved for"
