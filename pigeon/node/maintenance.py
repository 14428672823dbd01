"""Periodic upkeep of a node. Owns the rules: unacked messages past a subscription's retention are dropped
for it (a Trim record); a shard keeps what any subscription, snapshot or retention still needs; checkpoints are
written tmp → fsync → rename → fsync dir and only once the WAL covers their position; the WAL is cut only below
what the two newest checkpoints and the retained messages need.

Pruning that removes nothing a reader can still see — expired idempotency keys, activation seconds every
subscription walked past, index batches below every floor — is not a record: recovery may prune later."""

from __future__ import annotations

import asyncio
import logging

from pigeon.broker import resources
from pigeon.storage import checkpoint as ck
from pigeon.storage import records as R

log = logging.getLogger("pigeon.maintenance")


async def maintain_once(engine) -> None:
    """Retention, expirations, index trimming, checkpoints and WAL segment deletion: one pass."""
    now = engine.clock.now()
    st = engine.state
    for name in [n for n, sn in st.snapshots.items() if sn.config.expire_time.ToMilliseconds() <= now * 1000]:
        await engine._change(R.SnapDel(name))
    # expiration policy: subscriptions inactive for their ttl are deleted
    for s in list(st.subs_by_uid.values()):
        ep = s.config.expiration_policy
        if s.config.HasField("expiration_policy") and ep.HasField("ttl"):
            if now - s.last_activity > resources.duration_s(ep.ttl):
                log.info("deleting %s: inactive for longer than its expiration ttl", s.name)
                await engine.delete_subscription(s.name)
    # unacked messages older than a subscription's retention are dropped for it
    for s in list(st.subs_by_uid.values()):
        if s.topic is None:
            continue
        cutoff_ms = int((now - resources.duration_s(s.config.message_retention_duration)) * 1000)
        for shard, ix in enumerate(s.topic.shards):
            if s.shards[shard].floor < ix.durable:
                offset = min(ix.offset_at_ms(cutoff_ms), ix.durable)
                if offset > s.shards[shard].floor:
                    engine.commit(R.Trim(s.uid, shard, offset))
    cutoff = int((now - engine.config.idempotency_window_s) * 1000)
    for t in st.topics_by_uid.values():
        t.idempotency.expire(cutoff)
        if t.schedule.count:  # forget activation seconds every subscription has walked and acked
            subs = [st.subs_by_uid[u] for u in t.subscriptions]
            low = min((s.sched_mark[0] for s in subs), default=int(now) + 1)
            t.schedule.drop_seconds_before(low, lambda n, subs=subs: any(not s.is_acked(n) for s in subs))
    # what each topic shard must keep
    need_pos = engine.journal.tail
    for t in st.topics_by_uid.values():
        for shard, ix in enumerate(t.shards):
            keep = ix.next
            if t.config.HasField("message_retention_duration"):
                ms = int((now - resources.duration_s(t.config.message_retention_duration)) * 1000)
                keep = min(keep, ix.offset_at_ms(ms))
            for uid in t.subscriptions:
                s = st.subs_by_uid[uid]
                keep = min(keep, s.shards[shard].floor)
                if s.config.retain_acked_messages:
                    ms = int((now - resources.duration_s(s.config.message_retention_duration)) * 1000)
                    keep = min(keep, ix.offset_at_ms(ms))
            for sn in st.snapshots.values():
                if sn.topic_uid == t.uid and shard < len(sn.floors):
                    keep = min(keep, sn.floors[shard])
            ix.trim_before(keep)
            if ix.base:
                need_pos = min(need_pos, ix.pos[0])
    grown = engine.journal.tail - (engine._checkpoints[-1] if engine._checkpoints else 0)
    if grown >= engine.config.checkpoint_wal_bytes or (
        grown > 0 and now - engine._last_ck_time >= engine.config.checkpoint_interval_s
    ):
        await checkpoint(engine)
    # recovery needs the WAL from the older of the two newest checkpoints
    if len(engine._checkpoints) >= 2:
        removed = engine.journal.delete_before(min(need_pos, engine._checkpoints[-2]))
        if removed:
            log.info("deleted %d WAL segments no longer needed", len(removed))


async def checkpoint(engine) -> None:
    """Write a checkpoint of everything at the current WAL position (once the WAL covers it)."""
    async with engine._ck_lock:
        pos = engine.journal.tail
        if engine._checkpoints and engine._checkpoints[-1] == pos:
            return
        st = engine.state
        logs = {i: (lg.next, lg.epoch, lg.fenced) for i, lg in engine.journal.journal.logs.items()}
        recs = ck.encode(ck.Header(pos, st.next_uid, logs), st.meta_records(), st.images())
        await engine.journal.wait_durable(pos)
        keep = engine._checkpoints[-1:]
        await asyncio.get_running_loop().run_in_executor(None, ck.write, engine.journal.disk, engine._ck_dir, pos,
                                                         recs, keep)
        engine._checkpoints = keep + [pos]
        engine._last_ck_time = engine.clock.now()
