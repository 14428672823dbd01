"""The broker state written down: as the records that recreate its metadata plus the compact images of its indexes
and subscriptions (a checkpoint: storage.checkpoint frames them), or one bundle's data state as a Snapshot record
(a cluster's bundle log is cut there). Owns the rule: applying what is written here to an empty state — the
records with `BrokerState.apply`, the images with `BrokerState.restore` — gives back the state it was written
from, but for message indexes a snapshot leaves out (the log after it holds every message still needed). Pure."""

from __future__ import annotations

import sys
from array import array
from typing import Callable

from pigeon.broker.state import BrokerState
from pigeon.broker.subscription import SubscriptionState
from pigeon.broker.topic import SHARD_MASK, TopicState
from pigeon.core.bundles import LOG_ADDRESS, split_log_address
from pigeon.storage import checkpoint as CK
from pigeon.storage import records as R


def meta_records(state: BrokerState) -> list[R.Record]:
    """Records that recreate the metadata (topics, subscriptions, snapshots, schemas, policies) on an empty state,
    in an order `apply` accepts: a deleted topic that kept subscriptions comes back with them and is deleted again
    before a newer topic of the same name is created."""
    out: list[R.Record] = []

    def topic_and_subs(t: TopicState) -> None:
        out.append(R.TopicPut(t.uid, len(t.shards), t.config.SerializeToString(deterministic=True), t.layout_spread))
        out.extend(_homes(t))
        for uid in sorted(t.subscriptions):
            out.append(_sub_record(state.subs_by_uid[uid]))
        if t.deleted:
            out.append(R.TopicDel(t.uid))

    topics = sorted(state.topics_by_uid.values(), key=lambda t: t.uid)
    for t in topics:
        if t.deleted:
            topic_and_subs(t)
    for t in topics:
        if not t.deleted:
            topic_and_subs(t)
    out.extend(_sub_record(s) for s in state.subs_by_uid.values() if s.topic is None)
    for sn in state.snapshots.values():
        out.append(R.SnapPut(sn.topic_uid, sn.config.SerializeToString(deterministic=True), list(sn.floors),
                             [list(a) for a in sn.acked]))
    for revs in state.schemas.values():
        out.extend(R.SchemaPut(r.SerializeToString(deterministic=True)) for r in revs)
    for name, p in state.policies.items():
        out.append(R.PolicyPut(name, p.SerializeToString(deterministic=True)))
    return out


def _homes(t: TopicState) -> list[R.ShardHome]:
    """The topic's homes as the metadata log made them: a homing only a log's own record made (`landed`) is
    written as the home before it — a checkpoint must not make it one no reset of the log undoes (the log,
    read back by a takeover, homes the pair again if it holds that record)."""
    out = []
    for k, log in sorted(t.homes.items()):
        landing = t.landed.get(k)
        if landing is not None and landing[0] == log and landing[1] == t.gens[k]:
            if landing[2] is not None and landing[3] is not None:
                out.append(R.ShardHome(t.uid, k, landing[2], landing[3]))
        else:
            out.append(R.ShardHome(t.uid, k, log, t.gens[k]))
    return out


def _sub_record(s: SubscriptionState) -> R.SubPut:
    return R.SubPut(s.uid, s.topic.uid if s.topic is not None else 0, s.config.SerializeToString(deterministic=True),
                    list(s.start))


def images(state: BrokerState):
    """The compact parts of a checkpoint, after `meta_records`: shard indexes, activation indexes, idempotency
    windows and each subscription's durable state."""
    for t in sorted(state.topics_by_uid.values(), key=lambda t: t.uid):
        for shard, ix in enumerate(t.shards):
            yield CK.ShardImage(t.uid, shard, *ix.export())
        if t.schedule.count:
            yield CK.ScheduleImage(t.uid, t.schedule.export())
        idem = t.idempotency.export()
        if idem:
            yield CK.IdempotencyImage(t.uid, idem)
        yield from (t.away[k] for k in sorted(t.away))  # (pairs handed out, not homed elsewhere yet)
    for s in sorted(state.subs_by_uid.values(), key=lambda s: s.uid):
        yield sub_image(s)


def sub_image(s: SubscriptionState, shards: set[int] | None = None) -> CK.SubImage:
    """A subscription's durable state — of `shards` only, when given (the others' floors are written as they are
    and never read: `BrokerState.restore` loads a snapshot's shards only)."""
    floors, acked = s.export_state()
    leases, versions = s.export_leases(), list(s.versions.items())
    parked, overrides = list(s.parked.items()), list(s.overrides.items())
    if shards is not None and len(shards) < len(s.shards):
        leases, versions, parked, overrides = ([row for row in rows if row[0] & SHARD_MASK in shards]
                                               for rows in (leases, versions, parked, overrides))
        acked = [a if k in shards else [] for k, a in enumerate(acked)]
    return CK.SubImage(s.uid, floors, acked, leases, versions, parked, overrides, list(s.generations))


def _bundle(state: BrokerState, log: int, bundles: int) -> list[tuple[TopicState, set[int]]]:
    """(topic, its shards in the log) for every topic with a shard in bundle log `log`, by uid."""
    return sorted(state.log_shards(log, bundles), key=lambda pair: pair[0].uid)


def bundle_snapshot(state: BrokerState, log: int, bundles: int,
                    addresses: Callable[[array], array] | None = None, indexes: bool = True) -> R.Snapshot:
    """The record that recreates this bundle's data state when applied — its message indexes too, with each batch
    named by its log address (`addresses` turns the index's positions into those: docs/cluster.md, "Scale-out"), so
    the messages before the snapshot are read from the ledgers that hold them. Without `indexes` (cluster format 1)
    the shard indexes are left empty: the log after the snapshot must hold every message still needed. A pair
    handed out of the log and not homed elsewhere yet comes with its ShardOut (its image in it): a new owner of the
    log refuses its records, and can finish the hand-over, from the snapshot alone; one handed in comes with its
    ShardHome, so that a node whose metadata log is behind loads it too. (A ShardOut goes with its old home's
    snapshot even when this node's ShardIn homed the pair already: broker.log_state.shard_out.)"""
    out = []
    for t, shards in _bundle(state, log, bundles):
        out.extend(R.ShardHome(t.uid, k, log, t.gens[k]) for k in sorted(shards) if t.homes.get(k) == log)
        out.extend(_pair_images(state, t, shards, addresses, indexes))
    out.extend(o for t in sorted(state.topics_by_uid.values(), key=lambda t: t.uid)
               for _, o in sorted(t.away.items()) if o.log == log)
    return R.Snapshot(log, bundles, CK.encode_images(out))


def pair_images(state: BrokerState, t: TopicState, shard: int,
                addresses: Callable[[array], array] | None = None) -> bytes:
    """One (topic, shard) pair's state as a ShardOut carries it: as a bundle snapshot holds it (docs/cluster.md,
    "Scale-out" 4.3)."""
    return CK.encode_images(_pair_images(state, t, {shard}, addresses, True))


def _pair_images(state: BrokerState, t: TopicState, shards: set[int], addresses, indexes: bool) -> list:
    whole = len(shards) == len(t.shards)
    ours = (lambda n: True) if whole else (lambda n: n & SHARD_MASK in shards)  # noqa: E731
    out = []
    for shard, ix in enumerate(t.shards):
        if shard not in shards:
            continue
        if not indexes:
            out.append(CK.ShardImage(t.uid, shard, ix.next, b"", b"", b"", b""))
            continue
        nxt, base, pos, ms, keys = ix.export()
        if addresses is not None and len(ix.pos):
            pos = addresses(ix.pos).tobytes()
        out.append(CK.ShardImage(t.uid, shard, nxt, base, pos, ms, keys))
    if t.schedule.count:
        seconds = t.schedule.export(None if whole else ours)
        if seconds:
            out.append(CK.ScheduleImage(t.uid, seconds))
    idem = [e for e in t.idempotency.export() if ours(int(e[1]))]
    if idem:
        out.append(CK.IdempotencyImage(t.uid, idem))
    for uid in sorted(t.subscriptions):
        out.append(sub_image(state.subs_by_uid[uid], None if whole else shards))
    return out


def bundle_need(state: BrokerState, log: int, bundles: int, address: Callable[[int], int] = lambda a: a) -> int:
    """The lowest address (`address` of the index's position) of a message index batch of the bundle still kept (a
    huge number when none is): nothing stored before it holds a message the bundle still needs. Only the log's own
    batches count: a pair handed over into the log names its older batches by log addresses of the logs it came
    from (those logs keep them for it: `lent_map`), and an address of another log is no offset of this one."""
    need = 1 << 63
    for t, shards in _bundle(state, log, bundles):
        for ix in (t.shards[k] for k in shards):
            i = own_first(ix.pos, log)
            if i < len(ix.pos):
                need = min(need, address(ix.pos[i]))
    return need


def lent_map(state: BrokerState, log: int, bundles: int) -> dict[int, dict[tuple[int, int], int]]:
    """{another log: {(topic uid, shard): the lowest offset of it that pair's index names}} for the pairs of log
    `log`: what their indexes need of the logs they were handed over from (docs/cluster.md, "Scale-out" 4.3 step
    4; the owner of `log` keeps it as `lent/` keys, the owner of each other log keeps its ledgers from there)."""
    out: dict[int, dict[tuple[int, int], int]] = {}
    for t, shards in _bundle(state, log, bundles):
        for k in sorted(shards):
            for other, (low, _) in foreign_spans(t.shards[k].pos, log).items():
                out.setdefault(other, {})[(t.uid, k)] = low
    return out


def named_top(state: BrokerState, log: int, bundles: int, other: int) -> int:
    """The highest offset of log `other` an index of a pair of log `log` names (-1 when none does)."""
    top = -1
    for t, shards in _bundle(state, log, bundles):
        for k in shards:
            span = foreign_spans(t.shards[k].pos, log).get(other)
            if span is not None:
                top = max(top, span[1])
    return top


# An index's positions, in publish order, are the pair's stays one after the other: the batches of each log it was
# handed over from, named by log addresses (a log it came back to is its own again: its earlier stay's batches are
# its own log's addresses), then those of its present stay — log addresses of its log (from its owners before this
# one), then this owner's journal positions, the last. Each stay's batches ascend (a log's offsets only grow), so
# a log's first batch in the index is the lowest of it the index names. The stays are found run by run: a run is
# the positions whose bits 40–63 (bit 62 and the log id) are equal, found a byte column at a time by `lstrip`, in C
# (a backlog handed over may be millions of batches: a Python step each would hold the loop for a second).


def _runs(pos: array, log: int):
    """(first index, end index, log) of each run of `pos` — `log` for this owner's journal positions, the last run
    (where the scan stops)."""
    i, n, columns = 0, len(pos), None
    while i < n:
        if pos[i] < LOG_ADDRESS:
            yield i, n, log
            return
        columns = columns or _top_bytes(pos)
        end = _run_end(columns, i)
        yield i, end, split_log_address(pos[i])[0]
        i = end


def _top_bytes(pos: array) -> list[bytes]:
    """Bits 40–63 of every position, as three strings of a byte each."""
    raw = pos.tobytes()
    return [raw[j::8] for j in ((5, 6, 7) if sys.byteorder == "little" else (2, 1, 0))]


def _run_end(columns: list[bytes], i: int) -> int:
    """The end of the run from `i`: where one of the columns first differs from its byte at `i`."""
    end = len(columns[0])
    for column in columns:
        rest = column[i:]
        end = min(end, i + len(rest) - len(rest.lstrip(rest[:1])))
    return end


def own_first(pos: array, log: int) -> int:
    """The index of the first position of `pos` naming a batch of log `log` itself — a journal position, or one of
    its log addresses — (len(pos) when none does): the positions before it name batches of other logs only."""
    i, n, columns = 0, len(pos), None
    while i < n:
        if pos[i] < LOG_ADDRESS or split_log_address(pos[i])[0] == log:
            return i
        columns = columns or _top_bytes(pos)
        i = _run_end(columns, i)
    return n


def foreign_spans(pos: array, log: int) -> dict[int, tuple[int, int]]:
    """{another log: (the lowest, the highest offset of it `pos` names)} — the logs other than `log` whose batches
    an index of a pair of `log` names."""
    out: dict[int, tuple[int, int]] = {}
    for i, end, of in _runs(pos, log):
        if of != log:
            low, high = split_log_address(pos[i])[1], split_log_address(pos[end - 1])[1]
            had = out.get(of)
            out[of] = (low, high) if had is None else (min(had[0], low), max(had[1], high))
    return out
