"""The broker's state machine. Owns the rule: `apply(record)` is the only code that changes broker state — live
(after the executor appended the record to its log), in recovery (over the log's tail) and on a replica (over a
replicated log) alike — and it is pure: no I/O, no clock (time comes in the record).

A record applies or raises; it never half-applies: every check that can fail runs before the first change.
Data records of a subscription that no longer exists change nothing (a deletion is final and uids are never
reused, so they are dead records); any other inconsistency — a publish at an offset its shard is not at, a
topic or subscription that does not exist when it must — raises Contradiction, which recovery reports as a
record that cannot be applied.

`apply` returns effects for the executor to perform, or None: (WAKE, uid) something became deliverable on the
subscription; (WAKE_ALL, uid) every waiter must look again (configuration, seek, deletion); (CHANGED, uid) the
subscription's configuration changed (push delivery looks again); (DEAD_LETTERS, uid) messages wait to be
forwarded to its dead-letter topic; (DEADLINE, uid) a lease's deadline moved: the timer that wakes a waiter when
the earliest lease runs out must look again."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from pigeon.core.pubsub_types import types

from pigeon.core import limits, names, rawproto
from pigeon.core.bundles import LOG_ADDRESS, META_LOG, bundle_log, shard_log
from pigeon.core.regions import Region, copied_away, copy_shards, region_log
from pigeon.core.errors import LimitExceeded, NotFound, Unavailable
from pigeon.broker import iam, log_state, resources, restore, shard_split
from pigeon.broker.restore import Contradiction
from pigeon.broker.resources import Policy, Schema, Snapshot, Subscription, Topic
from pigeon.broker.subscription import SubscriptionState
from pigeon.broker.topic import SHARD_MASK, TopicState
from pigeon.storage import checkpoint as CK
from pigeon.storage import records as R

WAKE, WAKE_ALL, CHANGED, DEAD_LETTERS, DEADLINE = "wake", "wake_all", "changed", "dead_letters", "deadline"
_PublishRequest = types.PublishRequest.pb()


_APPLY = {
    R.RecordType.MODACK: "_modack", R.RecordType.SEEK: "_seek", R.RecordType.TRIM: "_trim",
    R.RecordType.PARK: "_park", R.RecordType.KICK: "_kick", R.RecordType.UPDATE: "_update",
    R.RecordType.RESET: "_reset", R.RecordType.SNAPSHOT: "_snapshot",
    R.RecordType.SHARD_OUT: "_shard_out", R.RecordType.SHARD_IN: "_shard_in", R.RecordType.SHARD_HOME: "_shard_home",
    R.RecordType.TOPIC_PUT: "_topic_put", R.RecordType.TOPIC_DEL: "_topic_del", R.RecordType.SUB_PUT: "_sub_put",
    R.RecordType.SUB_DEL: "_sub_del", R.RecordType.SNAP_PUT: "_snap_put", R.RecordType.SNAP_DEL: "_snap_del",
    R.RecordType.SCHEMA_PUT: "_schema_put", R.RecordType.SCHEMA_DEL: "_schema_del",
    R.RecordType.SCHEMA_REVDEL: "_schema_revdel", R.RecordType.POLICY_PUT: "_policy_put",
}


_OWN_LOG = log_state.OWN_LOG  # (records that name the log they go to)


@dataclass(frozen=True)
class Quotas:
    """How many resources of each kind a project may hold (Pub/Sub's quotas) and the server may hold in all (so
    that projects made up by the dozen cannot fill its memory either). Commands refuse what would pass one."""
    topics: int = limits.topics_per_project_max
    subscriptions: int = limits.subscriptions_per_project_max
    snapshots: int = limits.snapshots_per_project_max
    schemas: int = limits.schemas_per_project_max
    server: int = limits.resources_per_server_max


def _project(name: str) -> str:
    return name.split("/", 2)[1]


@dataclass
class SnapshotState:
    name: str
    topic_uid: int
    config: object  # Snapshot proto
    floors: list[int]
    acked: list[list[int]] = field(default_factory=list)


def _lookup(table: dict, name: str, kind: str):
    """The resource named `name`: INVALID_ARGUMENT for a malformed name, NOT_FOUND for a missing one."""
    found = table.get(name)
    if found is None:
        names.split(name, kind)
        raise NotFound(f"Resource not found (resource={name.split('/')[-1]}).")
    return found


def _parse(cls, raw):
    m = cls()
    m.ParseFromString(bytes(raw))
    return m


class BrokerState:
    def __init__(self):
        self.topics: dict[str, TopicState] = {}
        self.topics_by_uid: dict[int, TopicState] = {}
        self.subs: dict[str, SubscriptionState] = {}
        self.subs_by_uid: dict[int, SubscriptionState] = {}
        self.snapshots: dict[str, SnapshotState] = {}
        self.schemas: dict[str, list] = {}  # name → revisions (Schema protos), oldest first
        self.policies: dict[str, object] = iam.Policies()  # resource name → google.iam.v1.Policy
        self.next_uid = 1
        self.quotas = Quotas()
        self.census: Counter = Counter()  # (project, kind) → how many it holds; (None, None) → the server's total
        self.dispatching = True  # off while a log tail is applied (recovery, a replica): see dispatch_off
        self.spread = False  # a spread topic was created: records are cut by shard (`split`) before they commit
        self.region: Region | None = None  # this node's region (core.regions), in a deployment of regions
        self.log_eras: dict[int, dict[tuple[int, int], int]] = {}  # log → (topic, shard) → the hand-over whose
        # records the log holds now (its latest ShardIn of the pair read; none: the pair's first home's records)
        self.unlanded: dict[int, set[int]] = {}  # log → topics a reset of it put a pair of back (log_state.reset)

    # --- look-ups ------------------------------------------------------------------------------
    def topic(self, name: str) -> TopicState:
        return _lookup(self.topics, name, "topics")

    def sub(self, name: str) -> SubscriptionState:
        return _lookup(self.subs, name, "subscriptions")

    def schema(self, name: str) -> list:
        """The revisions of a schema, oldest first."""
        return _lookup(self.schemas, name, "schemas")

    def snapshot(self, name: str) -> SnapshotState:
        return _lookup(self.snapshots, name, "snapshots")

    def check_room(self, name: str, kind: str) -> None:
        """Raise ResourceExhausted when creating `name` (of `kind`: "topics", "subscriptions", …) would pass its
        project's quota or the server's, in the words Pub/Sub uses."""
        for key, maximum, what in ((( _project(name), kind), getattr(self.quotas, kind), f"{kind}-per-project"),
                                   ((None, None), self.quotas.server, "resources-per-server")):
            current = self.census[key]
            if current >= maximum:
                raise LimitExceeded(f'Your project has exceeded a limit: (type="{what}", current={current}, '
                                    f'maximum={maximum}).', f"projects/{key[0]}" if key[0] else "server")

    def _count(self, name: str, kind: str, n: int) -> None:
        self.census[(_project(name), kind)] += n
        self.census[(None, None)] += n

    def log_of(self, rec: R.Record, bundles: int) -> int:
        """The log a record goes to: metadata to the metadata log, a topic's data and its subscriptions' to the
        log of the topic's bundle — of a spread topic, of the shard the record names (`split` cut it so: one
        shard a record). A record of a subscription deleted meanwhile changes nothing; it goes to the metadata
        log."""
        if rec.META:
            return META_LOG
        if rec.TYPE in _OWN_LOG:
            return rec.log
        if rec.TYPE == R.RecordType.PUBLISH:
            owner = self.topics_by_uid[rec.topic]
        else:
            owner = self.subs_by_uid.get(rec.sub)
            if owner is None:
                return META_LOG
        topic = owner if isinstance(owner, TopicState) else owner.topic
        if topic is not None and topic.spread:
            shard = shard_split.shard_of(rec)  # (`split` cut it so: one shard a record)
            if topic.away and shard in topic.away:
                raise Unavailable("A shard of the topic is moving to another node; retry.")
            logs = self.shard_logs(topic, bundles)
            owner.log_id = tuple(logs)  # (what the node waits on for its records: each shard's log it writes)
            return logs[shard]
        log_id = owner.log_id
        if log_id is None:
            log_id = owner.log_id = bundle_log(owner.name if topic is None else topic.name, bundles)
        return log_id

    def split(self, rec: R.Record) -> list[R.Record]:
        """`rec` as the records to commit: one a shard for a data record of a spread topic that names several
        (broker.shard_split), `rec` itself otherwise."""
        if rec.META or rec.TYPE == R.RecordType.PUBLISH or rec.TYPE in _OWN_LOG:
            return [rec]
        s = self.subs_by_uid.get(rec.sub)
        if s is None or s.topic is None or not s.topic.spread:
            return [rec]
        return [part for _, part in shard_split.split(rec)]

    @staticmethod
    def shard_logs(t: TopicState, bundles: int) -> list[int]:
        """The log of each shard of `t` (of a shard another region stores: that region's log, core.regions)."""
        logs = t.shard_logs
        if logs is None:
            local = t.local
            logs = t.shard_logs = [t.homes.get(k) or (  # (a copy of another region's: in a bundle, by its number)
                shard_log(t.name, k - local.start if k in local else k, bundles, t.layout_spread)
                if k in local or k in t.copies else region_log(k // len(local))) for k in range(len(t.shards))]
        return logs

    def shards_in(self, t: TopicState, log: int, bundles: int) -> set[int]:
        """The shards of `t` whose records go to `log`."""
        return {k for k, at in enumerate(self.shard_logs(t, bundles)) if at == log}

    def log_of_sub(self, name: str, bundles: int) -> int:
        """The log that holds a subscription's state (its topic's bundle — of a spread topic, its first shard's;
        the metadata log once the topic is gone)."""
        s = self.subs[name]
        return META_LOG if s.topic is None else self.shard_logs(s.topic, bundles)[0]

    # --- the one way state changes ---------------------------------------------------------------
    def apply(self, rec: R.Record, at: int = 0, owner=None):
        """Apply one record (`at`: where the log stored it, for a publish batch; `owner`: the stream or push
        worker a Deliver record leases to). Returns a list of effects, or None."""
        rtype = rec.TYPE
        if rtype == R.RecordType.PUBLISH:
            return self._publish(rec, at)
        if rtype == R.RecordType.DELIVER:
            return self._deliver(rec, owner)
        if rtype == R.RecordType.ACK:
            return self._ack(rec)
        return getattr(self, _APPLY[rtype])(rec)

    def describe(self, rec: R.Record) -> str | None:
        """What an administrative record does, in words, for the log line of the change (before it is applied:
        a deletion names what it deletes). None for a data record."""
        T = R.RecordType
        kinds = {T.TOPIC_PUT: ("topic", Topic, self.topics_by_uid), T.TOPIC_DEL: ("topic", None, self.topics_by_uid),
                 T.SUB_PUT: ("subscription", Subscription, self.subs_by_uid),
                 T.SUB_DEL: ("subscription", None, self.subs_by_uid)}
        if rec.TYPE in kinds:
            kind, cls, table = kinds[rec.TYPE]
            if cls is not None:
                return f"{kind} {_parse(cls, rec.config).name} {'updated' if rec.uid in table else 'created'}"
            old = table.get(rec.uid)
            return f"{kind} {old.name if old else rec.uid} deleted"
        if rec.TYPE == T.SNAP_PUT:
            name = _parse(Snapshot, rec.config).name
            return f"snapshot {name} {'updated' if name in self.snapshots else 'created'}"
        if rec.TYPE == T.SCHEMA_PUT:
            return f"schema {_parse(Schema, rec.config).name} revision committed"
        if rec.TYPE in (T.SNAP_DEL, T.SCHEMA_DEL):
            return f"{'snapshot' if rec.TYPE == T.SNAP_DEL else 'schema'} {rec.name} deleted"
        if rec.TYPE == T.SCHEMA_REVDEL:
            return f"schema {rec.name} revision {rec.revision_id} deleted"
        if rec.TYPE == T.POLICY_PUT:
            return f"IAM policy of {rec.resource} set"
        if rec.TYPE == T.SEEK:
            sub = self.subs_by_uid.get(rec.sub)
            return f"subscription {sub.name if sub else rec.sub} seeked"
        return None

    # data records ---------------------------------------------------------------------------------
    def _publish(self, rec: R.Publish, at: int):
        t = self.topics_by_uid.get(rec.topic)
        if t is None:
            raise Contradiction(f"publish to topic {rec.topic}, which does not exist")
        if rec.shard >= len(t.shards):
            raise Contradiction(f"publish to shard {rec.shard} of topic {rec.topic}, which has {len(t.shards)}")
        ix = t.shards[rec.shard]
        if rec.base > ix.next and t.copy_gap(rec.shard, rec.base):  # (core.regions: the copier's)
            for uid in t.subscriptions:
                self.subs_by_uid[uid].drop_before(rec.shard, rec.base)
        if rec.base != ix.next:
            raise Contradiction(f"publish at offset {rec.base} but shard {rec.shard} of topic {rec.topic} is at "
                                f"{ix.next}")
        if rec.activations is not None and len(rec.activations) != rec.count or (
                rec.idempotency_keys is not None and len(rec.idempotency_keys) != rec.count):
            raise Contradiction("publish with per-message lists of the wrong length")
        ix.append(rec.count, at, rec.publish_ms, rec.key)
        bits = limits.shard_bits
        first = (rec.base << bits) | rec.shard
        step = 1 << bits
        subs = [self.subs_by_uid[u] for u in t.subscriptions]
        if rec.activations:
            for i, at_ms in enumerate(rec.activations):
                num = first + i * step
                t.schedule.add(at_ms, num)
                for s in subs:
                    if s.dispatching:
                        s.scheduled(at_ms, num)
        if rec.idempotency_keys:
            id_base = t.id_base()
            for i, k in enumerate(rec.idempotency_keys):
                if k:
                    t.idempotency.add(k, str(id_base | (first + i * step)), rec.publish_ms)
        filtered = [s for s in subs if s.filter is not None]
        return self._filter(filtered, rec, first, step) if filtered else None

    @staticmethod
    def _filter(filtered, rec: R.Publish, first: int, step: int):
        """Messages a subscription's filter rejects are acked for it as they are stored, never delivered: part
        of applying the publish, so every replay decides the same."""
        nums = range(first, first + rec.count * step, step)
        effects = None
        if rawproto.only_data(rec.request, rec.count):  # no attributes: one evaluation decides for all
            drops = {id(s): list(nums) for s in filtered if not s.filter.matches({})}
        else:
            attrs = [m.attributes for m in _PublishRequest.FromString(bytes(rec.request)).messages]
            drops = {id(s): [n for n, a in zip(nums, attrs) if not s.filter.matches(a)] for s in filtered}
        for s in filtered:
            drop = drops.get(id(s))
            if drop and s.ack(drop) and s.ready_keys:
                effects = (effects or []) + [(WAKE, s.uid)]
        return effects

    def _ack(self, rec):
        s = self.subs_by_uid.get(rec.sub)
        if s is not None and s.ack(rec.nums) and s.ready_keys:
            return [(WAKE, s.uid)]  # an ordering key unblocked (a stream's own room is its release's business)
        return None

    def _deliver(self, rec: R.Deliver, owner):
        s = self.subs_by_uid.get(rec.sub)
        if s is None:
            return None
        s.lease(rec, owner)
        return [(DEAD_LETTERS, s.uid)] if s.dead_letters else None

    def _modack(self, rec: R.Modack):
        s = self.subs_by_uid.get(rec.sub)
        if s is None or not s.modify_deadlines(list(zip(rec.nums, rec.versions)), rec.seconds, rec.now):
            return None
        return [(WAKE, s.uid)] if rec.seconds == 0 else [(DEADLINE, s.uid)]  # nacked: ready again

    def _seek(self, rec: R.Seek):
        s = self.subs_by_uid.get(rec.sub)
        if s is None:
            return None
        if rec.shard is not None:
            if rec.shard >= len(s.shards) or len(rec.floors) != 1:
                raise Contradiction(f"seek of shard {rec.shard} of subscription {rec.sub}")
            s.reset_shard(rec.shard, rec.floors[0], rec.acked[0])
            s.generations[rec.shard] += 1
            return [(WAKE_ALL, s.uid)]
        if len(rec.floors) != len(s.shards):
            raise Contradiction(f"seek of subscription {rec.sub} with {len(rec.floors)} shards, it has "
                                f"{len(s.shards)}")
        s.reset(rec.floors, rec.acked)
        s.generations = [g + 1 for g in s.generations]
        return [(WAKE_ALL, s.uid)]

    def _trim(self, rec: R.Trim):
        s = self.subs_by_uid.get(rec.sub)
        if s is not None:
            if rec.shard >= len(s.shards):
                raise Contradiction(f"trim of shard {rec.shard} of subscription {rec.sub}")
            s.drop_before(rec.shard, rec.offset, rec.keeps_rescheduled)
        return None

    def _park(self, rec: R.Park):
        s = self.subs_by_uid.get(rec.sub)
        if s is None:
            return None
        s.park(rec.nums, rec.activate_ms)
        return [(WAKE, s.uid)] if rec.activate_ms >= 0 else None

    def _kick(self, rec):
        s = self.subs_by_uid.get(rec.sub)
        if s is None:
            return None
        s.kick(rec.nums)
        return [(WAKE, s.uid)]

    def log_shards(self, log: int, bundles: int) -> list[tuple[TopicState, set[int]]]:
        """(topic, its shards in `log`) for each topic with a shard there."""
        out = []
        for t in self.topics_by_uid.values():
            shards = self.shards_in(t, log, bundles)
            if shards:
                out.append((t, shards))
        return out

    # --- a log's state replaced (Reset, Snapshot) or a pair's moved (ShardOut, ShardIn, ShardHome): broker.log_state
    _reset, _snapshot = log_state.reset, log_state.snapshot
    _shard_out, _shard_in, _shard_home = log_state.shard_out, log_state.shard_in, log_state.shard_home
    apply_in_log = log_state.apply_in_log
    confirm_landings = log_state.confirm_landings

    def resume_log(self, log: int, bundles: int, now: float) -> None:
        """After a bundle log was applied again from its start (`_reset`): everything in it is durable, and its
        subscriptions dispatch again."""
        for t, shards in self.log_shards(log, bundles):
            for k in shards:
                t.shards[k].settle()
            for uid in t.subscriptions:
                self.subs_by_uid[uid].rebuild(now)
        for uid in self.unlanded.pop(log, ()):  # (a pair the reset put back in its old home: not the log's now)
            t = self.topics_by_uid.get(uid)
            for sid in t.subscriptions if t is not None else ():
                s = self.subs_by_uid[sid]
                if not s.dispatching:
                    s.rebuild(now)

    def _update(self, rec: R.Update):
        s = self.subs_by_uid.get(rec.sub)
        if s is not None:
            s.update(rec.num, rec.message)
        return None

    # metadata records -----------------------------------------------------------------------------
    def _topic_put(self, rec: R.TopicPut):
        cfg = _parse(Topic, rec.config)
        t = self.topics_by_uid.get(rec.uid)
        if t is None:
            if not 1 <= rec.shards <= limits.shards_per_topic_max:
                raise Contradiction(f"topic {rec.uid} with {rec.shards} shards")
            if self.topics.get(cfg.name) is not None:
                raise Contradiction(f"topic {cfg.name} created again while it exists")
            t = TopicState(rec.uid, cfg.name, cfg, rec.shards, rec.spread,
                           None if self.region is None else self.region.shards(rec.shards),
                           copy_shards(self.region, rec.shards, cfg.labels), copied_away(self.region, cfg.labels))
            self.spread = self.spread or t.spread
            self.topics_by_uid[t.uid] = t
            self.topics[t.name] = t
            self._count(t.name, "topics", 1)
            self._dead_letter_topic_changed(t.name)
        t.config = cfg
        self.next_uid = max(self.next_uid, rec.uid + 1)
        return None

    def _topic_del(self, rec):
        t = self.topics_by_uid.get(rec.uid)
        if t is None or t.deleted:
            raise Contradiction(f"deletion of topic {rec.uid}, which does not exist")
        t.deleted = True
        if self.topics.get(t.name) is t:
            del self.topics[t.name]
            self.policies.pop(t.name, None)
            self._count(t.name, "topics", -1)
        for uid in t.subscriptions:
            self.subs_by_uid[uid].config.topic = names.DELETED_TOPIC
        if not t.subscriptions:
            del self.topics_by_uid[t.uid]
        self._dead_letter_topic_changed(t.name)
        return None

    def _dead_letter_topic_changed(self, name: str) -> None:
        """A topic was created or deleted: subscriptions that name it as their dead-letter topic forward to it
        only while it exists; without it their messages go on being delivered (as on the service)."""
        for s in self.subs.values():
            if s.config.dead_letter_policy.dead_letter_topic == name:
                s.dead_letter_open = name in self.topics

    def _sub_put(self, rec: R.SubPut):
        cfg = _parse(Subscription, rec.config)
        s = self.subs_by_uid.get(rec.uid)
        if s is None:
            topic = self.topics_by_uid.get(rec.topic) if rec.topic else None
            if rec.topic and topic is None:
                raise Contradiction(f"subscription {rec.uid} of topic {rec.topic}, which does not exist")
            if rec.start is None or (topic is not None and len(rec.start) != len(topic.shards)):
                raise Contradiction(f"subscription {rec.uid} created without a start for each shard")
            if cfg.name in self.subs:
                raise Contradiction(f"subscription {cfg.name} created again while it exists")
            s = SubscriptionState(rec.uid, cfg.name, topic, cfg)
            s.dispatching = self.dispatching
            s.reset(rec.start, [[] for _ in rec.start])
            s.start = list(rec.start)
            if topic is not None:
                topic.subscriptions.add(s.uid)
            self.subs_by_uid[s.uid] = s
            self.subs[s.name] = s
            self._count(s.name, "subscriptions", 1)
        s.configure(cfg)
        s.dead_letter_open = cfg.dead_letter_policy.dead_letter_topic in self.topics
        s.detached = cfg.detached
        self.next_uid = max(self.next_uid, rec.uid + 1)
        return [(CHANGED, s.uid), (WAKE_ALL, s.uid)]

    def _sub_del(self, rec):
        s = self.subs_by_uid.pop(rec.uid, None)
        if s is None:
            raise Contradiction(f"deletion of subscription {rec.uid}, which does not exist")
        self.subs.pop(s.name, None)
        self.policies.pop(s.name, None)
        self._count(s.name, "subscriptions", -1)
        t = s.topic
        if t is not None:
            t.subscriptions.discard(s.uid)
            if t.deleted and not t.subscriptions:
                self.topics_by_uid.pop(t.uid, None)
        return [(CHANGED, s.uid), (WAKE_ALL, s.uid)]

    def _snap_put(self, rec: R.SnapPut):
        cfg = _parse(Snapshot, rec.config)
        old = self.snapshots.get(cfg.name)
        if rec.floors is None and old is None:
            raise Contradiction(f"update of snapshot {cfg.name}, which does not exist")
        floors = rec.floors if rec.floors is not None else old.floors
        acked = rec.acked if rec.acked is not None else old.acked
        if old is None:
            self._count(cfg.name, "snapshots", 1)
        self.snapshots[cfg.name] = SnapshotState(cfg.name, rec.topic, cfg, floors, acked)
        return None

    def _snap_del(self, rec):
        if self.snapshots.pop(rec.name, None) is not None:
            self._count(rec.name, "snapshots", -1)
        self.policies.pop(rec.name, None)
        return None

    def _schema_put(self, rec: R.SchemaPut):
        cfg = _parse(Schema, rec.config)
        if cfg.name not in self.schemas:
            self._count(cfg.name, "schemas", 1)
        self.schemas.setdefault(cfg.name, []).append(cfg)
        return None

    def _schema_del(self, rec):
        if self.schemas.pop(rec.name, None) is not None:
            self._count(rec.name, "schemas", -1)
        self.policies.pop(rec.name, None)
        for t in self.topics.values():
            if t.config.schema_settings.schema == rec.name:
                t.config.schema_settings.schema = names.DELETED_SCHEMA
        return None

    def _schema_revdel(self, rec: R.SchemaRevDel):
        revs = self.schemas.get(rec.name)
        if revs is None:
            raise Contradiction(f"revision deleted from schema {rec.name}, which does not exist")
        revs[:] = [r for r in revs if r.revision_id != rec.revision_id]
        return None

    def _policy_put(self, rec: R.PolicyPut):
        self.policies[rec.resource] = _parse(Policy, rec.policy)
        return None

    # --- upkeep: pruning what no reader can see any more (not records: recovery may prune later) -------
    def prune(self, now: float, idempotency_window_s: float) -> None:
        """Forget idempotency keys older than the window and activation seconds every subscription walked past
        and acked."""
        cutoff = int((now - idempotency_window_s) * 1000)
        for t in self.topics_by_uid.values():
            t.idempotency.expire(cutoff)
            if t.schedule.count:
                subs = [self.subs_by_uid[u] for u in t.subscriptions]
                low = min((s.sched_mark[0] for s in subs), default=int(now) + 1)
                t.schedule.drop_seconds_before(low, lambda n, subs=subs: any(not s.is_acked(n) for s in subs))

    def trim_indexes(self, now: float, gone: list[int] | None = None) -> int:
        """Forget the index batches no subscription (its floor, or a rescheduled message retention kept below it),
        snapshot or retention needs, adding their addresses to `gone` (so a reader can drop them from its cache);
        return the lowest log position a kept batch needs (a huge number when none does)."""
        need = 1 << 62
        for t in self.topics_by_uid.values():
            for shard, ix in enumerate(t.shards):
                keep = ix.next if t.copied is None else min(ix.next, t.copied[shard])  # (core.regions)
                if t.config.HasField("message_retention_duration"):
                    ms = int((now - resources.duration_s(t.config.message_retention_duration)) * 1000)
                    keep = min(keep, ix.offset_at_ms(ms))
                for uid in t.subscriptions:
                    s = self.subs_by_uid[uid]
                    keep = min(keep, s.shards[shard].floor)
                    for n in s.kept:  # rescheduled messages retention kept below the floor: read when due
                        if n & SHARD_MASK == shard:
                            keep = min(keep, n >> limits.shard_bits)
                    if s.config.retain_acked_messages:
                        ms = int((now - resources.duration_s(s.config.message_retention_duration)) * 1000)
                        keep = min(keep, ix.offset_at_ms(ms))
                for sn in self.snapshots.values():
                    if sn.topic_uid == t.uid and shard < len(sn.floors):
                        keep = min(keep, sn.floors[shard])
                dropped = ix.trim_before(keep)
                if gone is not None:
                    gone += dropped
                if ix.base:  # the oldest batch in this node's journal: a taken-over bundle's index names its older
                    #          batches by log address (core.bundles), then its own term's by journal position
                    first = bisect.bisect_left(ix.pos, True, key=lambda p: p < LOG_ADDRESS)
                    if first < len(ix.pos):
                        need = min(need, ix.pos[first])
        return need

    # --- recovery --------------------------------------------------------------------------------
    def dispatch_off(self) -> None:
        """Before applying a log tail (recovery, a replica): dispatch state is derived afterwards."""
        self.dispatching = False
        for s in self.subs_by_uid.values():
            s.dispatching = False

    def all_durable(self) -> None:
        """Everything applied so far came from a log read back from disk: it is durable (visible)."""
        for t in self.topics_by_uid.values():
            for ix in t.shards:
                ix.settle()

    def rebuild(self, now: float) -> None:
        """After applying a log tail: every subscription dispatches again."""
        self.dispatching = True
        self.all_durable()
        self.unlanded.clear()
        for s in self.subs_by_uid.values():
            s.rebuild(now)
            s.last_activity = now  # inactivity is counted from the restart

    # --- checkpoints and bundle snapshots (broker.images writes what broker.restore loads) ------------------
    def restore(self, image, shards: set[int] | None = None) -> None:
        """Load one image of a checkpoint (after its meta records were applied), or of a bundle snapshot: then
        only its part of `shards` (those of the log); a pair handed out and not homed elsewhere yet comes as its
        ShardOut. Raises Contradiction."""
        if isinstance(image, R.ShardOut):
            self._shard_out(image)
            return
        if isinstance(image, R.ShardHome):
            self._shard_home(image)
            return
        restore.load(self, image, shards)
