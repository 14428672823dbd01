"""Start-up recovery and offline checking. Owns the rule: state = the newest valid checkpoint + the journal tail
after it, applied through the caller's `apply` (the same function as the live path); the first record that fails
framing or CRC ends the valid journal, which is truncated there (later segments removed) and reported — never
skipped silently — while a record that passes both but cannot be applied stops start-up and deletes nothing.

Two passes over the tail: the first checks framing and CRC of every record and follows each log's offsets,
epochs, fences and truncations (a truncation can drop entries written before it); the second applies the
entries that survive, in journal order.

Decision table, per step:
| what is found                                   | repair=True (start-up)              | repair=False (fsck)  |
|-------------------------------------------------|-------------------------------------|----------------------|
| newest checkpoint broken or incomplete          | report, set aside, try an older one | report               |
| no usable checkpoint                            | replay the journal from its start   | same                 |
| journal does not reach back to the checkpoint   | report the gap, start at checkpoint | report               |
| broken record (bad length/CRC, short)           | truncate there, drop later segments | report               |
| gap between one segment's end and the next      | same as a broken record             | report               |
| only zeros after a segment's last record        | cut the zeros off (reserved space)  | nothing to report    |
| record that decodes but cannot be applied, an   | stop start-up (Unappliable), delete | report; `--repair`   |
|   entry at an offset its log is not at, or from | nothing                             | truncates there      |
|   an epoch its log was fenced against           |                                     |                      |

Only a failed framing or CRC check (or a torn tail) proves that bytes were never fully written; a record that
passes both was written whole, so failing to apply it is a bug or a foreign directory, and truncating there
would silently drop every acknowledged record after it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from pigeon.core import limits
from pigeon.storage import checkpoint as ck
from pigeon.storage import formats, record
from pigeon.storage.disk import Disk, join
from pigeon.storage.journal import MARKERS, TRUNCATE, FENCE, LogState, list_segments, segment_name

class Target(Protocol):
    """What recovery rebuilds (the broker state, through the node): fresh per attempt."""

    def load(self, header: ck.Header, meta: list, images: list) -> None:
        """Take a checkpoint's contents; raise anything when they do not fit (the checkpoint is then skipped)."""

    def apply(self, rtype: int, body, at: int) -> None:
        """Apply one entry of the tail; raise anything when it cannot be applied (start-up stops)."""


@dataclass
class Report:
    checkpoint: str | None = None
    broken_checkpoints: list[tuple[str, str]] = field(default_factory=list)
    replayed_records: int = 0
    broken: list[tuple[str, int, int, str]] = field(default_factory=list)  # (file, at, bytes dropped, reason)
    dropped_segments: list[str] = field(default_factory=list)
    gap: str | None = None
    tail: int = 0

    @property
    def clean(self) -> bool:
        return not (self.broken_checkpoints or self.broken or self.dropped_segments or self.gap)

    def lines(self) -> list[str]:
        out = []
        for path, reason in self.broken_checkpoints:
            out.append(f"checkpoint {path}: broken ({reason}); not used")
        if self.gap:
            out.append(self.gap)
        for path, at, dropped, reason in self.broken:
            out.append(f"wal {path}: broken record at byte {at} ({reason}); {dropped} bytes after it dropped")
        for path in self.dropped_segments:
            out.append(f"wal {path}: after the broken record; dropped whole")
        return out


class Unappliable(Exception):
    """A journal record that passed its framing and CRC checks but cannot be applied: start-up stops here."""

    def __init__(self, path: str, at: int, rtype: int, reason: str, dropped: list[tuple[str, int]],
                 type_name: str):
        self.path, self.at, self.rtype, self.reason = path, at, rtype, reason
        self.dropped = dropped  # (file, bytes) that `pigeon fsck --repair` would drop: this file's rest, later files
        self.type_name = type_name
        super().__init__(self.describe())

    def describe(self) -> str:
        return (f"wal {self.path}: the {self.type_name} record at byte {self.at} decodes but cannot be applied "
                f"({self.reason})")

    def repair_plan(self) -> str:
        total = sum(n for _, n in self.dropped)
        files = len(self.dropped) - 1
        return (f"`pigeon fsck --repair` would truncate the log there, dropping {total} bytes "
                f"({self.dropped[0][1]} of {self.dropped[0][0]}"
                + (f" and {files} later segment(s) whole" if files else "") + ")")


@dataclass
class Recovered:
    target: object
    report: Report
    tail: int
    logs: dict[int, LogState]
    checkpoints: list[int]  # positions of the checkpoints kept, oldest first


def recover(disk: Disk, data_dir: str, new_target: Callable[[], Target], *, repair: bool,
            drop_unappliable: bool = False, type_name: Callable[[int], str] = str,
            forgotten: frozenset[int] = frozenset(),
            on_entry: Callable[[int, int, int], None] | None = None) -> Recovered:
    """Rebuild a target from `data_dir`. With `repair`, truncate what is broken; a record that cannot be
    applied raises Unappliable before anything is deleted, unless `drop_unappliable` (`pigeon fsck --repair`)
    treats it as broken. `type_name` names record types in reports. Entries of the logs in `forgotten` (deleted
    ledgers of a storage node, whose earlier segments are gone) are passed over: no offsets are checked.
    `on_entry(log, offset, position)` hears of every entry applied (a store that indexes where its entries lie)."""
    formats.check_data_dir(disk, data_dir)  # (before anything is read: a newer format would read as damage)
    rep = Report()
    wal_dir, ck_dir = join(data_dir, "wal"), join(data_dir, "checkpoints")
    target, start, logs = _newest_checkpoint(disk, ck_dir, new_target, rep, repair)
    segments = list_segments(disk, wal_dir)
    if segments and segments[0] > start:
        rep.gap = f"wal starts at {segments[0]} but state needs it from {start}: data in between is lost"
        start = segments[0] if rep.checkpoint is None else start
    scan = _scan(disk, wal_dir, segments, start, logs, type_name, forgotten)
    if scan.cut is not None:
        _cut(disk, wal_dir, segments, scan, rep, repair)
    try:
        _apply(disk, wal_dir, segments, start, scan, target, rep, type_name, on_entry)
    except Unappliable as e:
        if not drop_unappliable:
            raise
        rep.broken.append((e.path, e.at, e.dropped[0][1], f"unappliable {e.type_name} record: {e.reason}"))
        _truncate_at(disk, wal_dir, segments, e.path, e.at, rep, repair=True)
        return recover(disk, data_dir, new_target, repair=repair, type_name=type_name, forgotten=forgotten,
                       on_entry=on_entry)
    if repair:  # reserved space goes: a segment's length is its records' end again (journal.open relies on it)
        for seg, end in scan.ends.items():
            disk.truncate(join(wal_dir, segment_name(seg)), end)
    rep.tail = scan.tail
    return Recovered(target, rep, scan.tail, scan.logs, ck.list_files(disk, ck_dir))


def _newest_checkpoint(disk, ck_dir, new_target, rep: Report, repair: bool):
    """(target loaded from the newest usable checkpoint or fresh, its journal position, its logs' states)."""
    for pos in reversed(ck.list_files(disk, ck_dir)):
        path = join(ck_dir, ck.file_name(pos))
        target = new_target()
        try:
            header, meta, images = ck.decode(disk.read_file(path))
            target.load(header, meta, images)
        except Exception as e:  # noqa: BLE001 — broken or not fitting: an older checkpoint and more journal do
            rep.broken_checkpoints.append((path, str(e)))
            if repair:  # set it aside: it must never count as one of the checkpoints kept
                disk.write_durably(path + ck.BROKEN_SUFFIX, disk.read_file(path))
                disk.remove(path)
            continue
        rep.checkpoint = path
        logs = {i: LogState(i, nxt, epoch, fenced) for i, (nxt, epoch, fenced) in header.logs.items()}
        return target, header.pos, logs
    return new_target(), 0, {}


@dataclass
class _Scan:
    logs: dict[int, LogState]
    tail: int
    cut: tuple[int, str, int, str] | None = None  # (segment index, file, byte, reason): the valid journal ends here
    ends: dict[int, int] = field(default_factory=dict)  # segment → where its records end, for one with zeros after
    unappliable: Unappliable | None = None
    kept: dict[str, bytes] = field(default_factory=dict)  # segments read by pass one, for pass two (up to a bound)
    kept_bytes: int = 0


def _scan(disk, wal_dir, segments, start, logs, type_name, forgotten=frozenset()) -> _Scan:
    """Pass one: framing and CRC of every record from `start`, each log's offsets, epochs, fences, truncations."""
    out = _Scan(logs, start)
    found = _scan_segments(disk, wal_dir, segments, start, out, forgotten)
    if found is not None:  # what a repair would drop: from the record to its segment's records' end, later ones
        i, pos, rtype, why = found
        paths = [join(wal_dir, segment_name(s)) for s in segments[i:]]
        sizes = [out.ends[s] if s in out.ends else disk.size(p) for s, p in zip(segments[i:], paths)]
        sizes[0] -= pos
        out.unappliable = Unappliable(paths[0], pos, rtype, why, list(zip(paths, sizes)), type_name(rtype))
    return out


def _scan_segments(disk, wal_dir, segments, start, out: _Scan, forgotten) -> tuple[int, int, int, str] | None:
    """`_scan`'s reading; the first record that cannot be applied: (segment index, byte, type, why), or None."""
    first = max(0, sum(1 for s in segments if s <= start) - 1)
    expected = None
    found = None
    for i in range(first, len(segments)):
        seg = segments[i]
        path = join(wal_dir, segment_name(seg))
        if expected is not None and seg != expected:
            out.cut = (i, path, 0, f"segment starts at {seg}, expected {expected}")
            return found
        buf = disk.read_file(path)
        if out.kept_bytes + len(buf) <= limits.recovery_kept_bytes_max:  # pass two need not read it again
            out.kept[path] = buf
            out.kept_bytes += len(buf)
        pos = max(0, start - seg)
        if pos > len(buf):
            out.cut = (i, path, len(buf), f"segment ends at {seg + len(buf)} before the checkpoint position {start}")
            out.tail = start
            return found
        while pos < len(buf):
            try:
                rtype, payload, nxt = record.decode_at(buf, pos, limits.record_bytes_max)
            except record.Broken as e:
                if record.unwritten(buf, pos):  # the space reserved ahead of the writer: its records end here
                    out.ends[seg] = pos
                    break
                out.cut = (i, path, pos, e.reason)
                out.tail = seg + pos
                return found
            if found is None:
                why = _follow(out.logs, rtype, payload, seg + pos, forgotten)
                if why is not None:
                    found = (i, pos, rtype, why)
            pos = nxt
        out.tail = expected = seg + out.ends.get(seg, len(buf))
    return found


def _follow(logs: dict[int, LogState], rtype: int, payload, at: int, forgotten=frozenset()) -> str | None:
    """Account one record to its log; why it cannot be (or None)."""
    try:
        log, epoch, offset, body = record.split_entry(payload)
    except record.Malformed as e:
        return str(e)
    if log in forgotten:
        return None
    st = logs.get(log)
    if st is None:
        st = logs[log] = LogState(log)
    if rtype == FENCE:
        st.fenced = max(st.fenced, epoch)
    elif rtype == TRUNCATE:
        if len(body) != 8:
            return "a truncation marker of the wrong size"
        after = int.from_bytes(body, "little")
        st.truncations.append((at, after))
        st.next = after + 1  # (a marker past the end moves it on: Journal.advance)
    else:
        if epoch < st.fenced:
            return f"an entry of log {log} from epoch {epoch}, which was fenced at {st.fenced}"
        if offset != st.next:
            return f"an entry of log {log} at offset {offset}, where the log is at {st.next}"
        st.next = offset + 1
        st.epoch = epoch
        if not st.samples or st.samples[-1][1] < at:
            st.samples.append((offset, at))
    return None


def _apply(disk, wal_dir, segments, start, scan: _Scan, target, rep: Report, type_name, on_entry=None) -> None:
    """Pass two: apply every entry of the valid journal that no truncation dropped, in order."""
    if scan.unappliable is not None:
        raise scan.unappliable
    first = max(0, sum(1 for s in segments if s <= start) - 1)
    for i in range(first, len(segments)):
        seg = segments[i]
        if seg > scan.tail:
            break
        path = join(wal_dir, segment_name(seg))
        buf = scan.kept.pop(path, None) or disk.read_file(path)  # (a cut only ever shortened it past scan.tail)
        end = min(scan.ends.get(seg, len(buf)), scan.tail - seg)
        pos = max(0, start - seg)
        while pos < end:
            rtype, payload, nxt = record.decode_at(buf, pos, limits.record_bytes_max)
            if rtype not in MARKERS:
                log, _, offset, body = record.split_entry(payload)
                st = scan.logs.get(log)  # (none for a forgotten log)
                if st is not None and not st.dropped(seg + pos, offset):
                    try:
                        target.apply(rtype, body, seg + pos)
                    except Exception as e:  # noqa: BLE001 — whatever the bug, nothing after it may be lost
                        later = [(join(wal_dir, segment_name(s)), disk.size(join(wal_dir, segment_name(s))))
                                 for s in segments[i + 1:] if s < scan.tail]
                        reason = str(e) if type(e).__name__ == "Contradiction" else f"{type(e).__name__}: {e}"
                        raise Unappliable(path, pos, rtype, reason, [(path, end - pos)] + later,
                                          type_name(rtype)) from e
                    rep.replayed_records += 1
                    if on_entry is not None:
                        on_entry(log, offset, seg + pos)
            pos = nxt


def _cut(disk, wal_dir, segments, scan: _Scan, rep: Report, repair: bool) -> None:
    """Truncate the journal where pass one found the first broken record; drop every later segment."""
    i, path, at, reason = scan.cut
    size = disk.size(path)
    written = len(disk.read_file(path).rstrip(b"\0")) if size > at else at  # (not the zeros reserved after it)
    rep.broken.append((path, at, max(0, written - at), reason))
    if repair and at < size:
        disk.truncate(path, at)
    _drop_after(disk, wal_dir, segments[i + 1:], rep, repair)


def _truncate_at(disk, wal_dir, segments, path: str, at: int, rep: Report, repair: bool) -> None:
    i = [join(wal_dir, segment_name(s)) for s in segments].index(path)
    if repair:
        disk.truncate(path, at)
    _drop_after(disk, wal_dir, segments[i + 1:], rep, repair)


def _drop_after(disk, wal_dir, later: list[int], rep: Report, repair: bool) -> None:
    for seg in later:
        p = join(wal_dir, segment_name(seg))
        rep.dropped_segments.append(p)
        if repair:
            disk.remove(p)
    if repair and later:
        disk.sync_dir(wal_dir)
