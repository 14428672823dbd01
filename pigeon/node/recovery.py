"""Startup recovery and offline checking. Owns the rule: state = the newest valid checkpoint + the WAL
tail after it; the first broken record ends the valid log, which is truncated there (later segments
removed) and reported — never skipped silently.

Decision table, per step:
| what is found                                   | repair=True (startup)               | repair=False (fsck)  |
|-------------------------------------------------|-------------------------------------|----------------------|
| newest checkpoint broken or incomplete          | report, try the next older one      | report               |
| no usable checkpoint                            | replay the WAL from its first byte  | same                 |
| WAL does not reach back to the checkpoint's pos | report the gap, start at checkpoint | report               |
| broken record (bad length/CRC, short)           | truncate there, drop later segments | report               |
| gap between one segment's end and the next      | same as a broken record             | report               |
| record that decodes but cannot be applied       | stop start-up (Unappliable), delete | report; `--repair`   |
|   (a bug, or a directory of another format)     | nothing                             | truncates there      |

Only a failed framing or CRC check (or a torn tail) proves that bytes were never fully written; a record
that passes both was written whole, so failing to apply it is a bug or a foreign directory, and truncating
there would silently drop every acknowledged record after it.
"""

from __future__ import annotations

import base64
import logging
import os
from dataclasses import dataclass, field

from prometheus_client import Counter

from pigeon.broker.state import BrokerState, Contradiction
from pigeon.core import limits
from pigeon.node.wal import fsync_dir, list_segments, segment_path
from pigeon.storage import checkpoint as ck
from pigeon.storage import record, records
from pigeon.storage.records import RecordType

log = logging.getLogger("pigeon.recovery")

DROPPED_BYTES = Counter("pigeon_recovery_dropped_bytes", "WAL bytes dropped at startup because they were broken")
DROPPED_CHECKPOINTS = Counter("pigeon_recovery_broken_checkpoints", "Checkpoints found broken at startup")

CK_SUFFIX = ".ckpt"
BROKEN_SUFFIX = ".broken"


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


def checkpoint_name(pos: int) -> str:
    return f"{pos:020d}{CK_SUFFIX}"


def list_checkpoints(ck_dir: str) -> list[int]:
    if not os.path.isdir(ck_dir):
        return []
    return sorted(
        int(f[: -len(CK_SUFFIX)]) for f in os.listdir(ck_dir) if f.endswith(CK_SUFFIX) and f[: -len(CK_SUFFIX)].isdigit()
    )


def load_checkpoint(path: str, state: BrokerState) -> int:
    """Fill an empty state from a checkpoint file; return its WAL position. Raises record.Broken (framing, CRC,
    structure), records.Malformed or Contradiction (a payload that decodes badly or does not fit)."""
    with open(path, "rb") as f:
        buf = f.read()
    header, meta, images = ck.decode(buf)
    for rec in meta:
        state.apply(rec)
    for image in images:
        state.restore(image)
    state.next_uid = max(state.next_uid, header.next_uid)
    return header.pos


def apply_record(state: BrokerState, pos: int, rtype: int, payload) -> None:
    """Replay one WAL record: decode it and apply it, as the live path did."""
    state.apply(records.decode(rtype, payload), pos)


class Unappliable(Exception):
    """A WAL record that passed its framing and CRC checks but cannot be applied: start-up stops here."""

    def __init__(self, path: str, at: int, rtype: int, reason: str, dropped: list[tuple[str, int]]):
        self.path, self.at, self.rtype, self.reason = path, at, rtype, reason
        self.dropped = dropped  # (file, bytes) that `pigeon fsck --repair` would drop: this file's rest, later files
        try:
            self.type_name = RecordType(rtype).name
        except ValueError:
            self.type_name = f"type {rtype}"
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


def recover(data_dir: str, *, repair: bool, drop_unappliable: bool = False) -> tuple[BrokerState, Report]:
    """Rebuild the broker state from `data_dir` (the caller then derives its dispatch state: BrokerState.rebuild).
    With repair, truncate what is broken. A record that
    decodes but cannot be applied raises Unappliable (before anything is deleted), unless `drop_unappliable`
    (`pigeon fsck --repair`) treats it as broken."""
    rep = Report()
    state = BrokerState()
    wal_dir = os.path.join(data_dir, "wal")
    ck_dir = os.path.join(data_dir, "checkpoints")
    start = 0
    for ck in reversed(list_checkpoints(ck_dir)):
        path = os.path.join(ck_dir, checkpoint_name(ck))
        fresh = BrokerState()
        try:
            start = load_checkpoint(path, fresh)
        except (record.Broken, records.Malformed, Contradiction) as e:
            rep.broken_checkpoints.append((path, str(e)))
            DROPPED_CHECKPOINTS.inc()
            log.error("checkpoint %s is broken (%s); trying an older one", path, e)
            if repair:  # set it aside: it must never count as one of the two checkpoints kept
                os.replace(path, path + BROKEN_SUFFIX)
                fsync_dir(ck_dir)
            continue
        state = fresh
        rep.checkpoint = path
        break
    state.dispatch_off()
    segments = list_segments(wal_dir) if os.path.isdir(wal_dir) else []
    if not segments:
        rep.tail = start
        state.all_durable()
        return state, rep
    if segments[0] > start:
        rep.gap = f"wal starts at {segments[0]} but state needs it from {start}: data in between is lost"
        log.error(rep.gap)
        start = segments[0] if rep.checkpoint is None else start
    # the segment holding `start`
    first = max(0, sum(1 for s in segments if s <= start) - 1)
    expected = None
    tail = start
    broken_at = None
    for i in range(first, len(segments)):
        seg = segments[i]
        path = segment_path(wal_dir, seg)
        if expected is not None and seg != expected:
            broken_at = (i, path, 0, f"segment starts at {seg}, expected {expected}")
            break
        with open(path, "rb") as f:
            buf = f.read()
        offset = max(0, start - seg)
        if offset > len(buf):
            broken_at = (i, path, len(buf), f"segment ends at {seg + len(buf)} before the checkpoint position {start}")
            rep.broken.append((path, len(buf), 0, broken_at[3]))
            tail = start
            break
        pos = offset
        reason = None
        while pos < len(buf):
            try:
                rtype, payload, nxt = record.decode_at(buf, pos, limits.record_bytes_max)
            except record.Broken as e:
                reason = e.reason
                break
            try:
                apply_record(state, seg + pos, rtype, payload)
            except Exception as e:  # noqa: BLE001 — whatever the bug, nothing after this record may be lost
                why = str(e) if isinstance(e, Contradiction) else f"{type(e).__name__}: {e}"
                if not drop_unappliable:
                    later = [(segment_path(wal_dir, s), os.path.getsize(segment_path(wal_dir, s)))
                             for s in segments[i + 1:]]
                    raise Unappliable(path, pos, rtype, why, [(path, len(buf) - pos)] + later) from e
                reason = f"unappliable {Unappliable(path, pos, rtype, why, []).type_name} record: {why}"
                break
            rep.replayed_records += 1
            pos = nxt
        tail = seg + pos
        if reason is not None:
            broken_at = (i, path, pos, reason)
            dropped = len(buf) - pos
            rep.broken.append((path, pos, dropped, reason))
            DROPPED_BYTES.inc(dropped)
            log.error("wal %s: broken record at byte %d (%s); dropping %d bytes", path, pos, reason, dropped)
            if repair:
                with open(path, "r+b") as f:
                    f.truncate(pos)
                    os.fsync(f.fileno())
            break
        expected = seg + len(buf)
    if broken_at is not None:
        i, path, at, reason = broken_at
        later = segments[i + 1 :] if rep.broken and rep.broken[-1][0] == path else segments[i:]
        if not (rep.broken and rep.broken[-1][0] == path):
            rep.broken.append((path, at, os.path.getsize(path), reason))
        for seg in later:
            p = segment_path(wal_dir, seg)
            rep.dropped_segments.append(p)
            DROPPED_BYTES.inc(os.path.getsize(p))
            log.error("wal %s: dropped whole (after the broken record)", p)
            if repair:
                os.unlink(p)
        if repair and later:
            fsync_dir(wal_dir)
    rep.tail = tail
    state.all_durable()
    return state, rep
