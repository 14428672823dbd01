"""ReadRange responses → Arrow record batches. Owns the rule: no Python object per message — the stored
PubsubMessages are split straight into Arrow's buffers (values and offsets of data, ordering_key and the
attributes map's keys and values), by the compiled walker (pigeon.spark._decode) where the package was built with
it, else vectorized with numpy: messages carrying only data by their headers, any others walked field by field for
all messages at once (one numpy step per field position). Both walkers give exactly the same columns for the same
bytes (attributes in their wire order, the last occurrence of a field winning as in protobuf) and call the same
bytes malformed; bytes they do not understand fall back to a protobuf parse of the whole response."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pigeon.api.proto import pigeon_ranges_pb2 as pb

try:
    import pigeon.spark._decode as _decode  # the compiled twin of _walk (setup.py)
except ImportError:  # not built: no C compiler where the package was installed, or the package shipped zipped
    _decode = None
COMPILED = _decode is not None

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
_LEAD = np.zeros(4, np.uint8)
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
    covers tags and lengths; longer varints (skipped fields) only need their end. When every varint is one
    byte (nearly all tags, the lengths of short fields) that is one step."""
    b = padded[pos]
    if not (b & 0x80).any():
        return b.astype(np.int64), pos + 1
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


class _Fields:
    """The length-delimited fields of the messages [begins[i], ends[i]) of `padded`, walked for all messages
    at once: one vectorized step per field position (the k-th field of every message that has k fields).
    `start[f]`, `length[f]`: for each field number f in `single`, its value per message — the last occurrence
    wins, as in protobuf; absent: empty. For the field number `repeated`, every occurrence in message order
    and each message's in wire order: `offsets` (where each message's begin), `repeated_start`,
    `repeated_length`. Fields of other numbers and wire types are skipped; a group, a field number 0 or a field
    running past its message raises _Malformed."""

    def __init__(self, padded: np.ndarray, begins: np.ndarray, ends: np.ndarray, single: tuple[int, ...],
                 repeated: int = 0):
        n = len(begins)
        self.start = {f: np.zeros(n, np.int64) for f in single}
        self.length = {f: np.zeros(n, np.int64) for f in single}
        count = np.zeros(n, np.int64)
        found = []  # per step: (messages, their occurrences of `repeated` before this one, starts, lengths)
        cur = begins.copy()
        who = np.flatnonzero(cur < ends)
        while len(who):
            tag, p = _varint(padded, cur[who])
            wire, field = tag & 7, tag >> 3
            if (wire == 2).all():  # the usual step: every field length-delimited
                if (field == 0).any():
                    raise _Malformed("field number 0")
                length, start = _varint(padded, p)
                p = start + length
            else:
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
                field = np.where(ld, field, 0)  # only length-delimited fields are kept
            if (p > ends[who]).any():
                raise _Malformed("field runs past its message")
            for f in single:
                sel = field == f
                if sel.any():
                    m = who[sel]
                    self.start[f][m] = start[sel]
                    self.length[f][m] = length[sel]
            if repeated:
                sel = field == repeated
                if sel.any():
                    m = who[sel]
                    found.append((m, count[m], start[sel], length[sel]))
                    count[m] += 1
            cur[who] = p
            who = who[p < ends[who]]
        # each occurrence's place, without a sort: its message's first place plus the occurrences before it
        self.offsets = np.concatenate([[0], np.cumsum(count)])
        total = int(self.offsets[-1])
        self.repeated_start = np.zeros(total, np.int64)
        self.repeated_length = np.zeros(total, np.int64)
        for m, before, start, length in found:
            at = self.offsets[m] + before
            self.repeated_start[at] = start
            self.repeated_length[at] = length


_INLINE = 12  # a BinaryView holds a value of up to this many bytes itself
_KEEP = np.tril(np.full((_INLINE + 1, _INLINE), 0xFF, np.uint8), -1)  # row k: k bytes of 0xFF, then zeros


def _values(padded: np.ndarray, start: np.ndarray, length: np.ndarray, typ) -> pa.Array:
    """The byte ranges [start[i], start[i] + length[i]) of `padded` (which has _LEAD bytes before its first
    message and _PAD after its last) as an Arrow binary or string array: a BinaryView array over `padded` is
    built first (16 bytes a value: its size, then the value itself up to 12 bytes, or its first 4 bytes and
    its offset), and Arrow's cast copies the values into one buffer."""
    n = len(start)
    # each view's 16 bytes from the 4 before the value on: bytes 4-16 then hold its first 12 bytes (an absent
    # value, start 0 and length 0, takes the window at -4, at the end: all its bytes are masked below)
    views = np.lib.stride_tricks.sliding_window_view(padded, 4 + _INLINE)[start - 4]
    views[:, 4:] &= _KEEP[np.minimum(length, _INLINE)]
    words = views.view(np.int32)  # size, and for a long value: prefix, buffer index, offset
    words[:, 0] = length
    long = length > _INLINE
    words[long, 2] = 0
    words[long, 3] = start[long]
    view_type = pa.string_view() if typ == pa.string() else pa.binary_view()
    return pa.Array.from_buffers(view_type, n, [None, pa.py_buffer(views), pa.py_buffer(padded)]).cast(typ)


def _walk(buf: np.ndarray, begins: np.ndarray, ends: np.ndarray):
    """(data, ordering_key, attributes) columns of arbitrary stored PubsubMessages, vectorized."""
    if len(buf) + len(_LEAD) + len(_PAD) >= 1 << 31:  # views address `padded` with 32-bit offsets
        raise _Malformed("more bytes than 32-bit offsets address")
    padded = np.concatenate([_LEAD, buf, _PAD])
    top = _Fields(padded, begins + len(_LEAD), ends + len(_LEAD), single=(1, 5), repeated=2)
    data = _values(padded, top.start[1], top.length[1], pa.binary())
    keys = _values(padded, top.start[5], top.length[5], pa.string())
    entries = _Fields(padded, top.repeated_start, top.repeated_start + top.repeated_length, single=(1, 2))
    names = _values(padded, entries.start[1], entries.length[1], pa.string())
    values = _values(padded, entries.start[2], entries.length[2], pa.string())
    attrs = pa.MapArray.from_arrays(pa.array(top.offsets.astype(np.int32)), names, values)
    return data, keys, attrs


def _walk_compiled(buf: np.ndarray, begins: np.ndarray, ends: np.ndarray):
    """`_walk` by pigeon.spark._decode: the same columns, from the Arrow buffers it fills (one pass over the
    bytes, no Python object per message)."""
    if len(buf) + len(_LEAD) + len(_PAD) >= 1 << 31:  # as _walk: 32-bit offsets
        raise _Malformed("more bytes than 32-bit offsets address")
    out = _decode.walk(buf, begins, ends)
    if out is None:
        raise _Malformed("the compiled walker stopped")
    data_values, data_offsets, key_values, key_offsets, map_offsets, names, name_offsets, values, value_offsets = out
    n, e = len(begins), len(name_offsets) - 1
    attrs = pa.MapArray.from_arrays(pa.array(map_offsets), _binary(names, name_offsets, e, pa.string()),
                                    _binary(values, value_offsets, e, pa.string()))
    return _binary(data_values, data_offsets, n), _binary(key_values, key_offsets, n, pa.string()), attrs


WALKERS = {"numpy": _walk, "compiled": _walk_compiled}  # (tests hold them side by side)


def message_ids(topic_uid: int, offset_bits: int, shard_bits: int, shard: int, offsets: np.ndarray) -> pa.Array:
    """The ids of the messages at `offsets` (consecutive) of a shard: decimal strings, by the compiled part where
    it is built (a third of the time of Arrow's cast, which builds the strings one append at a time)."""
    base = topic_uid << (offset_bits + shard_bits)
    n = len(offsets)
    if n == 0:
        return pa.array([], pa.string())
    if base + (int(offsets[-1]) << shard_bits) + shard < (1 << 63):
        if COMPILED:
            values, value_offsets = _decode.message_ids(base, shard_bits, shard, int(offsets[0]), n)
            return _binary(values, value_offsets, n, pa.string())
        return pa.array((offsets << shard_bits) + (base + shard)).cast(pa.string())
    return pa.array([str(base + (int(o) << shard_bits) + shard) for o in offsets], pa.string())


def _parsed(buf: np.ndarray, lengths: np.ndarray):
    """The slow, sure path: one protobuf parse of all messages, then field by field."""
    msgs = pb.StoredMessages.FromString(_framed(buf, lengths)).messages
    data = pa.array([m.data for m in msgs], pa.binary())
    keys = pa.array([m.ordering_key for m in msgs], pa.string())
    attrs = pa.array([sorted(m.attributes.items()) for m in msgs], pa.map_(pa.string(), pa.string()))
    return data, keys, attrs


def _columns(buf: np.ndarray, begins: np.ndarray, ends: np.ndarray, lengths: np.ndarray):
    """(data, ordering_key, attributes): by the compiled walker when it is built, which is as fast on messages
    that carry only data; else those split at once by their headers, or the numpy walker."""
    if COMPILED:
        return _walk_compiled(buf, begins, ends)
    simple, header, size = _decode_headers(buf, begins, lengths)
    if not simple.all():
        return _walk(buf, begins, ends)
    keep = np.ones(len(buf), bool)
    keep[_ranges(begins, header)] = False
    data = _binary(buf[keep], np.concatenate([[0], np.cumsum(size)]), len(begins))
    return data, _binary(b"", np.zeros(len(begins) + 1, np.int32), len(begins), pa.string()), _empty_maps(len(begins))


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
    if ends[-1] != len(buf):
        raise ValueError(f"a ReadRange response whose lengths add up to {ends[-1]} bytes carries {len(buf)}")
    try:
        data, keys, attrs = _columns(buf, begins, ends, lengths)
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
