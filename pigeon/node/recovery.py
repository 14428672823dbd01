"""Recovery, performed: storage.recovery decides (checkpoint, journal tail, what to truncate); this module gives it
the real files and the broker state to rebuild, and reports what it found in the log and the metrics."""

from __future__ import annotations

import logging

from prometheus_client import Counter

from pigeon.broker.state import BrokerState
from pigeon.node.disk import OsDisk
from pigeon.storage import recovery as storage_recovery
from pigeon.storage import records
from pigeon.storage.recovery import Recovered, Report, Unappliable  # noqa: F401  (re-exported: server, fsck)

log = logging.getLogger("pigeon.recovery")

DROPPED_BYTES = Counter("pigeon_recovery_dropped_bytes", "Journal bytes dropped at start-up because they were broken")
DROPPED_CHECKPOINTS = Counter("pigeon_recovery_broken_checkpoints", "Checkpoints found broken at start-up")


class BrokerTarget:
    """A fresh broker state to rebuild: a checkpoint's records and images, then the journal tail, applied with
    dispatch off (the executor derives the dispatch state afterwards)."""

    def __init__(self, region=None):
        self.state = BrokerState()
        self.state.region = region  # (core.regions: before any topic is made)
        self.state.dispatch_off()

    def load(self, header, meta, images) -> None:
        for rec in meta:
            self.state.apply(rec)
        for image in images:
            self.state.restore(image)
        self.state.next_uid = max(self.state.next_uid, header.next_uid)

    def apply(self, rtype: int, body, at: int) -> None:
        self.state.apply(records.decode(rtype, body), at)


def type_name(rtype: int) -> str:
    try:
        return records.RecordType(rtype).name
    except ValueError:
        return f"type {rtype}"


def recover(data_dir: str, *, repair: bool, drop_unappliable: bool = False,
            disk: OsDisk | None = None, region=None) -> tuple[BrokerState, Recovered]:
    """The broker state of `data_dir` (all durable, dispatch still off) and what recovery found (`region`: the
    node's, core.regions)."""
    found = storage_recovery.recover(disk or OsDisk(), data_dir, lambda: BrokerTarget(region), repair=repair,
                                     drop_unappliable=drop_unappliable, type_name=type_name)
    state = found.target.state
    state.all_durable()
    return state, found


def report(rep: Report) -> None:
    """Log and count what recovery dropped (start-up)."""
    for path, reason in rep.broken_checkpoints:
        DROPPED_CHECKPOINTS.inc()
        log.error("checkpoint %s is broken (%s); trying an older one", path, reason)
    if rep.gap:
        log.error(rep.gap)
    for path, at, dropped, reason in rep.broken:
        DROPPED_BYTES.inc(dropped)
        log.error("wal %s: broken record at byte %d (%s); dropping %d bytes", path, at, reason, dropped)
    for path in rep.dropped_segments:
        log.error("wal %s: dropped whole (after the broken record)", path)
