"""The storage role (docs/cluster.md): ledgers of other owners' logs, kept in a journal of their own under
`<data dir>/ledgers` — one journal log per ledger (its id), entries numbered from 0 within the ledger — so their
appends share one group commit and one fdatasync, as a BookKeeper bookie's journal does. Owns the rules:

  * an entry is answered once durable; entries of a ledger are dense (an append that would leave a gap is
    refused, one already held is answered again once durable: a writer's retry is harmless);
  * a fence is durable before it is answered, survives restarts, and from then on the ledger refuses its writer's
    appends; recovery's copies (at the fence epoch) are still taken;
  * this journal is never `apply`d and never cut below a ledger that has not been deleted: start-up scans it
    whole to find every ledger's entries (no checkpoints here), and notes where each entry's record lies (8 bytes
    an entry held): a read goes straight to the entries asked for, never through the other ledgers' records;
  * a deleted ledger (its log was cut past it: node.bundle_logs) is forgotten for good — with every earlier
    ledger of its log (cluster.ledgers.DeletedLedgers: `deleted`, written durably before the delete is
    answered) — it reads as empty and refuses appends and fences
    — and the journal segments below the first entry of every ledger still kept are removed. A kept ledger that
    holds a fence but no entry has its fence written again at the end before a removal (losing it could let a
    replaced writer in again; where the first one lies is not known after a restart), so it never holds the
    segments before it;
  * a ledger its log's list no longer names (a member unreachable when the owner cut the list) is deleted by the
    member itself once it sees the list (node.ledger_upkeep: `collect_strays`), as a BookKeeper bookie's garbage
    collector compares the ledgers it holds with the metadata.

The owner's own copy of its own ledgers is lent by the node's journal (node.own_copy, which owns its rules P1 and P2
and the seal): the record the owner wrote there for the log is that entry already, so the store notes where it lies, in
memory only, writes nothing for it and answers it once the node journal holds it durable. Besides, the rules:

  * the node journal keeps every segment from the first lent record of a ledger still kept (`journal_floor`;
    from the node's start until this store has opened, all of it);
  * a fence seals an own ledger and waits for the node journal to hold every entry it lent durable before it
    answers;
  * reading a lent entry reads the node journal's record and checks it is that log's entry at that offset: a
    mismatch is an error, never other bytes.

Stores written before kept a `BORROWED` record of each such entry here; those are read as they were (a restart drops,
with a truncation marker, those whose node journal record is past the end it recovered: never answered).

The node's own logs and state are untouched by it: the node journal is only read and kept from being cut."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

from pigeon.cluster.ledgers import DeletedLedgers
from pigeon.core import limits
from pigeon.core.errors import FailedPrecondition, PigeonError
from pigeon.node import own_copy
from pigeon.node.disk import OsDisk
from pigeon.node.journal_writer import FsyncPolicy, JournalWriter
from pigeon.node.own_copy import HOLE, OWN_FIRST, Own
from pigeon.storage import recovery
from pigeon.storage.journal import Cold, Entry
from pigeon.storage.record import Broken, Malformed, decode_at, split_entry

log = logging.getLogger("pigeon.ledgers")

FENCE_EPOCH = 0xFFFF_FFFF  # above every writer's epoch (epochs are 32-bit): recovery writes at it
BORROWED = 28  # (stores written before) an entry the node journal holds, where it lies; no broker record has this type
# ledger · index · the node journal's record: position, size, log, offset
BORROWED_WHERE = struct.Struct("<QQQIIQ")


class _Found:
    """Recovery's target for stored ledgers: nothing is applied (the scan's index is what is wanted) but the own
    ledgers' first entries are noted, and the BORROWED records of stores written before: where each ledger's first
    lies in the node journal, and the first one past `node_end` (the node journal's recovered end), if any."""

    def __init__(self, node_end: int | None):
        self.node_end = node_end
        self.owns: dict[int, Own] = {}  # ledger → its first entry's log and offset in the node journal
        self.borrowed: dict[int, list[int]] = {}  # ledger → [first record's position, last one's end]
        self.dangling: dict[int, int] = {}  # ledger → the index of its first borrowed entry past node_end

    def load(self, header, meta, images) -> None:
        raise ValueError("the ledger journal has no checkpoints")

    def apply(self, rtype: int, body, at: int) -> None:
        if rtype == OWN_FIRST:
            ledger, index, log, offset, _, epoch, _ = own_copy.parse_first(body)
            self.owns[ledger] = Own(log, offset, epoch, index)
        if rtype != BORROWED:
            return
        ledger, index, pos, size, _, _ = BORROWED_WHERE.unpack_from(body)
        b = self.borrowed.get(ledger)
        if b is None:
            self.borrowed[ledger] = [pos, pos + size]
        else:
            b[1] = pos + size
        if (self.node_end is None or pos + size > self.node_end) and ledger not in self.dangling:
            self.dangling[ledger] = index


def _place(w: array, index: int, at: int) -> None:
    """Note where entry `index` lies in a ledger's index: the entries past it go (a truncation, replayed), the ones
    before it it lacks are the node journal's (a sealed own ledger's: node.own_copy)."""
    if index < len(w):
        del w[index:]
    elif index > len(w):
        w.extend(array("q", [HOLE]) * (index - len(w)))
    w.append(at)


@dataclass(frozen=True)
class LedgerStats:
    ledgers: int
    entries: int
    fenced: int


class LedgerStore:
    def __init__(self, data_dir: str, policy: FsyncPolicy | str = FsyncPolicy.always,
                 segment_bytes: int = 64 * 1024 * 1024, node: JournalWriter | None = None, host=None):
        """`node`: the node's own journal (open before this store opens), which lends the owner's copies. `host`:
        the machine (node.host) its disks and journal come from; the real files without one."""
        self.host = host
        self.dir = os.path.join(data_dir, "ledgers")
        self.policy, self.segment_bytes = FsyncPolicy(policy), segment_bytes
        self.node = node
        self.writer: JournalWriter | None = None
        self.deleted = DeletedLedgers()
        self.borrowed: dict[int, list[int]] = {}  # ledger → [its first borrowed record's position, last's end]
        self._where: dict[int, array] = {}  # ledger → its entries' record positions in this journal, by index
        self.append_requests = {"channel": 0, "grpc": 0}  # Append requests taken, by the way they came (statistics)
        self.cold_reads = self.cold_read_bytes = 0  # reads that found entries outside the page cache, bytes warmed
        self._disk = host.disk if host is not None else OsDisk()
        self._deleting = asyncio.Lock()  # one write of `deleted` at a time, each holding every one before it
        self._fence_at: dict[int, int] = {}  # a kept ledger with a fence and no entry → where its fence was rewritten
        self._lent_end = 0  # the node journal's position past the latest entry borrowed from it
        self._own: dict[int, Own] = {}  # own ledger → where the node journal holds its entries (node.own_copy)
        self._seal_end = 0  # a whole copy is answered once the node journal holds this durable (the sealed entries)
        self._mark = 0  # … the node journal's durable end when the positions were last checkpointed (P2)
        self._checkpointing: asyncio.Task | None = None
        # the node journal position of the first record of a log its ledgers have not been sent yet (None: none)
        self.unsent_from: Callable[[], int | None] = lambda: None

    @property
    def _deleted_path(self) -> str:
        return os.path.join(self.dir, "deleted")

    @property
    def _positions_path(self) -> str:
        return os.path.join(self.dir, "positions")

    async def open(self) -> None:
        # read back only to recover or repair a ledger: not worth the page cache
        disk = self.host.cold_disk if self.host is not None else OsDisk(drop_synced=True)
        for sub in ("wal", "checkpoints"):  # (recovery looks in both; this journal never writes a checkpoint)
            disk.makedirs(os.path.join(self.dir, sub))
        if self._disk.exists(self._deleted_path):
            self.deleted = DeletedLedgers(json.loads(self._disk.read_file(self._deleted_path)))  # (every id, before)
        gone = self.deleted
        target = _Found(self.node.opened_at if self.node is not None else None)
        where: dict[int, array] = {}

        def noted(ledger: int, index: int, at: int) -> None:  # (in index order; a truncated one is not applied)
            w = where.get(ledger)
            if w is None:
                w = where[ledger] = array("q")
            _place(w, index, at)
        found = await asyncio.get_running_loop().run_in_executor(
            None, lambda: recovery.recover(disk, self.dir, lambda: target, repair=True, forgotten=gone,
                                           on_entry=noted))
        self._where = {lid: w for lid, w in where.items() if lid not in self.deleted}
        logs = {lid: st for lid, st in found.logs.items() if lid not in self.deleted}
        wal = os.path.join(self.dir, "wal")
        self.writer = self.host.journal(wal, self.policy, self.segment_bytes, disk) if self.host is not None else \
            JournalWriter(wal, self.policy, self.segment_bytes, disk)
        self.writer.open(found.tail, logs)
        if target.borrowed and self.node is None:
            raise ValueError(f"{self.dir} holds entries kept in a node journal, and none was given")
        for ledger, index in target.dangling.items():  # durable here, not in the node journal: never answered
            assert index > 0, f"ledger {ledger}: its first entry is borrowed"  # (a whole copy, always)
            self.writer.truncate(ledger, index - 1)
            del self._where.setdefault(ledger, array("q"))[index:]
        if target.dangling:
            await self.writer.wait_durable(self.writer.tail)
        self.borrowed = target.borrowed
        for b in self.borrowed.values():
            b[1] = min(b[1], self.node.opened_at)
        owns = {lid: o for lid, o in target.owns.items() if lid in self._where}
        if owns:
            await self._rebuild(owns)

    async def _rebuild(self, owns: dict[int, Own]) -> None:
        """P1: each own ledger's lent entries from the node journal it recovered (from the positions checkpoint's
        mark on), then every one sealed: its writer died with the process before."""
        logs, end = self.writer.journal.logs, self.node.opened_at
        for lid, o in owns.items():
            w = self._where[lid]
            o.copies = [i for i in range(len(w)) if w[i] != HOLE]
            o.copy_ends = [0] * len(o.copies)
        caps = {lid: logs[lid].next for lid in owns if logs[lid].fenced >= FENCE_EPOCH}
        mark, listed = 0, {}
        if self._disk.exists(self._positions_path):
            mark, listed = own_copy.decode_checkpoint(self._disk.read_file(self._positions_path)) or (0, {})
        if mark > end:  # (a node journal that lost what it had made durable: trust none of it)
            mark, listed = 0, {}
        for lid, pos in listed.items():
            o = owns.get(lid)
            if o is not None:
                o.pos = pos[:caps[lid] - bisect_left(o.copies, caps[lid])] if lid in caps else pos
        starts = self.node.journal.starts
        await asyncio.get_running_loop().run_in_executor(
            None, own_copy.scan, self.node.journal, max(mark, starts[0] if starts else end), end, owns, caps)
        for lid, o in owns.items():
            o.end, o.ended = 0, False  # (all of it durable)
            cut = own_copy.hole(o.copies, len(o.pos))
            if cut < logs[lid].next:  # a copy after entries the node journal lost (never answered: it waited)
                self.writer.truncate(lid, cut - 1)
                del self._where[lid][cut:]
                del o.copies[bisect_left(o.copies, cut):]
                del o.copy_ends[len(o.copies):]
            if lid in caps:
                o.sealed = True
            else:
                self._seal(lid, o)
        self._own = owns
        await self.writer.wait_durable(self.writer.tail)
        await self._checkpoint()  # (what a restart reads is of this history: the node journal's tail may be new)

    async def close(self) -> None:
        if self.writer is not None:
            if self._checkpointing is not None:
                await self._checkpointing
            if self._own:  # (a restart's scan then starts about here)
                await self._checkpoint()
            await self.writer.close()
            self.writer = None

    def held(self, ledger: int) -> int:
        """How many entries of `ledger` this node holds (appended; durable once answered)."""
        own = self._own.get(ledger)
        if own is not None:
            return len(own.copies) + len(own.pos)
        st = self.writer.journal.logs.get(ledger)
        return st.next if st is not None and ledger not in self.deleted else 0

    def _refuse_deleted(self, ledger: int) -> None:
        if ledger in self.deleted:
            raise FailedPrecondition(f"ledger {ledger} was deleted: its log was cut past it")

    def submit(self, ledger: int, epoch: int, index: int, rtype: int, body: bytes, now: bool = True,
               where: tuple[int, int, int, int] | None = None) -> asyncio.Future:
        """Store entry `index` of `ledger` from a writer at `epoch`: a future done once it is durable (entries
        submitted together share a group commit). FailedPrecondition at once for a gap or a fenced ledger. With
        `now` false the entry rides with the next group commit somebody asks for (`flush`), or the journal's
        lazy flush at the latest. `where`: the node journal holds the entry already — (log, offset, position,
        end) of its record there: from the first entry that comes so, a ledger is an own ledger, and the later ones
        that come so are lent by the node journal (node.own_copy), not written here."""
        own = self._own.get(ledger)
        lend = where is not None and own is not None and not own.sealed
        self._submit(ledger, epoch, index, rtype, body, where)
        if not lend:
            return self.writer.wait_durable(self.writer.tail, ask=now, also=self._sealed_wait())
        end = where[3]
        self._lent_end = max(self._lent_end, end)
        if now and self.node.durable < end:
            self.node.flush_soon()
        if end - self._mark >= limits.own_positions_checkpoint_bytes and self._checkpointing is None:
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint())
        if self.writer.durable < own.copy_ends[-1]:  # (an entry before it, written whole, is not yet)
            return self.writer.wait_durable(own.copy_ends[-1], ask=now, also=(self.node, end))
        return self.node.wait_durable(end, ask=now)

    def _sealed_wait(self) -> tuple[JournalWriter, int] | None:
        """What a whole copy waits for besides this journal: the entries of a ledger sealed before it that the
        node journal holds (a copy after them counts them held)."""
        return (self.node, self._seal_end) if self.node is not None and self.node.durable < self._seal_end else None

    def flush(self) -> None:
        """Make everything submitted so far durable now: somebody waits for it — the node journal's records of the
        entries borrowed from it too (the owner answers a replicated entry once Qa members hold it, without waiting
        for its own journal: this store's answer, when it is one of the Qa, does)."""
        self.writer.flush_soon()
        if self.node is not None and self.node.durable < max(self._lent_end, self._seal_end):
            self.node.flush_soon()

    def _submit(self, ledger: int, epoch: int, index: int, rtype: int, body, where=None) -> bool:
        """Whether the entry was appended (False: held already, a retry)."""
        self._refuse_deleted(ledger)
        st = self.writer.journal.logs.get(ledger)
        if st is not None and epoch < st.fenced:  # also a retry: the writer was replaced, recovery decides
            raise FailedPrecondition(f"ledger {ledger} is fenced: its writer was replaced")
        held = self.held(ledger)
        if index > held:
            raise FailedPrecondition(f"ledger {ledger}: entry {index} would leave a gap (entries below {held} held)")
        if index < held:
            return False
        own = self._own.get(ledger)
        if own is not None and where is not None and not own.sealed:
            log, offset, pos, end = where
            if (log, offset) != (own.log, own.first + len(own.pos) + 1):
                raise FailedPrecondition(f"ledger {ledger}: entry {index} is log {own.log}'s record at offset "
                                         f"{own.first + len(own.pos) + 1} in the node journal, not log {log}'s at "
                                         f"{offset}")
            own.pos.append(pos)
            own.end = end
            return True
        if own is not None:  # a whole copy (a snapshot, recovery's): numbered past the lent entries before it
            if epoch >= FENCE_EPOCH and not own.sealed:  # recovery's: its writer was replaced
                self._seal(ledger, own)
            self.writer.advance(ledger, index)
            self._seal_end = max(self._seal_end, own.end)
        first = own is None and where is not None and self.node is not None
        if first:
            rtype, body = OWN_FIRST, own_copy.first_entry(ledger, index, where[0], where[1], rtype, epoch, body)
        _, at = self.writer.append(ledger, epoch, rtype, [body])
        w = self._where.get(ledger)
        if w is None:
            w = self._where[ledger] = array("q")
        _place(w, index, at)
        if own is not None:
            own.copies.append(index)
            own.copy_ends.append(self.writer.tail)
        elif first:
            self._own[ledger] = Own(where[0], where[1], epoch, index, copies=list(range(index + 1)),
                                    copy_ends=[self.writer.tail] * (index + 1), at=where[2])
        return True

    def _seal(self, ledger: int, own: Own) -> None:
        """No more lent entries: the ledger is fenced, and this journal numbers its next entry past them."""
        self.writer.fence(ledger, FENCE_EPOCH)
        self.writer.advance(ledger, len(own.copies) + len(own.pos))
        own.sealed = True
        self._seal_end = max(self._seal_end, own.end)

    def take_many(self, ledger: int, epoch: int, index: int, types: list[int], bodies: list) -> tuple[int, int]:
        """Entries `index`, `index + 1`, … of `ledger` from a writer at `epoch`, appended at once: (the last one's
        index, the journal position they are durable at — `on_durable`; `flush` asks for it).
        FailedPrecondition as `submit` (the entries before the refused one are taken)."""
        for i, (rtype, body) in enumerate(zip(types, bodies)):
            self._submit(ledger, epoch, index + i, rtype, body)
        return index + len(bodies) - 1, self.writer.tail

    def on_durable(self, end: int, callback) -> None:
        """`callback(None)` once this store's journal is durable up to `end` (at once when it is), `callback(exc)`
        if its writer fails first."""
        also = self._sealed_wait()
        if also is None:
            self.writer.on_durable(end, callback)
        else:
            self.writer.on_durable(end, lambda exc: callback(exc) if exc is not None else
                                   also[0].on_durable(also[1], callback))

    async def append(self, ledger: int, epoch: int, index: int, rtype: int, body: bytes) -> None:
        await self.submit(ledger, epoch, index, rtype, body)

    async def fence(self, ledger: int) -> int:
        """Refuse the ledger's writer from now on (durably); the number of entries held."""
        self._refuse_deleted(ledger)
        own = self._own.get(ledger)
        if own is not None and not own.sealed:
            self._seal(ledger, own)
        end = self.writer.fence(ledger, FENCE_EPOCH)
        await self.writer.wait_durable(self.writer.tail)
        b = self.borrowed.get(ledger)
        lent = max(b[1] if b is not None else 0, own.end if own is not None else 0)
        if self.node is not None and self.node.durable < lent:  # every entry it holds, durable: the lent ones too
            await self.node.wait_durable(lent)
        return end

    def fenced(self, ledger: int) -> bool:
        st = self.writer.journal.logs.get(ledger)
        return st is not None and st.fenced >= FENCE_EPOCH

    def read(self, ledger: int, start: int, end: int, nowait: bool = False, nbytes_max: int | None = None,
             held: int = 0) -> list[Entry]:
        """The durable entries of `ledger` in [start, end), in order: each read where its record lies. With
        `nbytes_max`, no more than fit in it besides the `held` bytes the caller has (one at least, when it has
        none). With `nowait`, journal.Cold where the page cache lacks the next one (its `got`: those before)."""
        if ledger in self.deleted:
            return []
        journal, out, size = self.writer.journal, [], held
        where = self._where.get(ledger, ())
        own = self._own.get(ledger)
        for index in range(start, min(end, len(where) if own is None else self.held(ledger))):
            try:
                k = bisect_left(own.copies, index) if own is not None else 0
                if own is not None and (k == len(own.copies) or own.copies[k] != index):  # lent
                    e = self._lent_own(ledger, own, index, index - k, nowait)
                    if e is None:
                        break  # the node journal does not hold it durable yet
                    size += len(e.body)
                    if nbytes_max is not None and size > nbytes_max and (out or held):
                        break
                    out.append(e)
                    continue
                at = where[index]
                if at >= journal.durable:  # (written whole: not yet)
                    break
                rtype, payload = journal.read_record(at, nowait)
                got_ledger, epoch, offset, body = split_entry(payload)
                if (got_ledger, offset) != (ledger, index):
                    raise PigeonError(f"ledger {ledger} entry {index}: the record at {at} is ledger {got_ledger}'s "
                                      f"entry {offset}")
                if rtype == OWN_FIRST:
                    _, _, _, _, rtype, _, body = own_copy.parse_first(body)
                e = Entry(epoch, offset, rtype, bytes(body), at)
                if e.rtype == BORROWED:
                    e = self._lent(ledger, e, nowait)
                    if e is None:
                        break  # the node journal does not hold it durable yet
            except Cold as c:
                c.got = out
                raise
            size += len(e.body)
            if nbytes_max is not None and size > nbytes_max and (out or held):
                break
            out.append(e)
        return out

    async def read_warm(self, ledger: int, start: int, end: int, nbytes_max: int | None = None) -> list[Entry]:
        """`read`, without the event loop ever waiting for the disk: what the page cache holds is read at once, and
        where it lacks an entry, a thread brings limits.cold_read_bytes from there into it first. (A member's ledger
        files leave the cache once synced, and a backlog may be larger than memory: read from the disk on the
        loop, every stream and append of the node waited for each of those reads.)"""
        out: list[Entry] = []
        held, warmed = 0, None
        while True:
            try:
                return out + self.read(ledger, start, end, True, nbytes_max, held)
            except Cold as c:
                cold = c
            got, at = cold.got, (cold.path, cold.offset)
            out += got
            start += len(got)
            held += sum(len(e.body) for e in got)
            if at == warmed and not got:  # warmed, and out of the cache again before it was read (memory is that
                one = self.read(ledger, start, start + 1, False, nbytes_max, held)  # short): wait for one entry
                if not one:
                    return out
                out += one
                start += 1
                held += len(one[0].body)
                warmed = None
                continue
            warmed = at
            self.cold_reads += 1
            self.cold_read_bytes += await asyncio.get_running_loop().run_in_executor(None, cold.disk.warm, *at,
                                                                                     limits.cold_read_bytes)

    def _lent_own(self, ledger: int, own: Own, index: int, rank: int, nowait: bool) -> Entry | None:
        """Entry `index` of an own ledger, its `rank`-th lent one, read from the node journal (None while its
        record is not durable)."""
        pos = own.pos[rank]
        journal = self.node.journal
        if pos >= journal.durable:
            return None
        if not journal.starts or pos < journal.starts[0]:
            raise PigeonError(f"ledger {ledger} entry {index}: the node journal no longer holds position {pos} "
                              f"(it starts at {journal.starts[0] if journal.starts else journal.tail})")
        try:
            rtype, payload = journal.read_record(pos, nowait)
            log, _, offset, body = split_entry(payload)
        except (Broken, Malformed, OSError) as e:
            raise PigeonError(f"ledger {ledger} entry {index}: the node journal's record at {pos} cannot be read "
                              f"({e})") from None
        if (log, offset) != (own.log, own.first + rank + 1):
            raise PigeonError(f"ledger {ledger} entry {index}: the node journal's record at {pos} is not log "
                              f"{own.log}'s entry {own.first + rank + 1} (found log {log}'s entry {offset})")
        return Entry(own.epoch, index, rtype, bytes(body), pos)

    def _lent(self, ledger: int, e: Entry, nowait: bool = False) -> Entry | None:
        """A borrowed entry, read from the node journal (None while its record there is not durable)."""
        _, index, pos, size, log, offset = BORROWED_WHERE.unpack_from(e.body)
        if pos + size > self.node.durable:
            return None
        journal = self.node.journal
        if not journal.starts or pos < journal.starts[0]:
            raise PigeonError(f"ledger {ledger} entry {index}: the node journal no longer holds position {pos} "
                              f"(it starts at {journal.starts[0] if journal.starts else journal.tail})")
        try:
            rtype, payload, _ = decode_at(journal.read(pos, size, nowait), 0, size)  # (its size, not the bytes')
            got_log, _, got_offset, body = split_entry(payload)
        except (Broken, Malformed, OSError) as e:
            raise PigeonError(f"ledger {ledger} entry {index}: the node journal's record at {pos} cannot be read "
                              f"({e})") from None
        if (got_log, got_offset) != (log, offset):
            raise PigeonError(f"ledger {ledger} entry {index}: the node journal's record at {pos} is not log {log}'s "
                              f"entry {offset} it was borrowed from (found log {got_log}'s entry {got_offset})")
        return Entry(e.epoch, e.offset, rtype, bytes(body), e.at)

    async def delete(self, ledgers) -> int:
        """Forget `ledgers` for good (durably, before answering) and remove the journal segments no kept ledger
        needs; how many segments went."""
        if self.writer is None:  # (not open: what it deleted before is not known yet, and would be written over)
            raise FailedPrecondition("this node's ledger store is not open yet; retry")
        async with self._deleting:  # (two at once wrote the same temporary file: one failed, its ledgers kept)
            new = [lid for lid in ledgers if lid not in self.deleted]
            if new:
                after = DeletedLedgers(self.deleted.ids())
                after.update(new)
                await asyncio.get_running_loop().run_in_executor(
                    None, self._disk.write_durably, self._deleted_path, json.dumps(after.ids()).encode())
                self.deleted = after
                # (the journal's own state of each goes too: a group commit walks every log it knows)
                for table in (self.borrowed, self._own, self._where, self._fence_at, self.writer.journal.logs):
                    for lid in [lid for lid in table if lid in after]:
                        del table[lid]
            await self._move_fences()
            return len(await self.collect())

    def kept(self) -> list[int]:
        """The ledgers this store holds (not deleted)."""
        return [lid for lid in self.writer.journal.logs if lid not in self.deleted]

    async def _move_fences(self) -> None:
        """Write the fence of every kept ledger that has one and no entry again at the end, unless it already lies
        in the segment being written: the segments before can go."""
        journal = self.writer.journal
        moved = False
        for lid, st in journal.logs.items():
            if lid not in self.deleted and st.fenced and not st.next and \
                    self._fence_at.get(lid, -1) < journal.starts[-1]:
                self._fence_at[lid] = self.writer.mark(lid)
                moved = True
        if moved:
            await self.writer.wait_durable(self.writer.tail)

    def journal_floor(self) -> int | None:
        """Where the node journal must be kept from for the entries borrowed from it (None: anywhere); before
        this store has opened, from its start (what it holds is not known yet)."""
        if self.writer is None:
            return 0
        return min([b[0] for b in self.borrowed.values()] + [o.pos[0] for o in self._own.values() if o.pos],
                   default=None)

    async def _checkpoint(self) -> None:
        """P2: every own ledger's positions below the mark, in one file (node.own_copy); a hint, so a failure to
        write it is only logged."""
        try:
            mark, unsent = self.node.durable, self.unsent_from()
            data = own_copy.encode_checkpoint(mark if unsent is None else min(mark, unsent), self._own,
                                              self.writer.durable)
            await asyncio.get_running_loop().run_in_executor(None, self._disk.write_durably, self._positions_path,
                                                             data)
            self._mark = mark
        except OSError as e:
            log.warning("the own ledgers' positions were not checkpointed (a restart scans more): %s", e)
        finally:
            self._checkpointing = None

    async def collect(self) -> list[int]:
        """Remove the journal segments wholly below the first entry of every kept ledger (and the fence of one that
        has no entry: none while one's is not known); the segments removed."""
        low = self.writer.tail
        for lid, st in self.writer.journal.logs.items():
            if lid in self.deleted:
                continue
            if not st.samples:
                if st.fenced or st.next:
                    at = self._fence_at.get(lid) if not st.next else None
                    if at is None:
                        return []
                    low = min(low, at)
                continue
            low = min(low, st.samples[0][1])
        return await self.writer.delete_before(low)

    def statistics(self) -> LedgerStats:
        held = [self.held(lid) for lid in self.kept()]
        return LedgerStats(sum(1 for n in held if n), sum(held),
                           sum(1 for lid in self.kept() if self.fenced(lid)))
