"""Periodic upkeep of a node. Owns the rules: unacked messages past a subscription's retention are dropped
for it; a shard keeps what any subscription, snapshot or retention still needs; checkpoints are written
tmp → fsync → rename → fsync dir and only once the WAL covers their position; the WAL is cut only below
what the two newest checkpoints and the retained messages need."""

from __future__ import annotations

import asyncio
import base64
import logging
import os

from pigeon.broker import resources
from pigeon.node import recovery
from pigeon.node.wal import fsync_dir
from pigeon.storage import payloads

log = logging.getLogger("pigeon.maintenance")


async def maintain_once(engine) -> None:
    """Retention, expirations, index trimming, checkpoints and WAL segment deletion: one pass."""
    now = engine.clock.now()
    reg = engine.registry
    for name in [n for n, sn in reg.snapshots.items() if sn.config.expire_time.ToMilliseconds() <= now * 1000]:
        await engine._log_change({"op": "snap.del", "name": name})
    # expiration policy: subscriptions inactive for their ttl are deleted
    for s in list(reg.subs_by_uid.values()):
        ep = s.config.expiration_policy
        if s.config.HasField("expiration_policy") and ep.HasField("ttl"):
            if now - s.last_activity > resources.duration_s(ep.ttl):
                log.info("deleting %s: inactive for longer than its expiration ttl", s.name)
                await engine.delete_subscription(s.name)
    # unacked messages older than a subscription's retention are dropped for it
    for s in reg.subs_by_uid.values():
        if s.topic is None:
            continue
        cutoff_ms = int((now - resources.duration_s(s.config.message_retention_duration)) * 1000)
        for shard, ix in enumerate(s.topic.shards):
            if s.shards[shard].floor < ix.durable:
                s.drop_before(shard, min(ix.offset_at_ms(cutoff_ms), ix.durable))
    cutoff = int((now - engine.config.idempotency_window_s) * 1000)
    for t in reg.topics_by_uid.values():
        t.idempotency.expire(cutoff)
        if t.schedule.count:  # forget activation seconds every subscription has walked and acked
            subs = [reg.subs_by_uid[u] for u in t.subscriptions]
            low = min((s.sched_mark[0] for s in subs), default=int(now) + 1)
            t.schedule.drop_seconds_before(low, lambda n, subs=subs: any(not s.is_acked(n) for s in subs))
    # what each topic shard must keep
    need_pos = engine.wal.tail
    for t in reg.topics_by_uid.values():
        for shard, ix in enumerate(t.shards):
            keep = ix.next
            if t.config.HasField("message_retention_duration"):
                ms = int((now - resources.duration_s(t.config.message_retention_duration)) * 1000)
                keep = min(keep, ix.offset_at_ms(ms))
            for uid in t.subscriptions:
                s = reg.subs_by_uid[uid]
                keep = min(keep, s.shards[shard].floor)
                if s.config.retain_acked_messages:
                    ms = int((now - resources.duration_s(s.config.message_retention_duration)) * 1000)
                    keep = min(keep, ix.offset_at_ms(ms))
            for sn in reg.snapshots.values():
                if sn.topic_uid == t.uid and shard < len(sn.floors):
                    keep = min(keep, sn.floors[shard])
            ix.trim_before(keep)
            if ix.base:
                need_pos = min(need_pos, ix.pos[0])
    grown = engine.wal.tail - (engine._checkpoints[-1] if engine._checkpoints else 0)
    if grown >= engine.config.checkpoint_wal_bytes or (
        grown > 0 and now - engine._last_ck_time >= engine.config.checkpoint_interval_s
    ):
        await checkpoint(engine)
    # recovery needs the WAL from the older of the two newest checkpoints
    if len(engine._checkpoints) >= 2:
        removed = engine.wal.delete_before(min(need_pos, engine._checkpoints[-2]))
        if removed:
            log.info("deleted %d WAL segments no longer needed", len(removed))

async def checkpoint(engine) -> None:
    """Write a checkpoint of everything at the current WAL position (once the WAL covers it)."""
    async with engine._ck_lock:
        pos = engine.wal.tail
        if engine._checkpoints and engine._checkpoints[-1] == pos:
            return
        reg = engine.registry
        recs = [payloads.checkpoint_header(pos, reg.export_meta())]
        for t in reg.topics_by_uid.values():
            for shard, ix in enumerate(t.shards):
                recs.append(payloads.checkpoint_shard(t.uid, shard, *ix.export()))
            if t.schedule.count:
                recs.append(payloads.checkpoint_schedule(t.uid, t.schedule.export()))
        for s in reg.subs_by_uid.values():
            extra = {}
            if s.parked:
                extra["parked"] = [[n, at] for n, at in s.parked.items()]
            if s.overrides:
                extra["overrides"] = [[n, base64.b64encode(b).decode()] for n, b in s.overrides.items()]
            recs.append(payloads.checkpoint_sub(s.uid, *s.export_state(), s.export_attempts(), extra))
        recs.append(payloads.checkpoint_end(len(recs)))
        await engine.wal.wait_durable(pos)
        keep = engine._checkpoints[-1:]
        await asyncio.get_running_loop().run_in_executor(None, _write_checkpoint, engine._ck_dir, pos, recs, keep)
        engine._checkpoints = keep + [pos]
        engine._last_ck_time = engine.clock.now()


def _write_checkpoint(ck_dir: str, pos: int, recs: list[bytes], keep: list[int]) -> None:
    final = os.path.join(ck_dir, recovery.checkpoint_name(pos))
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(recs))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, final)
    fsync_dir(ck_dir)
    for old in recovery.list_checkpoints(ck_dir):
        if old != pos and old not in keep:
            os.unlink(os.path.join(ck_dir, recovery.checkpoint_name(old)))
