"""ReadRange responses → Arrow record batches. Owns the rule: no Python object per message on the common
path — messages carrying only data are split by vectorized varint decoding (numpy); messages with
attributes or an ordering key are parsed in one protobuf call and then read field by field."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pigeon.api.proto import pigeon_ranges_pb2 as pb

SPARK_SCHEMA = (
    "message_id string, shard int, offset long, ordering_key string, publish_time timestamp, "
    "attributes map<string,string>, data binary"
)
SCHEMA = pa.schema(
    [
        ("message_id", pa.string()),
        ("shard", pa.int32()),
        ("offset", pa.int64()),
        ("ordering_key", pa.string()),
        ("publish_time", pa.timestamp("us", tz="UTC")),
        ("attributes", pa.map_(pa.string(), pa.string())),
        ("data", pa.binary()),
    ]
)
_PAD = np.zeros(16, np.uint8)
_VARINT_BYTES_MAX = 5  # lengths are < 2^32


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """How many bytes each value takes as a protobuf varint."""
    n = np.ones(len(values), np.int64)
    for k in range(1, _VARINT_BYTES_MAX):
        n += values >= (1 << (7 * k))
    return n


def _decode_headers(buf: np.ndarray, begins: np.ndarray, lengths: np.ndarray):
    """For messages that are exactly `data` (field 1) and nothing else: (simple mask, header size, data length)."""
    padded = np.concatenate([buf, _PAD])
    tag = padded[begins]
    value = np.zeros(len(begins), np.int64)
    header = np.ones(len(begins), np.int64)
    more = np.ones(len(begins), bool)
    for k in range(_VARINT_BYTES_MAX):
        b = padded[begins + 1 + k].astype(np.int64)
        value |= np.where(more, (b & 0x7F) << (7 * k), 0)
        header += more
        more &= b >= 0x80
    simple = (tag == 0x0A) & ~more & (header + value == lengths)
    return simple, header, value


def _binary(values: bytes | np.ndarray, offsets: np.ndarray, n: int, typ=pa.binary()) -> pa.Array:
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(values)])


def _empty_maps(n: int) -> pa.Array:
    empty = pa.array([], pa.string())
    return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), empty, empty)


def _framed(buf: np.ndarray, lengths: np.ndarray) -> bytes:
    """The messages, each framed as field 1 (tag + varint length), so StoredMessages parses them at once."""
    vl = _varint_lengths(lengths)
    head = 1 + vl
    total = int(lengths.sum() + head.sum())
    out = np.zeros(total, np.uint8)
    starts = np.cumsum(head + lengths) - (head + lengths)
    out[starts] = 0x0A
    for k in range(_VARINT_BYTES_MAX):
        sel = vl > k
        byte = (lengths[sel] >> (7 * k)) & 0x7F
        byte |= np.where(vl[sel] > k + 1, 0x80, 0)
        out[starts[sel] + 1 + k] = byte
    body = np.ones(total, bool)
    body[_ranges(starts, head)] = False
    out[body] = buf
    return out.tobytes()


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + size) for each (s, size)."""
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    firsts = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
    return firsts + np.arange(total)


def message_ids(topic_uid: int, offset_bits: int, shard_bits: int, shard: int, offsets: np.ndarray) -> pa.Array:
    base = topic_uid << (offset_bits + shard_bits)
    if len(offsets) == 0:
        return pa.array([], pa.string())
    if base + (int(offsets[-1]) << shard_bits) + shard < (1 << 63):
        return pa.array((offsets << shard_bits) + (base + shard)).cast(pa.string())
    return pa.array([str(base + (int(o) << shard_bits) + shard) for o in offsets], pa.string())


def to_record_batch(r: pb.ReadRangeResponse, shard: int) -> pa.RecordBatch:
    lengths = np.frombuffer(r.lengths, "<u4").astype(np.int64)
    n = len(lengths)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=SCHEMA)
    offsets = np.arange(r.start_offset, r.start_offset + n, dtype=np.int64)
    counts = np.diff(np.append(np.asarray(r.batch_starts, np.int64), r.start_offset + n))
    publish_us = np.repeat(np.asarray(r.batch_publish_ms, np.int64), counts) * 1000
    buf = np.frombuffer(r.messages, np.uint8)
    ends = np.cumsum(lengths)
    begins = ends - lengths
    simple, header, size = _decode_headers(buf, begins, lengths)
    if simple.all():
        keep = np.ones(len(buf), bool)
        keep[_ranges(begins, header)] = False
        data = _binary(buf[keep], np.concatenate([[0], np.cumsum(size)]), n)
        keys = _binary(b"", np.zeros(n + 1, np.int32), n, pa.string())
        attrs = _empty_maps(n)
    else:
        msgs = pb.StoredMessages.FromString(_framed(buf, lengths)).messages
        data = pa.array([m.data for m in msgs], pa.binary())
        keys = pa.array([m.ordering_key for m in msgs], pa.string())
        attrs = pa.array([sorted(m.attributes.items()) for m in msgs], pa.map_(pa.string(), pa.string()))
    cols = [
        message_ids(r.topic_uid, r.offset_bits, r.shard_bits, shard, offsets),
        pa.array(np.full(n, shard, np.int32)),
        pa.array(offsets),
        keys,
        pa.array(publish_us, pa.timestamp("us", tz="UTC")),
        attrs,
        data,
    ]
    return pa.RecordBatch.from_arrays(cols, schema=SCHEMA)
