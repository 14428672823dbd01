# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of `pigeon.core.hot`'s loops: the same signatures, exactly the same results (see its rule).
Numbers that do not fit the C types below take the Python function, so no input changes the answer."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport uint64_t
from libc.string cimport memcmp, memcpy

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)

cdef uint64_t _BIG = 1 << 62  # numbers at or above this take the Python function
cdef uint64_t _VERSIONS = (<uint64_t>1) << 32  # delivery versions at or above this too (pigeon.core.ackid)


cdef object _python():
    """The Python functions (for inputs outside the C types here)."""
    from pigeon.core import hot
    return hot.PYTHON


cdef inline int _digits(uint64_t v, char* out) noexcept:
    """The decimal digits of v written to out (room for 20); returns how many."""
    cdef char tmp[20]
    cdef int n = 0, i
    if v == 0:
        out[0] = b'0'
        return 1
    while v:
        tmp[n] = <char>(48 + v % 10)
        v //= 10
        n += 1
    for i in range(n):
        out[i] = tmp[n - 1 - i]
    return n


cdef inline Py_ssize_t _varint_len(uint64_t v) noexcept:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline char* _put_varint(char* p, uint64_t v) noexcept:
    while v >= 0x80:
        p[0] = <char>((v & 0x7F) | 0x80)
        v >>= 7
        p += 1
    p[0] = <char>v
    return p + 1


def received_entries(locate, topic, taken, sub_uid, bint show_attempt, Py_ssize_t max_bytes, overrides,
                     id_base, int shard_bits, generation=0):
    if not (0 <= sub_uid < _BIG and 0 <= id_base < _BIG and 0 <= shard_bits < 32 and 0 <= generation < _BIG >> 32):
        return _python().received_entries(locate, topic, taken, sub_uid, show_attempt, max_bytes, overrides,
                                          id_base, shard_bits, generation)
    cdef uint64_t gen_bits = <uint64_t>generation << 32
    cdef list out = [], sizes = []
    cdef Py_ssize_t total = 0, size, n, fixed = 0, blen, tlen = 0, i = 0
    cdef uint64_t num, version, offset, uid = sub_uid, base = id_base
    cdef uint64_t mask = (<uint64_t>1 << shard_bits) - 1, shard = <uint64_t>-1, lo = 0, hi = 0
    cdef object messages = ()
    cdef bytes time_field = b"", entry
    cdef object body
    cdef char ack[64]
    cdef char mid[24]
    cdef Py_ssize_t alen, mlen
    cdef char* p
    for pair in taken:
        pnum, pversion = pair
        if pnum >= _BIG or pversion >= _VERSIONS or pnum < 0 or pversion < 0:
            return _python().received_entries(locate, topic, taken, sub_uid, show_attempt, max_bytes,
                                              overrides, id_base, shard_bits, generation)
        num = pnum
        version = pversion
        offset = num >> shard_bits
        if (num & mask) != shard or not (lo <= offset < hi):
            located_shard, located_lo, located_hi, messages, time_field = locate(topic, pnum)
            shard, lo, hi = located_shard, located_lo, located_hi
            tlen = PyBytes_GET_SIZE(time_field)
            fixed = 2 + tlen
        body = messages[offset - lo]
        if overrides:
            body = overrides.get(pnum, body)
        if type(body) is not bytes:
            body = bytes(body)
        mlen = _digits(base | num, mid)
        blen = PyBytes_GET_SIZE(body)
        size = blen + fixed + mlen
        total += size
        if total > max_bytes and out:
            break
        alen = _digits(uid, ack)
        ack[alen] = b'.'
        alen += 1
        alen += _digits(num, ack + alen)
        ack[alen] = b'.'
        alen += 1
        alen += _digits(version | gen_bits, ack + alen)
        n = 3 + alen + _varint_len(size) + size + ((1 + _varint_len(version)) if show_attempt else 0)
        entry = PyBytes_FromStringAndSize(NULL, 1 + _varint_len(n) + n)
        p = PyBytes_AS_STRING(entry)
        p[0] = 0x0a  # ReceivedMessage
        p = _put_varint(p + 1, n)
        p[0] = 0x0a  # ack_id
        p[1] = <char>alen
        memcpy(p + 2, ack, alen)
        p += 2 + alen
        p[0] = 0x12  # message: the stored bytes, message_id, publish_time
        p = _put_varint(p + 1, size)
        memcpy(p, PyBytes_AS_STRING(body), blen)
        p += blen
        p[0] = 0x1a
        p[1] = <char>mlen
        memcpy(p + 2, mid, mlen)
        p += 2 + mlen
        memcpy(p, PyBytes_AS_STRING(time_field), tlen)
        p += tlen
        if show_attempt:  # delivery_attempt
            p[0] = 0x18
            _put_varint(p + 1, version)
        out.append(entry)
        sizes.append(size)
    return out, sizes


cdef inline bint _all_digits(const char* s, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    if n == 0:
        return False
    for i in range(n):
        if s[i] < b'0' or s[i] > b'9':
            return False
    return True


cdef object _number(const char* s, Py_ssize_t n):
    """The value of n ASCII digits (checked before)."""
    cdef uint64_t v = 0
    cdef Py_ssize_t i
    if n > 18:
        return int(s[:n].decode("ascii"))
    for i in range(n):
        v = v * 10 + <uint64_t>(s[i] - 48)
    return v


def ack_numbers(sub_uid, ack_ids, generation=0):
    if generation:
        return _python().ack_numbers(sub_uid, ack_ids, generation)
    cdef bytes prefix = b"%d." % sub_uid
    cdef const char* pre = PyBytes_AS_STRING(prefix)
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(prefix), n, i, dot
    cdef const char* s
    cdef list out = []
    for a in ack_ids:
        if type(a) is not str:
            return _python().ack_numbers(sub_uid, ack_ids, generation)
        if not PyUnicode_IS_ASCII(a):  # its digits would not be ASCII digits
            return None
        s = PyUnicode_AsUTF8AndSize(a, &n)
        if n < plen + 3 or memcmp(s, pre, plen) != 0:
            return None
        dot = -1
        for i in range(plen, n):
            if s[i] == b'.':
                dot = i
                break
        if dot < 0 or not _all_digits(s + plen, dot - plen) or not _all_digits(s + dot + 1, n - dot - 1) or \
                n - dot - 1 > 9:  # (a version of 10 digits or more may carry a seek generation)
            return None
        out.append(_number(s + plen, dot - plen))
    return out


def ack_groups(ack_ids, table, Py_ssize_t groups, int shard_bits):
    cdef list out = [[] for _ in range(groups)]
    cdef list tab = list(table)
    cdef Py_ssize_t ntab = len(tab), n, i, start, end
    cdef uint64_t mask = ((<uint64_t>1) << shard_bits) - 1, v
    cdef long k
    cdef const char* s
    for a in ack_ids:
        if type(a) is not str or not PyUnicode_IS_ASCII(a):
            k = _python().ack_shard(a, shard_bits)
        else:
            s = PyUnicode_AsUTF8AndSize(a, &n)
            start = -1
            for i in range(n):
                if s[i] == b'.':
                    start = i + 1
                    break
            if start < 0:
                k = -1
            else:
                end = n
                for i in range(start, n):
                    if s[i] == b'.':
                        end = i
                        break
                if end - start > 18 or not _all_digits(s + start, end - start):  # (int() reads more: signs, _)
                    k = _python().ack_shard(a, shard_bits)
                else:
                    v = 0
                    for i in range(start, end):
                        v = v * 10 + <uint64_t>(s[i] - 48)
                    k = <long>(v & mask)
        (<list>out[tab[k] if 0 <= k < ntab else 0]).append(a)
    return out
