"""Loading the images a checkpoint or a bundle snapshot holds (broker.images writes them) into broker state. Owns
the rule: an image loads whole into a state that has just been cleared for it — or, from the snapshot of one shard's
log of a spread topic, only that shard's part, beside the others' (docs/cluster.md, invariant T3). Pure."""

from __future__ import annotations

from pigeon.broker.topic import SHARD_MASK, ShardIndex
from pigeon.storage import checkpoint as CK


class Contradiction(Exception):
    """A record or image that does not fit the state it is applied to."""


def load(state, image, shards: set[int] | None = None) -> None:
    """Load `image` into `state` (a BrokerState): of `shards` only, when given. Raises Contradiction."""
    if isinstance(image, CK.SubImage):
        s = state.subs_by_uid.get(image.uid)
        if s is None or len(image.floors) != len(s.shards):
            raise Contradiction(f"checkpoint state of subscription {image.uid}, which does not fit")
        gens = image.generations or [0] * len(image.floors)
        if shards is None or len(shards) == len(s.shards):
            s.reset(image.floors, image.acked)
            s.restore_leases(image.leases)
            s.versions.update(image.versions)
            s.restore_parked(image.parked)
            s.overrides.update(image.overrides)
            s.generations = list(gens)
            return
        ours = lambda n: n & SHARD_MASK in shards  # noqa: E731
        for k in shards:
            s.load_shard(k, image.floors[k], image.acked[k])
            s.generations[k] = gens[k]
        s.restore_leases([row for row in image.leases if ours(row[0])])
        s.versions.update((n, v) for n, v in image.versions if ours(n))
        s.restore_parked([(n, at) for n, at in image.parked if ours(n)])
        s.overrides.update((n, m) for n, m in image.overrides if ours(n))
        return
    t = state.topics_by_uid.get(image.topic)
    if t is None:
        raise Contradiction(f"checkpoint index of topic {image.topic}, which does not exist")
    ours = (lambda n: True) if shards is None else (lambda n: n & SHARD_MASK in shards)  # noqa: E731
    if isinstance(image, CK.ShardImage):
        if image.shard >= len(t.shards):
            raise Contradiction(f"checkpoint index of shard {image.shard} of topic {image.topic}")
        if shards is None or image.shard in shards:
            t.shards[image.shard] = t.new_index(image.shard, ShardIndex.restore(image.next, image.base, image.pos, image.ms,
                                                                                image.keys))
    elif isinstance(image, CK.ScheduleImage):
        t.schedule.restore(image.seconds, None if shards is None else ours)
    else:
        for key, mid, ms in image.entries:
            if ours(int(mid)):
                t.idempotency.add(key, mid, ms)
