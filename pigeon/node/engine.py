"""The node's engine: wires the pure broker state to the WAL, the reader and the event loop.

Owns the rules: a state change is applied to memory, logged, and answered only once its record is
durable; a published message becomes visible to subscribers only once durable; checkpoints are written
only after the WAL covers their position. Every public coroutine here is one API call."""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import time
import uuid
from operator import itemgetter

from google.pubsub_v1 import types

from pigeon.broker import resources
from pigeon.broker.registry import Registry, SnapshotState, pb64
from pigeon.broker.subscription import SubscriptionState
from pigeon.broker.schedule import parse_activation
from pigeon.broker.topic import SCHEDULED, key_hash
from pigeon.core import ackid, limits, names, rawproto
from pigeon.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PigeonError,
    AckIdFailure,
    Unavailable,
)
from pigeon.node import recovery
from pigeon.node import maintenance, push
from pigeon.node.iam_ops import IamOps
from pigeon.node.streams import Signal, Stream, WallClock
from pigeon.node.push import PushManager
from pigeon.node.reader import MessageReader
from pigeon.node.queue_ops import QueueOps
from pigeon.node.schema_service import SchemaService
from pigeon.node.wal import Wal
from pigeon.ops.config import Config
from pigeon.storage import payloads

log = logging.getLogger("pigeon.engine")
_PubsubMessage = types.PubsubMessage.pb()
_PublishRequest = types.PublishRequest.pb()


class Engine:
    def __init__(self, config: Config, clock=None):
        self.config = config
        self.clock = clock or WallClock()
        self.registry = Registry()
        self.wal = Wal(
            os.path.join(config.data_dir, "wal"), config.fsync, config.segment_bytes, limits.group_commit_bytes_max
        )
        self.reader = MessageReader(self.wal, limits.read_cache_bytes_max)
        self.signals: dict[int, Signal] = {}
        self.closing = False
        self.report: recovery.Report | None = None
        self._checkpoints: list[int] = []
        self._last_ck_time = 0.0
        self._maintenance: asyncio.Task | None = None
        self._ck_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self.push = PushManager(self)
        self.schemas = SchemaService(self)
        self.queue = QueueOps(self)
        self.iam = IamOps(self)

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        os.makedirs(os.path.join(self.config.data_dir, "checkpoints"), exist_ok=True)
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        self.report = await loop.run_in_executor(
            None, lambda: recovery.recover(self.config.data_dir, self.registry, repair=True)
        )
        for line in self.report.lines():
            log.error("recovery: %s", line)
        self.wal.open(self.report.tail)
        self._checkpoints = recovery.list_checkpoints(self._ck_dir)
        self._last_ck_time = self.clock.now()
        for s in self.registry.subs_by_uid.values():  # inactivity is counted from the restart
            s.last_activity = self._last_ck_time
        log.info(
            "recovered %d topics, %d subscriptions, %d records replayed in %.3fs",
            len(self.registry.topics),
            len(self.registry.subs),
            self.report.replayed_records,
            time.monotonic() - t0,
        )
        self._maintenance = asyncio.create_task(self._maintain())
        allowed = [p.strip() for p in self.config.push_allowed_endpoints.split(",") if p.strip()]
        push.set_allowed_endpoints(allowed)
        self.push.start()

    async def stop(self) -> None:
        self.closing = True
        for sig in self.signals.values():
            sig.notify_all()
        await self.push.stop()
        if self._maintenance:
            self._maintenance.cancel()
        try:
            await self.checkpoint()
        except Exception:  # the WAL still holds everything; a checkpoint only speeds up the next start
            log.exception("final checkpoint failed")
        await self.wal.close()

    @property
    def _ck_dir(self) -> str:
        return os.path.join(self.config.data_dir, "checkpoints")

    def signal(self, sub_uid: int) -> Signal:
        sig = self.signals.get(sub_uid)
        if sig is None:
            sig = self.signals[sub_uid] = Signal()
        return sig

    def _check_open(self) -> None:
        if self.closing:
            raise Unavailable("The server is shutting down; retry on another connection.")

    async def _log_change(self, change: dict) -> None:
        self.registry.apply(change)
        self.wal.append(payloads.meta_record(change))
        await self.wal.wait_durable(self.wal.tail)
        if change["op"].startswith("sub."):
            self.push.subscription_changed(change["uid"])

    # --- topics ----------------------------------------------------------------------------------
    async def create_topic(self, topic):
        self._check_open()
        resources.check_topic(topic)
        if topic.name in self.registry.topics:
            raise AlreadyExists("Resource already exists in the project (resource=%s)." % topic.name.split("/")[-1])
        await self.schemas.check_topic_settings(topic)
        uid = self.registry.next_uid
        await self._log_change(
            {"op": "topic.put", "uid": uid, "pb": pb64(topic), "shards": self.config.shards_per_topic}
        )
        return self.registry.topics_by_uid[uid].config

    def get_topic(self, name: str):
        return self.registry.topic(name).config

    async def update_topic(self, topic, mask):
        self._check_open()
        t = self.registry.topic(topic.name)
        merged = resources.apply_mask(t.config, topic, mask, resources.TOPIC_MUTABLE, "topic")
        resources.check_topic(merged)
        await self.schemas.check_topic_settings(merged)
        await self._log_change({"op": "topic.put", "uid": t.uid, "pb": pb64(merged), "shards": len(t.shards)})
        return t.config

    async def delete_topic(self, name: str) -> None:
        self._check_open()
        t = self.registry.topic(name)
        await self._log_change({"op": "topic.del", "uid": t.uid})

    def list_topics(self, project: str, page_size: int, token: str):
        prefix = f"projects/{project}/topics/"
        return _page(sorted(n for n in self.registry.topics if n.startswith(prefix)), page_size, token)

    def list_topic_subscriptions(self, topic_name: str, page_size: int, token: str):
        t = self.registry.topic(topic_name)
        subs = sorted(self.registry.subs_by_uid[u].name for u in t.subscriptions)
        return _page(subs, page_size, token)

    def list_topic_snapshots(self, topic_name: str, page_size: int, token: str):
        t = self.registry.topic(topic_name)
        snaps = sorted(s.name for s in self.registry.snapshots.values() if s.topic_uid == t.uid)
        return _page(snaps, page_size, token)

    # --- subscriptions ---------------------------------------------------------------------------
    async def create_subscription(self, sub):
        self._check_open()
        if not sub.name:
            project = names.split(sub.topic, "topics")[0]
            sub.name = names.join(project, "subscriptions", f"sub-{uuid.uuid4().hex}")
        names.split(sub.name, "subscriptions")
        topic = self.registry.topic(sub.topic)
        if sub.name in self.registry.subs:
            raise AlreadyExists("Resource already exists in the project (resource=%s)." % sub.name.split("/")[-1])
        resources.check_subscription(sub, creating=True)
        if sub.detached:
            raise InvalidArgument("A subscription cannot be created detached.")
        uid = self.registry.next_uid
        await self._log_change(
            {"op": "sub.put", "uid": uid, "topic": topic.uid, "pb": pb64(sub), "start": topic.backlog_end()}
        )
        created = self.registry.subs_by_uid[uid]
        created.last_activity = self.clock.now()
        return self.subscription_view(created)

    def subscription_view(self, s: SubscriptionState):
        """The Subscription proto as Get returns it (with output-only fields filled in)."""
        out = resources.Subscription()
        out.CopyFrom(s.config)
        if s.topic is not None and s.topic.config.HasField("message_retention_duration"):
            out.topic_message_retention_duration.CopyFrom(s.topic.config.message_retention_duration)
        return out

    def get_subscription(self, name: str):
        return self.subscription_view(self.registry.sub(name))

    async def update_subscription(self, sub, mask):
        self._check_open()
        s = self.registry.sub(sub.name)
        merged = resources.apply_mask(s.config, sub, mask, resources.SUBSCRIPTION_MUTABLE, "subscription")
        resources.check_subscription(merged, creating=False)
        await self._log_change({"op": "sub.put", "uid": s.uid, "topic": None, "pb": pb64(merged)})
        self.signal(s.uid).notify_all()
        return self.subscription_view(s)

    async def delete_subscription(self, name: str) -> None:
        self._check_open()
        s = self.registry.sub(name)
        await self._log_change({"op": "sub.del", "uid": s.uid})
        sig = self.signals.pop(s.uid, None)
        if sig:
            sig.notify_all()

    async def detach_subscription(self, name: str) -> None:
        """Stop delivery for good: the backlog is dropped, later pulls fail with FAILED_PRECONDITION."""
        self._check_open()
        s = self.registry.sub(name)
        cfg = resources.Subscription()
        cfg.CopyFrom(s.config)
        cfg.detached = True
        await self._log_change({"op": "sub.put", "uid": s.uid, "topic": None, "pb": pb64(cfg)})
        ends = s.topic.backlog_end() if s.topic is not None else [sh.floor for sh in s.shards]
        await self._log_change({"op": "sub.reset", "uid": s.uid, "floors": ends, "acked": [[] for _ in ends]})
        self.signal(s.uid).notify_all()

    def list_subscriptions(self, project: str, page_size: int, token: str):
        prefix = f"projects/{project}/subscriptions/"
        return _page(sorted(n for n in self.registry.subs if n.startswith(prefix)), page_size, token)

    def _live_sub(self, name: str) -> SubscriptionState:
        self._check_open()
        s = self.registry.sub(name)
        if s.detached:
            raise FailedPrecondition(f"The subscription {name} is detached.")
        return s

    # --- publish ---------------------------------------------------------------------------------
    async def publish(
        self,
        topic_name: str,
        request: bytes,
        count: int,
        ordering_key: str,
        idem_keys: list[str] | None = None,
        sched: list[tuple[str, str]] | None = None,
    ) -> list[str]:
        """Store one PublishRequest (validated by the caller) whole; return the message ids once durable.
        `idem_keys`: the messages' idempotency keys ("" for none); repeats inside the window are not stored
        again and get the original message id. `sched`: the messages' (activate-at, delay) attributes, when
        some message carries one: the batch then waits in the topic's activation index."""
        self._check_open()
        t = self.registry.topic(topic_name)
        if idem_keys:
            return await self._publish_idempotent(t, request, ordering_key, idem_keys, sched)
        return await self._publish_stored(t, request, count, ordering_key, None, sched)

    async def _publish_stored(self, t, request: bytes, count: int, ordering_key: str, keys, sched) -> list[str]:
        if t.config.schema_settings.schema:
            request = self.schemas.check_publish(t.config, request)
        shard = t.shard_for(ordering_key)
        ix = t.shards[shard]
        ms = int(self.clock.now() * 1000)
        if ix.ms and ms < ix.ms[-1]:
            ms = ix.ms[-1]
        base = ix.next
        key = SCHEDULED if sched else key_hash(ordering_key)
        rec = payloads.publish_record(t.uid, shard, base, ms, count, request, key)
        pos = self.wal.append(rec)
        ix.append(count, pos, ms, key)
        end = base + count
        self._apply_filters(t, shard, base, request, count)
        step = 1 << limits.shard_bits
        first = t.id_base() | (base << limits.shard_bits) | shard
        if sched:  # index the activation times with the same group commit as the messages
            entries = [
                [parse_activation(at, delay, ms) or ms, ((base + i) << limits.shard_bits) | shard]
                for i, (at, delay) in enumerate(sched)
            ]
            change = {"op": "sched.put", "topic": t.uid, "entries": entries}
            self.registry.apply(change)
            self.wal.append(payloads.meta_record(change))
            for uid in t.subscriptions:
                s = self.registry.subs_by_uid[uid]
                for a, num in entries:
                    s.scheduled(a, num)
        if keys:  # remember the keys with the same group commit as the messages
            entries = [[k, str(first + i * step), ms] for i, k in enumerate(keys) if k]
            change = {"op": "idem.put", "topic": t.uid, "keys": entries}
            self.registry.apply(change)
            self.wal.append(payloads.meta_record(change))
        await self.wal.wait_durable(pos + len(rec))
        if ix.durable < end:
            ix.durable = end
            for uid in t.subscriptions:
                sig = self.signals.get(uid)
                if sig is not None:
                    sig.notify()
        return [str(n) for n in range(first, first + count * step, step)]

    async def _publish_idempotent(self, t, request: bytes, ordering_key: str, keys: list[str], sched) -> list[str]:
        window = t.idempotency
        window.expire(int((self.clock.now() - self.config.idempotency_window_s) * 1000))
        seen: dict[str, int] = {}
        fresh = []  # indexes of messages to store
        for i, k in enumerate(keys):
            if k and (window.get(k) is not None or k in seen):
                continue
            if k:
                seen[k] = i
            fresh.append(i)
        ids: list[str | None] = [None] * len(keys)
        if fresh:
            if len(fresh) < len(keys):
                req = _PublishRequest.FromString(request)
                keep = [req.messages[i] for i in fresh]
                del req.messages[:]
                req.messages.extend(keep)
                request = req.SerializeToString()
            stored = await self._publish_stored(
                t, request, len(fresh), ordering_key, [keys[i] for i in fresh], [sched[i] for i in fresh] if sched else None
            )
            for i, mid in zip(fresh, stored):
                ids[i] = mid
        else:
            await self.wal.wait_durable(self.wal.tail)  # the originals may still be on their way to disk
        return [mid if mid is not None else window.get(k) for mid, k in zip(ids, keys)]

    def _apply_filters(self, t, shard: int, base: int, request: bytes, count: int) -> None:
        """Messages a subscription's filter rejects are acked for it at once (logged right after the
        publish record, so a restart agrees) and never delivered."""
        filtered = [s for s in (self.registry.subs_by_uid[u] for u in t.subscriptions) if s.filter is not None]
        if not filtered:
            return
        if rawproto.only_data(request, count):
            for s in filtered:  # no message has attributes: one evaluation decides for all
                if not s.filter.matches({}):
                    self.ack_logged(s, [((base + i) << limits.shard_bits) | shard for i in range(count)])
            return
        attrs = [m.attributes for m in _PublishRequest.FromString(request).messages]
        for s in filtered:
            match = s.filter.matches
            drop = [((base + i) << limits.shard_bits) | shard for i, a in enumerate(attrs) if not match(a)]
            if drop:
                self.ack_logged(s, drop)

    def ack_logged(self, s: SubscriptionState, nums: list[int]) -> list[int]:
        """Acknowledge message numbers and log the ones that changed (durable with the next group commit;
        callers that answer a client wait for it). Returns those that changed."""
        changed = s.ack(nums)
        if changed:
            self.wal.append(payloads.ack_record(s.uid, changed))
            if s.ready_keys:  # an ordering key unblocked (a stream's own room is its release's business)
                self.signal(s.uid).notify()
        return changed

    # --- delivery --------------------------------------------------------------------------------
    def deliver(self, s: SubscriptionState, max_messages: int, max_bytes: int, owner, deadline_s: float) -> list[bytes]:
        """Lock up to `max_messages` messages; return each as an encoded `received_messages` entry (field 1 of
        PullResponse and StreamingPullResponse alike)."""
        taken = self.lease(s, max_messages, deadline_s, owner)
        if not taken:
            return []
        show_attempt = bool(s.config.dead_letter_policy.dead_letter_topic)
        out, sizes = self.reader.received(s.topic, taken, s.uid, show_attempt, max_bytes, s.overrides)
        if len(out) < len(taken):  # the rest did not fit
            s.untake(taken[len(out):])
            del taken[len(out):]
        if owner is not None:  # nothing ran since lease(): every message taken is leased to the stream
            owner.hold(map(itemgetter(0), taken), sizes)
        self.count_deliveries(s, map(itemgetter(0), taken))
        return out

    def lease(self, s: SubscriptionState, max_messages: int, deadline_s: float, owner=None, per_key_max: int = 0):
        """Lock up to `max_messages` messages for `owner` (a stream, a push worker or None); messages past
        their delivery attempts go to the dead-letter topic instead. [(num, version)]"""
        taken = s.take(max_messages, self.clock.now(), deadline_s, owner, per_key_max)
        if s.dead_letters:
            self._forward_dead_letters(s)
        return taken

    def read(self, s: SubscriptionState, nums: list[int]) -> list[tuple[bytes, bytes]]:
        """(stored message bytes, message id/publish time tail) as this subscription delivers them: a message
        updated in place through the queue extensions reads as updated."""
        return self.reader.messages(s.topic, nums, s.overrides)

    def count_deliveries(self, s: SubscriptionState, nums) -> None:
        """Deliveries are counted durably for dead-lettering (logged, not waited for); `nums` is only read
        when the subscription has a dead-letter policy."""
        if s.max_attempts:
            nums = list(nums)
            if nums:
                self.wal.append(payloads.deliver_record(s.uid, nums))

    def _forward_dead_letters(self, s: SubscriptionState) -> None:
        nums, s.dead_letters = s.dead_letters, []
        task = asyncio.get_running_loop().create_task(self._dead_letter(s, nums))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dead_letter(self, s: SubscriptionState, nums: list[int]) -> None:
        """Publish to the dead-letter topic with the source attributes, then ack on the source. If the
        topic is missing or the publish fails, the held leases run out and the messages come back."""
        dlt = s.config.dead_letter_policy.dead_letter_topic
        try:
            self.registry.topic(dlt)
            project, sub_id = names.split(s.name, "subscriptions")
            groups: dict[str, list] = {}
            for num, (body, tail) in zip(nums, self.reader.messages(s.topic, nums)):
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
            for key, msgs in groups.items():
                request = _PublishRequest(topic=dlt, messages=msgs).SerializeToString()
                await self.publish(dlt, request, len(msgs), key)
        except PigeonError as e:
            log.warning("dead-lettering %d messages of %s to %s failed: %s", len(nums), s.name, dlt, e.message)
            return
        self.ack_logged(s, nums)
        await self.wal.wait_durable(self.wal.tail)

    async def pull(self, name: str, max_messages: int, return_immediately: bool) -> list[bytes]:
        if max_messages <= 0:
            raise InvalidArgument("max_messages must be greater than 0.")
        s = self._live_sub(name)
        s.last_activity = self.clock.now()
        max_messages = min(max_messages, limits.pull_messages_max)
        give_up = time.monotonic() + limits.pull_wait_s_max
        while True:
            out = self.deliver(s, max_messages, limits.response_bytes_max, None, s.ack_deadline_s)
            if out:
                self._pass_on(s)
                return out
            left = give_up - time.monotonic()
            if return_immediately or left <= 0:
                return out
            await self._wait(s, left)
            s = self._live_sub(name)

    async def _wait(self, s: SubscriptionState, cap: float, stream: Stream | None = None) -> None:
        """Wait for `s`'s messages (or `stream`'s own events), at most `cap` seconds; the subscription's
        timer wakes one waiter when something becomes ready by itself."""
        sig = self.signal(s.uid)
        d = s.next_deadline()
        if d is not None:
            loop = asyncio.get_running_loop()
            sig.wake_at(loop.time() + max(0.001, d - self.clock.now()))
        await sig.wait(cap, stream)

    def _pass_on(self, s: SubscriptionState) -> None:
        """A waiter took messages: if more are ready, wake the next one (the chain that replaces waking all)."""
        if s.has_ready(self.clock.now()):
            sig = self.signals.get(s.uid)
            if sig is not None:
                sig.notify()

    def open_stream(self, name: str, client_id: str, deadline_s: int, max_messages: int, max_bytes: int) -> Stream:
        s = self._live_sub(name)
        if not limits.ack_deadline_s_min <= deadline_s <= limits.ack_deadline_s_max:
            raise InvalidArgument(
                f"Invalid stream_ack_deadline_seconds: it must be between {limits.ack_deadline_s_min} and "
                f"{limits.ack_deadline_s_max} (got {deadline_s})."
            )
        return Stream(s, client_id, deadline_s, max_messages, max_bytes)

    async def stream_next(self, stream: Stream) -> list[bytes] | None:
        """Wait until the stream may take messages and some are ready, or it has something in its outbox;
        return the messages (possibly none), or None once the client has half-closed."""
        s = stream.sub
        while True:
            self._check_open()
            if stream.error is not None or stream.ended:
                self._pass_on(s)  # it may have been the waiter woken for messages: the next one takes them
                if stream.error is not None:
                    raise stream.error
                return None
            if stream.outbox:
                return []
            if self.registry.subs_by_uid.get(s.uid) is not s:
                raise NotFound(f"Resource not found (resource={s.name.split('/')[-1]}).")
            if s.detached:
                raise FailedPrecondition(f"The subscription {s.name} is detached.")
            s.last_activity = self.clock.now()  # an open stream keeps the subscription alive
            room = stream.room()
            if room > 0:
                out = self.deliver(
                    s,
                    min(room, limits.stream_response_messages_max),
                    max(1, stream.max_bytes - stream.held_bytes),
                    stream,
                    stream.deadline_s,
                )
                if out:
                    self._pass_on(s)
                    return out
                await self._wait(s, 1.0, stream)
            else:  # flow control: only this stream's acks (or its own events) can change that
                await stream.wait(1.0)

    def close_stream(self, stream: Stream) -> None:
        """Messages it still holds stay leased until their deadline (the client may still ack them)."""
        stream.sub.disown(stream, list(stream.held))
        stream.held.clear()

    def ack_nowait(self, s: SubscriptionState, ack_ids) -> dict[str, str]:
        """Apply acks (logged, not yet durable). Returns exactly-once failures {ack_id: code}: with
        exactly-once delivery an ack id is valid only for the current, unexpired delivery."""
        s.last_activity = self.clock.now()
        eod = s.config.enable_exactly_once_delivery
        failures: dict[str, str] = {}
        nums = []
        if eod:
            s.expire(self.clock.now())
        elif not s.parked:  # nothing to check per id: a batch of this subscription's ids is parsed at once
            batch = ackid.parse_many(s.uid, ack_ids)
            if batch is not None:
                self.ack_logged(s, batch)
                return failures
        leases, uid = s.leases, s.uid
        for a in ack_ids:
            try:
                p = ackid.parse(uid, a)
            except InvalidArgument:
                if not eod:
                    raise
                p = None
            if p is None:
                if eod:
                    failures[a] = "PERMANENT_FAILURE_INVALID_ACK_ID"
                continue
            num, version = p
            if s.parked and num in s.parked and num not in leases:
                continue  # rescheduled or buried with this ack id first: that call won
            if eod:
                lease = leases.get(num)
                if lease is None or lease[1] != version:
                    if not s.is_acked(num):
                        failures[a] = "PERMANENT_FAILURE_INVALID_ACK_ID"
                    continue
            nums.append(num)
        self.ack_logged(s, nums)
        return failures

    async def acknowledge(self, name: str, ack_ids) -> None:
        s = self._live_sub(name)
        if not ack_ids:
            raise InvalidArgument("ack_ids must not be empty.")
        failures = self.ack_nowait(s, ack_ids)
        await self.wal.wait_durable(self.wal.tail)  # also covers an equal ack still in flight
        if failures:
            raise AckIdFailure(failures)

    async def modify_ack_deadline(self, name: str, ack_ids, seconds: int) -> None:
        s = self._live_sub(name)
        failures = self.modify_deadlines(s, ack_ids, [seconds] * len(ack_ids))
        if failures:
            raise AckIdFailure(failures)

    def modify_deadlines(self, s: SubscriptionState, ack_ids, seconds) -> dict[str, str]:
        """Extend or release (0) leases. Returns exactly-once failures {ack_id: code}."""
        if len(ack_ids) != len(seconds):
            raise InvalidArgument("modify_deadline_seconds and modify_deadline_ack_ids must have the same length.")
        for sec in seconds:
            if not 0 <= sec <= limits.modify_deadline_s_max:
                raise InvalidArgument(
                    f"Invalid ack deadline ({sec}s): it must be between 0 and {limits.modify_deadline_s_max} seconds."
                )
        now = self.clock.now()
        s.last_activity = now
        eod = s.config.enable_exactly_once_delivery
        if eod:
            s.expire(now)
        failures: dict[str, str] = {}
        groups: dict[int, list[tuple[int, int]]] = {}
        for a, sec in zip(ack_ids, seconds):
            try:
                p = ackid.parse(s.uid, a)
            except InvalidArgument:
                if not eod:
                    raise
                p = None
            if p is not None and eod:
                lease = s.leases.get(p[0])
                if lease is None or lease[1] != p[1]:
                    p = None
            if p is None:
                if eod:
                    failures[a] = "PERMANENT_FAILURE_INVALID_ACK_ID"
                continue
            groups.setdefault(sec, []).append(p)
        for sec, items in groups.items():
            if s.modify_deadlines(items, sec, now) and sec == 0:
                self.signal(s.uid).notify()  # nacked: ready again (the waiter woken passes it on)
        return failures

    def stream_acks(self, stream: Stream, ack_ids) -> tuple[asyncio.Future | None, dict[str, str]]:
        """Acks sent on a stream: (durability future with exactly-once delivery — the confirmation waits for
        it —, else None: the acks ride along with the next group commit; exactly-once failures)."""
        failures = self.ack_nowait(stream.sub, ack_ids)
        if not stream.sub.config.enable_exactly_once_delivery:
            return None, failures
        return self.wal.wait_durable(self.wal.tail), failures

    # --- snapshots and seek ----------------------------------------------------------------------
    async def create_snapshot(self, name: str, sub_name: str, labels: dict):
        self._check_open()
        s = self.registry.sub(sub_name)
        if not name:
            project = names.split(sub_name, "subscriptions")[0]
            name = names.join(project, "snapshots", f"snap-{uuid.uuid4().hex}")
        names.split(name, "snapshots")
        if name in self.registry.snapshots:
            raise AlreadyExists("Resource already exists in the project (resource=%s)." % name.split("/")[-1])
        if s.topic is None or s.topic.deleted:
            raise FailedPrecondition("Cannot create a snapshot of a subscription whose topic was deleted.")
        now = self.clock.now()
        oldest_ms = None
        for ss, ix in zip(s.shards, s.topic.shards):
            if ss.floor < ix.durable:
                ms = ix.publish_ms(ss.floor)
                oldest_ms = ms if oldest_ms is None else min(oldest_ms, ms)
        base = now if oldest_ms is None else oldest_ms / 1000
        expire = base + limits.snapshot_lifetime_s_max
        if expire - now < limits.snapshot_lifetime_s_min:
            raise FailedPrecondition(
                "The snapshot would expire in less than 1 hour: the subscription's oldest unacked message is too old."
            )
        snap = resources.Snapshot(name=name, topic=s.topic.name)
        snap.labels.update(labels)
        resources.check_labels(snap.labels)
        snap.expire_time.FromMilliseconds(int(expire * 1000))
        floors, acked = s.export_state()
        await self._log_change(
            {"op": "snap.put", "pb": pb64(snap), "topic": s.topic.uid, "floors": floors, "acked": acked}
        )
        return self.registry.snapshots[name].config

    def get_snapshot(self, name: str):
        return self.registry.snapshot(name).config

    def list_snapshots(self, project: str, page_size: int, token: str):
        prefix = f"projects/{project}/snapshots/"
        return _page(sorted(n for n in self.registry.snapshots if n.startswith(prefix)), page_size, token)

    async def update_snapshot(self, snap, mask):
        self._check_open()
        cur = self.registry.snapshot(snap.name)
        merged = resources.apply_mask(cur.config, snap, mask, resources.SNAPSHOT_MUTABLE, "snapshot")
        resources.check_labels(merged.labels)
        now = self.clock.now()
        exp = merged.expire_time.ToMilliseconds() / 1000
        if exp <= now or exp > now + limits.snapshot_lifetime_s_max:
            raise InvalidArgument("Invalid expire_time: it must lie in the future and at most 7 days ahead.")
        await self._log_change({"op": "snap.put", "pb": pb64(merged), "topic": cur.topic_uid})
        return self.registry.snapshots[snap.name].config

    async def delete_snapshot(self, name: str) -> None:
        self._check_open()
        self.registry.snapshot(name)
        await self._log_change({"op": "snap.del", "name": name})

    async def seek(self, sub_name: str, time_ms: int | None, snapshot: str | None) -> None:
        s = self._live_sub(sub_name)
        if snapshot is not None:
            snap: SnapshotState = self.registry.snapshot(snapshot)
            if s.topic is None or snap.topic_uid != s.topic.uid:
                raise FailedPrecondition(
                    f"The subscription's topic and the snapshot's topic must be the same (snapshot={snapshot})."
                )
            floors, acked = list(snap.floors), [list(a) for a in snap.acked]
            # messages the snapshot still counts as unacked must still be retained
            floors = [max(f, ix.first()) for f, ix in zip(floors, s.topic.shards)]
            acked = [[o for o in a if o >= f] for a, f in zip(acked, floors)]
        else:
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
        await self._log_change({"op": "sub.reset", "uid": s.uid, "floors": floors, "acked": acked})
        self.signal(s.uid).notify_all()

    # --- maintenance -----------------------------------------------------------------------------
    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(limits.retention_tick_s)
            try:
                await self.maintain_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("maintenance failed")

    async def maintain_once(self) -> None:
        await maintenance.maintain_once(self)

    async def checkpoint(self) -> None:
        await maintenance.checkpoint(self)


def _page(items: list[str], page_size: int, token: str) -> tuple[list[str], str]:
    """Keyset paging over sorted names: the token is the last name returned."""
    if page_size < 0:
        raise InvalidArgument("page_size must not be negative.")
    size = min(page_size or limits.list_page_size_default, limits.list_page_size_max)
    start = 0
    if token:
        start = bisect.bisect_right(items, token)
    page = items[start : start + size]
    nxt = page[-1] if start + size < len(items) and page else ""
    return page, nxt
