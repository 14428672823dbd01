"""The node's executor: runs commands against the broker state and the log. Owns the rules: a state change is
validated (broker.commands), appended to the log as a record and applied (broker.state) in one step of the event
loop — so the log's order is the order of application — and answered only once its record is durable; a
published message becomes visible to subscribers only once durable; apply's effects (wake-ups, push, dead
letters) are performed here. Every public coroutine here is one API call; the decisions are the broker's."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from dataclasses import dataclass
from operator import itemgetter
from typing import Callable

from pigeon.broker import commands
from pigeon.broker import state as bs
from pigeon.broker.state import BrokerState
from pigeon.broker.subscription import SubscriptionState, SubscriptionStats
from pigeon.core import limits
from pigeon.core.errors import AckIdFailure, InvalidArgument, NotFound, FailedPrecondition, PigeonError, Unavailable
from pigeon.node import hops, maintenance, push, recovery
from pigeon.node.admission import Admission, AdmissionStats
from pigeon.node.host import OsHost
from pigeon.node.iam_ops import IamOps
from pigeon.node.push import PushManager
from pigeon.node.queue_ops import QueueOps
from pigeon.node.reader import MessageReader, ReaderStats
from pigeon.node.samples import AckLatency, HotKeys
from pigeon.node.schema_service import SchemaService
from pigeon.node.streams import Signal, Stream, StreamStats, WallClock
from pigeon.node.journal import WriterStats
from pigeon.ops.config import Config
from pigeon.core.bundles import META_LOG, bundle_log
from pigeon.core.histogram import Histogram, HistogramStats
from pigeon.storage import records as R

log = logging.getLogger("pigeon.engine")

SHUTTING_DOWN = "The server is shutting down; retry on another connection."


@dataclass(frozen=True, slots=True)
class NodeStats:
    journal: WriterStats
    reader: ReaderStats
    subscriptions: tuple[SubscriptionStats, ...]
    streams: tuple[StreamStats, ...]
    topics: int
    admission: AdmissionStats
    topic_stats: tuple[tuple[str, int, int, int], ...]  # (name, publish requests, messages, bytes) since start
    publish_latency: HistogramStats  # from a Publish reaching the engine to its messages being durable
    ack_latency: HistogramStats  # sampled: from handing a message out to its ack (node.samples)
    hot_keys: tuple[tuple[str, str, int], ...]  # (topic, ordering key, messages): the hottest keys


class Engine:
    def __init__(self, config: Config, clock=None, host=None):
        self.config = config
        self.clock = clock or WallClock()
        self.host = host or OsHost()
        self.state = BrokerState()
        self.publish_latency = Histogram()
        self.ack_latency = AckLatency()  # sampled, from delivery to ack
        self.hot_keys = HotKeys()  # the ordering keys published most, per topic
        self.journal = self.host.journal(os.path.join(config.data_dir, "wal"), config.fsync, config.segment_bytes)
        self.reader = MessageReader(self.journal, limits.read_cache_bytes_max)
        self.epoch = 0  # this process's epoch: it fences every log it writes at it
        self.signals: dict[int, Signal] = {}
        self.streams: set[Stream] = set()  # open StreamingPull streams
        c = config
        self.admission = Admission(c.publish_pending_bytes, c.streams_max, c.stream_unsent_bytes,
                                   c.stream_write_stall_s)
        self.closing = False
        self._dir_lock = None
        self.meta_log = None  # a cluster node's metadata log (node.meta_log): metadata changes go through it
        self.owns = lambda log_id: True  # whether this node owns a log (a cluster node owns some bundles)
        self.replicas = None  # a cluster node's bundle logs (node.bundle_logs): data records are replicated
        # where the journal must be kept from whatever the checkpoints allow (a cluster node's ledger store
        # borrows its own copies from it: node.ledger_store); None: no such bound
        self.journal_floor: Callable[[], int | None] = (lambda: 0) if config.etcd else (lambda: None)
        self._replicated: dict[int, asyncio.Future] = {}  # log → the replication of its latest record
        self.report: recovery.Report | None = None
        self._fenced: set[int] = set()  # logs fenced at self.epoch
        self.checkpoints = maintenance.Checkpoints(os.path.join(config.data_dir, "checkpoints"))
        self._maintenance: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.push = PushManager(self)
        self.schemas = SchemaService(self)
        self.queue = QueueOps(self)
        self.iam = IamOps(self)

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        disk = self.journal.disk
        disk.makedirs(self.checkpoints.dir)
        self._dir_lock = self.host.lock_data_dir(self.config.data_dir)
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        self.state, found = await loop.run_in_executor(None, lambda: recovery.recover(self.config.data_dir,
                                                                                      repair=True, disk=disk))
        self.report = found.report
        recovery.report(self.report)
        self.journal.open(found.tail, found.logs)
        # a new owner of every log: appends of an earlier life (none can come: it is dead) would be refused
        self.epoch = 1 + max((st.fenced for st in found.logs.values()), default=0)
        self.checkpoints.found(found.checkpoints, self.clock.now())
        self.state.rebuild(self.checkpoints.last_time)
        c = self.config
        self.state.quotas = bs.Quotas(c.topics_per_project, c.subscriptions_per_project, c.snapshots_per_project,
                                      c.schemas_per_project, c.resources_per_server)
        log.info(
            "recovered %d topics, %d subscriptions, %d records replayed in %.3fs",
            len(self.state.topics),
            len(self.state.subs),
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
        await self.journal.close()
        if self._dir_lock is not None:
            self._dir_lock.close()
            self._dir_lock = None

    def signal(self, sub_uid: int) -> Signal:
        sig = self.signals.get(sub_uid)
        if sig is None:
            sig = self.signals[sub_uid] = Signal()
        return sig

    def check_open(self) -> None:
        if self.closing:
            raise Unavailable(SHUTTING_DOWN)

    # --- the one way state changes -----------------------------------------------------------------
    def commit(self, rec: R.Record, owner=None) -> int:
        """Append `rec` to its log and apply it (validated before: applying must not fail), then perform its
        effects. Returns the journal position after it: durable once the journal's durable position reaches it."""
        log_id = self.state.log_of(rec, self.config.bundles)
        if log_id not in self._fenced:
            self.journal.fence(log_id, self.epoch)
            self._fenced.add(log_id)
        parts = rec.parts()
        offset, at = self.journal.append(log_id, self.epoch, rec.TYPE, parts)
        if self.replicas is not None and log_id != META_LOG and rec.TYPE < R.RecordType.RESET:
            self._replicated[log_id] = self.replicas.append(log_id, rec.TYPE, b"".join(parts),
                                                            (log_id, offset, at, self.journal.tail))
        effects = self.state.apply(rec, at, owner)
        if effects:
            self._perform(effects)
        return self.journal.tail

    def _perform(self, effects) -> None:
        for kind, uid in effects:
            if kind == bs.WAKE:
                sig = self.signals.get(uid)
                if sig is not None:
                    sig.notify()  # the waiter woken passes it on while more is ready
            elif kind == bs.WAKE_ALL:
                gone = uid not in self.state.subs_by_uid
                sig = self.signals.pop(uid, None) if gone else self.signals.get(uid)
                if sig is not None:
                    sig.notify_all()
            elif kind == bs.CHANGED:
                self.push.subscription_changed(uid)
            elif kind == bs.DEAD_LETTERS:
                self._forward_dead_letters(self.state.subs_by_uid[uid])
            elif kind == bs.DEADLINE:
                sig = self.signals.get(uid)
                if sig is not None:
                    self._arm(self.state.subs_by_uid[uid], sig)

    async def durable(self, end: int | None = None, log_id: int | None = None) -> None:
        """Until everything committed so far (or up to `end`) is durable — and in a cluster, everything committed
        so far to `log_id` is held by Qa members of its ensemble (Unavailable when the log moved meanwhile). The
        owner's own journal must have it too: its reader serves messages from there."""
        replicated = self._replicated.get(log_id) if log_id is not None else None
        if replicated is not None and not replicated.done():
            self.replicas.flush(log_id)  # (records nobody waited for linger before they go to the members)
        await self.journal.wait_durable(self.journal.tail if end is None else end)
        if replicated is not None:
            await replicated

    async def recorded(self, log_id: int) -> None:
        """In a cluster, until every record committed so far to `log_id` is held by Qa members of its ensemble
        (Unavailable when the log moved meanwhile); on one node at once. A delivery waits for it before its messages
        go out: the lease it takes is then in the log every later owner of the bundle reads, before any ack of those
        messages — and an owner that lost its bundle without knowing it yet (paused, cut off) cannot have its Deliver
        record confirmed (the new owner fenced the ledger), so it hands out nothing, not even a message the new
        owner has seen acknowledged since."""
        replicated = self._replicated.get(log_id) if self.replicas is not None else None
        if replicated is not None:
            if not replicated.done():
                self.replicas.flush(log_id)
            await replicated

    async def change(self, *recs: R.Record) -> None:
        """Commit administrative records and answer once they are durable; one log line per change."""
        self.check_open()
        said = [d for d in map(self.state.describe, recs) if d]
        if self.meta_log is not None and any(rec.META for rec in recs):
            await self.meta_log.commit(recs)  # validated against this state: no await may come before
        else:
            logs = set()
            for rec in recs:
                logs.add(self.state.log_of(rec, self.config.bundles))
                self.commit(rec)
            for log_id in logs - {META_LOG}:  # in a cluster a data record (a seek) is answered once replicated
                await self.durable(log_id=log_id)
        await self.durable()
        for d in said:
            log.info("change: %s", d)

    # --- topics ----------------------------------------------------------------------------------
    async def create_topic(self, topic):
        self.check_open()
        await self.schemas.check_topic_settings(topic)
        rec = commands.create_topic(self.state, topic, self.config.shards_per_topic)
        await self.change(rec)
        return self.state.topics_by_uid[rec.uid].config

    def get_topic(self, name: str):
        return self.state.topic(name).config

    async def update_topic(self, topic, mask):
        self.check_open()
        await self.schemas.check_topic_settings(commands.merged_topic(self.state, topic, mask))
        rec = commands.update_topic(self.state, topic, mask)
        await self.change(rec)
        return self.state.topics_by_uid[rec.uid].config

    async def delete_topic(self, name: str) -> None:
        await self.change(commands.delete_topic(self.state, name))

    def list_topics(self, project: str, page_size: int, token: str):
        return commands.page(commands.in_project(self.state.topics, project, "topics"), page_size, token)

    def list_topic_subscriptions(self, topic_name: str, page_size: int, token: str):
        t = self.state.topic(topic_name)
        return commands.page(sorted(self.state.subs_by_uid[u].name for u in t.subscriptions), page_size, token)

    def list_topic_snapshots(self, topic_name: str, page_size: int, token: str):
        t = self.state.topic(topic_name)
        snaps = sorted(s.name for s in self.state.snapshots.values() if s.topic_uid == t.uid)
        return commands.page(snaps, page_size, token)

    # --- subscriptions ---------------------------------------------------------------------------
    async def create_subscription(self, sub):
        self.check_open()
        rec = commands.create_subscription(self.state, sub, f"sub-{uuid.uuid4().hex}")
        await self.change(rec)
        created = self.state.subs_by_uid[rec.uid]
        created.last_activity = self.clock.now()
        return commands.subscription_view(created)

    subscription_view = staticmethod(commands.subscription_view)

    def get_subscription(self, name: str):
        return commands.subscription_view(self.state.sub(name))

    async def update_subscription(self, sub, mask):
        self.check_open()
        rec = commands.update_subscription(self.state, sub, mask)
        await self.change(rec)
        return commands.subscription_view(self.state.subs_by_uid[rec.uid])

    async def delete_subscription(self, name: str) -> None:
        await self.change(commands.delete_subscription(self.state, name))

    async def detach_subscription(self, name: str) -> None:
        """Stop delivery for good: the backlog is dropped, later pulls fail with FAILED_PRECONDITION."""
        self.check_open()
        await self.change(*commands.detach_subscription(self.state, name))

    def list_subscriptions(self, project: str, page_size: int, token: str):
        return commands.page(commands.in_project(self.state.subs, project, "subscriptions"), page_size, token)

    def live_sub(self, name: str) -> SubscriptionState:
        self.check_open()
        s = commands.live_sub(self.state, name)
        if self.replicas is not None and not self.owns(self.state.log_of_sub(name, self.config.bundles)):
            raise Unavailable("The subscription's bundle moved to another node; retry.")
        return s

    # --- a cluster node's bundles ----------------------------------------------------------------
    async def rebuild_log(self, log_id: int, entries) -> None:
        """Take a bundle over: its state starts over as created — or as the Snapshot record the log starts with
        says, when the log was cut — and the log, read back from its ledgers ((type, body) in log order), is
        applied again — kept in this node's journal too, behind that Reset or Snapshot, so a restart rebuilds the
        same. Later snapshots are skipped: they describe the state the entries before them built. The new owner's
        first step in serving it (node.bundle_logs). Its messages become visible once the journal holds them, as
        a publish's do: the reader reads them from the journal's files (chaos found a Pull, 3 ms after a
        takeover, reading a record its writer had not yet written)."""
        entries = iter(entries)
        first = next(entries, None)
        if first is not None and first[0] == R.RecordType.SNAPSHOT:  # the log was cut: it starts with its state
            self.commit(R.decode(*first))
        else:
            self.commit(R.Reset(log_id, self.config.bundles))
            entries = itertools.chain([first] if first is not None else [], entries)
        apply, append, epoch = self.state.apply, self.journal.append, self.epoch
        topics = self.state.topics_by_uid
        for rtype, body in entries:
            if rtype == R.RecordType.SNAPSHOT:
                continue  # the state it describes is the one these entries built: a snapshot counts only first
            rec = R.decode(rtype, body)
            if rtype == R.RecordType.PUBLISH and rec.topic not in topics:
                continue  # its topic was deleted since (the metadata log runs ahead of this one): nothing to keep
            apply(rec, append(log_id, epoch, rtype, [body])[1])
        await self.journal.wait_durable(self.journal.tail)
        self.state.resume_log(log_id, self.config.bundles, self.clock.now())
        for t in self.state.topics_by_uid.values():
            for uid in t.subscriptions:
                sig = self.signals.get(uid)
                if sig is not None:
                    sig.notify_all()

    def log_moved(self, log_id: int) -> None:
        """A bundle is no longer this node's: its streams end with UNAVAILABLE (their clients reconnect, and are
        routed to the new owner); their leases are the new owner's business."""
        gone = Unavailable("The subscription's bundle moved to another node; reconnect.")
        for st in self.streams:
            if st.sub.topic is not None and bundle_log(st.sub.topic.name, self.config.bundles) == log_id:
                st.error = gone
                st.wake()
        self._replicated.pop(log_id, None)

    # --- publish ---------------------------------------------------------------------------------
    async def publish(self, topic_name: str, request: bytes, count: int, ordering_key: str,
                      idem_keys: list[str] | None = None, sched: list[tuple[str, str]] | None = None) -> list[str]:
        """Store one PublishRequest (validated by commands.check_publish) whole; return the message ids once
        durable. `idem_keys`: the messages' idempotency keys ("" for none); repeats inside the window are not
        stored again and get the original message id. `sched`: the messages' (activate-at, delay) attributes,
        when some message carries one: the batch then waits in the topic's activation index."""
        self.check_open()
        t = self.state.topic(topic_name)
        self.journal.check_publish()  # a full disk refuses publishes, keeps room for deliveries and acks
        if not idem_keys:
            return await self._store(t, request, count, ordering_key, None, sched)
        t.idempotency.expire(int((self.clock.now() - self.config.idempotency_window_s) * 1000))
        fresh = commands.deduplicate(t, idem_keys)
        stored: dict[int, str] = {}
        if fresh:
            if len(fresh) < count:
                request = commands.keep_messages(request, fresh)
                sched = [sched[i] for i in fresh] if sched else None
            ids = await self._store(t, request, len(fresh), ordering_key, [idem_keys[i] for i in fresh], sched)
            stored = dict(zip(fresh, ids))
        else:
            await self.durable(log_id=t.log_id)  # the originals may still be on their way to disk (and members)
        return [stored.get(i) or t.idempotency.get(k) for i, k in enumerate(idem_keys)]

    async def _store(self, t, request: bytes, count: int, ordering_key: str, keys, sched) -> list[str]:
        if t.config.schema_settings.schema:
            request = self.schemas.check_publish(t.config, request)
        rec = commands.publish(t, request, count, ordering_key, int(self.clock.now() * 1000), keys, sched)
        t0 = time.perf_counter()
        with self.admission.publishing(len(request)):
            end = self.commit(rec)
            if hops.ON:
                hops.mark("committed")
            self._show_when_durable(t, rec, end)
            await self.durable(end, t.log_id)
        self.publish_latency.observe(time.perf_counter() - t0)
        t.publish_requests += 1
        t.published += count
        t.published_bytes += len(request)
        if ordering_key:
            self.hot_keys.published(t.name, ordering_key, count)
        return commands.message_ids(t, rec)

    def _show_when_durable(self, t, rec: R.Publish, end: int) -> None:
        """Show the batch to the topic's subscriptions the moment it is durable (in a cluster: held by the
        ensemble too) — driven by the durability callbacks, never by the publisher's coroutine, so a publisher
        that goes away meanwhile (a deadline, a disconnect) does not hide it. The callbacks run before the
        publisher's own wait resumes: a waiting subscriber's delivery goes one step ahead of the answer, the
        part of end-to-end latency the server owns. A batch somebody waits for is kept in the reader's cache
        now, so that delivery neither reads nor parses the record back; one nobody waits for costs no memory."""
        if any(sig.waiting for uid in t.subscriptions if (sig := self.signals.get(uid)) is not None):
            pos = t.shards[rec.shard].pos[-1]  # apply has just indexed the batch
            self.reader.remember_published(pos, rec.request, rec.publish_ms, end - pos)
        replicated = self._replicated.get(t.log_id) if self.replicas is not None else None

        def on_journal(exc) -> None:
            if exc is not None:
                return
            if replicated is None:
                self._show(t, rec)
            else:  # (a failed replication raises in the publisher's wait: the log's next owner shows the batch)
                replicated.add_done_callback(lambda f: f.cancelled() or f.exception() is not None or self._show(t, rec))

        self.journal.on_durable(end, on_journal)

    def _show(self, t, rec: R.Publish) -> None:
        """The batch is durable: its messages may be handed out; wake one waiter of each subscription."""
        ix = t.shards[rec.shard]
        end = rec.base + rec.count
        if ix.durable < end:
            ix.durable = end
            for uid in t.subscriptions:
                sig = self.signals.get(uid)
                if sig is not None:
                    sig.notify()

    def ack(self, s: SubscriptionState, nums: list[int]) -> None:
        """Acknowledge message numbers (logged; durable with the next group commit — callers that answer a
        client wait for it)."""
        if nums:
            self.commit(R.Ack(s.uid, nums))
            self.ack_latency.acked(s.uid, nums, self.clock.now())

    # --- delivery --------------------------------------------------------------------------------
    def deliver(self, s: SubscriptionState, max_messages: int, max_bytes: int, owner, deadline_s: float) -> list[bytes]:
        """Lock up to `max_messages` messages; return each as an encoded `received_messages` entry (field 1 of
        PullResponse and StreamingPullResponse alike)."""
        now = self.clock.now()
        picks = s.take(max_messages, now)
        if not picks:
            return []
        out: list[bytes] = []
        sizes: list[int] = []
        if picks.out:
            show_attempt = bool(s.config.dead_letter_policy.dead_letter_topic)
            out, sizes = self.reader.received(s.topic, picks.out, s.uid, show_attempt, max_bytes, s.overrides)
            if len(out) < len(picks.out):  # the rest did not fit: given back before anything is leased
                s.untake(picks, len(out))
        self.commit(picks.record(s.uid, now + deadline_s), owner)
        if out:
            self.ack_latency.delivered(s.uid, picks.out[0][0], now)
        if owner is not None and out:  # nothing ran since the commit: every leased message is the stream's
            if picks.fresh:
                owner.hold(map(itemgetter(0), picks.out), sizes)
            else:  # an ordered batch resent whole may hold acked members: those have no lease to release
                held = [(n, size) for (n, _), size in zip(picks.out, sizes) if s.leases.get(n, (0, 0, None))[2] is owner]
                owner.hold([n for n, _ in held], [size for _, size in held])
        return out

    def lease(self, s: SubscriptionState, max_messages: int, deadline_s: float, owner=None, per_key_max: int = 0):
        """Lock up to `max_messages` messages for `owner` (a push worker); messages past their delivery attempts
        go to the dead-letter topic instead. [(num, version)]"""
        now = self.clock.now()
        picks = s.take(max_messages, now, per_key_max)
        if not picks:
            return []
        self.commit(picks.record(s.uid, now + deadline_s), owner)
        if picks.out:
            self.ack_latency.delivered(s.uid, picks.out[0][0], now)
        return picks.out

    def read(self, s: SubscriptionState, nums: list[int]) -> list[tuple[bytes, bytes]]:
        """(stored message bytes, message id/publish time tail) as this subscription delivers them: a message
        updated in place through the queue extensions reads as updated."""
        return self.reader.messages(s.topic, nums, s.overrides)

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
            commands.check_topic_exists(self.state, dlt)
            for key, request, count in commands.dead_letter_batches(s, nums, self.reader.messages(s.topic, nums)):
                await self.publish(dlt, request, count, key)
        except PigeonError as e:
            log.warning("dead-lettering %d messages of %s to %s failed: %s", len(nums), s.name, dlt, e.message)
            return
        if self.state.subs_by_uid.get(s.uid) is s:  # not deleted while the publish waited
            self.ack(s, nums)
            await self.durable(log_id=s.log_id)

    async def pull(self, name: str, max_messages: int, return_immediately: bool,
                   time_left_s: float | None = None) -> list[bytes]:
        """Messages to hand out, waiting for some while there are none: until shortly before the caller's
        deadline (`time_left_s`), at most limits.pull_wait_s_max. With nothing by then the answer is an empty
        list, which the caller sees as "no messages" rather than DEADLINE_EXCEEDED."""
        if max_messages <= 0:
            raise InvalidArgument("max_messages must be greater than 0.")
        s = self.live_sub(name)
        s.last_activity = self.clock.now()
        max_messages = min(max_messages, limits.pull_messages_max)
        wait = limits.pull_wait_s_max
        if time_left_s is not None:
            wait = min(wait, time_left_s - limits.pull_answer_before_deadline_s)
        give_up = time.monotonic() + wait
        while True:
            out = self.deliver(s, max_messages, limits.response_bytes_max, None, s.ack_deadline_s)
            if out:
                self._pass_on(s)
                await self.recorded(s.log_id)
                return out
            left = give_up - time.monotonic()
            if return_immediately or left <= 0:
                return out
            await self._wait(s, left)
            s = self.live_sub(name)

    async def _wait(self, s: SubscriptionState, cap: float, stream: Stream | None = None) -> None:
        """Wait for `s`'s messages (or `stream`'s own events), at most `cap` seconds; the subscription's
        timer wakes one waiter when something becomes ready by itself."""
        sig = self.signal(s.uid)
        self._arm(s, sig)
        await sig.wait(cap, stream)

    def _arm(self, s: SubscriptionState, sig: Signal) -> None:
        """Keep `sig`'s timer at the earliest time something of `s` becomes ready by itself."""
        d = s.next_deadline()
        if d is not None:
            sig.wake_at(asyncio.get_running_loop().time() + max(0.001, d - self.clock.now()))

    def _pass_on(self, s: SubscriptionState) -> None:
        """A waiter took messages: if more are ready, wake the next one (the chain that replaces waking all)."""
        if s.has_ready(self.clock.now()):
            sig = self.signals.get(s.uid)
            if sig is not None:
                sig.notify()

    def open_stream(self, name: str, client_id: str, deadline_s: int, max_messages: int, max_bytes: int) -> Stream:
        s = self.live_sub(name)
        commands.check_stream(deadline_s)
        self.admission.open_stream()
        stream = Stream(s, client_id, deadline_s, max_messages, max_bytes)
        self.streams.add(stream)
        return stream

    async def stream_next(self, stream: Stream) -> list[bytes] | None:
        """Wait until the stream may take messages and some are ready, or it has something in its outbox;
        return the messages (possibly none), or None once the client has half-closed."""
        s = stream.sub
        while True:
            self.check_open()
            if stream.error is not None or stream.ended:
                self._pass_on(s)  # it may have been the waiter woken for messages: the next one takes them
                if stream.error is not None:
                    raise stream.error
                return None
            if stream.outbox:
                return []
            if self.state.subs_by_uid.get(s.uid) is not s:
                raise NotFound(f"Resource not found (resource={s.name.split('/')[-1]}).")
            if s.detached:
                raise FailedPrecondition(f"The subscription {s.name} is detached.")
            s.last_activity = self.clock.now()  # an open stream keeps the subscription alive
            room = stream.room()
            if room > 0:
                out = self.deliver(
                    s,
                    min(room, limits.stream_response_messages_max),
                    max(1, min(stream.max_bytes - stream.held_bytes, self.admission.share())),
                    stream,
                    stream.deadline_s,
                )
                if out:
                    self._pass_on(s)
                    await self.recorded(s.log_id)
                    return out
                await self._wait(s, limits.stream_idle_wake_s, stream)
                if hops.ON:
                    hops.mark("woken")
            else:  # flow control: only this stream's acks (or its own events) can change that
                await stream.wait(limits.stream_idle_wake_s)

    def close_stream(self, stream: Stream) -> None:
        """Messages it still holds stay leased until their deadline (the client may still ack them)."""
        stream.sub.disown(stream, list(stream.held))
        stream.held.clear()
        if stream in self.streams:
            self.streams.discard(stream)
            self.admission.close_stream()

    def note_stalled_streams(self) -> int:
        """Log (once each) the streams whose client has left a response untaken past the stall limit: they hold
        that response until the client reads or goes (the server's keepalive closes a connection whose peer
        vanished; a live client that does not read keeps it). Their leases run out as any other's, so the
        messages go to other subscribers. Returns how many were found this time."""
        now = self.clock.now()
        stalled = [st for st in self.streams if st.sending_since is not None and not st.stall_noted
                   and now - st.sending_since > self.admission.stall_s]
        for st in stalled:
            st.stall_noted = True
            log.warning("a StreamingPull client of %s (client id %r) has left a response of %d bytes untaken for "
                        "%.1f s; its stream holds it until the client reads or disconnects",
                        st.sub.name, st.client_id, st.sending_bytes, now - st.sending_since)
        self.admission.stalled += len(stalled)
        return len(stalled)

    def subscription_statistics(self, chunk: int = 2000):
        """Every subscription's statistics, `chunk` at a time (a generator: the metrics endpoint spreads the pass
        over turns of the event loop when there are many)."""
        subs = list(self.state.subs_by_uid.values())
        for i in range(0, len(subs), chunk):
            now = self.clock.now()
            yield [s.statistics(now) for s in subs[i:i + chunk] if s.uid in self.state.subs_by_uid]

    def statistics(self, subscriptions: bool = True) -> "NodeStats":
        """Plain values of every part, for the metrics endpoint (nothing reaches inside for them); without
        `subscriptions`, none of theirs (see subscription_statistics)."""
        now = self.clock.now()
        self.ack_latency.prune(self.state.subs_by_uid)
        self.hot_keys.prune(self.state.topics)
        return NodeStats(self.journal.statistics(), self.reader.statistics(),
                         tuple(s.statistics(now) for s in self.state.subs_by_uid.values()) if subscriptions else (),
                         tuple(st.statistics() for st in self.streams), len(self.state.topics),
                         self.admission.statistics(),
                         tuple((t.name, t.publish_requests, t.published, t.published_bytes)
                               for t in self.state.topics.values()),
                         self.publish_latency.snapshot(), self.ack_latency.histogram.snapshot(),
                         tuple(self.hot_keys.hottest(limits.hot_keys_exported)))

    def ack_nowait(self, s: SubscriptionState, ack_ids) -> dict[str, str]:
        """Apply acks (logged, not yet durable). Returns exactly-once failures {ack_id: code}: with
        exactly-once delivery an ack id is valid only for the current, unexpired delivery."""
        now = self.clock.now()
        s.last_activity = now
        nums, failures = commands.acks(s, ack_ids, now)
        self.ack(s, nums)
        return failures

    async def acknowledge(self, name: str, ack_ids) -> None:
        s = self.live_sub(name)
        if not ack_ids:
            raise InvalidArgument("ack_ids must not be empty.")
        failures = self.ack_nowait(s, ack_ids)
        await self.durable(log_id=s.log_id)  # also covers an equal ack still in flight
        if failures:
            raise AckIdFailure(failures)

    async def modify_ack_deadline(self, name: str, ack_ids, seconds: int) -> None:
        """Answered once durable, as an ack is: a nack or an extension the client was told of survives a crash
        (delivery counts and lease deadlines after a restart are what the client saw)."""
        s = self.live_sub(name)
        failures = self.modify_deadlines(s, ack_ids, [seconds] * len(ack_ids))
        await self.durable(log_id=s.log_id)
        if failures:
            raise AckIdFailure(failures)

    def modify_deadlines(self, s: SubscriptionState, ack_ids, seconds) -> dict[str, str]:
        """Extend or release (0) leases. Returns exactly-once failures {ack_id: code}."""
        now = self.clock.now()
        s.last_activity = now
        recs, failures = commands.modacks(s, ack_ids, seconds, now)
        for rec in recs:
            self.commit(rec)
        return failures

    def stream_acks(self, stream: Stream, ack_ids) -> tuple[asyncio.Future | None, dict[str, str]]:
        """Acks sent on a stream: (durability future with exactly-once delivery — the confirmation waits for
        it —, else None: the acks ride along with the next group commit; exactly-once failures)."""
        failures = self.ack_nowait(stream.sub, ack_ids)
        if not stream.sub.config.enable_exactly_once_delivery:
            return None, failures
        if self.replicas is not None:
            return asyncio.ensure_future(self.durable(log_id=stream.sub.log_id)), failures
        return self.journal.wait_durable(self.journal.tail), failures

    # --- snapshots and seek ----------------------------------------------------------------------
    async def create_snapshot(self, name: str, sub_name: str, labels: dict):
        self.check_open()
        name, rec = commands.create_snapshot(self.state, name, sub_name, labels, self.clock.now(),
                                             f"snap-{uuid.uuid4().hex}")
        await self.change(rec)
        return self.state.snapshots[name].config

    def get_snapshot(self, name: str):
        return self.state.snapshot(name).config

    def list_snapshots(self, project: str, page_size: int, token: str):
        return commands.page(commands.in_project(self.state.snapshots, project, "snapshots"), page_size, token)

    async def update_snapshot(self, snap, mask):
        self.check_open()
        await self.change(commands.update_snapshot(self.state, snap, mask, self.clock.now()))
        return self.state.snapshots[snap.name].config

    async def delete_snapshot(self, name: str) -> None:
        await self.change(commands.delete_snapshot(self.state, name))

    async def seek(self, sub_name: str, time_ms: int | None, snapshot: str | None) -> None:
        self.check_open()
        await self.change(commands.seek(self.state, sub_name, time_ms, snapshot))

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
