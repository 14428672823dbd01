"""pigeon.v1.Storage's AppendRequest (pigeon/node/proto/pigeon_storage.proto) encoded and read by hand on the
replication path. Owns the rule: an entry's bytes are copied once on the way to a member (into the request)
and not at all on the way in (the member's views point into the request) — a megabyte publish record went
through a protobuf message, its serialization and its parse, two copies more each way, for every member.

The bytes are the proto's wire format exactly (fields 1–7), so the generated class reads what `encode` writes
and `decode` reads what it writes; the tests hold both to that."""

from __future__ import annotations

import struct

from pigeon.core.wire import read_varint, varint

_FRAME = struct.Struct("<I")

_LEDGER, _EPOCH, _INDEX, _TYPE, _ENTRY, _MORE_TYPES, _MORE_ENTRIES = 1, 2, 3, 4, 5, 6, 7


def _key(field: int, wire_type: int) -> bytes:
    return bytes(((field << 3) | wire_type,))


_K_LEDGER, _K_EPOCH, _K_INDEX, _K_TYPE = (_key(f, 0) for f in (_LEDGER, _EPOCH, _INDEX, _TYPE))
_K_ENTRY, _K_MORE_TYPES, _K_MORE_ENTRIES = (_key(f, 2) for f in (_ENTRY, _MORE_TYPES, _MORE_ENTRIES))


def encode(ledger: int, epoch: int, index: int, types: list[int], entries: list[bytes]) -> bytes:
    """An AppendRequest for entries `index`, `index + 1`, … of `ledger` (at least one)."""
    return b"".join(encode_parts(ledger, epoch, index, types, entries))


def encode_parts(ledger: int, epoch: int, index: int, types: list[int], entries: list[bytes],
                 framed: bool = False) -> list[bytes]:
    """`encode`'s bytes as the pieces they are made of, the entries themselves among them (not copied: a
    transport that gathers its writes sends them from where they are); `framed`: after the request's length (u32,
    little endian), as the append channel sends it (pigeon.node.append_channel)."""
    parts = [_K_LEDGER, varint(ledger), _K_EPOCH, varint(epoch), _K_INDEX, varint(index), _K_TYPE, varint(types[0]),
             _K_ENTRY, varint(len(entries[0])), entries[0]]
    if len(entries) > 1:
        packed = b"".join(map(varint, types[1:]))
        parts += [_K_MORE_TYPES, varint(len(packed)), packed]
        for e in entries[1:]:
            parts += [_K_MORE_ENTRIES, varint(len(e)), e]
    if framed:
        parts.insert(0, _FRAME.pack(sum(map(len, parts))))
    return parts


class Malformed(ValueError):
    pass


_U32, _U64 = 2**32 - 1, 2**64 - 1


def decode(raw: bytes) -> tuple[int, int, int, list[int], list[memoryview]]:
    """(ledger, epoch, index, types, entries) of an AppendRequest; the entries are views into `raw`. Malformed
    when the bytes are not one (fields it does not know are passed over, as protobuf does)."""
    view = memoryview(raw)
    ledger = epoch = index = 0
    first_type, first = 0, None
    more_types: list[int] = []
    more: list[memoryview] = []
    pos, end = 0, len(raw)
    try:
        while pos < end:
            key, pos = read_varint(raw, pos)
            field, wire = key >> 3, key & 7
            if wire == 0:
                value, pos = read_varint(raw, pos)
                if field == _LEDGER:
                    ledger = value
                elif field == _EPOCH:
                    epoch = value
                elif field == _INDEX:
                    index = value
                elif field == _TYPE:
                    first_type = value
                elif field == _MORE_TYPES:
                    more_types.append(value)
            elif wire == 2:
                n, pos = read_varint(raw, pos)
                if pos + n > end:
                    raise Malformed("a field runs past the end of the request")
                if field == _ENTRY:
                    first = view[pos:pos + n]
                elif field == _MORE_ENTRIES:
                    more.append(view[pos:pos + n])
                elif field == _MORE_TYPES:
                    p, stop = pos, pos + n
                    while p < stop:
                        t, p = read_varint(raw, p)
                        more_types.append(t)
                    if p != stop:
                        raise Malformed("packed types run past their field")
                pos += n
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise Malformed(f"wire type {wire}")
    except IndexError:
        raise Malformed("the request ends inside a field") from None
    except ValueError as e:
        raise Malformed(str(e)) from None
    if pos != end:
        raise Malformed("the request ends inside a field")
    if len(more_types) != len(more):
        raise Malformed(f"{len(more_types)} more_types for {len(more)} more_entries")
    # wider than the proto's fields: protobuf would cut the high bits off; refused here — an epoch of 2**32 would
    # otherwise pass the fence (FENCE_EPOCH is the largest 32-bit value)
    if epoch > _U32 or first_type > _U32 or any(t > _U32 for t in more_types):
        raise Malformed("an epoch or a record type wider than 32 bits")
    if ledger > _U64 or index > _U64:
        raise Malformed("a ledger or an index wider than 64 bits")
    entries = ([first if first is not None else view[0:0]]) + more
    return ledger, epoch, index, [first_type, *more_types], entries
