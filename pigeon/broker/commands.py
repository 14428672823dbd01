"""Commands: validation and the records they become. Owns the rule: every check of a client's request and every
decision about what a request changes is made here, once, for every API (gRPC today, REST next) — the
executor in pigeon.node appends what a function here returns and applies it, and the API layers only translate.

Pure: functions take the state, the request and `now` (seconds) where time matters, and return records (and
answers) or raise PigeonError. Nothing here changes state: `apply` does (broker.state). Names the executor must
invent (a subscription or snapshot created without one) come in as arguments, so randomness stays outside."""

from __future__ import annotations

import bisect
from typing import NamedTuple

from pigeon.core.pubsub_types import types

from pigeon.broker import resources
from pigeon.broker.dispatch import activation_of, is_waiting
from pigeon.broker.schedule import parse_activation
from pigeon.broker.state import BrokerState
from pigeon.broker.subscription import SubscriptionState
from pigeon.broker.topic import SCHEDULED, SHARD_MASK, TopicState, key_hash
from pigeon.core import ackid, hot, limits, names, rawproto
from pigeon.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from pigeon.storage import records as R

_PublishRequest = types.PublishRequest.pb()
_PubsubMessage = types.PubsubMessage.pb()


def _exists(name: str) -> AlreadyExists:
    return AlreadyExists("Resource already exists in the project (resource=%s)." % name.split("/")[-1])


def page(items: list[str], page_size: int, token: str) -> tuple[list[str], str]:
    """Keyset paging over sorted names: the token is the last name returned."""
    if page_size < 0:
        raise InvalidArgument("page_size must not be negative.")
    size = min(page_size or limits.list_page_size_default, limits.list_page_size_max)
    start = bisect.bisect_right(items, token) if token else 0
    out = items[start:start + size]
    nxt = out[-1] if start + size < len(items) and out else ""
    return out, nxt


def in_project(names_: list[str], project: str, kind: str) -> list[str]:
    prefix = f"projects/{project}/{kind}/"
    return sorted(n for n in names_ if n.startswith(prefix))


# --- topics -----------------------------------------------------------------------------------------
def create_topic(state: BrokerState, topic, shards: int, spread: bool = False) -> R.TopicPut:
    """`spread`: each shard in a bundle of its own (core.bundles), for good."""
    resources.check_topic(topic, regions=state.region is not None)
    if topic.name in state.topics:
        raise _exists(topic.name)
    state.check_room(topic.name, "topics")
    return R.TopicPut(state.next_uid, shards, topic.SerializeToString(deterministic=True), spread)


def update_topic(state: BrokerState, topic, mask) -> R.TopicPut:
    t = state.topic(topic.name)
    merged = resources.apply_mask(t.config, topic, mask, resources.TOPIC_MUTABLE, "topic")
    resources.check_topic(merged, regions=state.region is not None)
    resources.check_copy_unchanged(t.config, merged)
    return R.TopicPut(t.uid, len(t.shards), merged.SerializeToString(deterministic=True), t.layout_spread)


def merged_topic(state: BrokerState, topic, mask):
    """The configuration an update would give (for the executor's schema check before `update_topic`)."""
    return resources.apply_mask(state.topic(topic.name).config, topic, mask, resources.TOPIC_MUTABLE, "topic")


def delete_topic(state: BrokerState, name: str) -> R.TopicDel:
    return R.TopicDel(state.topic(name).uid)


# --- subscriptions ----------------------------------------------------------------------------------
def create_subscription(state: BrokerState, sub, generated_name: str, start: list[int] | None = None) -> R.SubPut:
    """`generated_name`: the name to use when the request has none (the executor makes it up); `start`: each
    shard's end where the subscription begins (a spread topic's, gathered from its shards' owners), the topic's
    end here by default."""
    if not sub.name:
        project = names.split(sub.topic, "topics")[0]
        sub.name = names.join(project, "subscriptions", generated_name)
    names.split(sub.name, "subscriptions")
    topic = state.topic(sub.topic)
    if sub.name in state.subs:
        raise _exists(sub.name)
    resources.check_subscription(sub, creating=True)
    if sub.detached:
        raise InvalidArgument("A subscription cannot be created detached.")
    _check_dead_letter_topic(state, sub)
    state.check_room(sub.name, "subscriptions")
    if start is not None and len(start) != len(topic.shards):
        raise InvalidArgument(f"A start offset for each of the topic's {len(topic.shards)} shards is needed.")
    return R.SubPut(state.next_uid, topic.uid, sub.SerializeToString(deterministic=True),
                    topic.backlog_end() if start is None else list(start))


def subscription_view(s: SubscriptionState):
    """The Subscription proto as Get returns it (with output-only fields filled in)."""
    out = resources.Subscription()
    out.CopyFrom(s.config)
    out.push_config.SetInParent()  # a pull subscription has an empty PushConfig, never none (clients read it)
    if s.topic is not None and s.topic.config.HasField("message_retention_duration"):
        out.topic_message_retention_duration.CopyFrom(s.topic.config.message_retention_duration)
    return out


def update_subscription(state: BrokerState, sub, mask) -> R.SubPut:
    s = state.sub(sub.name)
    merged = resources.apply_mask(s.config, sub, mask, resources.SUBSCRIPTION_MUTABLE, "subscription")
    resources.check_subscription(merged, creating=False)
    _check_dead_letter_topic(state, merged)
    return R.SubPut(s.uid, 0, merged.SerializeToString(deterministic=True))


def _check_dead_letter_topic(state: BrokerState, sub) -> None:
    """The dead-letter topic must exist when a policy names it (deleting it later is allowed: forwarding then
    fails, is logged, and the messages stay in the subscription, redelivered as their leases run out)."""
    dlt = sub.dead_letter_policy.dead_letter_topic
    if dlt and dlt not in state.topics:
        raise NotFound(f"Dead-letter topic not found (resource={dlt}): create it before naming it in the "
                       "subscription's dead_letter_policy.")


def delete_subscription(state: BrokerState, name: str) -> R.SubDel:
    return R.SubDel(state.sub(name).uid)


def detach_subscription(state: BrokerState, name: str) -> list[R.Record]:
    """Stop delivery for good: the backlog is dropped, later pulls fail with FAILED_PRECONDITION."""
    s = state.sub(name)
    cfg = resources.Subscription()
    cfg.CopyFrom(s.config)
    cfg.detached = True
    ends = s.topic.backlog_end() if s.topic is not None else [sh.floor for sh in s.shards]
    return [R.SubPut(s.uid, 0, cfg.SerializeToString(deterministic=True)), R.Seek(s.uid, ends, [[] for _ in ends])]


def live_sub(state: BrokerState, name: str) -> SubscriptionState:
    """A subscription that delivers: it exists and is not detached."""
    s = state.sub(name)
    if s.detached:
        raise FailedPrecondition(f"The subscription {name} is detached.")
    return s


def check_stream(deadline_s: int) -> None:
    if not limits.ack_deadline_s_min <= deadline_s <= limits.ack_deadline_s_max:
        raise InvalidArgument(
            f"Invalid stream_ack_deadline_seconds: it must be between {limits.ack_deadline_s_min} and "
            f"{limits.ack_deadline_s_max} (got {deadline_s})."
        )


# --- publish ----------------------------------------------------------------------------------------
class PublishCommand(NamedTuple):
    """A validated PublishRequest: the bytes to store, its message count, ordering key, the messages'
    idempotency keys (None when no message has one) and (activate-at, delay) attributes (None when none)."""

    topic: str
    request: bytes
    count: int
    ordering_key: str
    idempotency_keys: list[str] | None
    activations: list[tuple[str, str]] | None


def check_publish(raw: bytes) -> PublishCommand:
    """Validate a serialized PublishRequest. Plain data-only messages are checked on the bytes; anything else
    (attributes, keys, odd encodings) message by message."""
    if len(raw) > limits.publish_request_bytes_max + 64 * 1024:
        raise InvalidArgument(
            f"The publish request is too large: the limit is {limits.publish_request_bytes_max} bytes.")
    topic, msgs = rawproto.split_publish(raw)
    n = len(msgs)
    if n == 0:
        raise InvalidArgument("The publish request must contain at least one message.")
    if n > limits.publish_messages_max:
        raise InvalidArgument(
            f"The publish request has {n} messages: the limit is {limits.publish_messages_max} per request.")
    sizes = list(map(len, msgs))
    if min(sizes) >= 3 and max(sizes) <= limits.message_data_bytes_max and rawproto.only_data(raw, n):
        return PublishCommand(topic, raw, n, "", None, None)
    return _check_publish_messages(topic, raw)


def check_message(m) -> None:
    if not m.data and not m.attributes:
        raise InvalidArgument("Some messages in the publish request are empty. Each message must contain "
                              "non-empty data, or at least one attribute.")
    if len(m.data) > limits.message_data_bytes_max:
        raise InvalidArgument(f"Message data is too large: the limit is {limits.message_data_bytes_max} bytes.")
    if m.attributes:
        if len(m.attributes) > limits.attributes_max:
            raise InvalidArgument(
                f"A message has {len(m.attributes)} attributes: the limit is {limits.attributes_max} per message.")
        for k, v in m.attributes.items():
            kb = len(k.encode())
            if kb == 0 or kb > limits.attribute_key_bytes_max:
                raise InvalidArgument(
                    f"Attribute key ({k[:32]}) must be 1 to {limits.attribute_key_bytes_max} bytes long.")
            if len(v.encode()) > limits.attribute_value_bytes_max:
                raise InvalidArgument(
                    f"The value of attribute {k} exceeds the limit of {limits.attribute_value_bytes_max} bytes.")
            if k.startswith("goog"):
                raise InvalidArgument(f'Attribute key ({k}) must not start with "goog": that prefix is reserved.')


def _check_publish_messages(topic: str, raw: bytes) -> PublishCommand:
    req = rawproto.parse_request(_PublishRequest, raw)
    key = req.messages[0].ordering_key
    server_fields = False
    idem = [m.attributes.get(names.ATTR_IDEMPOTENCY_KEY, "") for m in req.messages]
    sched = [(m.attributes.get(names.ATTR_ACTIVATE_AT, ""), m.attributes.get(names.ATTR_DELAY, ""))
             for m in req.messages]
    for at, delay in sched:
        if at or delay:
            try:
                parse_activation(at, delay, 0)
            except ValueError as e:
                raise InvalidArgument(f"Invalid {names.ATTR_ACTIVATE_AT if at else names.ATTR_DELAY}: {e}.")
    for k in idem:
        if len(k.encode()) > limits.idempotency_key_bytes_max:
            raise InvalidArgument(f"The {names.ATTR_IDEMPOTENCY_KEY} attribute exceeds the limit of "
                                  f"{limits.idempotency_key_bytes_max} bytes.")
    for m in req.messages:
        check_message(m)
        if m.ordering_key != key:
            raise InvalidArgument("All messages in one publish request must have the same ordering key.")
        if m.message_id or m.HasField("publish_time"):
            server_fields = True
    if len(key.encode()) > limits.ordering_key_bytes_max:
        raise InvalidArgument(f"The ordering key exceeds the limit of {limits.ordering_key_bytes_max} bytes.")
    if key and any(a or d for a, d in sched):  # refused, not ignored: a scheduled message goes out by its time
        raise InvalidArgument(f"A message with an ordering key cannot be scheduled ({names.ATTR_ACTIVATE_AT}, "
                              f"{names.ATTR_DELAY}): messages of a key go out in publish order, scheduled ones "
                              "at their activation time. Publish it without the ordering key, or without the "
                              "schedule.")
    if server_fields:  # the server owns these: drop what the client sent
        for m in req.messages:
            m.ClearField("message_id")
            m.ClearField("publish_time")
        raw = req.SerializeToString()
    return PublishCommand(topic, raw, len(req.messages), key, idem if any(idem) else None,
                          sched if any(a or d for a, d in sched) else None)


def deduplicate(t: TopicState, keys: list[str]) -> list[int]:
    """broker.dedup for one publish: the indexes of the messages to store. A message whose key was accepted
    inside the window, or earlier in the same request, is not stored again (it answers with the original's
    id, which the window holds once the fresh ones are applied)."""
    window = t.idempotency
    seen: set[str] = set()
    fresh: list[int] = []
    for i, k in enumerate(keys):
        if k:
            if k in seen or window.get(k) is not None:
                continue
            seen.add(k)
        fresh.append(i)
    return fresh


def keep_messages(request: bytes, indexes: list[int]) -> bytes:
    req = _PublishRequest.FromString(request)
    keep = [req.messages[i] for i in indexes]
    del req.messages[:]
    req.messages.extend(keep)
    return req.SerializeToString()


def publish(t: TopicState, request: bytes, count: int, ordering_key: str, now_ms: int,
            idempotency_keys: list[str] | None = None,
            activations: list[tuple[str, str]] | None = None, among: list[int] | None = None) -> R.Publish:
    """The Publish record of one validated request (schema-checked by the executor) to topic `t`: the shard by
    ordering key (without one: in turn, among the shards `among` when given), the next offset, a publish time
    that never goes back within the shard."""
    shard = t.shard_for(ordering_key, among)
    ix = t.shards[shard]
    ms = max(now_ms, ix.ms[-1]) if ix.ms else now_ms
    key = SCHEDULED if activations else key_hash(ordering_key)
    acts = [parse_activation(at, delay, ms) or ms for at, delay in activations] if activations else None
    return R.Publish(t.uid, shard, ix.next, ms, count, key, request, acts, idempotency_keys)


class PublishPlan(NamedTuple):
    """What one publish stores and how it answers (publish_batch)."""

    record: R.Publish | None  # None: every message repeats one accepted inside the idempotency window
    fresh: list[int] | None  # with idempotency keys: the indexes of the request's messages the record stores …
    keys: list[str] | None  # … and every message's key ("" for none), to answer repeats with the originals' ids


def publish_batch(t: TopicState, cmd: PublishCommand, now_ms: int, idempotency_window_s: float,
                  check=None, among: list[int] | None = None) -> PublishPlan:
    """One validated publish into topic `t`, the broker's whole part of it: broker.dedup inside the window (a
    message whose key was accepted, or repeats one earlier in the request, is not stored again), the messages
    kept, `check` on the request to store (a schema's: it may re-encode it), and its Publish record."""
    request, keys, acts = cmd.request, cmd.idempotency_keys, cmd.activations
    fresh = None
    if keys:
        t.idempotency.expire(now_ms - int(idempotency_window_s * 1000))
        fresh = deduplicate(t, keys)
        if not fresh:
            return PublishPlan(None, fresh, keys)
        if len(fresh) < cmd.count:
            request = keep_messages(request, fresh)
            acts = [acts[i] for i in fresh] if acts else None
    if check is not None:
        request = check(request)
    stored_keys = [keys[i] for i in fresh] if keys else None
    count = cmd.count if fresh is None else len(fresh)
    return PublishPlan(publish(t, request, count, cmd.ordering_key, now_ms, stored_keys, acts, among), fresh, keys)


def publish_answer(t: TopicState, plan: PublishPlan) -> list[str]:
    """The message ids a publish answers with, once its record was applied: each stored message's own, and a
    repeat's the original's (which the idempotency window holds)."""
    ids = message_ids(t, plan.record) if plan.record is not None else []
    if plan.keys is None:
        return ids
    stored = dict(zip(plan.fresh, ids))
    return [stored.get(i) or t.idempotency.get(k) for i, k in enumerate(plan.keys)]


def message_ids(t: TopicState, rec: R.Publish) -> list[str]:
    step = 1 << limits.shard_bits
    first = t.id_base() | (rec.base << limits.shard_bits) | rec.shard
    return [str(n) for n in range(first, first + rec.count * step, step)]


# --- acks and deadlines -------------------------------------------------------------------------------
def acks(s: SubscriptionState, ack_ids, now: float) -> tuple[list[int], dict[str, str]]:
    """Message numbers to acknowledge, and exactly-once failures {ack_id: code}: with exactly-once delivery an
    ack id is valid only for the current, unexpired delivery. Leases that ran out are expired first (`now`)."""
    eod = s.config.enable_exactly_once_delivery
    if eod:
        s.expire(now)
    elif not s.parked:  # nothing to check per id: a batch of this subscription's ids is parsed at once
        batch = hot.ack_numbers(s.uid, ack_ids, ackid.common(s.generations))
        if batch is not None:
            return batch, {}
    failures: dict[str, str] = {}
    nums = []
    leases, uid = s.leases, s.uid
    for a in ack_ids:
        try:
            p = ackid.parse(uid, a, s.generations)
        except InvalidArgument:
            if not eod:
                raise
            p = None
        if p is None:
            if eod:
                failures[a] = "PERMANENT_FAILURE_INVALID_ACK_ID"
            continue
        num, version = p
        if s.parked and num not in leases and is_waiting(s.parked.get(num, 0), now * 1000):
            continue  # rescheduled or buried with this ack id first: that call won
        if eod:
            lease = leases.get(num)
            if lease is None or lease[1] != version:
                if not s.is_acked(num):
                    failures[a] = "PERMANENT_FAILURE_INVALID_ACK_ID"
                continue
        nums.append(num)
    return nums, failures


def require_ack_ids(ack_ids) -> None:
    """An Acknowledge, a ModifyAckDeadline or a queue operation names at least one ack id (a stream's request
    need not)."""
    if not ack_ids:
        raise InvalidArgument("ack_ids must not be empty.")


def check_deadlines(ack_ids, seconds) -> None:
    if len(ack_ids) != len(seconds):
        raise InvalidArgument("modify_deadline_seconds and modify_deadline_ack_ids must have the same length.")
    for sec in seconds:
        if not 0 <= sec <= limits.modify_deadline_s_max:
            raise InvalidArgument(
                f"Invalid ack deadline ({sec}s): it must be between 0 and {limits.modify_deadline_s_max} seconds.")


def modacks(s: SubscriptionState, ack_ids, seconds, now: float) -> tuple[list[R.Modack], dict[str, str]]:
    """Modack records (one per deadline asked for) of the leases these ack ids hold now, and exactly-once
    failures. An ack id whose lease ran out or moved on to a newer delivery changes nothing (and is a failure
    with exactly-once delivery); leases that ran out are expired first, so the records name only leases that
    exist when they are applied."""
    check_deadlines(ack_ids, seconds)
    s.expire(now)
    eod = s.config.enable_exactly_once_delivery
    failures: dict[str, str] = {}
    groups: dict[int, tuple[list[int], list[int]]] = {}
    leases = s.leases
    for a, sec in zip(ack_ids, seconds):
        try:
            p = ackid.parse(s.uid, a, s.generations)
        except InvalidArgument:
            if not eod:
                raise
            p = None
        lease = leases.get(p[0]) if p is not None else None
        if lease is None or (p[1] and lease[1] != p[1]) or (eod and lease[1] != p[1]):
            if eod:
                failures[a] = "PERMANENT_FAILURE_INVALID_ACK_ID"
            continue
        nums, versions = groups.setdefault(sec, ([], []))
        nums.append(p[0])
        versions.append(p[1])
    return [R.Modack(s.uid, now, sec, nums, versions) for sec, (nums, versions) in groups.items()], failures


# --- snapshots and seek -------------------------------------------------------------------------------
def create_snapshot(state: BrokerState, name: str, sub_name: str, labels: dict, now: float,
                    generated_name: str, ack_state: tuple[list[int], list[list[int]]] | None = None
                    ) -> tuple[str, R.SnapPut]:
    """(the snapshot's name, its record): of the subscription's ack state here, or of `ack_state` (floors, acked
    by shard: a spread topic's, from each shard's owner)."""
    s = state.sub(sub_name)
    if not name:
        project = names.split(sub_name, "subscriptions")[0]
        name = names.join(project, "snapshots", generated_name)
    names.split(name, "snapshots")
    if name in state.snapshots:
        raise _exists(name)
    state.check_room(name, "snapshots")
    if s.topic is None or s.topic.deleted:
        raise FailedPrecondition("Cannot create a snapshot of a subscription whose topic was deleted.")
    floors, acked = ack_state if ack_state is not None else s.export_state()
    if len(floors) != len(s.shards) or len(acked) != len(s.shards):
        raise InvalidArgument(f"An ack state for each of the subscription's {len(s.shards)} shards is needed.")
    oldest_ms = None  # (of the shards whose messages are here)
    for floor, ix in zip(floors, s.topic.shards):
        if ix.first() <= floor < ix.durable:
            ms = ix.publish_ms(floor)
            oldest_ms = ms if oldest_ms is None else min(oldest_ms, ms)
    base = now if oldest_ms is None else oldest_ms / 1000
    expire = base + limits.snapshot_lifetime_s_max
    if expire - now < limits.snapshot_lifetime_s_min:
        raise FailedPrecondition(
            "The snapshot would expire in less than 1 hour: the subscription's oldest unacked message is too old.")
    snap = resources.Snapshot(name=name, topic=s.topic.name)
    snap.labels.update(labels)
    resources.check_labels(snap.labels)
    snap.expire_time.FromMilliseconds(int(expire * 1000))
    return name, R.SnapPut(s.topic.uid, snap.SerializeToString(deterministic=True), floors, acked)


def update_snapshot(state: BrokerState, snap, mask, now: float) -> R.SnapPut:
    cur = state.snapshot(snap.name)
    merged = resources.apply_mask(cur.config, snap, mask, resources.SNAPSHOT_MUTABLE, "snapshot")
    resources.check_labels(merged.labels)
    exp = merged.expire_time.ToMilliseconds() / 1000
    if exp <= now or exp > now + limits.snapshot_lifetime_s_max:
        raise InvalidArgument("Invalid expire_time: it must lie in the future and at most 7 days ahead.")
    return R.SnapPut(cur.topic_uid, merged.SerializeToString(deterministic=True))


def delete_snapshot(state: BrokerState, name: str) -> R.SnapDel:
    state.snapshot(name)
    return R.SnapDel(name)


def seek(state: BrokerState, sub_name: str, time_ms: int | None, snapshot: str | None) -> R.Seek:
    s = live_sub(state, sub_name)
    if snapshot is not None:
        snap = state.snapshot(snapshot)
        if s.topic is None or snap.topic_uid != s.topic.uid:
            raise FailedPrecondition(
                f"The subscription's topic and the snapshot's topic must be the same (snapshot={snapshot}).")
        # messages the snapshot still counts as unacked must still be retained
        floors = [max(f, ix.first()) for f, ix in zip(snap.floors, s.topic.shards)]
        acked = [[o for o in a if o >= f] for a, f in zip(snap.acked, floors)]
        return R.Seek(s.uid, floors, acked)
    if s.topic is None:
        raise FailedPrecondition("The subscription's topic was deleted.")
    topic_retains = s.topic.config.HasField("message_retention_duration")
    retained = s.config.retain_acked_messages or topic_retains
    floors, acked = [], []
    for shard, (ss, ix) in enumerate(zip(s.shards, s.topic.shards)):
        target = ix.offset_at_ms(time_ms)
        if retained:
            # topic retention reaches back before the subscription existed; its own retention does not
            f = max(target, ix.first() if topic_retains else max(ix.first(), s.start[shard]))
            floors.append(f)
            acked.append([])
        else:  # acked messages are gone for this subscription: they stay acked
            f = max(target, ss.floor)
            floors.append(f)
            acked.append(sorted(o for o in ss.acked if o >= f))
    return R.Seek(s.uid, floors, acked)


def move_floors(s: SubscriptionState, floors: list[int]) -> R.Seek:
    """Set the ack floors, keeping acks above them (a cursor moved; filters ack rejected messages ahead)."""
    acked = [sorted(o for o in sh.acked if o >= f) for sh, f in zip(s.shards, floors)]
    return R.Seek(s.uid, floors, acked)


# --- dead letters -----------------------------------------------------------------------------------
def dead_letter_batches(s: SubscriptionState, nums: list[int], stored: list[tuple[bytes, bytes]]) -> list[tuple[str, bytes, int]]:
    """The PublishRequests that forward messages to the dead-letter topic: (ordering key, request, count), with
    the attributes the service adds (source subscription and project, publish time, delivery count)."""
    dlt = s.config.dead_letter_policy.dead_letter_topic
    project, sub_id = names.split(s.name, "subscriptions")
    groups: dict[str, list] = {}
    for num, (body, tail) in zip(nums, stored):
        lease = s.leases.get(num)
        m = _PubsubMessage.FromString(body + tail)
        a = m.attributes
        a["CloudPubSubDeadLetterSourceSubscription"] = sub_id
        a["CloudPubSubDeadLetterSourceSubscriptionProject"] = project
        a["CloudPubSubDeadLetterSourceTopicPublishTime"] = m.publish_time.ToJsonString()
        a["CloudPubSubDeadLetterSourceDeliveryCount"] = str(lease[1] if lease else s.max_attempts)
        m.ClearField("message_id")
        m.ClearField("publish_time")
        groups.setdefault(m.ordering_key, []).append(m)
    return [(key, _PublishRequest(topic=dlt, messages=msgs).SerializeToString(), len(msgs))
            for key, msgs in groups.items()]


def check_topic_exists(state: BrokerState, name: str) -> TopicState:
    t = state.topics.get(name)
    if t is None:
        raise NotFound(f"Resource not found (resource={name.split('/')[-1]}).")
    return t


# --- upkeep -------------------------------------------------------------------------------------------
def expired_snapshots(state: BrokerState, now: float) -> list[R.SnapDel]:
    return [R.SnapDel(n) for n, sn in state.snapshots.items() if sn.config.expire_time.ToMilliseconds() <= now * 1000]


def inactive_subscriptions(state: BrokerState, now: float) -> list[str]:
    """Subscriptions inactive for longer than their expiration policy's ttl (to delete)."""
    out = []
    for s in state.subs_by_uid.values():
        ep = s.config.expiration_policy
        if s.config.HasField("expiration_policy") and ep.HasField("ttl"):
            if now - s.last_activity > resources.duration_s(ep.ttl):
                out.append(s.name)
    return out


def retention(state: BrokerState, now: float) -> list[R.Record]:
    """Unacked messages older than a subscription's retention are dropped for it: Trim records, by publish time.
    A rescheduled message's retention counts from its latest activation when that is later: the Trim keeps it
    (broker.subscription), and an Ack record after them drops it once that activation is older too."""
    out: list[R.Record] = []
    for s in state.subs_by_uid.values():
        if s.topic is None:
            continue
        cutoff_ms = int((now - resources.duration_s(s.config.message_retention_duration)) * 1000)
        floors = []
        for shard, ix in enumerate(s.topic.shards):
            floor = s.shards[shard].floor
            if floor < ix.durable:
                offset = min(ix.offset_at_ms(cutoff_ms), ix.durable)
                if offset > floor:
                    keeps = any(n & SHARD_MASK == shard and n >> limits.shard_bits < offset and
                                activation_of(at) is not None for n, at in s.parked.items())
                    out.append(R.Trim(s.uid, shard, offset, keeps))  # (the flag only when it keeps one)
                    floor = offset
            floors.append(floor)
        expired = s.expired_reschedules(floors, cutoff_ms)
        if expired:
            out.append(R.Ack(s.uid, expired))
    return out
