"""A record of a spread topic cut into one record a shard (docs/cluster.md, "Which state is a shard's"). Owns the
rule: each shard's part of a subscription's state lives in that shard's log, so a record that names messages of
several shards — a delivery, an ack, a deadline change, a reschedule — is committed as one record a shard, each
holding exactly that shard's messages in their order; applied one after the other, the parts change the state
as the whole would. Pure."""

from __future__ import annotations

from pigeon.broker.topic import SHARD_MASK
from pigeon.storage import records as R


def shards_of(rec: R.Record) -> list[int] | None:
    """The shards a data record names, in order of first appearance (shard 0 for one that names no message);
    None for a Seek of every shard."""
    t = rec.TYPE
    if t in (R.RecordType.PUBLISH, R.RecordType.TRIM):
        return [rec.shard]
    if t == R.RecordType.SEEK:
        return None if rec.shard is None else [rec.shard]
    if t == R.RecordType.UPDATE:
        return [rec.num & SHARD_MASK]
    shards = dict.fromkeys(_shards(rec.nums))
    if t == R.RecordType.DELIVER and rec.dead:
        shards.update(dict.fromkeys(_shards(n for n, _ in rec.dead)))
    return list(shards) or [0]  # (naming none, it changes nothing)


def _shards(nums) -> list[int]:
    """Each number's shard (a list comprehension, Python's quickest pass here: an ack of thousands is common)."""
    return [n & SHARD_MASK for n in nums]


def shard_of(rec: R.Record) -> int:
    """The shard of a data record that names one shard (a part `split` cut, or a record of a topic in one bundle):
    its first message's (shard 0 for one that names none)."""
    t = rec.TYPE
    if t in (R.RecordType.PUBLISH, R.RecordType.TRIM, R.RecordType.SEEK):
        return rec.shard or 0
    if t == R.RecordType.UPDATE:
        return rec.num & SHARD_MASK
    if rec.nums:
        return rec.nums[0] & SHARD_MASK
    if t == R.RecordType.DELIVER and rec.dead:
        return rec.dead[0][0] & SHARD_MASK
    return 0



def split(rec: R.Record) -> list[tuple[int, R.Record]]:
    """(shard, the record's part of it) for each shard `rec` names; one pair when it names one."""
    shards = shards_of(rec)
    if shards is None:  # a Seek of every shard: one a shard, each bumping its own shard's seek generation
        return [(k, R.Seek(rec.sub, [f], [a], k)) for k, (f, a) in enumerate(zip(rec.floors, rec.acked))]
    if len(shards) == 1:
        return [(shards[0], rec)]
    t = rec.TYPE
    picks: dict[int, list[int]] = {k: [] for k in shards}  # shard → the indexes of its messages, in one pass
    for i, k in enumerate(_shards(rec.nums)):
        picks[k].append(i)
    out = []
    for k in shards:
        pick = picks[k]
        nums = [rec.nums[i] for i in pick]
        if t == R.RecordType.DELIVER:
            dead = [d for d in rec.dead or () if d[0] & SHARD_MASK == k] or None
            part = R.Deliver(rec.sub, rec.deadline, nums,
                             None if rec.versions is None else [rec.versions[i] for i in pick],
                             None if rec.keys is None else [rec.keys[i] for i in pick], dead)
        elif t == R.RecordType.MODACK:
            part = R.Modack(rec.sub, rec.now, rec.seconds, nums, [rec.versions[i] for i in pick])
        elif t == R.RecordType.PARK:
            part = R.Park(rec.sub, rec.activate_ms, nums)
        else:  # Ack, Kick
            part = type(rec)(rec.sub, nums)
        out.append((k, part))
    return out
