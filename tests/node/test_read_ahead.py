"""The read-ahead thread: it reads the log ahead of the reader, across segment files, never past what is
durable nor past its window, starts over where the reader jumped, and goes on past a segment deleted under it.
The waits below bound how long a thread may take to catch up; nothing is timed."""

import os
import time

from pigeon.node import readahead
from pigeon.storage.readahead import Window
from pigeon.storage.journal import segment_name


def segment_path(directory: str, start: int) -> str:
    return os.path.join(directory, segment_name(start))


SEG = 256 * 1024


def _log(directory, segments: int) -> list[int]:
    starts = []
    for i in range(segments):
        with open(segment_path(str(directory), i * SEG), "wb") as f:
            f.write(os.urandom(SEG))
        starts.append(i * SEG)
    return starts


def _read_ahead(directory, starts: list[int], durable) -> readahead.ReadAhead:
    return readahead.ReadAhead(starts, durable, lambda seg: segment_path(str(directory), seg))


def _until(cond, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "the read-ahead thread did not get there"
        time.sleep(0.005)


def test_reads_ahead_across_segments_up_to_what_is_durable(tmp_path):
    starts = _log(tmp_path, 4)
    durable = [3 * SEG + 100]
    ra = _read_ahead(tmp_path, starts, lambda: durable[0])
    try:
        ra.ahead_of(SEG // 2)
        _until(lambda: ra.warmed == 3 * SEG + 100)
        durable[0] = 4 * SEG  # the writer made more durable: the window covers it, the thread goes on
        _until(lambda: ra.warmed == 4 * SEG)
        assert ra.fetched == 4 * SEG - SEG // 2
    finally:
        ra.close()


def test_keeps_a_window_ahead_of_the_reader_and_starts_over_where_it_jumps(tmp_path, monkeypatch):
    ra = _read_ahead(tmp_path, _log(tmp_path, 4), lambda: 4 * SEG)
    ra._window = Window(SEG)
    try:
        ra.ahead_of(0)
        _until(lambda: ra.warmed == SEG)
        _until(lambda: not ra._fds)  # its window done: it holds no segment open (one deleted later keeps no space)
        ra.ahead_of(SEG * 3 // 4)  # past the window's middle: it moves on
        _until(lambda: ra.warmed == SEG * 7 // 4)
        ra.ahead_of(3 * SEG)  # a jump forward (a seek): read from there
        _until(lambda: ra.warmed == 4 * SEG)
        ra.ahead_of(0)  # and back (another subscription far behind)
        _until(lambda: ra.fetched == SEG * 7 // 4 + SEG + SEG)
        assert ra.warmed == SEG
    finally:
        ra.close()


def test_a_segment_deleted_under_it_is_skipped(tmp_path):
    starts = _log(tmp_path, 3)
    os.unlink(segment_path(str(tmp_path), 0))  # compacted away while the thread still has it listed
    ra = _read_ahead(tmp_path, starts, lambda: 3 * SEG)
    try:
        ra.ahead_of(0)
        _until(lambda: ra.warmed == 3 * SEG)
        assert ra.fetched == 2 * SEG
    finally:
        ra.close()
