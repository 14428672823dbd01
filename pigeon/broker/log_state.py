"""A bundle log's state replaced, or a (topic, shard) pair's moved to another log: how Reset and Snapshot (a node's
copy of a log starts over, from nothing or from the state its owner wrote into it) and ShardOut, ShardIn and
ShardHome (docs/cluster.md, "Scale-out" 4.3) change broker state. Owns invariant H1 on the state's side — a pair
handed out of a log is refused there (`BrokerState.log_of` raises Unavailable) until the metadata log homes it
elsewhere, and the state its new home loads is the image its old home wrote (as a snapshot of one shard loads:
invariant T3), and a log read back by a new owner applies only the records of its pairs' present stays there
(`apply_in_log`). Pure; the functions are BrokerState's `apply` handlers."""

from __future__ import annotations

from pigeon.broker import shard_split
from pigeon.broker.restore import Contradiction
from pigeon.core.bundles import META_LOG
from pigeon.core.errors import Unavailable
from pigeon.storage import checkpoint as CK
from pigeon.storage import records as R

WAKE_ALL = "wake_all"  # (broker.state's effect: every waiter of the subscription looks again)
OWN_LOG = frozenset((R.RecordType.RESET, R.RecordType.SNAPSHOT, R.RecordType.SHARD_OUT, R.RecordType.SHARD_IN))
# (records that name the log they go to)


def reset(state, rec: R.Reset):
    """The node's copy of a bundle log starts over (it takes the bundle over and reads the log back from its
    ledgers): the shards of the log — every shard of its together topics, one of a spread topic — and their
    part of their subscriptions go back to their state as created. Those subscriptions' dispatch stays off
    until `resume_log`, after the log was applied again. The ShardOuts written to the log go too (each is read
    again with the log, if it holds it; a next owner of the log finishes its hand-over) — also one whose pair a
    ShardIn on this node homed in the new log already, pending until its ShardHome, which is not among the log's
    pairs any more: kept, it would leave the pair handed out for good on a node that no longer owns the old home,
    and a takeover of the new home would leave out the pair's records there."""
    effects = []
    state.log_eras[rec.log] = {}
    for t, shards in state.log_shards(rec.log, rec.bundles):
        t.clear_data(shards)
        for uid in t.subscriptions:
            s = state.subs_by_uid[uid]
            s.clear_data(shards)
            s.dispatching = False
            effects.append((WAKE_ALL, uid))
    for t in state.topics_by_uid.values():
        if t.away:
            for k in [k for k, out in t.away.items() if out.log == rec.log]:
                del t.away[k]
        if t.landed and _unland(state, t, rec.log):
            # (the pair left the log: `resume_log` of the log turns its subscriptions' dispatch on again, which
            # the loop above turned off — they may have no other shard in the log)
            state.unlanded.setdefault(rec.log, set()).add(t.uid)
    return effects or None


def _unland(state, t, log: int) -> bool:
    """The homings in `log` that only the log's own records made (`TopicState.landed`) go with the log's state:
    the pair is back where it was before. Kept, a ShardIn that never became durable in the log (its owner lost
    the log first, or crashed and replayed it from its journal) left the pair homed there for good: on taking
    the log (back), the node took the pair's records into it before any ShardIn, and counted the pair's empty
    index as the log's — its `lent/` key of the old log deleted, the old log cut under the batches the
    hand-over's image names (cluster simulator seed 3763: acknowledged publishes never delivered). The log read
    back homes the pair again if it holds its ShardIn (or a snapshot's ShardHome). Whether it put a pair back."""
    moved = False
    for k in [k for k, landing in t.landed.items() if landing[0] == log]:
        _, gen, before, gen_before = t.landed.pop(k)
        if t.homes.get(k) != log or t.gens.get(k) != gen:
            continue  # (homed on since)
        moved = True
        if before is None:
            del t.homes[k]
        else:
            t.homes[k] = before
        if gen_before is None:
            t.gens.pop(k, None)
        else:
            t.gens[k] = gen_before
        t.shard_logs = None
        t.log_id = None
        for uid in t.subscriptions:
            state.subs_by_uid[uid].log_id = None
    return moved


def confirm_landings(state, log: int, pair: tuple[int, int, int] | None = None) -> None:
    """The records of `log` that homed pairs there — each (`pair`: topic, shard, hand-over), or all — are known
    to be in the log: this node's commit of them is held by the log's quorum, or it read them back from the log's
    ledgers. Their homings are no longer undone by a reset of the log (`_unland`): every later owner of the log
    reads them back, and the hand-over's ShardHome follows (its old home's owner commits it until it is homed).
    Undone, such a homing left a node that gave the log up (or lost it) with the pair back in its old home, its
    dispatch off until the ShardHome (cluster simulator seeds 3608, 3700, 3752: an ordering key stuck)."""
    for t in state.topics_by_uid.values() if pair is None else filter(None, [state.topics_by_uid.get(pair[0])]):
        for k in [k for k, landing in t.landed.items()
                  if landing[0] == log and (pair is None or (k, landing[1]) == (pair[1], pair[2]))]:
            del t.landed[k]


def landings_pending(state) -> bool:
    """Whether a pair is homed by a log's record the metadata log has not homed it by yet. Not held by the log's
    quorum yet either (`landed`), a checkpoint would hold the pair's state as that record made it but its home
    as before it (`images`: no checkpoint makes a homing one that no reset of the log undoes), and the record
    itself would lie before the checkpoint: replayed on it, the hand-over's ShardHome finds the pair never
    handed in and drops its state — the node's next start then fails on the pair's next record. Held, the
    checkpoint would write it as a ShardHome: replayed, the pair would look homed by the metadata log, and its
    ShardOut, read back with the old home, would no longer be kept pending (`shard_out`)."""
    return any(t.landed or not t.deleted and any(g > t.meta_gens.get(k, 0) for k, g in t.gens.items())
               for t in state.topics_by_uid.values())  # (a checkpoint writes no home of a deleted topic)


def _landing(t, shard: int, log: int, gen: int) -> tuple:
    """What `TopicState.landed` keeps for a homing of the pair in `log` by a record of that log: the homing
    before it (the earliest one's, when the log's records homed it before already)."""
    was = t.landed.get(shard)
    if was is not None and was[0] == log:
        return log, gen, was[2], was[3]
    return log, gen, t.homes.get(shard), t.gens.get(shard)


def snapshot(state, rec: R.Snapshot):
    """A bundle's data state as its owner wrote it into the log (`bundle_snapshot`): the bundle is reset, then
    loaded, message indexes too: their batches are named by log addresses (core.bundles), read from the ledgers
    that hold them. (A snapshot of an earlier release has empty indexes: the log after it held every message
    still needed, its owner cut the log only where that was so.) A pair handed out and not homed elsewhere yet
    comes as its ShardOut; one handed in by a hand-over comes with its ShardHome, applied first, so that a node
    whose metadata log has not homed it yet loads it too."""
    images = CK.decode_images(rec.images)
    landed = []  # (a homing the snapshot makes or carries is the log's own: the reset below must not undo it,
    for image in images:  # and a later reset of the log must)
        t = state.topics_by_uid.get(image.topic) if isinstance(image, R.ShardHome) else None
        if t is not None and t.gens.get(image.shard, 0) < image.gen:  # (the reset below clears the pair)
            landing = _landing(t, image.shard, image.log, image.gen)  # (homed by the log, not yet by the metadata
            _homed(state, t, image.shard, image.log, image.gen, until_home=True)  # log: as a ShardIn, `shard_in`)
            landed.append((t, image.shard, landing))
        elif t is not None and image.shard in t.landed and t.gens.get(image.shard) == image.gen:
            landed.append((t, image.shard, t.landed.pop(image.shard)))
    effects = reset(state, R.Reset(rec.log, rec.bundles))
    for t, k, landing in landed:
        t.landed[k] = landing
    state.log_eras[rec.log] = {(i.topic, i.shard): i.gen for i in images if isinstance(i, R.ShardHome)}
    for image in images:
        if isinstance(image, R.ShardHome):
            continue
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
    elsewhere), and the record is kept — with the pair's image — until then, for a bundle snapshot to carry. A
    ShardOut of a hand-over the metadata log has homed already, or a later one, changes nothing (read again with
    its log). One whose ShardIn alone homed the pair here (this node owns, or owned, the new home too) is kept
    pending, the pair's state left as its new home has it: until the metadata log's ShardHome, which this log's
    owner commits (`node.handover`) and its snapshots carry on — dropped, no node would commit it, and a next
    owner of the log whose metadata log has no ShardHome would count the pair as the log's, with none of its
    state, and hand it over again with an empty index (cluster simulator seed 23105: the log cut under the
    batches the first hand-over's image names)."""
    t = state.topics_by_uid.get(rec.topic)
    gen = None if t is None else t.gens.get(rec.shard, 0)
    if t is None or gen > rec.gen or t.meta_gens.get(rec.shard, 0) >= rec.gen:
        return None
    t.away[rec.shard] = rec
    if gen == rec.gen:
        return None
    t.spread = True
    state.spread = True
    return _drop_pair(state, t, rec.shard, rec.now)


def shard_in(state, rec: R.ShardIn):
    """The pair arrives with the state it had in its old home, loaded as a snapshot of one shard loads, and its
    records go to this log from now on — on this node at once (its old home refuses them since its ShardOut:
    invariant H1), on the others once the metadata log's ShardHome reaches them. A ShardIn of a hand-over this
    state has seen superseded changes nothing; one of the pair's latest hand-over loads the image — read back
    with its log after a reset, before any of the pair's records in the log (its owner commits it again only
    while the pair is not homed here: `node.handover`)."""
    state.log_eras.setdefault(rec.log, {})[(rec.topic, rec.shard)] = rec.gen
    t = state.topics_by_uid.get(rec.topic)
    if t is None or t.gens.get(rec.shard, 0) > rec.gen:
        return None
    effects = _drop_pair(state, t, rec.shard, None)
    for image in CK.decode_images(rec.images):
        if isinstance(image, CK.SubImage) and state.subs_by_uid.get(image.uid) is None:
            continue  # deleted since
        state.restore(image, {rec.shard})
    if t.gens.get(rec.shard, 0) < rec.gen:  # (not homed by the metadata log's ShardHome already)
        t.landed[rec.shard] = _landing(t, rec.shard, rec.log, rec.gen)
    _homed(state, t, rec.shard, rec.log, rec.gen, until_home=True)
    _rebuild(state, t, rec.now)
    return effects


def shard_home(state, rec: R.ShardHome):
    """The pair's records go to `rec.log` from now on (every node applies it in the metadata log's order). One of
    a hand-over this state has applied already, or seen superseded, changes nothing. Applied where the ShardIn
    was not, it drops what the state holds of the pair: nothing on a node that owns neither log; the pair as of
    before its ShardOut on one that owned the old home and lost it without learning of the ShardOut (its log was
    another's by then) — left, that copy would be dispatched from, and no later reset of the old log would clear
    it (the pair is not that log's any more)."""
    t = state.topics_by_uid.get(rec.topic)
    if t is None:
        raise Contradiction(f"a home for shard {rec.shard} of topic {rec.topic}, which does not exist")
    if rec.shard >= len(t.shards):
        raise Contradiction(f"a home for shard {rec.shard} of topic {rec.topic}, which has {len(t.shards)}")
    t.meta_gens[rec.shard] = max(rec.gen, t.meta_gens.get(rec.shard, 0))
    out = t.away.get(rec.shard)
    if out is not None and out.gen <= rec.gen:  # (that hand-over is homed: a ShardIn here kept it pending till now)
        del t.away[rec.shard]
    landing = t.landed.get(rec.shard)
    if landing is not None and landing[1] <= rec.gen:  # (the metadata log homes it: no reset of a log undoes it)
        del t.landed[rec.shard]
    if t.gens.get(rec.shard, 0) >= rec.gen:
        return None
    effects = _drop_pair(state, t, rec.shard, None)
    _homed(state, t, rec.shard, rec.log, rec.gen)
    _rebuild(state, t, rec.now)
    return effects


def _homed(state, t, shard: int, log: int, gen: int, until_home: bool = False) -> None:
    """The pair's records go to `log` from its `gen`-th hand-over on. A ShardOut this state holds of a later
    hand-over stays pending; so does the ShardOut of this one when a ShardIn homes it (`until_home`: on a node
    that owns both logs, the pair is refused until the metadata log's ShardHome — which the old home's owner
    waits for, and commits again after a failure, as long as the ShardOut is pending)."""
    out = t.away.get(shard)
    t.home(shard, log, gen)
    if out is not None and (out.gen > gen or until_home and out.gen == gen):
        t.away[shard] = out
    state.spread = True
    for uid in t.subscriptions:
        state.subs_by_uid[uid].log_id = None


def apply_in_log(state, rec: R.Record, log: int, bundles: int, at: int = 0):
    """Apply a record read back from bundle log `log` (a takeover): the parts of a pair this state knows is
    no longer the log's — handed over since (invariant H1: the log holds the pair's records only from before
    its ShardOut) — are left out, so that they touch neither the pair's state another log of this node holds
    nor a state that would be dispatched from. A pair handed into the log, whose hand-over is pending still on
    this node (it owns the old home too: its own ShardIn left it so until the ShardHome), is the log's: the
    records after its ShardIn are its present stay there — another owner of the log, which homed the pair at
    its ShardIn, may have committed them meanwhile. Effects as `apply`'s."""
    if not state.spread or rec.TYPE in OWN_LOG:
        return state.apply(rec, at)
    effects = []
    eras = state.log_eras.get(log, {})
    for part in state.split(rec):
        t = state.topics_by_uid.get(part.topic) if part.TYPE == R.RecordType.PUBLISH else \
            getattr(state.subs_by_uid.get(part.sub), "topic", None)
        shards = shard_split.shards_of(part) if t is not None and t.gens else None
        try:
            if state.log_of(part, bundles) not in (log, META_LOG):
                continue
        except Unavailable:  # (handed out of another log, not homed yet: not this log's either — unless handed
            out = t.away.get(shards[0]) if shards else None  # in here, and read back after its ShardIn)
            if out is None or out.to != log or eras.get((t.uid, shards[0]), 0) != out.gen:
                continue
        if shards and eras.get((t.uid, shards[0]), 0) != t.gens.get(shards[0], 0):
            continue  # (of an earlier stay of the pair in this log: the hand-over since brought its state)
        effects.extend(state.apply(part, at) or ())
    return effects or None


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
