# cython: language_level=3
"""The compiled twin of `pigeon.node.disk`'s group commit: `commit` writes a journal's batch, fdatasyncs it and tells
the event loop — the three without the GIL. The Python twin (`disk._py_commit`) takes the GIL back after each
system call, and in a busy process that costs more than the calls: the thread waits for the event loop's
thread to let go of it, and the loop hears that the batch is durable only after that wait. (On a cluster owner
at 1,000 publishes a second, fdatasync took 0.21–0.24 ms at p50 by the kernel's count and 0.86–0.88 ms by the
writer's.) Owns the rule: the bytes are written in order and whole, or `commit` raises OSError and tells
nobody; `Post.end` only grows, and is set before the eventfd is written.

Not when the loop has asked for more LATER times or more since the batch was taken (`Post.asked` − `Post.seen`):
then the writer tells once it has the GIL back, and takes the next batch while it holds it — the loop answers one
batch's waiters while the disk writes the next. Told at once there, the loop would take the GIL to answer, and
the writer would wait for it to start the next batch: the disk idle while the loop works (publish at 100
messages a request, 6 % less). One ask meanwhile (a publish at a low rate) is not a load: told at once."""

cdef enum:
    LATER = 2  # asks since the batch was taken from which the caller tells (pigeon.node.disk: the same)

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.errno cimport EINTR, EIO, errno
from libc.stdint cimport uint64_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.uio cimport iovec, writev
from posix.unistd cimport fdatasync, write

cdef extern from "<limits.h>":
    int IOV_MAX


cdef class Post:
    """Where a journal's writer tells the event loop how far the journal is written (synced, under
    fsync=always): `end`, then a wake-up on the eventfd `fd`, which the loop watches. With them, counted before
    the wake-up so that the loop's statistics agree with what it was told: `told` (group commits told of) and
    `syncs` (of which fdatasync'd). `synced_ns`: when the last fdatasync returned (CLOCK_MONOTONIC)."""

    cdef public long long end
    cdef public long long synced_ns
    cdef public long long told
    cdef public long long syncs
    cdef public long long asked  # times the loop asked the writer for more (counted by the loop)
    cdef public long long seen  # … of them, when the writer took its batch (set by the writer)
    cdef readonly int fd

    def __init__(self, int fd):
        self.fd = fd
        self.end = self.synced_ns = self.told = self.syncs = self.asked = self.seen = 0

    def tell(self, long long end, bint synced, long long synced_ns=0):
        """From Python (a disk that is not a file: the simulator's)."""
        cdef uint64_t one = 1
        if end > self.end:
            self.end = end
        self.told += 1
        if synced:
            self.syncs += 1
            self.synced_ns = synced_ns
        write(self.fd, &one, sizeof(one))


cdef inline long long _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000LL + ts.tv_nsec


cdef int _write_all(int fd, iovec* iov, int n) noexcept nogil:
    """0, or the errno of the call that failed. A short write goes on from where it stopped."""
    cdef int i = 0
    cdef ssize_t got
    while i < n:
        got = writev(fd, iov + i, n - i if n - i < IOV_MAX else IOV_MAX)
        if got < 0:
            if errno == EINTR:
                continue
            return errno
        if got == 0:
            return EIO  # a file that takes nothing (a full disk says ENOSPC)
        while got > 0:
            if <size_t>got >= iov[i].iov_len:
                got -= iov[i].iov_len
                i += 1
            else:
                iov[i].iov_base = <char*>iov[i].iov_base + got
                iov[i].iov_len -= got
                got = 0
    return 0


def commit(int fd, list chunks, bint sync, Post post, long long end):
    """Write every byte of `chunks` at `fd`'s position, in order (bytes-like objects, not copied); fdatasync if
    `sync`; then, with `post`, set `post.end` to `end` and wake the loop — unless the loop asked LATER times or
    more since the batch was taken (the caller then calls `post.tell`: `post.told` did not move). The fdatasync's time in ns (0 without)."""
    cdef Py_ssize_t n = len(chunks), i, used = 0
    cdef Py_buffer* views = <Py_buffer*>PyMem_Malloc(n * sizeof(Py_buffer) + 1)
    cdef iovec* iov = <iovec*>PyMem_Malloc(n * sizeof(iovec) + 1)
    cdef int err = 0, efd = -1
    cdef long long t0 = 0, t1 = 0, took = 0
    cdef long long* post_end = NULL
    cdef long long* post_synced = NULL
    cdef long long* post_told = NULL
    cdef long long* post_syncs = NULL
    cdef long long* post_asked = NULL
    cdef long long* post_seen = NULL
    cdef uint64_t one = 1
    cdef int k = 0
    if views == NULL or iov == NULL:
        PyMem_Free(views)
        PyMem_Free(iov)
        raise MemoryError()
    if post is not None:
        efd, post_end, post_synced, post_told, post_syncs = post.fd, &post.end, &post.synced_ns, &post.told, \
            &post.syncs
        post_asked, post_seen = &post.asked, &post.seen
    try:
        for i in range(n):
            PyObject_GetBuffer(chunks[i], &views[used], PyBUF_SIMPLE)
            used += 1
            if views[used - 1].len:
                iov[k].iov_base = views[used - 1].buf
                iov[k].iov_len = views[used - 1].len
                k += 1
        with nogil:
            err = _write_all(fd, iov, k)
            if err == 0 and sync:
                t0 = _now_ns()
                if fdatasync(fd) != 0:
                    err = errno
                t1 = _now_ns()
                took = t1 - t0
            if err == 0 and post_end != NULL:
                if sync:
                    post_synced[0] = t1
                if post_asked[0] - post_seen[0] < LATER:  # (else the caller tells, with the GIL: see above)
                    if end > post_end[0]:
                        post_end[0] = end
                    post_told[0] += 1
                    if sync:
                        post_syncs[0] += 1
                    write(efd, &one, sizeof(one))
    finally:
        for i in range(used):
            PyBuffer_Release(&views[i])
        PyMem_Free(views)
        PyMem_Free(iov)
    if err:
        from os import strerror
        raise OSError(err, strerror(err))
    return took
