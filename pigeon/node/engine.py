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
from typing import Callable

from pigeon.broker import commands, images, shard_split
from pigeon.broker import state as bs
from pigeon.broker.state import BrokerState
from pigeon.broker.subscription import SubscriptionState, SubscriptionStats
from pigeon.core import limits
from pigeon.core.errors import Unavailable
from pigeon.node import hops, maintenance, push, recovery
from pigeon.node.admission import Admission, AdmissionStats
from pigeon.node.delivery import Delivery
from pigeon.node.executor import append_step, commit
from pigeon.node.logs import NodeLogs
from pigeon.node.host import OsHost
from pigeon.node.iam_ops import IamOps
from pigeon.node.push import PushManager
from pigeon.node.queue_ops import QueueOps
from pigeon.node.reader import MessageReader, ReaderStats
from pigeon.node.samples import AckLatency, HotKeys
from pigeon.node.schema_service import SchemaService
from pigeon.node.streams import Signal, Stream, StreamStats, WallClock
from pigeon.node.transforms import Transforms
from pigeon.node.journal_writer import WriterStats
from pigeon.ops.config import Config
from pigeon.storage import formats
from pigeon.core.bundles import META_LOG, bundle_log, log_address
from pigeon.core.histogram import Histogram, HistogramStats
from pigeon.storage import records as R

log = logging.getLogger("pigeon.engine")

SHUTTING_DOWN = "The server is shutting down; retry on another connection."
_HANDOVER = frozenset((R.RecordType.SHARD_OUT, R.RecordType.SHARD_IN, R.RecordType.SHARD_HOME))


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
    def __init__(self, config: Config, clock=None, host=None, region=None):
        self.config = config
        self.region = region  # its region in a deployment of regions (core.regions; node.regions found it)
        self.clock = clock or WallClock()
        self.host = host or OsHost()
        self.state = BrokerState()
        self.state.region = region
        self.publish_latency = Histogram()
        self.ack_latency = AckLatency()  # sampled, from delivery to ack
        self.hot_keys = HotKeys()  # the ordering keys published most, per topic
        self.journal = self.host.journal(os.path.join(config.data_dir, "wal"), config.fsync, config.segment_bytes)
        self.logs = NodeLogs(self.journal)  # what commit appends to (in a cluster: replicated)
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
        self._publish_at_owner = None  # a cluster node's way to publish to a topic another node owns
        self.owns = lambda log_id: True  # whether this node owns a log (a cluster node owns some bundles)
        self._writes = None  # a cluster node's `owns`, which every record it commits is checked against (a single
        # node owns every log: nothing to check on its hot path)
        # where the journal must be kept from whatever the checkpoints allow (a cluster node's ledger store
        # borrows its own copies from it: node.ledger_store); None: no such bound
        self.journal_floor: Callable[[], int | None] = (lambda: 0) if config.etcd else (lambda: None)
        self.report: recovery.Report | None = None
        self._fenced: set[int] = set()  # logs fenced at self.epoch
        self.checkpoints = maintenance.Checkpoints(os.path.join(config.data_dir, "checkpoints"))
        self._maintenance: asyncio.Task | None = None
        self.delivery = Delivery(self)
        self.push = PushManager(self)
        self.schemas = SchemaService(self)
        self.queue = QueueOps(self)
        self.iam = IamOps(self)
        self.transforms = Transforms()  # message_transforms' JavaScript (one V8 isolate, made when first needed)

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        disk = self.journal.disk
        disk.makedirs(self.config.data_dir)
        self._dir_lock = self.host.lock_data_dir(self.config.data_dir)
        formats.check_data_dir(disk, self.config.data_dir)  # (before anything is written: recovery checks it too)
        disk.makedirs(self.checkpoints.dir)
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        self.state, found = await loop.run_in_executor(None, lambda: recovery.recover(
            self.config.data_dir, repair=True, disk=disk, region=self.region))
        self.report = found.report
        recovery.report(self.report)
        formats.mark_data_dir(disk, self.config.data_dir)  # (recovery refused a newer one)
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
        self.refuse_calls()
        await self.push.stop()
        if self._maintenance:
            self._maintenance.cancel()
        try:
            await self.checkpoint()
        except Exception:  # the WAL still holds everything; a checkpoint only speeds up the next start
            log.exception("final checkpoint failed")
        await self.journal.close()
        self.transforms.close()
        if self._dir_lock is not None:
            self._dir_lock.close()
            self._dir_lock = None

    def signal(self, sub_uid: int) -> Signal:
        sig = self.signals.get(sub_uid)
        if sig is None:
            sig = self.signals[sub_uid] = Signal()
        return sig

    def join_cluster(self, meta_log, owns: Callable[[int], bool], replicas) -> None:
        """Serve as a cluster node from now on (node.cluster_node, once joined): metadata changes go through
        `meta_log`, the data logs this node `owns` are replicated by `replicas` (node.bundle_logs)."""
        self.meta_log, self.owns, self._writes = meta_log, owns, owns
        self.logs.replicate_with(replicas)
        self.reader.fetcher = replicas.reads.fetch  # batches named by log addresses are read from their ledgers

    def publish_through(self, publish_at_owner: Callable) -> None:
        """Publishes of this node's own (dead letters) to a topic another cluster node owns go through
        `await publish_at_owner(topic, request)` (api.router: a forwarded Publish)."""
        self._publish_at_owner = publish_at_owner

    async def publish_anywhere(self, topic_name: str, request: bytes, count: int, ordering_key: str) -> None:
        """A publish of this node's own: stored here when the topic's bundle is this node's, else sent to its
        owner (Unavailable when neither can be done now)."""
        t = self.state.topics.get(topic_name)
        if t is not None and t.spread:
            mine = t.publishable(self.owned_shards(t))
            here = bool(mine) and (not ordering_key or t.shard_for(ordering_key) in mine)
        else:
            here = self.owns(bundle_log(topic_name, self.config.bundles))
        if here:
            await self.publish(topic_name, request, count, ordering_key)
        elif self._publish_at_owner is not None:
            await self._publish_at_owner(topic_name, request)
        else:
            raise Unavailable("The topic's bundle is another node's; retry.")

    def leave_cluster(self) -> None:
        """Metadata changes are refused from now on (the node is leaving its cluster)."""
        self.meta_log = None

    def borrowed_from(self, journal_floor: Callable[[], int | None]) -> None:
        """The journal must be kept from `journal_floor()` on (a cluster node's ledger store borrows its own copies
        of ledger entries from it: node.ledger_store)."""
        self.journal_floor = journal_floor

    def refuse_calls(self) -> None:
        """Shutting down: every call from now on is refused (UNAVAILABLE), every waiter looks again and leaves."""
        self.closing = True
        for sig in self.signals.values():
            sig.notify_all()

    def check_open(self) -> None:
        if self.closing:
            raise Unavailable(SHUTTING_DOWN)

    # --- the one way state changes -----------------------------------------------------------------
    def commit(self, rec: R.Record, owner=None) -> int:
        """Append `rec` to its log and apply it (validated before: applying must not fail), then perform its
        effects. Returns the journal position after it: durable once the journal's durable position reaches it."""
        if rec.META and rec.TYPE == R.RecordType.TOPIC_PUT and rec.spread:  # (a record format 1 has not)
            formats.raise_data_dir(self.journal.disk, self.config.data_dir, formats.DATA_SPREAD)
        elif rec.TYPE in _HANDOVER:  # (records formats 1 and 2 have not)
            formats.raise_data_dir(self.journal.disk, self.config.data_dir, formats.DATA_HANDOVER)
        steps = commit(self.state, self.logs, self.epoch, self._fenced, self.config.bundles, rec, owner, self._writes)
        for _, _, _, effects in steps:  # (performed once every part of a record cut by shard is applied)
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
                self.delivery.forward_dead_letters(self.state.subs_by_uid[uid])
            elif kind == bs.DEADLINE:
                sig = self.signals.get(uid)
                if sig is not None:
                    self.delivery.arm(self.state.subs_by_uid[uid], sig)

    async def durable(self, end: int | None = None, log_id: int | None = None) -> None:
        """Until everything committed so far (or up to journal position `end`) is durable — in a cluster, what was
        committed to `log_id` once Qa members of its ensemble hold it, whether or not the owner's journal does yet
        (Unavailable when the log moved meanwhile; the reader waits for the journal itself where it reads there)."""
        await self.logs.durable(end, log_id)

    async def change(self, *recs: R.Record) -> None:
        """Commit administrative records and answer once they are durable; one log line per change."""
        self.check_open()
        said = [d for d in map(self.state.describe, recs) if d]
        if self.meta_log is not None and any(rec.META for rec in recs):
            await self.meta_log.commit(recs)  # validated against this state: no await may come before
        else:
            logs = set()
            for rec in recs:
                logs.update(self.state.log_of(part, self.config.bundles) for part in self.state.split(rec))
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
        await self.transforms.check(topic.message_transforms)
        region = self.region  # (a topic has its shards in every region's slot: core.regions)
        shards = self.config.shards_per_topic * (region.slots if region is not None else 1)
        rec = commands.create_topic(self.state, topic, shards, await self._spreads())
        await self.change(rec)
        return self.state.topics_by_uid[rec.uid].config

    async def _spreads(self) -> bool:
        """As configured, once every node of the cluster reads spread topics (until then: together)."""
        if self.config.topic_layout != "spread":
            return False
        replicas = self.logs.replicas
        if replicas is not None and (speaks := await replicas.speaks()) < formats.CLUSTER_SPREAD:
            log.warning("a new topic is laid out together, not spread: a node of the cluster speaks format %d, "
                        "older than spread topics (every node must run this release first)", speaks)
            return False
        return True

    def get_topic(self, name: str):
        return self.state.topic(name).config

    async def update_topic(self, topic, mask):
        self.check_open()
        merged = commands.merged_topic(self.state, topic, mask)
        await self.schemas.check_topic_settings(merged)
        await self.transforms.check(merged.message_transforms)
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
    async def create_subscription(self, sub, start: list[int] | None = None):
        """`start`: where it begins in each shard (a spread topic's ends, gathered from their owners: api.router);
        the topic's ends here by default."""
        self.check_open()
        await self.transforms.check(sub.message_transforms)
        rec = commands.create_subscription(self.state, sub, f"sub-{uuid.uuid4().hex}", start)
        await self.change(rec)
        created = self.state.subs_by_uid[rec.uid]
        created.last_activity = self.clock.now()
        return commands.subscription_view(created)

    subscription_view = staticmethod(commands.subscription_view)

    def get_subscription(self, name: str):
        return commands.subscription_view(self.state.sub(name))

    async def update_subscription(self, sub, mask):
        self.check_open()
        if "message_transforms" in mask.paths:
            await self.transforms.check(sub.message_transforms)
        rec = commands.update_subscription(self.state, sub, mask)
        await self.change(rec)
        return commands.subscription_view(self.state.subs_by_uid[rec.uid])

    async def delete_subscription(self, name: str) -> None:
        await self.change(commands.delete_subscription(self.state, name))

    async def detach_subscription(self, name: str) -> None:
        """Stop delivery for good: the backlog is dropped, later pulls fail with FAILED_PRECONDITION. Of a spread
        topic, this node drops the backlog of the shards it owns (api.spread asks each owner), and marks the
        subscription detached unless it already is."""
        self.check_open()
        s = self.state.sub(name)
        if s.topic is None or not s.topic.spread:
            await self.change(*commands.detach_subscription(self.state, name))
            return
        if self.meta_log is not None:
            await self.meta_log.catch_up()  # (detached by the node that took the call, a moment ago)
            s = self.state.sub(name)
        recs = commands.detach_subscription(self.state, name)
        await self.change(*([] if s.detached else recs[:1]), *self.own_part(recs[1]))

    def list_subscriptions(self, project: str, page_size: int, token: str):
        return commands.page(commands.in_project(self.state.subs, project, "subscriptions"), page_size, token)

    def live_sub(self, name: str) -> SubscriptionState:
        """A subscription this node serves: of a spread topic, the shards it owns of it (at least one)."""
        self.check_open()
        s = commands.live_sub(self.state, name)
        if s.topic is not None and s.topic.spread:
            if not self.owned_shards(s.topic):
                raise Unavailable("No shard of the subscription's topic is this node's now; retry.")
        elif not self.owns(self.state.log_of_sub(name, self.config.bundles)):
            raise Unavailable("The subscription's bundle moved to another node; retry.")
        return s

    def owned_shards(self, t) -> list[int]:
        """The shards of topic `t` whose logs this node owns (every one on a single node), but one being handed
        to another log (refused here until it is homed there)."""
        return [k for k, log in enumerate(self.state.shard_logs(t, self.config.bundles))
                if self.owns(log) and k not in t.away]

    # --- a cluster node's bundles ----------------------------------------------------------------
    async def load_log(self, log_id: int, entries, first: int) -> None:
        """Take a bundle over (node.bundle_logs): its state starts over as created — or as the Snapshot record the
        log starts with says, when it was cut (message indexes included) — and the log's entries from offset
        `first` on, read back from its ledgers ((type, body) in log order), are applied again, each publish batch
        named by its log address (core.bundles): its bytes stay in the ledgers, read when delivered (node.reader).
        Later snapshots are skipped: they describe the state the entries before them built. Nothing of the log is
        copied into this node's journal but the state it built — a Snapshot record of it, so a restart rebuilds
        the same — and the call returns once that is durable. Publishes of topics the metadata log deleted since
        are skipped."""
        bundles = self.config.bundles
        entries = iter(entries)
        head = next(entries, None)
        if head is not None and head[0] == R.RecordType.SNAPSHOT:  # the log was cut: it starts with its state
            effects = self.state.apply(R.decode(*head))
            offset = first + 1
        else:
            effects = self.state.apply(R.Reset(log_id, bundles))
            entries = itertools.chain([head] if head is not None else [], entries)
            offset = first
        apply, topics = self.state.apply_in_log, self.state.topics_by_uid
        for rtype, body in entries:
            if rtype != R.RecordType.SNAPSHOT:  # (the state a later one describes is the one these entries built)
                rec = R.decode(rtype, body)
                if rtype != R.RecordType.PUBLISH or rec.topic in topics:  # (else its topic was deleted since)
                    apply(rec, log_id, bundles, log_address(log_id, offset))
            offset += 1
        self.state.confirm_landings(log_id)  # (what homes a pair in the log now was read from its ledgers)
        if effects:
            self._perform(effects)
        append_step(self.state, self.logs, self.epoch, self._fenced, bundles,  # this node's journal only (not the
                    images.bundle_snapshot(self.state, log_id, bundles))  # log's): a restart rebuilds the same
        await self.journal.wait_durable(self.journal.tail)
        self.state.resume_log(log_id, bundles, self.clock.now())
        for t in self.state.topics_by_uid.values():
            for uid in t.subscriptions:
                sig = self.signals.get(uid)
                if sig is not None:
                    sig.notify_all()

    def log_moved(self, log_id: int) -> None:
        """A bundle is no longer this node's: its streams end with UNAVAILABLE (one another node forwarded here is
        replaced there, a client's goes on through the new owner: api.merge); their leases are the new owner's."""
        gone = Unavailable("The subscription's bundle moved to another node; reconnect.")
        for st in self.streams:
            if st.sub.topic is not None and log_id in self.state.shard_logs(st.sub.topic, self.config.bundles):
                st.error = gone
                st.wake()
        self.logs.moved(log_id)

    def shard_moved(self, t) -> None:
        """A shard of topic `t` was handed from this node's log to another's (node.handover): the topic's streams
        here end with UNAVAILABLE: a stream another node forwarded here is replaced there by one to the shard's new
        owner, and a client's stream goes on through every shard's owner (api.merge.follow)."""
        gone = Unavailable("A shard of the topic moved to another node; reconnect.")
        for st in self.streams:
            if st.sub.topic is t:
                st.error = gone
                st.wake()

    def forget_log(self, log_id: int) -> None:
        """A bundle given up, its records in flight answered: its data state goes (the new owner has it), so
        this node neither holds it in memory nor keeps journal segments for its message indexes — a Reset in
        this node's journal says so after a restart too (the log's ledgers never see it). Its metadata stays."""
        bundles = self.config.bundles
        rec = R.Reset(log_id, bundles)
        append_step(self.state, self.logs, self.epoch, self._fenced, bundles, rec)
        effects = self.state.apply(rec)
        # the subscriptions go on dispatching what they still hold: a spread topic's other shards (whose logs
        # are applied: one being taken over has every entry applied before it waits for its snapshot's sync)
        self.state.resume_log(log_id, bundles, self.clock.now())
        if effects:
            self._perform(effects)

    def forget_logs_not_owned(self) -> None:
        """`forget_log` every bundle log this node's state holds data of and does not own — on joining, all of
        them: what its journal held of the bundles it owned in an earlier life is their new owners' now (it would
        sit in memory and keep journal segments until this node took each one over again)."""
        shard_logs = self.state.shard_logs
        for log_id in sorted({log for t in self.state.topics.values()
                              for log, ix in zip(shard_logs(t, self.config.bundles), t.shards) if len(ix.pos)}):
            if not self.owns(log_id):
                self.forget_log(log_id)

    # --- publish ---------------------------------------------------------------------------------
    async def publish(self, topic_name: str, request: bytes, count: int, ordering_key: str,
                      idem_keys: list[str] | None = None, sched: list[tuple[str, str]] | None = None,
                      transformed: bool = False, shard: int | None = None, answered=None) -> list[str]:
        """Store one PublishRequest (validated by commands.check_publish: these are its fields) whole; return the
        message ids once durable. `idem_keys`: the messages' idempotency keys ("" for none); repeats inside the
        window are not stored again and get the original message id. `sched`: the messages' (activate-at, delay)
        attributes, when some message carries one: the batch then waits in the topic's activation index.
        A topic with message transforms has them run first (node.transforms), then comes back `transformed`.
        `answered(callback)`: registers `callback()` for when the caller has its answer; the batch is handed out
        only then (node.delivery.show_when_durable)."""
        self.check_open()
        t = self.state.topic(topic_name)
        if t.config.message_transforms and not transformed:  # the one check a publish without them pays
            return await self.transforms.publish(self, t, request, ordering_key)
        self.journal.check_publish()  # a full disk refuses publishes, keeps room for deliveries and acks
        check = (lambda req: self.schemas.check_publish(t.config, req)) if t.config.schema_settings.schema else None
        among = None
        if t.spread:  # a keyless batch goes to a shard this node owns, not a copy (`shard`, when the router chose it
            among = t.publishable(self.owned_shards(t))  # for its idempotency keys); a keyed one to its key's
            if shard is not None:
                among = [shard] if shard in among else []
            if not among or (ordering_key and t.shard_for(ordering_key) not in among):
                raise Unavailable("The topic's shard for this publish is another node's now; retry.")
        plan = commands.publish_batch(t, commands.PublishCommand(topic_name, request, count, ordering_key, idem_keys,
                                                                 sched),
                                      int(self.clock.now() * 1000), self.config.idempotency_window_s, check, among)
        rec = plan.record
        if rec is None:
            await self.durable(log_id=t.log_id)  # the originals may still be on their way to disk (and members)
            return commands.publish_answer(t, plan)
        t0 = time.perf_counter()
        with self.admission.publishing(len(rec.request)):
            end = self.commit(rec)
            if hops.ON:
                hops.mark("committed")
            log_id = self.delivery.show_when_durable(t, rec, end, answered)
            await self.durable(end, log_id)
            if hops.ON:
                hops.mark("resumed")
        self.publish_latency.observe(time.perf_counter() - t0)
        t.publish_requests += 1
        t.published += rec.count
        t.published_bytes += len(rec.request)
        if ordering_key:
            self.hot_keys.published(t.name, ordering_key, rec.count)
        return commands.publish_answer(t, plan)

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

    # --- snapshots and seek ----------------------------------------------------------------------
    async def create_snapshot(self, name: str, sub_name: str, labels: dict,
                              state: tuple[list[int], list[list[int]]] | None = None):
        """`state`: the subscription's (floors, acked) by shard as their owners hold them (a spread topic's,
        gathered by api.spread); this node's view by default."""
        self.check_open()
        name, rec = commands.create_snapshot(self.state, name, sub_name, labels, self.clock.now(),
                                             f"snap-{uuid.uuid4().hex}", state)
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
        """Seek the shards this node owns: all of them, but a spread topic's in a cluster (api.spread asks each
        owner for its own)."""
        self.check_open()
        await self.change(*self.own_part(commands.seek(self.state, sub_name, time_ms, snapshot)))

    def own_part(self, rec: R.Record) -> list[R.Record]:
        """A record of a subscription as this node commits it: whole — but of a spread topic, the parts of the
        shards this node owns but held copies (each owner commits its own: api.spread asks them all); Unavailable
        when it owns none now."""
        s = self.state.subs_by_uid.get(rec.sub)
        if s is None or s.topic is None or not s.topic.spread:
            return [rec]
        held = s.topic.held  # (copies of shards their region serves: only their copier changes them, node.copies)
        parts = [p for p in self.state.split(rec) if self.owns(self.state.log_of(p, self.config.bundles))
                 and not (held and shard_split.shards_of(p)[0] in held)]
        if not parts:
            raise Unavailable("No shard of the subscription's topic is this node's now; retry.")
        return parts

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
