"""The owner's own copy of its own ledgers, lent by the node's journal (docs/cluster.md, "The owner's own copy").

The record an owner writes to its journal for a replicated log is that log's ledger entry already, so the node's
ledger store keeps no copy of it and writes nothing for it: it notes in memory where the record lies (8 bytes an
entry) and answers the entry once the node journal holds the record durable — the owner's round waits for one
fdatasync, not two. A ledger's first entry is a whole copy (`OWN_FIRST`) that also names the log and the offset in
the node journal its entries start at: entry i of the ledger is that log's record at offset first + i. The rules
this module owns, with node.ledger_store:

  * P1 (positions are rebuilt, never guessed): at a restart a ledger's positions come only from records the node
    journal recovered, up to its end: those a positions checkpoint lists, then a scan of the journal from the
    checkpoint's mark taking, for each own ledger, its log's records at the offsets it expects next, in order. A
    ledger's run ends at a record of its log the ledgers never see (a Reset or a Snapshot: the log was given up or
    taken over) and at a truncation of the log. No position outlives its record. Past what the store was sent, a
    rebuild may find records the ledger's writer wrote for it and had not sent yet when the process died (held
    back, lingering): they are the entries it would have sent, as if they had arrived before the crash.
  * Sealed ledgers: an own ledger takes borrowed entries only from its writer, in one life of the node. It is
    sealed — fenced, and the ledger journal's numbering moved on to the count it holds (storage.journal's
    `advance`) — when it is fenced, when a recovery's whole copy comes first, and when the store opens (its writer
    died with the process). Whole copies after the seal are numbered rightly; a rebuild takes no more borrowed
    entries than the seal's count (the journal may hold records the store refused once fenced), and one that finds
    fewer (the node journal lost records of a seal never answered: its answer waits for them) ends the ledger there.
  * P2 (a checkpoint bounds the restart): every limits.own_positions_checkpoint_bytes of node journal, and at a
    clean stop, the store writes in one file every own ledger's positions below a mark: the node journal's durable
    end, or the first record a log holds that its ledgers were not sent yet (a roll's, which a later ledger takes),
    if lower. A hint for the scan, which nothing waits for: a broken or missing one means a longer scan."""

from __future__ import annotations

import struct
import zlib
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field

from pigeon.storage import record
from pigeon.storage import records as R
from pigeon.storage.journal import FENCE, TRUNCATE

OWN_FIRST = 29  # an own ledger's first entry: a whole copy, naming where the ledger's records lie in the node journal
_FIRST = struct.Struct("<QQQQII")  # ledger · index · the log · its record's offset in the log there · type · epoch
_HEAD = struct.Struct("<8sQQ")  # magic · mark · ledgers
_LEDGER = struct.Struct("<QQ")  # ledger · positions
_MAGIC = b"PGOWNPOS"
_CHUNK = 4 << 20  # the node journal is scanned this much at a time
HOLE = -1  # a ledger journal index's place for an entry the node journal holds (never a position there)


def replicated(rtype: int) -> bool:
    """Whether a data log's record is a ledger entry (Reset, Snapshot: the node's own copy starting over)."""
    return rtype < R.RecordType.RESET or rtype > R.RecordType.SNAPSHOT


@dataclass(slots=True)
class Own:
    """One own ledger: its log, the offset there of the record of its entry written whole, where the lent ones lie."""
    log: int
    first: int
    epoch: int
    index: int  # (the entry written whole that names them)
    pos: array = field(default_factory=lambda: array("q"))  # node journal positions of the lent entries, in order
    copies: list = field(default_factory=list)  # the indexes of the entries written whole, ascending
    copy_ends: list = field(default_factory=list)  # … where each ends in the ledger journal (0: durable before)
    at: int = 0  # the node journal position of the record of its entry written whole (0: durable before)
    end: int = 0  # the node journal position past the latest of them (durable there: all of them are)
    sealed: bool = False
    ended: bool = False  # (a rebuild's scan) its run ended


def first_entry(ledger: int, index: int, log: int, offset: int, rtype: int, epoch: int, body) -> bytes:
    return _FIRST.pack(ledger, index, log, offset, rtype, epoch) + bytes(body)


def parse_first(body) -> tuple[int, int, int, int, int, int, memoryview]:
    """(ledger, index, log, offset, type, epoch, the entry's bytes) of an OWN_FIRST record's body."""
    return *_FIRST.unpack_from(body), memoryview(body)[_FIRST.size:]


def scan(journal, start: int, end: int, owns: dict[int, Own], caps: dict[int, int]) -> None:
    """Extend each own ledger's lent entries from the node journal's records in [start, end) (`start`: where a
    record starts): P1's scan. `caps`: the index a sealed ledger's lent entries stay below. A record goes to every
    ledger of its log that takes its offset next (a roll sends the entries its ledger did not confirm to the next
    one again: ledgers can share records), into the ledger's next index not written whole. Offsets repeat after a
    crash: a ledger whose records the node journal lost is sealed at the restart that finds it so, with what it
    had, and takes none written since. A marker of the log (a fence at the fence it has) says an entry the node
    journal does not hold went in there (a snapshot): the ledger must hold it whole there, or its run ends — a lost
    copy never shifts the entries after it."""
    runs: dict[int, list[int]] = {}  # log → its own ledgers
    for lid, o in owns.items():
        runs.setdefault(o.log, []).append(lid)
    whole = {lid: set(o.copies) for lid, o in owns.items()}
    slot = {lid: hole(o.copies, len(o.pos)) for lid, o in owns.items()}  # the index its next lent entry takes
    last = {lid: hole(o.copies, len(o.pos) - 1) if o.pos else o.index for lid, o in owns.items()}  # … the last's
    marks = dict.fromkeys(owns, 0)  # markers since
    for pos, rtype, payload, nxt in _records(journal, start, end):
        log, _, offset, _ = record.split_entry(payload)
        r = runs.get(log)
        if r is None:
            continue
        if rtype == TRUNCATE or (rtype != FENCE and not replicated(rtype)):
            for lid in r:  # the log was cut, given up or taken over: no ledger of before takes more
                if owns[lid].first <= offset:
                    owns[lid].ended = True
            continue
        for lid in r:
            o = owns[lid]
            if o.ended or offset != o.first + len(o.pos) + 1:
                continue
            i = slot[lid]
            if rtype == FENCE:  # as many whole entries before the next lent one as markers since the last one
                marks[lid] += 1
                if i - last[lid] - 1 < marks[lid]:
                    o.ended = True  # (what it held there is gone: no later entry is this ledger's)
            elif i < caps.get(lid, i + 1):
                o.pos.append(pos)
                o.end = nxt
                last[lid], marks[lid] = i, 0
                i += 1
                while i in whole[lid]:
                    i += 1
                slot[lid] = i
            else:
                o.ended = True  # (full)


def hole(copies: list[int], n: int) -> int:
    """The index of a ledger's n-th entry (from 0) not written whole, its whole ones at `copies` (ascending)."""
    for c in copies:
        if c > n:
            break
        n += 1
    return n


def _records(journal, start: int, end: int):
    """(position, type, payload, next position) of the journal's records in [start, end), read in chunks."""
    pos = start
    while pos < end:
        buf = journal.read(pos, min(_CHUNK, end - pos))
        i = 0
        while i + record.PREFIX_BYTES <= len(buf):
            size = record.size_from_prefix(buf[i:i + record.PREFIX_BYTES])
            if i + size > len(buf):
                break
            rtype, payload, nxt = record.decode_at(buf, i, size)
            yield pos + i, rtype, payload, pos + nxt
            i = nxt
        if i == 0:  # a segment's end (a record never spans two): on to the next one
            later = [s for s in journal.starts if s > pos]
            if not later:
                raise ValueError(f"the node journal holds no record at {pos}, before its end {end}")
            pos = later[0]
        else:
            pos += i


def encode_checkpoint(mark: int, owns: dict[int, Own], durable: int) -> bytes:
    """Each own ledger's lent entries below the mark. A ledger's whole copy not yet durable (`durable`: the ledger
    journal's durable end) moves the mark back to the lent entry before it: a restart then meets its marker in the
    node journal and holds it whole there, or ends the ledger before it."""
    for o in owns.values():
        c = next((c for c, end in zip(o.copies, o.copy_ends) if end > durable), None)
        if c is not None:
            k = c - bisect_left(o.copies, c)  # (the lent entries before it)
            mark = min(mark, o.pos[k - 1] if k else o.at)
    parts = [b""]
    n = 0
    for lid, o in owns.items():
        k = bisect_left(o.pos, mark)
        if k:
            parts += [_LEDGER.pack(lid, k), o.pos[:k].tobytes()]
            n += 1
    parts[0] = _HEAD.pack(_MAGIC, mark, n)
    data = b"".join(parts)
    return data + struct.pack("<I", zlib.crc32(data))


def decode_checkpoint(data: bytes) -> tuple[int, dict[int, array]] | None:
    """(mark, ledger → positions) of a checkpoint; None when it is not one (broken, or of another format)."""
    if len(data) < _HEAD.size + 4 or struct.unpack_from("<I", data, len(data) - 4)[0] != zlib.crc32(data[:-4]):
        return None
    magic, mark, n = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        return None
    out, at = {}, _HEAD.size
    for _ in range(n):
        lid, k = _LEDGER.unpack_from(data, at)
        at += _LEDGER.size
        out[lid] = array("q", data[at:at + 8 * k])
        at += 8 * k
    return mark, out
