"""A journal's group commit (pigeon.node.disk: `commit` and `Post`), compiled and in Python side by side: every
byte written in order whatever the chunks are made of and however many; the fdatasync timed; the loop told how
far, through the eventfd, only once the write and the sync succeeded; a failure raises OSError and tells
nobody."""

from __future__ import annotations

import errno
import os
import time

import pytest

from pigeon.node import disk

TWINS = [pytest.param((disk._PyPost, disk._py_commit), id="python")]
if disk.COMPILED:
    from pigeon.node import _commit

    TWINS.append(pytest.param((_commit.Post, _commit.commit), id="compiled"))


def test_the_install_built_the_compiled_commit():
    assert disk.COMPILED, "pigeon.node._commit was not built: `pip install -e .` needs a C compiler (setup.py)"


@pytest.fixture(params=TWINS)
def twin(request):
    post_type, commit = request.param
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    yield post_type(fd), commit
    os.close(fd)


def _told(post) -> int:
    """How many times the loop was woken since the last look (0: not at all)."""
    try:
        return os.eventfd_read(post.fd)
    except BlockingIOError:
        return 0


def test_every_byte_in_order_from_any_buffers_and_more_than_iov_max_of_them(tmp_path, twin):
    post, commit = twin
    chunks = [b"head", bytearray(b"-mutable-"), memoryview(b"view of bytes").toreadonly()[5:], b"",
              memoryview(bytearray(b"rw view"))]
    chunks += [bytes([i % 251]) * (i % 7) for i in range(3 * os.sysconf("SC_IOV_MAX") + 5)]
    path = tmp_path / "seg"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"before:")
        assert commit(fd, chunks, False, None, 0) == 0  # no sync, nobody told
        assert commit(fd, [b"|second"], True, post, 123) > 0  # the fdatasync's ns
    finally:
        os.close(fd)
    assert path.read_bytes() == b"before:" + b"".join(bytes(c) for c in chunks) + b"|second"


def test_the_loop_is_told_how_far_once_synced_and_the_end_never_goes_back(tmp_path, twin):
    post, commit = twin
    fd = os.open(tmp_path / "seg", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert _told(post) == 0
        before = time.monotonic_ns()
        commit(fd, [b"x" * 100], True, post, 100)
        after = time.monotonic_ns()
        assert _told(post) == 1 and post.end == 100 and (post.told, post.syncs) == (1, 1)
        assert before <= post.synced_ns <= after  # the hop stamp: when fdatasync returned
        commit(fd, [b"y"], True, post, 101)
        commit(fd, [b"z"], False, post, 102)  # (fsync=batch and never tell what is written)
        assert _told(post) == 2 and post.end == 102  # two wake-ups, read at once: the latest end stands
        assert (post.told, post.syncs) == (3, 2)  # counted with the end, before the wake-up
        commit(fd, [b""], False, post, 50)
        assert _told(post) == 1 and post.end == 102
        post.asked += 1  # one ask since the batch was taken: not a load, told at once
        commit(fd, [b"v"], True, post, 103)
        assert _told(post) == 1 and (post.end, post.told, post.syncs) == (103, 5, 3)
        post.asked += 1  # a second: the caller tells, once it holds the GIL
        before = time.monotonic_ns()
        commit(fd, [b"w"], True, post, 104)
        assert _told(post) == 0 and (post.end, post.told, post.syncs) == (103, 5, 3)
        assert post.synced_ns >= before
        post.tell(104, True, post.synced_ns)
        assert _told(post) == 1 and (post.end, post.told, post.syncs) == (104, 6, 4)
    finally:
        os.close(fd)


def test_a_failed_write_or_sync_raises_and_tells_nobody(tmp_path, twin):
    post, commit = twin
    fd = os.open(tmp_path / "seg", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    with pytest.raises(OSError) as e:
        commit(fd, [b"lost"], True, post, 10)  # a closed descriptor: the write fails
    assert e.value.errno == errno.EBADF
    r, w = os.pipe()
    try:
        with pytest.raises(OSError) as e:
            commit(w, [b"written"], True, post, 20)  # a pipe takes the bytes, and cannot be synced
        assert e.value.errno == errno.EINVAL
        assert os.read(r, 100) == b"written"
    finally:
        os.close(r)
        os.close(w)
    assert _told(post) == 0 and (post.end, post.told, post.syncs) == (0, 0, 0)


@pytest.mark.parametrize("which", [p.id for p in TWINS])
def test_a_short_write_goes_on_from_where_it_stopped(tmp_path, which):
    """The kernel may write part of a writev (here: a file-size limit reached part of the way through a chunk,
    the next write refused): what came before is written whole and in order, then the error, and nobody told.
    (In a process of its own: the limit and the signal it sends are the process's.)"""
    import subprocess
    import sys

    path = tmp_path / "seg"
    code = f"""
import os, resource, signal, sys
from pigeon.node import disk
post_type, commit = (disk._PyPost, disk._py_commit) if {which!r} == "python" else (disk.Post, disk._commit_io)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
post = post_type(os.eventfd(0, os.EFD_NONBLOCK))
fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT, 0o644)
try:
    commit(fd, [bytes([i]) * 300 for i in range(5)], True, post, 1500)
except OSError as e:
    print(e.errno, post.end)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [str(errno.EFBIG), "0"], out.stderr
    assert path.read_bytes() == b"".join(bytes([i]) * 300 for i in range(5))[:1000]


# --- the lane: placed batches written by a thread that never takes the GIL ------------------------------------------

needs_lane = pytest.mark.skipif(disk.Lane is None, reason="pigeon.node._commit was not built")


def _lane_run(lane):
    """`lane.run()` on a thread of its own (as the journal's writer runs it); the result once it returns."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1)
    fut = pool.submit(lane.run)
    pool.shutdown(wait=False)
    return fut


@needs_lane
def test_a_lane_writes_its_jobs_in_order_and_tells_once_synced(tmp_path):
    post = disk.Post(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
    lane = disk.Lane(post)
    path = tmp_path / "seg"
    lane.fd = fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        running = _lane_run(lane)
        lane.push([b"one", bytearray(b"-two")], False, 7)  # nobody waits: written, not told
        deadline = time.monotonic() + 10
        while lane.written_id < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert lane.written_id == 1 and path.read_bytes() == b"one-two"
        assert _told(post) == 0 and post.end == 0 and post.told == 0
        lane.push([memoryview(b"|three").toreadonly()], True, 13)  # waited for: synced, then told
        while not post.told and time.monotonic() < deadline:
            time.sleep(0.001)
        assert _told(post) == 1 and post.end == 13 and post.syncs == 1 and post.synced_ns > 0
        assert lane.rounds == 2 and lane.bytes_written == 13 and lane.sync_histogram()[-1] == 1  # (cumulative)
        lane.push([], True, 13)  # a sync with nothing new (a lazy flush)
        while post.told < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert post.syncs == 2
        lane.reap()  # the buffers of the written jobs let go
        lane.python()
        assert running.result(10) == disk.LANE_PYTHON
        running = _lane_run(lane)
        lane.push([b"|four"], True, 18, 4096)  # with a reservation ahead of it
        while post.told < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        lane.stop()
        assert running.result(10) == disk.LANE_STOPPED
        assert os.fstat(fd).st_size == 4096 and lane.reserve_errno == 0
    finally:
        os.close(fd)
        os.close(post.fd)
    assert path.read_bytes()[:18] == b"one-two|three|four"


@needs_lane
def test_a_lane_on_a_full_disk_fails_the_round_and_tells_nobody(tmp_path):
    post = disk.Post(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
    lane = disk.Lane(post)
    lane.fd = fd = os.open("/dev/full", os.O_WRONLY)
    try:
        lane.push([b"x" * 100], False, 100)
        lane.push([b"y" * 100], True, 200)
        assert _lane_run(lane).result(10) == disk.LANE_FAILED
        assert lane.errno_failed == errno.ENOSPC and lane.failed == 1  # the round's first job
        assert _told(post) == 0 and post.told == 0 and post.end == 0 and lane.written_id == 0
        lane.clear()  # the writer hands the entries to the journal again
        assert lane.failed == -1 and lane.errno_failed == 0
    finally:
        os.close(fd)
        os.close(post.fd)
