"""Payload layouts of WAL and checkpoint records (the framing itself is storage.record's).

PUBLISH   topic uid u32 · shard u16 · base offset u64 · publish ms i64 · count u32 · key hash i64 · the PublishRequest bytes
          (stored whole as received: message ids and publish time are derived, not written per message)
ACK       subscription uid u32 · n × message number u64
META      UTF-8 JSON of one registry change
CK_HEADER UTF-8 JSON {version, pos, meta}
CK_SHARD  topic uid u32 · shard u16 · next offset u64 · batches u64 · base[] · pos[] · ms[] · keys[] (i64 arrays)
DELIVER   subscription uid u32 · n × message number u64 (deliveries counted for dead-lettering)
CK_SUB    UTF-8 JSON {uid, floors, acked, attempts}
CK_SCHED  topic uid u32 · seconds u32 · per second: second i64 · entries u32 · entries (u64 each)
CK_END    records u64 (the number of records before it)
"""

from __future__ import annotations

import json
import struct
from array import array

from pigeon.core import rawproto
from pigeon.storage import record
from pigeon.storage.record import RecordType

PUBLISH_HEAD = struct.Struct("<IHQqIq")
_ACK_HEAD = struct.Struct("<I")
_SHARD_HEAD = struct.Struct("<IHQQ")
_END = struct.Struct("<Q")


def publish_record(
    topic_uid: int, shard: int, base: int, publish_ms: int, count: int, request: bytes, key: int = 0
) -> bytes:
    head = PUBLISH_HEAD.pack(topic_uid, shard, base, publish_ms, count, key)
    return record.encode_parts(RecordType.PUBLISH, [head, request])


def publish_head(payload) -> tuple[int, int, int, int, int, int]:
    """(topic uid, shard, base offset, publish ms, count, ordering-key hash)"""
    return PUBLISH_HEAD.unpack_from(payload, 0)


def publish_messages(payload) -> list[bytes]:
    """The serialized PubsubMessages of a PUBLISH payload (without message id / publish time)."""
    count = PUBLISH_HEAD.unpack_from(payload, 0)[4]
    _, msgs = rawproto.split_publish(payload[PUBLISH_HEAD.size :])  # bytes or a memoryview: parsed without a copy
    if len(msgs) != count:
        raise ValueError("publish payload count mismatch")
    return msgs


def ack_record(sub_uid: int, nums: list[int], rtype: int = RecordType.ACK) -> bytes:
    return record.encode_parts(rtype, [_ACK_HEAD.pack(sub_uid), array("Q", nums).tobytes()])


def deliver_record(sub_uid: int, nums: list[int]) -> bytes:
    return ack_record(sub_uid, nums, RecordType.DELIVER)


def ack_decode(payload) -> tuple[int, array]:
    (uid,) = _ACK_HEAD.unpack_from(payload, 0)
    nums = array("Q")
    nums.frombytes(bytes(payload[4:]))
    return uid, nums


def meta_record(change: dict) -> bytes:
    return record.encode(RecordType.META, json.dumps(change, separators=(",", ":")).encode())


def json_decode(payload) -> dict:
    return json.loads(bytes(payload))


def checkpoint_header(pos: int, meta: dict) -> bytes:
    return record.encode(RecordType.CK_HEADER, json.dumps({"version": 1, "pos": pos, "meta": meta}).encode())


def checkpoint_shard(
    topic_uid: int, shard: int, next_offset: int, base: bytes, pos: bytes, ms: bytes, keys: bytes
) -> bytes:
    n = len(base) // 8
    assert len(pos) == len(ms) == len(keys) == len(base)
    head = _SHARD_HEAD.pack(topic_uid, shard, next_offset, n)
    return record.encode_parts(RecordType.CK_SHARD, [head, base, pos, ms, keys])


def checkpoint_shard_decode(payload) -> tuple[int, int, int, bytes, bytes, bytes, bytes]:
    uid, shard, nxt, n = _SHARD_HEAD.unpack_from(payload, 0)
    o = _SHARD_HEAD.size
    b = bytes(payload[o:])
    if len(b) != 32 * n:
        raise ValueError("checkpoint shard length mismatch")
    return uid, shard, nxt, b[: 8 * n], b[8 * n : 16 * n], b[16 * n : 24 * n], b[24 * n :]


def checkpoint_sub(
    uid: int, floors: list[int], acked: list[list[int]], attempts: list[list[int]] = (), extra: dict | None = None
) -> bytes:
    """`attempts`: [message number, deliveries so far] of unacked messages (dead-letter counting); `extra`:
    queue-extension state ({"parked": [[num, at]], "overrides": [[num, base64]]})."""
    body = {"uid": uid, "floors": floors, "acked": acked, "attempts": list(attempts), **(extra or {})}
    return record.encode(RecordType.CK_SUB, json.dumps(body).encode())


_SCHED_HEAD = struct.Struct("<II")
_SCHED_SEC = struct.Struct("<qI")


def checkpoint_schedule(topic_uid: int, seconds: list[tuple[int, bytes]]) -> bytes:
    parts = [_SCHED_HEAD.pack(topic_uid, len(seconds))]
    for sec, raw in seconds:
        parts.append(_SCHED_SEC.pack(sec, len(raw) // 8))
        parts.append(raw)
    return record.encode_parts(RecordType.CK_SCHED, parts)


def checkpoint_schedule_decode(payload) -> tuple[int, list[tuple[int, bytes]]]:
    b = bytes(payload)
    uid, n = _SCHED_HEAD.unpack_from(b, 0)
    pos = _SCHED_HEAD.size
    out = []
    for _ in range(n):
        sec, count = _SCHED_SEC.unpack_from(b, pos)
        pos += _SCHED_SEC.size
        out.append((sec, b[pos : pos + 8 * count]))
        pos += 8 * count
    if pos != len(b):
        raise ValueError("checkpoint schedule length mismatch")
    return uid, out


def checkpoint_end(count: int) -> bytes:
    return record.encode(RecordType.CK_END, _END.pack(count))


def checkpoint_end_decode(payload) -> int:
    return _END.unpack_from(payload, 0)[0]
