"""ReadRange responses → Arrow record batches. Owns the rule: no Python object per message — messages
carrying only data are split by vectorized varint decoding (numpy); messages with attributes or an
ordering key are walked field by field for all messages at once (one numpy step per field position), and
attributes keep their wire order, so the same bytes always give the same rows. Bytes the walker does not
understand fall back to a protobuf parse of the whole response."""

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


class _Malformed(Exception):
    pass


def _varint(padded: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints at `pos` (vectorized): (values, positions after them). Values are exact below 2^35, which
    covers tags and lengths; longer varints (skipped fields) only need their end."""
    value = np.zeros(len(pos), np.int64)
    p = pos.copy()
    more = np.ones(len(pos), bool)
    for k in range(10):
        b = padded[p].astype(np.int64)
        if k < _VARINT_BYTES_MAX:
            value |= np.where(more, (b & 0x7F) << (7 * k), 0)
        p += more
        more &= b >= 0x80
        if not more.any():
            return value, p
    raise _Malformed("varint longer than 10 bytes")


def _fields(padded: np.ndarray, begins: np.ndarray, ends: np.ndarray):
    """The length-delimited fields of every message [begins[i], ends[i]): (message index, field number,
    value start, value length), each message's fields in wire order. Other wire types are skipped."""
    cur = begins.copy()
    idx = np.arange(len(begins))
    found = []
    active = cur < ends
    while active.any():
        who = idx[active]
        tag, p = _varint(padded, cur[active])
        wire, field = tag & 7, tag >> 3
        if ((wire == 3) | (wire == 4) | (wire > 5) | (field == 0)).any():
            raise _Malformed("unsupported wire type")
        ld = wire == 2
        length = np.zeros(len(who), np.int64)
        if ld.any():
            length[ld], p[ld] = _varint(padded, p[ld])
        start = p.copy()
        v = wire == 0
        if v.any():
            p[v] = _varint(padded, p[v])[1]
        p += np.where(wire == 1, 8, 0) + np.where(wire == 5, 4, 0) + np.where(ld, length, 0)
        if (p > ends[who]).any():
            raise _Malformed("field runs past its message")
        found.append((who[ld], field[ld], start[ld], length[ld]))
        cur[active] = p
        active = cur < ends
    if not found:
        z = np.zeros(0, np.int64)
        return z, z, z, z
    msg, field, start, length = (np.concatenate(a) for a in zip(*found))
    order = np.argsort(msg, kind="stable")  # found lists the k-th field of every message at step k
    return msg[order], field[order], start[order], length[order]


def _column(padded: np.ndarray, n: int, msg, start, length, typ) -> pa.Array:
    """One bytes/string value per message (the last occurrence wins, as in protobuf; absent: empty)."""
    s = np.zeros(n, np.int64)
    ln = np.zeros(n, np.int64)
    s[msg] = start
    ln[msg] = length
    return _binary(padded[_ranges(s, ln)], np.concatenate([[0], np.cumsum(ln)]), n, typ)


def _walk(buf: np.ndarray, begins: np.ndarray, ends: np.ndarray):
    """(data, ordering_key, attributes) columns of arbitrary stored PubsubMessages, vectorized."""
    n = len(begins)
    padded = np.concatenate([buf, _PAD])
    msg, field, start, length = _fields(padded, begins, ends)
    sel = field == 1
    data = _column(padded, n, msg[sel], start[sel], length[sel], pa.binary())
    sel = field == 5
    keys = _column(padded, n, msg[sel], start[sel], length[sel], pa.string())
    sel = field == 2
    entry_msg, entry_start, entry_len = msg[sel], start[sel], length[sel]
    e = len(entry_msg)
    emsg, efield, estart, elen = _fields(padded, entry_start, entry_start + entry_len)
    ak = efield == 1
    av = efield == 2
    names = _column(padded, e, emsg[ak], estart[ak], elen[ak], pa.string())
    values = _column(padded, e, emsg[av], estart[av], elen[av], pa.string())
    offsets = np.concatenate([[0], np.cumsum(np.bincount(entry_msg, minlength=n))]).astype(np.int32)
    attrs = pa.MapArray.from_arrays(pa.array(offsets), names, values)
    return data, keys, attrs


def message_ids(topic_uid: int, offset_bits: int, shard_bits: int, shard: int, offsets: np.ndarray) -> pa.Array:
    base = topic_uid << (offset_bits + shard_bits)
    if len(offsets) == 0:
        return pa.array([], pa.string())
    if base + (int(offsets[-1]) << shard_bits) + shard < (1 << 63):
        return pa.array((offsets << shard_bits) + (base + shard)).cast(pa.string())
    return pa.array([str(base + (int(o) << shard_bits) + shard) for o in offsets], pa.string())


def _parsed(buf: np.ndarray, lengths: np.ndarray):
    """The slow, sure path: one protobuf parse of all messages, then field by field."""
    msgs = pb.StoredMessages.FromString(_framed(buf, lengths)).messages
    data = pa.array([m.data for m in msgs], pa.binary())
    keys = pa.array([m.ordering_key for m in msgs], pa.string())
    attrs = pa.array([sorted(m.attributes.items()) for m in msgs], pa.map_(pa.string(), pa.string()))
    return data, keys, attrs


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
        try:
            data, keys, attrs = _walk(buf, begins, ends)
        except _Malformed:
            data, keys, attrs = _parsed(buf, lengths)
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
