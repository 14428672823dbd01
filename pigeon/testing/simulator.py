"""The deterministic simulator: one seed drives the whole broker — commands, records, the state machine, the
journal and recovery, the same code the node runs — over a simulated disk and clock through a random workload
(publish with ordering keys, attributes, delays and idempotency keys; pull with partial responses; ack, nack,
modack; seek to a time or a snapshot; dead-letter policies; filters; streams dropped mid-delivery; checkpoints
and segment deletion) with faults injected between steps: a crash (the unsynced tail is lost, sometimes torn), a
bit flipped in a closed segment, clock jumps, a disk that fills up (publishes refused at the reserve, writes
that meet ENOSPC cut back and kept, checkpoints skipped) and frees again. After every step it checks:

  * no publish acknowledged as durable is lost, and every stored message reads back as published;
  * no ack acknowledged as durable is undone (but by a seek: one a crash cut keeps the shards' parts it wrote);
  * per ordering key, a message goes out only after every earlier one of its key is acked (or in its batch);
  * delivery counts never pass a dead-letter policy's maximum; one taken out for dead-lettering has reached it;
  * after a crash, the recovered state is what replaying the surviving log gives (recovery equals the live
    path), and the log reaches at least as far as it was durable;
  * at the end: once every lease and backoff ran out, everything unacked and not parked is delivered; and the
    shards of every log read the same when their logs are applied alone, or loaded from a snapshot beside
    another log's, or handed over to another log mid-way (testing.shard_check: half the topics are spread).

A failure raises SimFailure naming the seed; `python -m pigeon.testing.simulator --seed N` replays it (`make sim`)."""

from __future__ import annotations

import argparse
import errno
import posixpath
import random
import sys
import time

from google.pubsub_v1 import types

from pigeon.broker import commands
from pigeon.broker.state import BrokerState
from pigeon.core import ackid, limits
from pigeon.core.errors import PigeonError
from pigeon.node.executor import commit
from pigeon.node.maintenance import Checkpoints, checkpoint_records
from pigeon.node.reader import MessageReader
from pigeon.node.recovery import BrokerTarget, type_name
from pigeon.storage import checkpoint as ck
from pigeon.storage import recovery as storage_recovery
from pigeon.storage import records as R
from pigeon.storage.space import SpaceWatch
from pigeon.testing.clock import SimClock
from pigeon.testing.sync_journal import SyncJournal
from pigeon.testing.sim_oracle import Msg, Oracle, Stream, summary
from pigeon.testing.simdisk import SimDisk
from pigeon.testing import shard_check

P = "projects/sim"
KEYS = ["k1", "k2", "k3"]
COLORS = ["red", "blue"]
BUNDLES = 3
_Topic, _Sub = types.Topic.pb(), types.Subscription.pb()
_PublishRequest, _PubsubMessage = types.PublishRequest.pb(), types.PubsubMessage.pb()


class SimFailure(AssertionError):
    pass


class Simulator:
    def __init__(self, seed: int, steps: int = 150, faults: bool = True):
        self.seed, self.steps, self.faults = seed, steps, faults
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.disk = SimDisk()
        self.sj = SyncJournal(self.disk, "/data", segment_bytes=8 * 1024, new_target=BrokerTarget,
                              type_name=type_name)
        self.state: BrokerState = self.sj.recovered.target.state
        self.state.rebuild(self.clock.now())
        self.reader = MessageReader(self.sj, 1 << 20)
        self.space = SpaceWatch(self.disk, "/data/wal")
        self.refused = self.enospc = 0  # publishes refused for a full disk; commits that met ENOSPC
        self.epoch = 1
        self.fenced: set[int] = set()
        self.history: list[tuple[R.Record, int, int]] = []  # every record appended: (record, at, end)
        self.topic_count = 0
        self.orphaned: set[int] = set()  # subscriptions whose dead-letter topic was missing at some point
        self.checkpoints = Checkpoints("/data/checkpoints")  # the node's own bookkeeping (node.maintenance)
        self.oracle = Oracle()
        self.held: dict[int, dict[int, str]] = {}  # sub uid → {num: ack id} a client holds
        self.before_seek: dict[int, list[str]] = {}  # sub uid → ack ids a client held when it last sought
        self.seeks: list[tuple[int, int, int]] = []  # (start, end, sub uid) of the seeks since the last crash
        self.streams: list[Stream] = [Stream(), Stream()]
        self.idem_keys: list[str] = []
        self.step_no = 0
        self.log: list[str] = []

    # --- running -------------------------------------------------------------------------------------
    def run(self) -> "Simulator":
        ops = [(self.create_topic, 2), (self.create_sub, 2), (self.publish, 20), (self.take, 18), (self.ack, 14),
               (self.modack, 6), (self.advance, 8), (self.commit, 10), (self.write_unsynced, 3), (self.seek, 2),
               (self.snapshot, 1), (self.drop_stream, 2), (self.checkpoint, 2), (self.delete_topic, 1),
               (self.late_ack, 2)]
        if self.faults:
            ops += [(self.crash, 3), (self.flip_bit, 1), (self.clock_jump, 1), (self.unappliable, 1),
                    (self.fill_disk, 1), (self.free_disk, 2)]
        funcs, weights = zip(*ops)
        try:
            for self.step_no in range(self.steps):
                op = self.rng.choices(funcs, weights)[0]
                self.log.append(op.__name__)
                op()
                self.check_states()
            self.final_drain()
            history = [(rec, at) for rec, at, _ in self.history]
            for problem in (shard_check.check_history(history, BUNDLES)
                            + shard_check.check_handover(history, BUNDLES, random.Random(self.seed))):
                self.fail(f"shards are not independent (invariants T3; H1, S2 across hand-overs): {problem}")
        except SimFailure:
            raise
        except Exception as e:  # noqa: BLE001 — any crash of the code under test is a finding
            raise SimFailure(f"seed {self.seed}, step {self.step_no} ({' '.join(self.log[-8:])}): "
                             f"{type(e).__name__}: {e}") from e
        return self

    def fail(self, what: str) -> None:
        raise SimFailure(f"seed {self.seed}, step {self.step_no} ({' '.join(self.log[-8:])}): {what}")

    # --- the executor's one step (node.executor's, as the engine commits) -------------------------------
    def commit_record(self, rec: R.Record, owner=None) -> int:
        effects = []
        for part, at, end, done in commit(self.state, self.sj, self.epoch, self.fenced, BUNDLES, rec, owner):
            self.history.append((part, at, end))  # (a record cut by shard: a crash may keep some parts only)
            effects += done or ()
        self.orphaned.update(s.uid for s in self.state.subs.values() if s.max_attempts and not s.dead_letter_open)
        for kind, uid in effects or ():
            if kind == "dead_letters":
                self.forward_dead_letters(uid)
        return end

    # --- workload ------------------------------------------------------------------------------------
    def create_topic(self) -> None:
        if len(self.state.topics) >= 3:
            return
        self.topic_count += 1
        name = f"{P}/topics/topic{self.topic_count}"
        spread = self.rng.random() < 0.5  # each shard in a log of its own: records are cut by shard
        self.commit_record(commands.create_topic(self.state, _Topic(name=name), self.rng.randint(1, 3), spread))

    def delete_topic(self) -> None:
        """Its subscriptions keep their backlog; one whose dead-letter topic it was goes on delivering."""
        if len(self.state.topics) < 2:
            return
        t = self.state.topics[self.rng.choice(sorted(self.state.topics))]
        self.commit_record(commands.delete_topic(self.state, t.name))
        self.commit()  # the client is answered once the deletion is durable
        if t.uid not in self.state.topics_by_uid:  # no subscription kept it: its messages are gone for good
            o = self.oracle
            o.msgs = {k: m for k, m in o.msgs.items() if k[0] != t.uid}
            o.durable_msgs = {k for k in o.durable_msgs if k[0] != t.uid}

    def create_sub(self) -> None:
        if not self.state.topics or len(self.state.subs) >= 4:
            return
        r = self.rng
        topic = r.choice(sorted(self.state.topics))
        sub = _Sub(name=f"{P}/subscriptions/sub{len(self.state.subs_by_uid)}", topic=topic,
                   ack_deadline_seconds=r.choice([10, 30]), enable_message_ordering=r.random() < 0.4)
        if r.random() < 0.3:
            dlt = r.choice(sorted(self.state.topics))
            sub.dead_letter_policy.dead_letter_topic = dlt
            sub.dead_letter_policy.max_delivery_attempts = 5
        if r.random() < 0.2:
            sub.filter = 'attributes.color = "red"'
        if r.random() < 0.3:
            sub.retry_policy.minimum_backoff.seconds = r.choice([1, 5])
        rec = commands.create_subscription(self.state, sub, "unused")
        self.commit_record(rec)
        self.held[rec.uid] = {}
        self.oracle.durable_acks[rec.uid] = set()
        self.oracle.dead[rec.uid] = set()

    def publish(self) -> None:
        if not self.state.topics:
            return
        r = self.rng
        t = self.state.topics[r.choice(sorted(self.state.topics))]
        self.space.stale()  # as the node's journal writer: a publish is refused while the disk is at its reserve
        self.space.look(self.clock.now(), self.sj.journal.tail)
        try:
            self.space.check_publish(self.sj.journal.tail)
        except PigeonError:
            self.refused += 1
            return
        key = r.choice(KEYS) if r.random() < 0.5 else ""
        msgs = []
        for _ in range(r.randint(1, 4)):
            m = _PubsubMessage(data=b"%d-%d" % (self.seed, r.getrandbits(40)), ordering_key=key)
            m.attributes["color"] = r.choice(COLORS)
            if not key and r.random() < 0.1:  # (a keyed message cannot be scheduled: check_publish refuses it)
                m.attributes["pigeon-delay"] = f"{r.randint(1, 20)}s"
            if r.random() < 0.15:
                k = r.choice(self.idem_keys) if self.idem_keys and r.random() < 0.5 else f"idem-{r.getrandbits(20)}"
                self.idem_keys.append(k)
                m.attributes["pigeon-idempotency-key"] = k
            msgs.append(m)
        cmd = commands.check_publish(_PublishRequest(topic=t.name, messages=msgs).SerializeToString())
        plan = commands.publish_batch(t, cmd, int(self.clock.now() * 1000), limits.idempotency_window_s_default)
        if plan.record is None:
            return
        if plan.fresh is not None:
            msgs = [msgs[i] for i in plan.fresh]
        rec = plan.record
        end = self.commit_record(rec)
        for i, m in enumerate(msgs):
            num = ((rec.base + i) << limits.shard_bits) | rec.shard
            self.oracle.msgs[(t.uid, num)] = Msg(t.uid, num, m.data, "" if cmd.activations else key, end)

    def take(self) -> None:
        subs = [s for s in self.state.subs_by_uid.values() if not s.detached]
        if not subs:
            return
        r = self.rng
        s = r.choice(subs)
        now = self.clock.now()
        picks = s.take(r.randint(1, 12), now, 1 if r.random() < 0.1 else 0)
        if not picks:
            return
        if picks.out and r.random() < 0.2:  # the response was full: the rest goes back unleased
            s.untake(picks, r.randint(0, len(picks.out) - 1))
        self.check_order(s, picks.out)
        for num, version in picks.out:
            if s.max_attempts and s.dead_letter_open and version > s.max_attempts:
                self.fail(f"message {num} of {s.name} delivered a {version}th time, past the maximum {s.max_attempts}")
        for num, attempts in picks.dead:
            if attempts != s.max_attempts and not (attempts > s.max_attempts and s.uid in self.orphaned):
                self.fail(f"message {num} of {s.name} dead-lettered after {attempts} deliveries, not {s.max_attempts}")
        owner = r.choice([None, *self.streams])
        self.commit_record(picks.record(s.uid, now + s.ack_deadline_s), owner)
        if picks.out:
            stored = self.reader.messages(s.topic, [n for n, _ in picks.out], s.overrides)
            for (num, version), (body, _) in zip(picks.out, stored):
                want = self.oracle.msgs.get((s.topic.uid, num))
                if want is not None and _PubsubMessage.FromString(body).data != want.data:
                    self.fail(f"message {num} of {s.topic.name} reads back different from what was published")
                self.held[s.uid][num] = ackid.make(s.uid, num, version, s.generation_of(num))
        self.oracle.dead[s.uid].update(n for n, _ in picks.dead)

    def check_order(self, s, out) -> None:
        """Per key, nothing goes out before every earlier message of its key is acked or went out before it in
        this batch (or was taken out for dead-lettering: the key moves on)."""
        if not s.ordered:
            return
        before: set[int] = set()
        for num, _ in out:
            m = self.oracle.msgs.get((s.topic.uid, num))
            if m is not None and m.key:
                for other in self.oracle.msgs.values():
                    if (other.topic == m.topic and other.key == m.key and other.num & 63 == num & 63
                            and other.num < num and other.num not in before and not s.is_acked(other.num)
                            and other.num not in self.oracle.dead[s.uid] and other.num not in s.parked):
                        self.fail(f"ordering key {m.key!r} of {s.name}: {num} went out before {other.num}")
            before.add(num)

    def _some_held(self):
        """A subscription with ack ids a client holds, and some of its held message numbers (or None)."""
        subs = [uid for uid, h in self.held.items() if h and uid in self.state.subs_by_uid]
        if not subs:
            return None
        uid = self.rng.choice(subs)
        held = self.held[uid]
        return uid, self.state.subs_by_uid[uid], held, self.rng.sample(sorted(held), self.rng.randint(1, len(held)))

    def ack(self) -> None:
        some = self._some_held()
        if some is None:
            return
        uid, s, held, chosen = some
        nums, _ = commands.acks(s, [held.pop(n) for n in chosen], self.clock.now())
        if nums:
            end = self.commit_record(R.Ack(uid, nums))
            # an ack id of a message a damaged log lost changes nothing: only what took effect counts
            self.oracle.pending_acks.append((end, uid, [n for n in nums if s.is_acked(n)]))

    def modack(self) -> None:
        some = self._some_held()
        if some is None:
            return
        uid, s, held, chosen = some
        seconds = self.rng.choice([0, 0, 15, 60])
        ids = [held[n] for n in chosen]
        if seconds == 0:
            for n in chosen:
                del held[n]
        recs, _ = commands.modacks(s, ids, [seconds] * len(ids), self.clock.now())
        for rec in recs:
            self.commit_record(rec)

    def seek(self) -> None:
        subs = [s for s in self.state.subs_by_uid.values() if not s.detached and s.topic is not None]
        if not subs:
            return
        s = self.rng.choice(subs)
        snaps = [n for n, sn in self.state.snapshots.items() if sn.topic_uid == s.topic.uid]
        to_snap = bool(snaps) and self.rng.random() < 0.5
        rec = commands.seek(self.state, s.name, None if to_snap else int((self.clock.now() - self.rng.randint(0, 60))
                                                                         * 1000), self.rng.choice(snaps) if to_snap else None)
        start = self.sj.journal.tail
        self.commit_record(rec)
        self.seeks.append((start, self.sj.journal.tail, s.uid))
        self.before_seek[s.uid] = list(self.held[s.uid].values())  # the client may still ack these, late
        self.held[s.uid] = {}
        self.oracle.pending_acks.append((self.sj.journal.tail, s.uid, None))  # None: a seek, once durable

    def late_ack(self) -> None:
        """A client acked and sought at once: its batched Acknowledge of ack ids handed out before the seek
        arrives after it, and must ack nothing (the seek made those messages unacked again)."""
        uids = [uid for uid, ids in self.before_seek.items() if ids and uid in self.state.subs_by_uid]
        if not uids:
            return
        uid = self.rng.choice(uids)
        s = self.state.subs_by_uid[uid]
        # (a crash or a damaged log may have lost the seek: ids of the subscription's generation ack as any)
        ids = [a for a in self.before_seek.pop(uid)
               if int(a.rsplit(".", 1)[1]) >> ackid.GENERATION_SHIFT < s.generation_of(int(a.split(".")[1]))]
        nums, _ = commands.acks(s, ids, self.clock.now()) if ids else ([], {})
        if nums:
            self.fail(f"{len(nums)} ack ids of {s.name} handed out before its seek acked messages after it")

    def snapshot(self) -> None:
        subs = [s for s in self.state.subs_by_uid.values() if s.topic is not None and not s.topic.deleted]
        if not subs or len(self.state.snapshots) >= 3:
            return
        s = self.rng.choice(subs)
        name = f"{P}/snapshots/snap{len(self.state.snapshots)}-{self.step_no}"
        try:
            _, rec = commands.create_snapshot(self.state, name, s.name, {}, self.clock.now(), "unused")
        except PigeonError:
            return
        self.commit_record(rec)

    def drop_stream(self) -> None:
        """A client's stream dies: its leases stay until their deadline; the client keeps its ack ids."""
        gone = self.rng.choice(self.streams)
        for s in self.state.subs_by_uid.values():
            s.disown(gone, [n for n, lease in s.leases.items() if lease[2] is gone])
        self.streams[self.streams.index(gone)] = Stream()

    def advance(self) -> None:
        self.clock.advance(self.rng.choice([0.5, 2.0, 5.0, 10.0, 31.0]))

    def clock_jump(self) -> None:
        self.clock.advance(self.rng.choice([700.0, 3600.0]))

    def forward_dead_letters(self, uid: int) -> None:
        """What the executor does with messages taken out for dead-lettering: publish them to the dead-letter
        topic with the source attributes, then ack them on the source."""
        s = self.state.subs_by_uid[uid]
        nums, s.dead_letters = s.dead_letters, []
        dlt = self.state.topics.get(s.config.dead_letter_policy.dead_letter_topic)
        if dlt is None:
            return  # the leases run out and the messages come back
        for key, request, count in commands.dead_letter_batches(s, nums, self.reader.messages(s.topic, nums)):
            self.commit_record(commands.publish(dlt, request, count, key, int(self.clock.now() * 1000)))
        self.commit_record(R.Ack(uid, nums))

    # --- durability ----------------------------------------------------------------------------------
    def commit(self) -> None:
        """One group commit: everything appended becomes durable; what clients were answered follows. On a
        full disk nothing more becomes durable, and nothing appended may be lost: it is written with the next."""
        if not self.sj.commit():
            self.enospc += 1
            return
        if self.sj.journal.durable != self.sj.journal.tail:
            self.fail(f"a commit left {self.sj.journal.tail - self.sj.journal.durable} bytes behind")
        self.state.all_durable()  # as the executor: a batch becomes visible once durable
        self.oracle.durable_up_to(self.sj.journal.durable, self.state.subs_by_uid)

    def write_unsynced(self) -> None:
        self.sj.write()

    def checkpoint(self) -> None:
        """As node.maintenance: a checkpoint at the current position once durable, then segment deletion. On a
        full disk it is skipped (the log still holds everything; the next one catches up)."""
        self.commit()
        pos = self.sj.journal.tail
        if self.sj.journal.durable < pos:
            return
        cks = self.checkpoints
        try:
            ck.write(self.disk, cks.dir, pos, checkpoint_records(self.state, self.sj.journal, pos), cks.keep())
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            return
        cks.wrote(pos, self.clock.now())
        cut = cks.journal_needed_from(min(self.sj.journal.tail, self.state.trim_indexes(self.clock.now())))
        if cut is not None:
            self.sj.journal.delete_before(cut)

    # --- faults --------------------------------------------------------------------------------------
    def fill_disk(self) -> None:
        """The disk fills up: a few KiB left (writes soon meet ENOSPC), or the reserve and a little more."""
        used = sum(len(f.data) for f in self.disk.files.values())
        left = self.rng.randint(0, 4096)
        if self.rng.random() < 0.5:
            left += limits.disk_reserve_bytes_min
        self.disk.space = used + left

    def free_disk(self) -> None:
        self.disk.space = None

    def crash(self, flipped: bool = False) -> None:
        durable = self.sj.journal.durable
        self.disk.crash(self.rng, torn=self.rng.random() < 0.5)
        self.recover(durable, flipped)

    def flip_bit(self) -> None:
        """A bit flips in a closed segment the recovery must read: it truncates there and says so."""
        self.commit()
        j = self.sj.journal
        start = self.checkpoints.positions[-1] if self.checkpoints.positions else 0
        closed = [s for s in j.starts[:-1] if s >= start or j.starts[j.starts.index(s) + 1] > start]
        if not closed:
            return
        seg = self.rng.choice(closed)
        path = j.path(seg)
        size = self.disk.size(path)
        if size == 0:
            return
        lo = max(0, start - seg)
        if lo >= size:
            return
        self.disk.flip_bit(path, self.rng.randrange(lo, size), self.rng.randrange(8))
        self.crash(flipped=True)

    def unappliable(self) -> None:
        """A bug writes a record that decodes but cannot be applied (a publish at an offset its shard is not at):
        start-up must stop, naming it, and change no file; an explicit repair then cuts the log there."""
        if not self.state.topics or self.disk.space is not None:  # (the bad record must reach the disk)
            return
        t = self.state.topics[self.rng.choice(sorted(self.state.topics))]
        self.commit()
        good_tail = self.sj.journal.tail
        bad = R.Publish(t.uid, 0, t.shards[0].next + 1000, 0, 1, 0, b"")
        self.sj.append(self.state.log_of(bad, BUNDLES), self.epoch, bad.TYPE, bad.parts())
        self.sj.commit()
        before = {p: bytes(f.data) for p, f in self.disk.files.items()}
        try:
            SyncJournal(self.disk, "/data", 8 * 1024, BrokerTarget, type_name)
        except storage_recovery.Unappliable as e:
            at = int(posixpath.basename(e.path).split(".")[0]) + e.at
            if e.type_name != "PUBLISH" or at != good_tail:
                self.fail(f"recovery stopped at the wrong place ({at}, the record is at {good_tail}): {e.describe()}")
        else:
            self.fail("recovery applied past a record that cannot be applied")
        if {p: bytes(f.data) for p, f in self.disk.files.items()} != before:
            self.fail("a start-up stopped by an unappliable record changed files")
        storage_recovery.recover(self.disk, "/data", BrokerTarget, repair=True, drop_unappliable=True,
                                 type_name=type_name)
        self.recover(good_tail, flipped=False)
        if self.sj.journal.tail != good_tail:
            self.fail(f"the repair cut the log at {self.sj.journal.tail}, not before the bad record ({good_tail})")

    def recover(self, durable_before: int, flipped: bool) -> None:
        self.sj = SyncJournal(self.disk, "/data", 8 * 1024, BrokerTarget, type_name)
        found = self.sj.recovered
        tail = found.tail
        if flipped:
            if not found.report.broken:
                self.fail("a flipped bit in a closed segment went unnoticed")
        elif tail < durable_before:
            self.fail(f"recovery ended the journal at {tail}, below what was durable ({durable_before})")
        recovered = found.target.state
        recovered.all_durable()
        # recovery equals the live path: replaying the records that survived gives the same state
        shadow = BrokerState()
        shadow.dispatch_off()
        for rec, at, end in self.history:
            if end <= tail:
                shadow.apply(rec, at)
        shadow.all_durable()
        now = self.clock.now()
        # compared once both dispatch again: a lease that ran out ends, with what its key's batch takes with it
        recovered.rebuild(now)
        shadow.rebuild(now)
        if summary(recovered, now) != summary(shadow, now):
            self.fail("the recovered state differs from a replay of the surviving records:\n"
                      f"  recovered {summary(recovered, now)}\n  replayed  {summary(shadow, now)}")
        for t in recovered.topics_by_uid.values():  # an index may have been trimmed before a checkpoint
            for ix, full in zip(t.shards, shadow.topics_by_uid[t.uid].shards):
                kept = len(ix.base)
                if kept and (list(ix.base) != list(full.base[-kept:]) or list(ix.pos) != list(full.pos[-kept:])):
                    self.fail(f"the recovered index of {t.name} is not the tail of the replayed one")
        self.history = [h for h in self.history if h[2] <= tail]
        self.state = recovered
        self.reader = MessageReader(self.sj, 1 << 20)
        self.epoch += 1
        self.fenced = set()
        self.checkpoints.found(found.checkpoints, self.clock.now())
        o = self.oracle
        if flipped:  # the damage cost what came after it: the oracle forgets it (nothing else may go)
            o.durable_msgs = {k for k in o.durable_msgs if o.msgs[k].end <= tail}
            for uid in o.durable_acks:  # (the state is checked above: it is the replay of what survived)
                s = recovered.subs_by_uid.get(uid)
                o.durable_acks[uid] = {n for n in o.durable_acks[uid] if s is not None and s.is_acked(n)}
        o.msgs = {k: m for k, m in o.msgs.items() if m.end <= tail}
        o.seeks_cut(self.seeks, self.history, tail, recovered)  # (and forgets them)
        o.pending_acks = [p for p in o.pending_acks if p[0] <= tail]
        self.commit()  # what survived is durable now: pending answers that made it count
        self.check_durability()
        self.streams = [Stream(), Stream()]  # every stream died with the process; clients keep their ack ids

    # --- invariants ----------------------------------------------------------------------------------
    def check_durability(self) -> None:
        st = self.state
        for key in self.oracle.durable_msgs:
            t = st.topics_by_uid.get(key[0])
            m = self.oracle.msgs.get(key)
            if t is None or m is None:
                self.fail(f"a durably acknowledged publish {key} is gone with its topic")
            ix = t.shards[key[1] & 63]
            if not key[1] >> limits.shard_bits < ix.next:
                self.fail(f"a durably acknowledged publish {key} is lost (shard at {ix.next})")
        for uid, nums in self.oracle.durable_acks.items():
            s = st.subs_by_uid.get(uid)
            for n in nums:
                if s is not None and not s.is_acked(n):
                    self.fail(f"a durably acknowledged ack of message {n} on subscription {uid} was undone")

    def check_states(self) -> None:
        for s in self.state.subs_by_uid.values():
            for num, lease in s.leases.items():
                if s.is_acked(num):
                    self.fail(f"message {num} of {s.name} is both acked and locked")
                if s.max_attempts and lease[1] > s.max_attempts and s.uid not in self.orphaned:
                    self.fail(f"message {num} of {s.name} locked at delivery {lease[1]} > {s.max_attempts}")
            both = set(s.versions) & set(s.leases)
            if both:
                self.fail(f"{s.name}: {sorted(both)[:5]} counted as waiting and as locked")

    def final_drain(self) -> None:
        """Once every lease and backoff ran out, everything unacked and not parked goes out (liveness) — also
        after a consumer failed it more often than a dead-letter policy allows: the first rounds let every
        lease run out (a message past its attempts is forwarded and acked, or, when its dead-letter topic is
        gone, delivered again), the last rounds ack."""
        self.free_disk()
        self.commit()
        failing, acking = 6, 3
        for s in self.state.subs_by_uid.values():
            if s.detached or s.topic is None:
                continue
            got: set[int] = set()
            for rnd in range(failing + acking):  # leases run out into backoff (≤ 600 s), backoff into redelivery
                self.clock.advance(limits.modify_deadline_s_max + 60)
                for _ in range(10_000):
                    picks = s.take(1000, self.clock.now())
                    if not picks:
                        break
                    self.commit_record(picks.record(s.uid, self.clock.now() + 600))
                    if rnd >= failing:
                        got.update(n for n, _ in picks.out)
                        self.commit_record(R.Ack(s.uid, [n for n, _ in picks.out]))
                self.commit()  # dead letters forwarded meanwhile become visible
            for ix_no, ix in enumerate(s.topic.shards):
                for o in range(ix.first(), ix.next):
                    num = (o << limits.shard_bits) | ix_no
                    if not s.is_acked(num) and num not in s.parked and num not in got:
                        self.fail(f"message {num} of {s.name} is unacked but never delivered again")


def run_seeds(first: int, count: int, steps: int, out=sys.stdout) -> int:
    """Run `count` seeds from `first`; print progress and the failures; return how many failed."""
    failed = 0
    t0 = time.monotonic()
    for i, seed in enumerate(range(first, first + count)):
        try:
            Simulator(seed, steps).run()
        except SimFailure as e:
            failed += 1
            print(f"FAIL {e}", file=out, flush=True)
        if (i + 1) % 50 == 0 or i + 1 == count:
            print(f"{i + 1}/{count} seeds, {failed} failed, {time.monotonic() - t0:.0f} s", file=out, flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Pigeon's deterministic simulator")
    ap.add_argument("--seed", type=int, help="replay one seed (prints the steps it took)")
    ap.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    ap.add_argument("--first", type=int, default=0, help="the first seed")
    ap.add_argument("--steps", type=int, default=150, help="steps per seed")
    a = ap.parse_args(argv)
    if a.seed is not None:
        sim = Simulator(a.seed, a.steps)
        try:
            sim.run()
        finally:
            print(" ".join(sim.log))
        print(f"seed {a.seed}: clean")
        return 0
    failed = run_seeds(a.first, a.seeds, a.steps)
    print(f"{a.seeds - failed} of {a.seeds} seeds ran clean")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
