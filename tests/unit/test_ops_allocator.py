"""The allocator settings a server applies at start: megabyte buffers come from the heap, not one mapping each.
Each case runs in a child process: the settings are process-wide."""

import subprocess
import sys

_MAPPED_WHILE_HELD = """
import ctypes, sys
from pigeon.ops import allocator
if sys.argv[1] == "tuned":
    assert allocator.tune()

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2
before = libc.mallinfo2().hblks
held = [bytearray(1 << 20) for _ in range(8)]
print(libc.mallinfo2().hblks - before)  # chunks that got a mapping of their own
"""


def mapped_chunks(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _MAPPED_WHILE_HELD, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_megabyte_buffers_come_from_the_heap_once_tuned():
    assert mapped_chunks("defaults") == 8  # glibc's defaults: one mmap per megabyte buffer
    assert mapped_chunks("tuned") == 0
