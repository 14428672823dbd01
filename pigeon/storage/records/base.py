"""The catalogue's common ground: the record types, the Record base class every record derives from, and the
payload codec every record's `parts` and `decode` use — fixed-width fields little endian, strings as u16 length ·
UTF-8, message numbers as raw u64 arrays, ack state as floors and acked offsets per shard. Owns the rule that a
payload is read exactly: an overrun or a leftover byte is Malformed (`PayloadReader`)."""

from __future__ import annotations

import enum
import struct
from array import array
from typing import ClassVar

from pigeon.storage.record import Malformed  # a payload that does not decode as its type says


class RecordType(enum.IntEnum):
    PUBLISH = 1
    ACK = 2
    DELIVER = 3
    MODACK = 4
    SEEK = 5
    TRIM = 6
    PARK = 7
    KICK = 8
    UPDATE = 9
    RESET = 10
    SNAPSHOT = 11
    SHARD_OUT = 12
    SHARD_IN = 13
    TOPIC_PUT = 16
    TOPIC_DEL = 17
    SUB_PUT = 18
    SUB_DEL = 19
    SNAP_PUT = 20
    SNAP_DEL = 21
    SCHEMA_PUT = 22
    SCHEMA_DEL = 23
    SCHEMA_REVDEL = 24
    POLICY_PUT = 25
    SHARD_HOME = 26


U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
KEEP_STATE = 0xFFFF


def u64s(values) -> bytes:
    return array("Q", values).tobytes()


def encode_str(s: str) -> bytes:
    b = s.encode()
    return U16.pack(len(b)) + b


class PayloadReader:
    """Reads a payload front to back; any overrun or leftover is Malformed."""

    __slots__ = ("buf", "pos")

    def __init__(self, payload):
        self.buf = memoryview(payload)
        self.pos = 0

    def take(self, s: struct.Struct) -> tuple:
        if self.pos + s.size > len(self.buf):
            raise Malformed("payload too short")
        out = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return out

    def raw(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise Malformed("payload too short")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def array(self, code: str, n: int) -> array:
        a = array(code)
        a.frombytes(self.raw(n * a.itemsize))
        return a

    def string(self) -> str:
        (n,) = self.take(U16)
        try:
            return str(self.raw(n), "utf-8")
        except UnicodeDecodeError as e:
            raise Malformed(f"bad string: {e}") from None

    def u64_rest(self) -> array:
        """The rest of the payload as message numbers."""
        rest = self.rest()
        if len(rest) % 8:
            raise Malformed("message numbers are not a whole number of u64")
        nums = array("Q")
        nums.frombytes(rest)
        return nums

    def rest(self) -> memoryview:
        out = self.buf[self.pos:]
        self.pos = len(self.buf)
        return out

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise Malformed(f"{len(self.buf) - self.pos} bytes left over")



def ack_state_parts(floors: list[int], acked: list[list[int]]) -> list[bytes]:
    assert len(floors) == len(acked)
    out = [U16.pack(len(floors)), u64s(floors)]
    for a in acked:
        out.append(U32.pack(len(a)))
        out.append(u64s(a))
    return out


def read_ack_state(r: PayloadReader) -> tuple[list[int], list[list[int]]]:
    (n,) = r.take(U16)
    floors = r.array("Q", n).tolist()
    acked = []
    for _ in range(n):
        (k,) = r.take(U32)
        acked.append(r.array("Q", k).tolist())
    return floors, acked


class Record:
    """A typed record: `parts()` are the payload's pieces (joined once, by the framing), `decode` reads one."""

    TYPE: ClassVar[RecordType]
    META: ClassVar[bool] = False  # metadata (the meta log) or data of a topic's bundle

    def parts(self) -> list[bytes]:
        raise NotImplementedError

    @classmethod
    def decode(cls, payload) -> "Record":
        raise NotImplementedError
