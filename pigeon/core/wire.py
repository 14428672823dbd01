"""Protobuf wire-format helpers for the hot path. Owns the rule: stored message bytes are spliced into
responses without re-encoding. Field numbers come from google/pubsub/v1/pubsub.proto."""

from __future__ import annotations


def varint(n: int) -> bytes:
    assert n >= 0
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_VARINT_1 = [bytes((i,)) for i in range(128)]
VARINT_TABLE = [varint(i) for i in range(1 << 14)]  # one- and two-byte varints, looked up on the hot path


def varint_fast(n: int) -> bytes:
    return VARINT_TABLE[n] if n < 16384 else varint(n)


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def length_delimited(field: int, payload: bytes) -> bytes:
    n = len(payload)
    key = (field << 3) | 2
    return (_VARINT_1[key] if key < 128 else varint(key)) + (_VARINT_1[n] if n < 128 else varint(n)) + payload


def split_repeated(buf: bytes, wanted_field: int) -> list[bytes]:
    """Slices of every length-delimited occurrence of `wanted_field` at the top level of `buf`."""
    out = []
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos)
        wire_type = key & 7
        if wire_type == 2:
            n, pos = read_varint(buf, pos)
            if key >> 3 == wanted_field:
                out.append(buf[pos : pos + n])
            pos += n
        elif wire_type == 0:
            _, pos = read_varint(buf, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
    if pos != end:
        raise ValueError("truncated message")
    return out


def leading_string(buf: bytes, field: int) -> str | None:
    """The string `field` when it is the first field of `buf` (as serializers write it, in field order), else
    None: a message's routing key read without parsing the rest (a megabyte of a publish). Not a check: the
    bytes may still be anything after it."""
    if not buf or buf[0] != (field << 3) | 2:
        return None
    try:
        n, pos = read_varint(buf, 1)
        return str(buf[pos:pos + n], "utf-8") if pos + n <= len(buf) else None
    except (IndexError, ValueError):  # (UnicodeDecodeError is a ValueError)
        return None


def timestamp(seconds: int, nanos: int) -> bytes:
    """google.protobuf.Timestamp bytes."""
    out = b""
    if seconds:
        out += b"\x08" + varint(seconds)
    if nanos:
        out += b"\x10" + varint(nanos)
    return out


def stamp_message(raw_message: bytes, message_id: str, publish_time: bytes) -> bytes:
    """PubsubMessage bytes with message_id (3) and publish_time (4) appended (server-set fields)."""
    mid = message_id.encode()
    return raw_message + b"\x1a" + _VARINT_1[len(mid)] + mid + length_delimited(4, publish_time)


def received_message(ack_id: bytes, message: bytes, delivery_attempt: int) -> bytes:
    """ReceivedMessage bytes: ack_id (1), message (2), delivery_attempt (3) when non-zero."""
    out = b"\x0a" + _VARINT_1[len(ack_id)] + ack_id + length_delimited(2, message)
    if delivery_attempt:
        out += b"\x18" + varint(delivery_attempt)
    return out
