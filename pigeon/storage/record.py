"""Record framing. Owns the rule: a record is `length:u32 · crc32c:u32 · type:u8 · payload`, little
endian, where length counts type + payload and the CRC covers type + payload. Nothing else knows
byte offsets inside a record. The types and payloads are storage.records' (log records) and
storage.checkpoint's (checkpoint files)."""

from __future__ import annotations

import struct

import crc32c

HEADER = struct.Struct("<IIB")
HEADER_BYTES = HEADER.size  # 9
LEN_CRC = struct.Struct("<II")
PREFIX_BYTES = LEN_CRC.size  # length · crc: read these first to learn how long a record is


def size_from_prefix(prefix: bytes | memoryview) -> int:
    """A record's whole size in bytes, from its first PREFIX_BYTES bytes."""
    return LEN_CRC.unpack_from(prefix, 0)[0] + PREFIX_BYTES


def encode(rtype: int, payload: bytes) -> bytes:
    return encode_parts(rtype, [payload])


_TYPE_BYTE = [bytes((t,)) for t in range(256)]  # a record's type byte …
_TYPE_CRC = [crc32c.crc32c(b) for b in _TYPE_BYTE]  # … and the CRC over it alone, where every record's CRC starts


def encode_parts(rtype: int, parts: list[bytes]) -> bytes:
    """Like encode, for a payload given in pieces: the CRC runs over the pieces in turn and the record is
    assembled with one copy (a megabyte publish request is copied once, not twice)."""
    if 0 <= rtype < 256:
        head, crc = _TYPE_BYTE[rtype], _TYPE_CRC[rtype]
    else:
        head = bytes((rtype,))  # (raises, as it always did)
        crc = crc32c.crc32c(head)
    length = 1
    for part in parts:
        crc = crc32c.crc32c(part, crc)
        length += len(part)
    return b"".join([LEN_CRC.pack(length, crc), head, *parts])


class Malformed(ValueError):
    """Bytes that passed framing and CRC but do not decode as their type says: a bug or a foreign format,
    never a torn write (recovery stops there instead of truncating)."""


class Broken(Exception):
    """A record that does not pass its checks; `reason` says which."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def decode_at(buf: bytes | memoryview, pos: int, record_bytes_max: int) -> tuple[int, memoryview, int]:
    """Decode the record at `pos`; return (type, payload view, next pos). Raises Broken."""
    end = len(buf)
    if end - pos < HEADER_BYTES:
        raise Broken("short header")
    length, crc = LEN_CRC.unpack_from(buf, pos)
    if length < 1 or length > record_bytes_max:
        raise Broken(f"bad length {length}")
    start = pos + 8
    stop = start + length
    if stop > end:
        raise Broken("short record")
    body = memoryview(buf)[start:stop]
    if crc32c.crc32c(body) != crc:
        raise Broken("crc mismatch")
    return body[0], body[1:], stop


def unwritten(buf: bytes, pos: int) -> bool:
    """Whether only zeros follow `pos`: space reserved for records not written yet (no record is all zeros: its
    length is at least 1), where the valid records end cleanly — not a broken record."""
    return buf.count(0, pos) == len(buf) - pos


def scan(buf: bytes | memoryview, record_bytes_max: int):
    """Yield (pos, type, payload) for every valid record; stops at the first broken one, or where only zeros
    follow (`unwritten`). After iteration, the generator's return value (StopIteration.value) is (valid_end,
    reason|None)."""
    pos = 0
    end = len(buf)
    while pos < end:
        try:
            rtype, payload, nxt = decode_at(buf, pos, record_bytes_max)
        except Broken as e:
            return pos, None if unwritten(bytes(buf), pos) else e.reason
        yield pos, rtype, payload
        pos = nxt
    return pos, None


def valid_end(buf: bytes, record_bytes_max: int) -> int:
    """Where the valid records at the start of `buf` end (`scan`'s end)."""
    it = scan(buf, record_bytes_max)
    while True:
        try:
            next(it)
        except StopIteration as stop:
            return stop.value[0]


# --- journal entries: a record whose payload starts with (log, epoch, offset) -------------------------
ENTRY = struct.Struct("<IIQ")  # log id · epoch · offset within the log
ENTRY_BYTES = ENTRY.size


def encode_entry(rtype: int, log: int, epoch: int, offset: int, parts: list[bytes]) -> bytes:
    """One entry of a log as a journal record: the entry header travels under the record's CRC."""
    return encode_parts(rtype, [ENTRY.pack(log, epoch, offset), *parts])


def entry_buffers(rtype: int, log: int, epoch: int, offset: int, parts: list) -> tuple:
    """`encode_entry`'s record as buffers to write one after the other — its header, then the parts themselves:
    a megabyte body is not copied into a joined record (writev gathers it). The parts must not change until
    written (bytes, or read-only views of bytes)."""
    head = bytes((rtype,)) + ENTRY.pack(log, epoch, offset)
    crc = crc32c.crc32c(head)
    length = len(head)
    for part in parts:
        crc = crc32c.crc32c(part, crc)
        length += len(part)
    return (LEN_CRC.pack(length, crc) + head, *parts)


def split_entry(payload) -> tuple[int, int, int, memoryview]:
    """(log, epoch, offset, body) of an entry's record payload. Raises Malformed when it is too short to be one."""
    if len(payload) < ENTRY_BYTES:
        raise Malformed("a journal record too short for its entry header")
    log, epoch, offset = ENTRY.unpack_from(payload, 0)
    return log, epoch, offset, memoryview(payload)[ENTRY_BYTES:]
