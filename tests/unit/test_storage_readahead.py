"""storage.readahead: the plan the read-ahead thread follows — a window ahead of the reader, never past what is
durable, starting over only where the reader jumped, skipping a segment that is gone."""

from pigeon.core import limits
from pigeon.storage.readahead import Window

MB = 1 << 20


def test_reads_in_chunks_up_to_the_window_and_what_is_durable():
    w = Window(4 * MB)
    w.reader_at(0)
    assert w.next_read(0, 100 * MB, [0]) == (0, 0, 0, limits.read_ahead_chunk_bytes)
    assert w.next_read(4 * MB - 10, 100 * MB, [0]) == (4 * MB - 10, 0, 4 * MB - 10, 10)  # the window's end
    assert w.next_read(2 * MB, 2 * MB + 5, [0]) == (2 * MB, 0, 2 * MB, 5)  # durable ends sooner
    assert w.next_read(4 * MB, 100 * MB, [0])[3] == 0 and w.caught_up(4 * MB)


def test_a_read_stops_at_its_segments_end():
    w = Window(8 * MB)
    w.reader_at(0)
    assert w.next_read(3 * MB - 100, 100 * MB, [0, 3 * MB]) == (3 * MB - 100, 0, 3 * MB - 100, 100)
    assert w.next_read(3 * MB, 100 * MB, [0, 3 * MB]) == (3 * MB, 3 * MB, 0, limits.read_ahead_chunk_bytes)


def test_a_reader_a_little_behind_keeps_the_window_a_jump_starts_it_over():
    w = Window(4 * MB)
    w.reader_at(10 * MB)
    assert w.settled(10 * MB) and w.settled(7 * MB)  # a little behind: another shard's batch
    assert not w.settled(13 * MB)  # past the middle: move on
    w.reader_at(13 * MB)
    assert (w.lo, w.hi, w.jumped) == (10 * MB, 17 * MB, True)
    w.next_read(10 * MB, 100 * MB, [0])
    w.reader_at(50 * MB)  # a jump
    assert w.next_read(14 * MB, 100 * MB, [0]) == (50 * MB, 0, 50 * MB, limits.read_ahead_chunk_bytes)


def test_a_deleted_segment_is_skipped():
    w = Window(8 * MB)
    w.reader_at(0)
    assert w.next_read(0, 100 * MB, [5 * MB]) == (5 * MB, -1, 0, 0)  # before the oldest segment: go on there
