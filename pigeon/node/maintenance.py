"""Periodic upkeep of a node, performed: what expires, what retention drops and what the indexes still need are
the broker's decisions (broker.commands, BrokerState.prune / trim_indexes). Owns the rules: a checkpoint is
written only once the journal covers its position; the journal is cut only below what the two newest
checkpoints, the retained messages and the entries a cluster node's ledger store borrows need."""

from __future__ import annotations

import asyncio
import logging

from pigeon.broker import images
from pigeon.broker import commands, log_state
from pigeon.core.bundles import META_LOG
from pigeon.core.errors import Unavailable
from pigeon.storage import checkpoint as ck

log = logging.getLogger("pigeon.maintenance")


class Checkpoints:
    """Where a node's checkpoints are and which it keeps: the journal positions of the newest ones (recovery needs
    the journal from the older of the last two), when the last was taken, and one writer at a time."""

    def __init__(self, directory: str):
        self.dir = directory
        self.positions: list[int] = []
        self.last_time = 0.0
        self.lock = asyncio.Lock()

    def found(self, positions: list[int], now: float) -> None:
        """Recovery found these (start-up)."""
        self.positions, self.last_time = list(positions), now

    def keep(self) -> list[int]:
        """The checkpoints to keep beside a new one: the newest (recovery falls back to it if the new one is
        found broken)."""
        return self.positions[-1:]

    def wrote(self, pos: int, now: float) -> None:
        self.positions, self.last_time = self.keep() + [pos], now

    def journal_needed_from(self, need_pos: int) -> int | None:
        """Where the journal may be cut below, given `need_pos` (what retention and the indexes still need):
        recovery needs it from the older of the two newest checkpoints. None while there is only one."""
        return min(need_pos, self.positions[-2]) if len(self.positions) >= 2 else None


def checkpoint_records(st, journal, pos: int) -> list:
    """The checkpoint of state `st` at journal position `pos`: its header (every log's next offset and epoch),
    the metadata records and the images."""
    logs = {i: (lg.next, lg.epoch, lg.fenced) for i, lg in journal.logs.items()}
    return ck.encode(ck.Header(pos, st.next_uid, logs), images.meta_records(st), images.images(st))


async def maintain_once(engine) -> None:
    """Retention, expirations, index trimming, checkpoints and WAL segment deletion: one pass."""
    now = engine.clock.now()
    engine.delivery.note_stalled_streams()
    st = engine.state
    try:
        for rec in commands.expired_snapshots(st, now):
            await engine.change(rec)
        for name in commands.inactive_subscriptions(st, now):
            if engine.owns(st.log_of_sub(name, engine.config.bundles)):  # only its owner sees its clients
                log.info("deleting %s: inactive for longer than its expiration ttl", name)
                await engine.delete_subscription(name)
    except Unavailable as e:  # a cluster node whose change met another node's (or etcd is away): next time
        log.info("expirations wait: %s", e.message)
    for rec in commands.retention(st, now):
        engine.commit(rec)
    st.prune(now, engine.config.idempotency_window_s)
    gone: list[int] = []
    need_pos = min(engine.journal.tail, st.trim_indexes(now, gone))
    engine.reader.forget(gone)  # no subscription reads them again: the cache holds what is still to be read
    floor = engine.journal_floor()  # entries a cluster node's ledger store borrows from the journal
    if floor is not None:
        need_pos = min(need_pos, floor)
    cks = engine.checkpoints
    grown = engine.journal.tail - (cks.positions[-1] if cks.positions else 0)
    if grown >= engine.config.checkpoint_wal_bytes or (
        grown > 0 and now - cks.last_time >= engine.config.checkpoint_interval_s
    ):
        await checkpoint(engine)
    if cks.positions and grown == 0:
        older = cks.positions[-2] if len(cks.positions) >= 2 else 0
        if engine.journal.journal.deletable(min(need_pos, cks.positions[-1])) > engine.journal.journal.deletable(
                min(need_pos, older)):
            # segments wait only for a second checkpoint while nothing is written (a drained backlog, a disk
            # that filled up): a marker entry that changes nothing gives a new checkpoint a position of its own
            engine.journal.mark(META_LOG)
            await engine.durable()
            await checkpoint(engine)
    cut = cks.journal_needed_from(need_pos)
    if cut is not None:
        removed = await engine.journal.delete_before(cut)
        if removed:
            log.info("deleted %d journal segments no longer needed", len(removed))


async def checkpoint(engine) -> None:
    """Write a checkpoint of everything at the current WAL position (once the WAL covers it)."""
    cks = engine.checkpoints
    async with cks.lock:
        pos = engine.journal.tail
        if cks.positions and cks.positions[-1] == pos:
            return
        if log_state.landings_pending(engine.state):
            return  # (a hand-over's homing not yet held by its log's quorum: next time)
        recs = checkpoint_records(engine.state, engine.journal.journal, pos)
        await engine.journal.wait_durable(pos)
        await asyncio.get_running_loop().run_in_executor(None, ck.write, engine.journal.disk, cks.dir, pos, recs,
                                                         cks.keep())
        cks.wrote(pos, engine.clock.now())
