# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of `pigeon.spark.arrow._walk`: stored PubsubMessages (data 1, attributes 2, ordering_key 5)
split into the values and offsets buffers of Arrow's columns in one pass over the bytes, no Python object per
message; and the messages' ids as decimal strings. Owns the rule of arrow's twins: for every input exactly what the numpy walker gives — the same fields
kept (length-delimited ones; the last occurrence of data, ordering_key, an entry's key and value; every entry, in
wire order), the same bytes called malformed (then None: the caller takes the protobuf parse) —
tests/spark/test_arrow.py holds them side by side. Built by the package's install (setup.py) where a C compiler
is found; without it arrow runs the numpy walker. numpy is imported by the call, not the module: a server's
install (no numpy) imports every compiled part to check it was built."""

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcpy

cdef enum:
    VARINT_BYTES = 10  # a varint longer than this is malformed
    EXACT_BYTES = 5  # values are exact below 2^35 (tags and lengths), as the numpy walker's


cdef inline int64_t _varint(const uint8_t* b, int64_t size, int64_t* pos) noexcept nogil:
    """The varint at pos[0] (bytes past `size` read as zeros, as the walker's padding), pos[0] moved past it;
    -1 when it is longer than 10 bytes."""
    cdef int64_t p = pos[0], value = 0, byte
    cdef int k
    for k in range(VARINT_BYTES):
        byte = b[p] if p < size else 0
        if k < EXACT_BYTES:
            value |= (byte & 0x7F) << (7 * k)
        p += 1
        if byte < 0x80:
            pos[0] = p
            return value
    return -1


cdef inline int _field(const uint8_t* b, int64_t size, int64_t* pos, int64_t end, int64_t* number,
                       int64_t* start, int64_t* length) noexcept nogil:
    """Read the field at pos[0] of a message ending at `end`: number[0] is its field number when it is
    length-delimited (its value at start[0], length[0]), else 0. Returns -1 when malformed."""
    cdef int64_t tag = _varint(b, size, pos), wire, field, p, n
    if tag < 0:
        return -1
    wire = tag & 7
    field = tag >> 3
    if wire == 3 or wire == 4 or wire > 5 or field == 0:
        return -1
    p = pos[0]
    number[0] = 0
    if wire == 2:
        n = _varint(b, size, &p)
        if n < 0:
            return -1
        start[0] = p
        length[0] = n
        number[0] = field
        p += n
    elif wire == 0:
        if _varint(b, size, &p) < 0:
            return -1
    elif wire == 1:
        p += 8
    else:
        p += 4
    if p > end:
        return -1
    pos[0] = p
    return 0


cdef inline int _entry(const uint8_t* b, int64_t size, int64_t begin, int64_t end, int64_t* name_start,
                       int64_t* name_len, int64_t* value_start, int64_t* value_len) noexcept nogil:
    """An attributes entry [begin, end): its key (1) and value (2), the last occurrence of each; absent: empty."""
    cdef int64_t pos = begin, number, start, length
    name_start[0] = name_len[0] = value_start[0] = value_len[0] = 0
    while pos < end:
        if _field(b, size, &pos, end, &number, &start, &length) < 0:
            return -1
        if number == 1:
            name_start[0] = start
            name_len[0] = length
        elif number == 2:
            value_start[0] = start
            value_len[0] = length
    return 0


cdef inline void _copy(uint8_t* dst, const uint8_t* src, int64_t n) noexcept nogil:
    """memcpy, with the short values of attributes (a few bytes each) copied in place rather than by a call."""
    cdef int64_t k
    if n > 16:
        memcpy(dst, src, n)
    else:
        for k in range(n):
            dst[k] = src[k]


def walk(const uint8_t[::1] buf, const int64_t[::1] begins, const int64_t[::1] ends):
    """The messages [begins[i], ends[i]) of `buf` as (data values, data offsets, ordering_key values, offsets,
    attributes' map offsets, key values, key offsets, value values, value offsets): uint8 and int32 numpy arrays,
    Arrow's buffers. None when the walker would call the bytes malformed. `buf` is below 2 GiB (32-bit offsets).

    One pass over the bytes: every value is copied as its field is met (data and ordering_key once their
    message is walked, the last occurrence winning). The value buffers are sized by `buf` (together they hold
    at most its bytes; the pages never written are never touched) and returned as views of their written part;
    the entries' offsets grow as needed (an entry takes at least 2 bytes)."""
    cdef Py_ssize_t n = begins.shape[0], i
    cdef int64_t size = buf.shape[0], pos, end, number = 0, start = 0, length = 0, e = 0, e_cap
    cdef int64_t ns, nl, vs, vl, dsi, dli, ksi, kli
    cdef const uint8_t* b = &buf[0] if size else NULL
    import numpy as np
    data_values = np.empty(size, np.uint8)
    key_values = np.empty(size, np.uint8)
    name_values = np.empty(size, np.uint8)
    value_values = np.empty(size, np.uint8)
    data_offsets = np.empty(n + 1, np.int32)
    key_offsets = np.empty(n + 1, np.int32)
    map_offsets = np.empty(n + 1, np.int32)
    e_cap = min(4 * n + 16, size // 2 + 1)
    name_offsets = np.empty(e_cap + 1, np.int32)
    value_offsets = np.empty(e_cap + 1, np.int32)
    cdef uint8_t[::1] dv = data_values, kv = key_values, nv = name_values, vv = value_values
    cdef int32_t[::1] do = data_offsets, ko = key_offsets, mo = map_offsets, no = name_offsets, vo = value_offsets
    cdef uint8_t* dvp = &dv[0] if size else NULL
    cdef uint8_t* kvp = &kv[0] if size else NULL
    cdef uint8_t* nvp = &nv[0] if size else NULL
    cdef uint8_t* vvp = &vv[0] if size else NULL
    cdef int64_t d_at = 0, k_at = 0, n_at = 0, v_at = 0
    cdef int bad = 0, full = 0
    do[0] = ko[0] = mo[0] = no[0] = vo[0] = 0
    i = 0
    while i < n:
        with nogil:
            while i < n:
                pos = begins[i]
                end = ends[i]
                if pos < 0 or end > size:
                    bad = 1
                    break
                dsi = dli = ksi = kli = 0
                while pos < end:
                    if _field(b, size, &pos, end, &number, &start, &length) < 0:
                        bad = 1
                        break
                    if number == 1:
                        dsi = start
                        dli = length
                    elif number == 5:
                        ksi = start
                        kli = length
                    elif number == 2:
                        if _entry(b, size, start, start + length, &ns, &nl, &vs, &vl) < 0:
                            bad = 1
                            break
                        if e == e_cap:
                            full = 1  # more entries than room for their offsets: grown below, then again
                            break
                        _copy(nvp + n_at, b + ns, nl)
                        n_at += nl
                        _copy(vvp + v_at, b + vs, vl)
                        v_at += vl
                        e += 1
                        no[e] = <int32_t>n_at
                        vo[e] = <int32_t>v_at
                if bad or full:
                    break
                _copy(dvp + d_at, b + dsi, dli)
                d_at += dli
                do[i + 1] = <int32_t>d_at
                _copy(kvp + k_at, b + ksi, kli)
                k_at += kli
                ko[i + 1] = <int32_t>k_at
                mo[i + 1] = <int32_t>e
                i += 1
        if bad:
            return None
        if full:  # message i stopped at a full e_cap: walk it again with twice the room
            full = 0
            e = mo[i]
            n_at = no[e]
            v_at = vo[e]
            e_cap = min(2 * e_cap, size // 2 + 1)
            name_offsets = np.concatenate([name_offsets[:e + 1], np.empty(e_cap - e, np.int32)])
            value_offsets = np.concatenate([value_offsets[:e + 1], np.empty(e_cap - e, np.int32)])
            no = name_offsets
            vo = value_offsets
    return (data_values[:d_at], data_offsets, key_values[:k_at], key_offsets, map_offsets, name_values[:n_at],
            name_offsets[:e + 1], value_values[:v_at], value_offsets[:e + 1])


def message_ids(int64_t base, int shard_bits, int64_t shard, int64_t start, Py_ssize_t n):
    """The decimal strings of base + ((start + i) << shard_bits) + shard, i < n, as Arrow's (values, offsets)
    buffers (uint8, int32 numpy arrays). The caller checks that the last one is below 2^63. The digits of the
    first are written out, each next one's by adding the step (1 << shard_bits) to the last digits."""
    cdef uint8_t[20] cur  # the current id's digits, right-aligned: cur[20 - d:]
    cdef int64_t v = base + (start << shard_bits) + shard, step = (<int64_t>1) << shard_bits, carry
    cdef Py_ssize_t i, at = 0
    cdef int d = 0, k, t
    import numpy as np
    values = np.empty(n * 19, np.uint8)
    offsets = np.empty(n + 1, np.int32)
    cdef uint8_t[::1] out = values
    cdef int32_t[::1] off = offsets
    cdef uint8_t* o = &out[0] if n else NULL
    with nogil:
        off[0] = 0
        while True:
            d += 1
            cur[20 - d] = <uint8_t>(v % 10)
            v //= 10
            if v == 0:
                break
        for i in range(n):
            for k in range(d):
                o[at + k] = 48 + cur[20 - d + k]
            at += d
            off[i + 1] = <int32_t>at
            carry = step
            k = 19
            while carry:
                if k < 20 - d:
                    d += 1
                    cur[k] = 0
                t = cur[k] + <int>(carry % 10)
                carry //= 10
                if t >= 10:
                    t -= 10
                    carry += 1
                cur[k] = <uint8_t>t
                k -= 1
    return values[:at], offsets
