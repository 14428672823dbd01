# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of `pigeon.spark.arrow._walk`: stored PubsubMessages (data 1, attributes 2, ordering_key 5)
split into the values and offsets buffers of Arrow's columns in two passes over the bytes, no Python object per
message. Owns the rule of arrow's twins: for every input exactly what the numpy walker gives — the same fields
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


def walk(const uint8_t[::1] buf, const int64_t[::1] begins, const int64_t[::1] ends):
    """The messages [begins[i], ends[i]) of `buf` as (data values, data offsets, ordering_key values, offsets,
    attributes' map offsets, key values, key offsets, value values, value offsets): uint8 and int32 numpy arrays,
    Arrow's buffers. None when the walker would call the bytes malformed. `buf` is below 2 GiB (32-bit offsets)."""
    cdef Py_ssize_t n = begins.shape[0], i
    cdef int64_t size = buf.shape[0], pos, end, number = 0, start = 0, length = 0, e = 0, j
    cdef int64_t data_bytes = 0, key_bytes = 0, name_bytes = 0, value_bytes = 0
    cdef int64_t ns, nl, vs, vl
    cdef const uint8_t* b = &buf[0] if size else NULL
    import numpy as np
    data_start = np.zeros(n, np.int64)
    data_len = np.zeros(n, np.int64)
    key_start = np.zeros(n, np.int64)
    key_len = np.zeros(n, np.int64)
    map_offsets = np.zeros(n + 1, np.int32)
    cdef int64_t[::1] ds = data_start, dl = data_len, ks = key_start, kl = key_len
    cdef int32_t[::1] mo = map_offsets
    cdef int bad = 0
    with nogil:  # pass 1: each message's data and ordering key, how many entries and their bytes
        for i in range(n):
            pos = begins[i]
            end = ends[i]
            if pos < 0 or end > size:
                bad = 1
                break
            while pos < end:
                if _field(b, size, &pos, end, &number, &start, &length) < 0:
                    bad = 1
                    break
                if number == 1:
                    ds[i] = start
                    dl[i] = length
                elif number == 5:
                    ks[i] = start
                    kl[i] = length
                elif number == 2:
                    if _entry(b, size, start, start + length, &ns, &nl, &vs, &vl) < 0:
                        bad = 1
                        break
                    e += 1
                    name_bytes += nl
                    value_bytes += vl
            if bad:
                break
            data_bytes += dl[i]
            key_bytes += kl[i]
            mo[i + 1] = <int32_t>e
    if bad:
        return None
    data_values = np.empty(data_bytes, np.uint8)
    data_offsets = np.empty(n + 1, np.int32)
    key_values = np.empty(key_bytes, np.uint8)
    key_offsets = np.empty(n + 1, np.int32)
    name_values = np.empty(name_bytes, np.uint8)
    name_offsets = np.empty(e + 1, np.int32)
    value_values = np.empty(value_bytes, np.uint8)
    value_offsets = np.empty(e + 1, np.int32)
    cdef uint8_t[::1] dv = data_values, kv = key_values, nv = name_values, vv = value_values
    cdef int32_t[::1] do = data_offsets, ko = key_offsets, no = name_offsets, vo = value_offsets
    cdef uint8_t* dvp = &dv[0] if data_bytes else NULL
    cdef uint8_t* kvp = &kv[0] if key_bytes else NULL
    cdef uint8_t* nvp = &nv[0] if name_bytes else NULL
    cdef uint8_t* vvp = &vv[0] if value_bytes else NULL
    cdef int64_t d_at = 0, k_at = 0, n_at = 0, v_at = 0
    with nogil:  # pass 2: copy the values; the entries are walked again (pass 1 checked them)
        do[0] = ko[0] = no[0] = vo[0] = 0
        j = 0
        for i in range(n):
            if dl[i]:
                memcpy(dvp + d_at, b + ds[i], dl[i])
                d_at += dl[i]
            do[i + 1] = <int32_t>d_at
            if kl[i]:
                memcpy(kvp + k_at, b + ks[i], kl[i])
                k_at += kl[i]
            ko[i + 1] = <int32_t>k_at
            if mo[i + 1] == mo[i]:
                continue
            pos = begins[i]
            end = ends[i]
            while pos < end:
                _field(b, size, &pos, end, &number, &start, &length)
                if number != 2:
                    continue
                _entry(b, size, start, start + length, &ns, &nl, &vs, &vl)
                if nl:
                    memcpy(nvp + n_at, b + ns, nl)
                    n_at += nl
                if vl:
                    memcpy(vvp + v_at, b + vs, vl)
                    v_at += vl
                j += 1
                no[j] = <int32_t>n_at
                vo[j] = <int32_t>v_at
    return (data_values, data_offsets, key_values, key_offsets, map_offsets, name_values, name_offsets,
            value_values, value_offsets)
