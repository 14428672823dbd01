"""The decoder pigeon.spark.arrow had before its walker was rewritten (one numpy step per field position, byte
ranges gathered through index arrays), kept as the reference the new walkers are held to: for the same bytes the
same columns, and malformed exactly when it is."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_PAD = np.zeros(16, np.uint8)
_VARINT_BYTES_MAX = 5


def _binary(values, offsets: np.ndarray, n: int, typ=pa.binary()) -> pa.Array:
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(values)])


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
