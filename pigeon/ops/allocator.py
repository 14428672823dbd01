"""The C allocator's settings for a server process.

Owns the rule: a node serves megabyte buffers — a 1,000-message publish request, its log record, a
StreamingPull response, a batch read back from the log — from the heap it keeps, not from fresh mappings.
glibc's defaults give every such buffer its own mmap (and unmap it when freed: page faults to fill it, a TLB
shootdown to return it; both are dear on a VM) or trim the heap top as soon as two of them are free. Measured
here: a 1 MiB log record read and split in 1.4–2.1 ms with the defaults, 0.21 ms with these settings
(`scripts/bench_ab.py` has the server-wide figures). The cost is at most limits.malloc_trim_threshold_bytes of
freed heap kept resident."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

from pigeon.core import limits

log = logging.getLogger("pigeon.allocator")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


def tune() -> bool:
    """Apply the settings when the C library is glibc; True when it took them."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): its allocator keeps its own defaults
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, limits.malloc_mmap_threshold_bytes) == 1 and \
        mallopt(M_TRIM_THRESHOLD, limits.malloc_trim_threshold_bytes) == 1
    if not ok:
        log.warning("mallopt refused the settings: large buffers are mapped and unmapped one by one")
    return ok
