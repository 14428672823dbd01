"""Checkpoint files. Owns the format: a checkpoint is a sequence of framed records — a header (format version, the
log position it covers, the next uid), the metadata as the typed records that recreate it, the compact images of
indexes and subscription state, and an end record that counts the records before it. A checkpoint without its
end record, with a wrong count or any failed CRC is broken as a whole (recovery falls back to an older one).

| type           | payload |
|----------------|---------|
| HEADER 32      | UTF-8 JSON {"version", "pos", "next_uid", "logs": {log id: [next offset, epoch, fenced epoch]}} |
| 16..25         | metadata records (storage.records), applied in order |
| SHARD 33       | topic u32 · shard u16 · next offset u64 · batches u64 · base i64[] · log position i64[] · publish ms i64[] · key i64[] |
| SCHEDULE 34    | topic u32 · seconds u32 · per second: second i64 · entries u32 · entries u64[] |
| IDEMPOTENCY 35 | topic u32 · count u32 · per key: key str · message id str · publish ms i64 |
| SUB 36         | uid u32 · ack state (as SEEK) · leases u32 · (num u64 · deadline f64 · version u32 · key i64)[] · counts u32 · (num u64 · deliveries u32)[] · parked u32 · (num u64 · at i64)[] · updates u32 · (num u64 · bytes u32 · bytes)[] · seek generation u32 [· shards u32 · generation u32[]: when shards differ] |
| SHARD_OUT 12   | a pair handed out of its log and not homed elsewhere yet: the record itself (storage.records) |
| SHARD_HOME 26  | in a bundle snapshot, a pair homed in its log by a hand-over: the record itself |
| END 37         | records before it u64 |
"""

from __future__ import annotations

import json
from array import array
import struct
from dataclasses import dataclass, field

from pigeon.storage import record, records
from pigeon.storage.disk import Disk, join
from pigeon.storage.records import Malformed, PayloadReader, ack_state_parts, encode_str, read_ack_state

VERSION = 2
HEADER, SHARD, SCHEDULE, IDEMPOTENCY, SUB, END = 32, 33, 34, 35, 36, 37

_SHARD = struct.Struct("<IHQQ")
_SCHED = struct.Struct("<II")
_SCHED_SEC = struct.Struct("<qI")
_U32 = struct.Struct("<I")
_END = struct.Struct("<Q")
_LEASE = struct.Struct("<QdIq")
_COUNT = struct.Struct("<QI")
_PARKED = struct.Struct("<Qq")
_UPDATE = struct.Struct("<QI")
_MS = struct.Struct("<q")


@dataclass(frozen=True, slots=True)
class Header:
    pos: int  # the journal position the checkpoint covers: recovery applies the journal from here
    next_uid: int
    logs: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # log id → (next offset, epoch, fenced)


@dataclass(slots=True)
class ShardImage:
    topic: int
    shard: int
    next: int
    base: bytes
    pos: bytes
    ms: bytes
    keys: bytes


@dataclass(slots=True)
class ScheduleImage:
    topic: int
    seconds: list[tuple[int, bytes]]


@dataclass(slots=True)
class IdempotencyImage:
    topic: int
    entries: list[tuple[str, str, int]]  # (key, message id, publish ms)


@dataclass(slots=True)
class SubImage:
    uid: int
    floors: list[int]
    acked: list[list[int]]
    leases: list[tuple[int, float, int, int]]  # (num, deadline, version, key)
    versions: list[tuple[int, int]]
    parked: list[tuple[int, int]]
    overrides: list[tuple[int, bytes]]
    # each shard's seeks so far (core.ackid); written as one u32 when they are equal, followed by the list when
    # not (an image written before seeks were counted has none: 0, before they were counted by shard: one)
    generations: list[int] = field(default_factory=list)


def encode(header: Header, meta: list[records.Record], images) -> list[bytes]:
    """The framed records of a checkpoint file, in order."""
    out = [record.encode(HEADER, json.dumps({"version": VERSION, "pos": header.pos, "next_uid": header.next_uid,
                                             "logs": {str(k): list(v) for k, v in header.logs.items()}}).encode())]
    out.extend(record.encode_parts(r.TYPE, r.parts()) for r in meta)
    out.extend(_encode_image(i) for i in images)
    out.append(record.encode(END, _END.pack(len(out))))
    return out


def _encode_image(i) -> bytes:
    if isinstance(i, (records.ShardOut, records.ShardHome)):  # a pair handed out and not homed elsewhere yet, or
        return record.encode_parts(i.TYPE, i.parts())          # handed in (docs/cluster.md 4.3)
    if isinstance(i, ShardImage):
        n = len(i.base) // 8
        assert len(i.pos) == len(i.ms) == len(i.keys) == len(i.base)
        return record.encode_parts(SHARD, [_SHARD.pack(i.topic, i.shard, i.next, n), i.base, i.pos, i.ms, i.keys])
    if isinstance(i, ScheduleImage):
        parts = [_SCHED.pack(i.topic, len(i.seconds))]
        for sec, raw in i.seconds:
            parts += [_SCHED_SEC.pack(sec, len(raw) // 8), raw]
        return record.encode_parts(SCHEDULE, parts)
    if isinstance(i, IdempotencyImage):
        parts = [_SCHED.pack(i.topic, len(i.entries))]
        for key, mid, ms in i.entries:
            parts += [encode_str(key), encode_str(mid), _MS.pack(ms)]
        return record.encode_parts(IDEMPOTENCY, parts)
    assert isinstance(i, SubImage), i
    parts = [_U32.pack(i.uid), *ack_state_parts(i.floors, i.acked), _U32.pack(len(i.leases))]
    parts += [_LEASE.pack(*row) for row in i.leases]
    parts.append(_U32.pack(len(i.versions)))
    parts += [_COUNT.pack(*row) for row in i.versions]
    parts.append(_U32.pack(len(i.parked)))
    parts += [_PARKED.pack(*row) for row in i.parked]
    parts.append(_U32.pack(len(i.overrides)))
    for num, raw in i.overrides:
        parts += [_UPDATE.pack(num, len(raw)), raw]
    gens = i.generations or [0]
    parts.append(_U32.pack(gens[0]))
    if any(g != gens[0] for g in gens):
        parts += [_U32.pack(len(gens)), array("I", gens).tobytes()]
    return record.encode_parts(SUB, parts)


def encode_images(images) -> bytes:
    """Images as one buffer of framed records (the body of a records.Snapshot)."""
    return b"".join(_encode_image(i) for i in images)


def decode_images(buf) -> list:
    """The images of `encode_images`. Raises record.Broken or records.Malformed."""
    out = []
    it = record.scan(buf, 1 << 40)
    try:
        while True:
            _, rtype, payload = next(it)
            out.append(_decode_image(rtype, payload))
    except StopIteration as stop:
        end, reason = stop.value
    if reason is not None:
        raise record.Broken(f"{reason} at byte {end} of a snapshot")
    return out


def decode(buf) -> tuple[Header, list[records.Record], list]:
    """Read a checkpoint file. Raises record.Broken for framing, CRC or structure (a checkpoint to skip) and
    records.Malformed for a payload that passed its CRC but does not decode."""
    items = []
    it = record.scan(buf, 1 << 40)
    try:
        while True:
            items.append(next(it))
    except StopIteration as stop:
        end, reason = stop.value
    if reason is not None:
        raise record.Broken(f"{reason} at byte {end}")
    if not items or items[0][1] != HEADER or items[-1][1] != END:
        raise record.Broken("incomplete checkpoint")
    if _END.unpack_from(items[-1][2], 0)[0] != len(items) - 1:
        raise record.Broken("record count mismatch")
    try:
        head = json.loads(bytes(items[0][2]))
    except ValueError as e:
        raise Malformed(f"checkpoint header: {e}") from None
    if head.get("version") != VERSION:
        raise Malformed(f"checkpoint format {head.get('version')}, this Pigeon reads {VERSION}")
    meta, images = [], []
    for _, rtype, payload in items[1:-1]:
        if rtype < HEADER:
            meta.append(records.decode(rtype, payload))
        else:
            images.append(_decode_image(rtype, payload))
    try:
        logs = {int(k): tuple(v) for k, v in head.get("logs", {}).items()}
        return Header(head["pos"], head["next_uid"], logs), meta, images
    except (KeyError, TypeError, ValueError) as e:
        raise Malformed(f"checkpoint header: {e}") from None


def _decode_image(rtype: int, payload):
    if rtype == records.RecordType.SHARD_OUT:
        return records.ShardOut.decode(payload)
    if rtype == records.RecordType.SHARD_HOME:
        return records.ShardHome.decode(payload)
    r = PayloadReader(payload)
    if rtype == SHARD:
        topic, shard, nxt, n = r.take(_SHARD)
        base, pos, ms, keys = (bytes(r.raw(8 * n)) for _ in range(4))
        r.done()
        return ShardImage(topic, shard, nxt, base, pos, ms, keys)
    if rtype == SCHEDULE:
        topic, n = r.take(_SCHED)
        seconds = []
        for _ in range(n):
            sec, count = r.take(_SCHED_SEC)
            seconds.append((sec, bytes(r.raw(8 * count))))
        r.done()
        return ScheduleImage(topic, seconds)
    if rtype == IDEMPOTENCY:
        topic, n = r.take(_SCHED)
        entries = [(r.string(), r.string(), r.take(_MS)[0]) for _ in range(n)]
        r.done()
        return IdempotencyImage(topic, entries)
    if rtype == SUB:
        (uid,) = r.take(_U32)
        floors, acked = read_ack_state(r)
        leases = [r.take(_LEASE) for _ in range(r.take(_U32)[0])]
        versions = [r.take(_COUNT) for _ in range(r.take(_U32)[0])]
        parked = [r.take(_PARKED) for _ in range(r.take(_U32)[0])]
        overrides = []
        for _ in range(r.take(_U32)[0]):
            num, size = r.take(_UPDATE)
            overrides.append((num, bytes(r.raw(size))))
        generation = r.take(_U32)[0] if r.pos < len(r.buf) else 0
        gens = r.array("I", r.take(_U32)[0]).tolist() if r.pos < len(r.buf) else [generation] * len(floors)
        if len(gens) != len(floors):
            raise Malformed("a subscription image with a seek generation count unlike its shards'")
        r.done()
        return SubImage(uid, floors, acked, leases, versions, parked, overrides, gens)
    raise Malformed(f"unknown checkpoint record type {rtype}")


# --- files -------------------------------------------------------------------------------------------------
SUFFIX = ".ckpt"
BROKEN_SUFFIX = ".broken"


def file_name(pos: int) -> str:
    return f"{pos:020d}{SUFFIX}"


def list_files(disk: Disk, directory: str) -> list[int]:
    """Positions of the checkpoints in `directory`, oldest first."""
    return sorted(int(f[:-len(SUFFIX)]) for f in disk.listdir(directory)
                  if f.endswith(SUFFIX) and f[:-len(SUFFIX)].isdigit())


def write(disk: Disk, directory: str, pos: int, recs: list[bytes], keep: list[int]) -> None:
    """Write the checkpoint of position `pos` durably (tmp → fsync → rename → fsync dir), then delete every
    other checkpoint but those in `keep`. Call it only once the journal is durable up to `pos`."""
    disk.write_durably(join(directory, file_name(pos)), b"".join(recs))
    for old in list_files(disk, directory):
        if old != pos and old not in keep:
            disk.remove(join(directory, file_name(old)))
