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


# --- the lane: a writer thread that never needs the GIL between its wake-up and the loop's ---------------------------

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t*, void*)
    int pthread_mutex_destroy(pthread_mutex_t*)
    int pthread_mutex_lock(pthread_mutex_t*)
    int pthread_mutex_unlock(pthread_mutex_t*)
    int pthread_cond_init(pthread_cond_t*, void*)
    int pthread_cond_destroy(pthread_cond_t*)
    int pthread_cond_wait(pthread_cond_t*, pthread_mutex_t*)
    int pthread_cond_signal(pthread_cond_t*)

cdef extern from "<fcntl.h>" nogil:
    int posix_fadvise(int fd, long offset, long length, int advice)
    int posix_fallocate(int fd, long offset, long length)
    enum: POSIX_FADV_DONTNEED

cdef extern from "<sys/stat.h>" nogil:
    cdef struct stat:
        long st_size
    int fstat(int fd, stat* buf)

cdef enum:
    SYNC_BOUNDS = 10  # buckets of the fdatasync histogram (JournalWriter's SYNC_BUCKETS_MS)
    _STOPPED = 0
    _PYTHON = 1
    _FAILED = 2

STOPPED, PYTHON, FAILED = _STOPPED, _PYTHON, _FAILED  # why Lane.run returned

cdef struct Job:
    Py_buffer* views
    iovec* iov
    int nviews
    int n
    long long nbytes
    long long end
    long long reserve
    long long id
    int sync
    Job* next


cdef void _free_job(Job* j):  # (with the GIL: the buffers' owners are Python objects)
    cdef int i
    for i in range(j.nviews):
        PyBuffer_Release(&j.views[i])
    PyMem_Free(j.views)
    PyMem_Free(j.iov)
    PyMem_Free(j)


cdef class Lane:
    """A journal's group commits handed to its writer thread already placed. The event loop, holding the GIL
    anyway, takes the entries and places them (`push`: the chunks of one segment, the position after them,
    whether somebody waits); the writer thread runs `run`, which waits, writes every job handed since its last
    round with one writev each, fdatasyncs once if any of them is waited for, and tells the loop through the
    `Post` — from its wake-up to the loop's wake-up without the GIL, so a busy loop never delays a commit's start
    (a writer that took its entries itself waited for the GIL first: 1.3 ms at p50 on a loaded cluster owner).

    Owns the rules: jobs are written in the order pushed, each whole, or `run` returns FAILED and tells nobody
    of the round (`failed` is the first job not written whole); `post.end` is set only to a job's end once every
    job up to it is written and synced; a job's buffers are held until `reap` after it is written (or `clear`).
    `run` returns PYTHON when asked (`python()`) once every job pushed before is written: the writer's Python side
    does what the lane cannot (a new segment, a reservation, a disk that filled up), and the loop pushes nothing
    meanwhile (JournalWriter's rule)."""

    cdef pthread_mutex_t mu
    cdef pthread_cond_t cv
    cdef Job* head  # oldest job not reaped
    cdef Job* tail
    cdef Job* todo  # first job not taken by the writer (NULL: none)
    cdef long long next_id
    cdef public int fd  # the segment written (set by the writer thread, between two runs)
    cdef int stopping, python_asked
    cdef Post post
    cdef readonly long long written_id  # the last job written (by the writer; reaped by the loop up to it)
    cdef readonly long long failed  # the first job of a round that failed (FAILED), else -1
    cdef readonly int errno_failed
    cdef readonly long long rounds, bytes_written, sync_ns, sync_ns_max, taken_ns, syncing_ns
    cdef long long bounds_ns[SYNC_BOUNDS]
    cdef long long hist[SYNC_BOUNDS]
    cdef public long long drop_bytes  # >0: drop the file's pages after a sync once this many were written since
    cdef long long undropped
    cdef public int reserve_errno  # the error of the last reservation that failed (0: none since the loop looked)

    def __cinit__(self, Post post, bounds_ms=(0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000)):
        pthread_mutex_init(&self.mu, NULL)
        pthread_cond_init(&self.cv, NULL)
        self.head = self.tail = self.todo = NULL
        self.post = post
        self.fd = -1
        self.failed = -1
        self.next_id = 1
        cdef int i
        for i in range(SYNC_BOUNDS):
            self.bounds_ns[i] = <long long>(bounds_ms[i] * 1e6)
            self.hist[i] = 0

    def __dealloc__(self):
        self._free_all()
        pthread_cond_destroy(&self.cv)
        pthread_mutex_destroy(&self.mu)

    cdef void _free_all(self):
        cdef Job* j = self.head
        cdef Job* nxt
        while j != NULL:
            nxt = j.next
            _free_job(j)
            j = nxt
        self.head = self.tail = self.todo = NULL

    # --- the loop's side (holding the GIL) -------------------------------------------------------------------
    def push(self, list chunks, bint sync, long long end, long long reserve=0):
        """Hand the writer `chunks` (bytes-like, not copied: held until reaped), which end the journal at `end`;
        `sync`: somebody waits for them (fdatasync and tell) — else they are written and ride with the next sync.
        `reserve`: allocate the file up to this length first (posix_fallocate; a failure is noted in
        `reserve_errno`, and the write goes on without)."""
        cdef Py_ssize_t n = len(chunks), i
        cdef Job* j = <Job*>PyMem_Malloc(sizeof(Job))
        if j == NULL:
            raise MemoryError()
        j.views = <Py_buffer*>PyMem_Malloc(n * sizeof(Py_buffer) + 1)
        j.iov = <iovec*>PyMem_Malloc(n * sizeof(iovec) + 1)
        j.nviews = j.n = 0
        j.nbytes = 0
        if j.views == NULL or j.iov == NULL:
            _free_job(j)
            raise MemoryError()
        try:
            for i in range(n):
                PyObject_GetBuffer(chunks[i], &j.views[j.nviews], PyBUF_SIMPLE)
                j.nviews += 1
                if j.views[j.nviews - 1].len:
                    j.iov[j.n].iov_base = j.views[j.nviews - 1].buf
                    j.iov[j.n].iov_len = j.views[j.nviews - 1].len
                    j.nbytes += j.views[j.nviews - 1].len
                    j.n += 1
        except BaseException:
            _free_job(j)
            raise
        j.end, j.sync, j.next, j.reserve = end, sync, NULL, reserve
        with nogil:
            pthread_mutex_lock(&self.mu)
            j.id = self.next_id
            self.next_id += 1
            if self.tail == NULL:
                self.head = j
            else:
                self.tail.next = j
            self.tail = j
            if self.todo == NULL:
                self.todo = j
            pthread_cond_signal(&self.cv)
            pthread_mutex_unlock(&self.mu)

    def reap(self):
        """Let go of the buffers of the jobs written."""
        cdef Job* j
        cdef Job* nxt
        cdef Job* done = NULL
        with nogil:
            pthread_mutex_lock(&self.mu)
            if self.head != NULL and self.head.id <= self.written_id:
                done = self.head
                j = self.head
                while j.next != NULL and j.next.id <= self.written_id:
                    j = j.next
                self.head = j.next
                if self.head == NULL:
                    self.tail = NULL
                j.next = NULL
            pthread_mutex_unlock(&self.mu)
        while done != NULL:
            nxt = done.next
            _free_job(done)
            done = nxt

    def python(self):
        """Have `run` return PYTHON once the jobs pushed so far are written."""
        self._ask(_PYTHON)

    def stop(self):
        """Have `run` return STOPPED once the jobs pushed so far are written."""
        self._ask(_STOPPED)

    cdef void _ask(self, int why) noexcept nogil:
        pthread_mutex_lock(&self.mu)
        if why == _PYTHON:
            self.python_asked = 1
        else:
            self.stopping = 1
        pthread_cond_signal(&self.cv)
        pthread_mutex_unlock(&self.mu)

    def clear(self):
        """After FAILED: drop every job (the caller hands their entries to the journal again)."""
        with nogil:
            pthread_mutex_lock(&self.mu)
        self._free_all()
        self.failed = -1
        self.errno_failed = 0
        pthread_mutex_unlock(&self.mu)

    def sync_histogram(self):
        return tuple(self.hist[i] for i in range(SYNC_BOUNDS))

    # --- the writer thread's side -----------------------------------------------------------------------------
    def run(self):
        """Write what is pushed, round after round, until asked to stop or for Python: STOPPED, PYTHON or FAILED."""
        cdef Job* first
        cdef Job* last
        cdef Job* j
        cdef int err = 0, sync, i, fd = self.fd, why = -1
        cdef long long end, t0 = 0, t1 = 0, took
        cdef uint64_t one = 1
        cdef stat st
        cdef int r
        cdef long long* post_end = &self.post.end
        cdef long long* post_synced = &self.post.synced_ns
        cdef long long* post_told = &self.post.told
        cdef long long* post_syncs = &self.post.syncs
        cdef int efd = self.post.fd
        with nogil:
            while True:
                pthread_mutex_lock(&self.mu)
                while self.todo == NULL and not self.stopping and not self.python_asked:
                    pthread_cond_wait(&self.cv, &self.mu)
                first = self.todo
                if first == NULL:
                    if self.stopping:
                        why = _STOPPED
                    else:
                        self.python_asked = 0
                        why = _PYTHON
                    pthread_mutex_unlock(&self.mu)
                    break
                last = self.tail
                self.todo = NULL
                pthread_mutex_unlock(&self.mu)
                self.taken_ns = _now_ns()
                sync = 0
                end = -1
                j = first
                while True:
                    if j.reserve > 0 and fstat(fd, &st) == 0 and st.st_size < j.reserve:
                        r = posix_fallocate(fd, st.st_size, j.reserve - st.st_size)
                        if r != 0:
                            self.reserve_errno = r
                    err = _write_all(fd, j.iov, j.n)
                    if err:
                        break
                    self.bytes_written += j.nbytes
                    self.undropped += j.nbytes
                    if j.sync:
                        sync = 1
                    end = j.end
                    if j == last:
                        break
                    j = j.next
                if err == 0 and sync:
                    t0 = _now_ns()
                    self.syncing_ns = t0
                    if fdatasync(fd) != 0:
                        err = errno
                        j = first  # (what the round wrote is not known to be on disk)
                    t1 = _now_ns()
                if err:
                    pthread_mutex_lock(&self.mu)
                    self.failed = j.id
                    self.errno_failed = err
                    pthread_mutex_unlock(&self.mu)
                    why = _FAILED
                    break
                pthread_mutex_lock(&self.mu)
                self.written_id = last.id
                pthread_mutex_unlock(&self.mu)
                self.rounds += 1
                if sync:
                    took = t1 - t0
                    self.sync_ns += took
                    if took > self.sync_ns_max:
                        self.sync_ns_max = took
                    for i in range(SYNC_BOUNDS):
                        if took <= self.bounds_ns[i]:
                            self.hist[i] += 1
                    if self.drop_bytes > 0 and self.undropped >= self.drop_bytes:
                        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)  # (clean once synced: no I/O)
                        self.undropped = 0
                    post_synced[0] = t1
                    if end > post_end[0]:
                        post_end[0] = end
                    post_told[0] += 1
                    post_syncs[0] += 1
                    write(efd, &one, sizeof(one))
        return why
