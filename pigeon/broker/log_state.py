"""A bundle log's state replaced, or a (topic, shard) pair's moved to another log: how Reset and Snapshot (a node's
copy of a log starts over, from nothing or from the state its owner wrote into it) and ShardOut, ShardIn and
ShardHome (docs/cluster.md, "Scale-out" 4.3) change broker state. Owns invariant H1 on the state's side — a pair
handed out of a log is refused there (`BrokerState.log_of` raises Unavailable) until the metadata log homes it
elsewhere, and the state its new home loads is the image its old home wrote (as a snapshot of one shard loads:
invariant T3). Pure; the functions are BrokerState's `apply` handlers."""

from __future__ import annotations

from pigeon.broker.restore import Contradiction
from pigeon.storage import checkpoint as CK
from pigeon.storage import records as R

WAKE_ALL = "wake_all"  # (broker.state's effect: every waiter of the subscription looks again)


def reset(state, rec: R.Reset):
    """The node's copy of a bundle log starts over (it takes the bundle over and reads the log back from its
    ledgers): the shards of the log — every shard of its together topics, one of a spread topic — and their
    part of their subscriptions go back to their state as created. Those subscriptions' dispatch stays off
    until `resume_log`, after the log was applied again."""
    effects = []
    for t, shards in state.log_shards(rec.log, rec.bundles):
        t.clear_data(shards)
        for uid in t.subscriptions:
            s = state.subs_by_uid[uid]
            s.clear_data(shards)
            s.dispatching = False
            effects.append((WAKE_ALL, uid))
    return effects or None


def snapshot(state, rec: R.Snapshot):
    """A bundle's data state as its owner wrote it into the log (`bundle_snapshot`): the bundle is reset, then
    loaded, message indexes too: their batches are named by log addresses (core.bundles), read from the ledgers
    that hold them. (A snapshot of an earlier release has empty indexes: the log after it held every message
    still needed, its owner cut the log only where that was so.) A pair handed out and not homed elsewhere yet
    comes as its ShardOut."""
    effects = reset(state, R.Reset(rec.log, rec.bundles))
    for image in CK.decode_images(rec.images):
        if isinstance(image, CK.SubImage):
            s = state.subs_by_uid.get(image.uid)
            if s is None:
                continue  # deleted since (the metadata log runs ahead of this one)
            t = s.topic
        else:
            t = state.topics_by_uid.get(image.topic)
            if t is None:
                continue
        state.restore(image, None if t is None else state.shards_in(t, rec.log, rec.bundles))
    return effects


def shard_out(state, rec: R.ShardOut):
    """The pair leaves this log: its state goes from here (its records are refused until it is homed
    elsewhere), and the record is kept — with the pair's image — until then, for a bundle snapshot to carry."""
    t = state.topics_by_uid.get(rec.topic)
    if t is None or t.deleted:
        return None
    t.away[rec.shard] = rec
    t.spread = True
    state.spread = True
    return _drop_pair(state, t, rec.shard, rec.now)


def shard_in(state, rec: R.ShardIn):
    """The pair arrives with the state it had in its old home: loaded as a snapshot of one shard loads. Applied
    twice (a hand-over finished again after a crash), the second changes nothing: the same image loads again."""
    t = state.topics_by_uid.get(rec.topic)
    if t is None or t.deleted:
        return None
    effects = _drop_pair(state, t, rec.shard, None)
    for image in CK.decode_images(rec.images):
        if isinstance(image, CK.SubImage) and state.subs_by_uid.get(image.uid) is None:
            continue  # deleted since
        state.restore(image, {rec.shard})
    _rebuild(state, t, rec.now)
    return effects


def shard_home(state, rec: R.ShardHome):
    """The pair's records go to `rec.log` from now on (every node applies it in the metadata log's order)."""
    t = state.topics_by_uid.get(rec.topic)
    if t is None:
        raise Contradiction(f"a home for shard {rec.shard} of topic {rec.topic}, which does not exist")
    if rec.shard >= len(t.shards):
        raise Contradiction(f"a home for shard {rec.shard} of topic {rec.topic}, which has {len(t.shards)}")
    t.home(rec.shard, rec.log)
    state.spread = True
    for uid in t.subscriptions:
        state.subs_by_uid[uid].log_id = None
    return None


def _drop_pair(state, t, shard: int, now: float | None):
    t.clear_data({shard})
    effects = []
    for uid in t.subscriptions:
        state.subs_by_uid[uid].clear_data({shard})
        effects.append((WAKE_ALL, uid))
    if now is not None:
        _rebuild(state, t, now)
    return effects or None


def _rebuild(state, t, now: float) -> None:
    """Dispatch of the topic's subscriptions derived again (a shard came or went), unless it is off (a log
    applied again: `resume_log` derives it once the log is through)."""
    for uid in t.subscriptions:
        s = state.subs_by_uid[uid]
        if state.dispatching and s.dispatching:
            s.rebuild(now)
