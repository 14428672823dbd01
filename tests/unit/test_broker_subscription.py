"""broker.subscription: SubscriptionState against a simple per-message model.

The model keeps, per message (shard, offset): acked, leased (deadline, version, owner), waiting for
redelivery, or never delivered since the last reset. Time is explicit (SimClock). Where the
implementation is free to choose an order (messages whose leases ran out in the same `expire`), the
model accepts any order and follows the implementation's choice.

The machine drives the subscription through records applied by BrokerState.apply, as the executor does, and
checks after every step that applying the same records to a fresh state (what recovery and a replica do) gives
the same durable state."""

from __future__ import annotations

import gc
from collections import Counter

import pytest
from google.pubsub_v1 import types
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pigeon.core import limits
from pigeon.broker.resources import Topic
from pigeon.broker.state import BrokerState
from pigeon.broker.subscription import SubscriptionState, SubShard
from pigeon.broker.topic import TopicState
from pigeon.storage import records as R
from pigeon.testing.clock import SimClock

BITS = limits.shard_bits
Subscription = types.Subscription.pb()


def num(offset: int, shard: int) -> int:
    return (offset << BITS) | shard


def split(n: int) -> tuple[int, int]:
    return n >> BITS, n & ((1 << BITS) - 1)


def take(s: SubscriptionState, max_messages: int, now: float, deadline_s: float, owner=None, keep=None):
    """What the executor does: choose (`keep` of the picks; the rest given back), then lease by applying the
    Deliver record. Returns the (num, version) pairs handed out."""
    picks = s.take(max_messages, now)
    if keep is not None and keep < len(picks):
        s.untake(picks, keep)
    s.lease(picks.record(s.uid, now + deadline_s), owner)
    return picks.out


def modify_deadline(s: SubscriptionState, n: int, version: int, seconds: float, now: float) -> bool:
    return s.modify_deadlines([(n, version)], seconds, now) == 1


class Owner:
    def __init__(self, name: str):
        self.name = name
        self.released: list[int] = []

    def release(self, n: int) -> None:
        self.released.append(n)

    def release_all(self, ns: list[int]) -> None:
        self.released.extend(ns)

    def __repr__(self):
        return f"Owner({self.name})"


class SubscriptionMachine(RuleBasedStateMachine):
    # --- setup ---------------------------------------------------------------------------------
    @initialize(shards=st.integers(1, 3), pre=st.lists(st.integers(0, 3), min_size=3, max_size=3))
    def init(self, shards, pre):
        self.clock = SimClock()
        self.log: list[tuple[R.Record, int]] = []  # every record applied, with its log position
        self.state = BrokerState()
        self.record(R.TopicPut(1, shards, Topic(name="projects/p/topics/t").SerializeToString()))
        self.topic = self.state.topics_by_uid[1]
        self.batches: list[tuple[int, int, int, int]] = []  # (log position, shard, first offset, end offset)
        for sh in range(shards):
            if pre[sh]:
                self.log_batch(sh, pre[sh], 0)
                self.topic.shards[sh].durable = self.topic.shards[sh].visible = self.topic.shards[sh].next
        config = Subscription(name="projects/p/subscriptions/s", topic="projects/p/topics/t", ack_deadline_seconds=10)
        self.record(R.SubPut(2, 1, config.SerializeToString(), self.topic.backlog_end()))
        self.sub = self.state.subs_by_uid[2]
        self.n = shards
        self.owners = [None, Owner("a"), Owner("b")]
        # model
        self.acked = [set(range(pre[sh])) for sh in range(shards)]  # existing messages are not for this sub
        self.cursor = [pre[sh] for sh in range(shards)]
        self.leases: dict[int, tuple[float, int, Owner | None]] = {}
        self.groups: list[set[int]] = []  # redelivery queue; order inside a group is the implementation's
        self.versions: dict[int, int] = {}  # deliveries so far of messages waiting for redelivery
        self.expected_releases: Counter = Counter()

    def record(self, rec: R.Record, owner=None):
        """Apply a record as the executor does (appended to the log first)."""
        at = len(self.log)
        self.log.append((rec, at))
        return self.state.apply(rec, at, owner)

    # --- model helpers -------------------------------------------------------------------------
    def log_batch(self, sh: int, count: int, ms: int) -> None:
        """A publish batch logged after every earlier one (each at its own log position)."""
        pos = len(self.log)
        base = self.topic.shards[sh].next
        self.record(R.Publish(1, sh, base, ms, count, 0, b""))
        self.batches.append((pos, sh, base, base + count))

    @property
    def now(self) -> float:
        return self.clock.now()

    def durable(self, sh: int) -> int:
        return self.topic.shards[sh].durable

    def is_acked(self, n: int) -> bool:
        o, sh = split(n)
        return o in self.acked[sh]

    def waiting(self) -> set[int]:
        return set().union(*self.groups) if self.groups else set()

    def end_lease(self, n: int) -> tuple[float, int, Owner | None]:
        lease = self.leases.pop(n)
        if lease[2] is not None:
            self.expected_releases[(lease[2].name, n)] += 1
        return lease

    def forget_waiting(self, pred) -> None:
        self.groups = [g for g in ({n for n in g if not pred(n)} for g in self.groups) if g]
        for n in [n for n in self.versions if pred(n)]:
            del self.versions[n]

    def model_expire(self) -> None:
        group = set()
        for n in [n for n, (d, _, _) in self.leases.items() if d <= self.now]:
            _, version, _ = self.end_lease(n)
            self.versions[n] = version
            group.add(n)
        if group:
            self.groups.append(group)

    def check_releases(self) -> None:
        got = Counter()
        for o in self.owners[1:]:
            for n in o.released:
                got[(o.name, n)] += 1
            o.released.clear()
        assert got == self.expected_releases, (got, self.expected_releases)
        self.expected_releases = Counter()

    def durable_messages(self):
        for sh in range(self.n):
            for o in range(self.durable(sh)):
                yield num(o, sh)

    def deliverable(self) -> set[int]:
        """What the model says a take right now could hand out (before it expires anything)."""
        out = self.waiting()
        out |= {n for n, (d, _, _) in self.leases.items() if d <= self.now}
        for sh in range(self.n):
            for o in range(self.cursor[sh], self.durable(sh)):
                if o not in self.acked[sh]:
                    out.add(num(o, sh))
        return out

    def do_take(self, max_messages: int, deadline_s: float, owner, keep: int | None = None) -> list[tuple[int, int]]:
        before_leased = {n for n, (d, _, _) in self.leases.items() if d > self.now}
        picks = self.sub.take(max_messages, self.now)
        out = list(picks.out)
        if keep is not None and keep < len(picks):
            self.sub.untake(picks, keep)
        self.record(picks.record(self.sub.uid, self.now + deadline_s), owner)
        assert len(out) <= max_messages
        nums = [n for n, _ in out]
        assert len(set(nums)) == len(nums), "a message handed out twice in one take"
        for n in nums:
            assert not self.is_acked(n), f"acked message {split(n)} handed out again"
            assert n not in before_leased, f"message {split(n)} handed out while its lease is valid"
        self.model_expire()
        deadline = self.now + deadline_s
        i = 0
        # redeliveries first, in queue order (any order inside one group)
        while self.groups and i < len(out):
            g = self.groups[0]
            k = min(len(g), max_messages - i)
            chunk = out[i : i + k]
            assert {n for n, _ in chunk} <= g and len(chunk) == k, (chunk, g)
            for n, version in chunk:
                assert version == self.versions.pop(n, 0) + 1
                self.leases[n] = (deadline, version, owner)
                g.discard(n)
            i += k
            if not g:
                self.groups.pop(0)
            if i >= max_messages:
                break
        if i == len(out) and i < max_messages:
            assert not self.groups, "redeliveries were waiting but not handed out"
        # then new messages in log order, batch by batch (the oldest first)
        expected_new = []
        for _, sh, base, end in self.batches:
            c = self.cursor[sh]
            if not base <= c < end:  # done with it, or an earlier batch of its shard is not
                continue
            while c < min(end, self.durable(sh)) and i + len(expected_new) < max_messages:
                if c not in self.acked[sh]:
                    expected_new.append((num(c, sh), 1))
                c += 1
            self.cursor[sh] = c
        assert out[i:] == expected_new, (out[i:], expected_new)
        for n, version in expected_new:
            self.leases[n] = (deadline, version, owner)
        if keep is not None and keep < len(out):  # given back before the lease: to the front of the queue
            for n, version in reversed(out[keep:]):
                del self.leases[n]
                if version > 1:
                    self.versions[n] = version - 1
                self.groups.insert(0, {n})
            out = out[:keep]
        return out

    # --- operations ----------------------------------------------------------------------------
    @rule(shard=st.integers(0, 2), count=st.integers(1, 4), durable=st.booleans())
    def publish(self, shard, count, durable):
        shard %= self.n
        ix = self.topic.shards[shard]
        self.log_batch(shard, count, int(self.now * 1000))
        if durable:
            ix.durable = ix.visible = ix.next
        self.last_take = None

    @rule(shard=st.integers(0, 2))
    def make_durable(self, shard):
        ix = self.topic.shards[shard % self.n]
        ix.durable = ix.visible = ix.next
        self.last_take = None

    @rule(max_messages=st.integers(1, 6), deadline_s=st.sampled_from([1.0, 10.0, 60.0]), owner=st.integers(0, 2),
          keep=st.none() | st.integers(0, 5))
    def take(self, max_messages, deadline_s, owner, keep):
        """A take; with `keep`, only that many fit in the response and the rest is given back unleased."""
        self.do_take(max_messages, deadline_s, self.owners[owner], keep)

    @rule(data=st.data())
    def ack(self, data):
        pool = sorted(self.leases) + list(self.durable_messages())
        nums = data.draw(st.lists(st.sampled_from(pool), max_size=5), label="nums") if pool else []
        if data.draw(st.booleans(), label="foreign shard") and self.n < 1 << BITS:
            nums.append(num(0, self.n))  # a shard this subscription does not have: ignored
        self.check_ack(nums)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def ack_leased_run(self, data):
        """A stream's usual ack: distinct leased numbers of one shard, in any order (SubscriptionState's
        C-level path; any other batch takes the per-message one)."""
        shard = data.draw(st.sampled_from(sorted({split(n)[1] for n in self.leases})), label="shard")
        mine = [n for n in sorted(self.leases) if split(n)[1] == shard]
        nums = data.draw(st.lists(st.sampled_from(mine), min_size=1, unique=True), label="nums")
        self.check_ack(nums)

    def check_ack(self, nums):
        before = {n for n in nums if split(n)[1] < self.n and not self.sub.is_acked(n)}
        self.record(R.Ack(self.sub.uid, nums))
        changed = [n for n in dict.fromkeys(nums) if n in before]
        expected = []
        for n in nums:
            o, sh = split(n)
            if sh >= self.n or o in self.acked[sh]:
                continue
            self.acked[sh].add(o)
            expected.append(n)
            if n in self.leases:
                self.end_lease(n)
        self.forget_waiting(self.is_acked)
        assert changed == expected
        self.last_take = None

    @rule(data=st.data(), seconds=st.sampled_from([0, 0, 1, 5, 10, 600]), which=st.sampled_from(
        ["current", "any", "stale", "unleased"]))
    def modify_deadline(self, data, seconds, which):
        if which == "unleased" or not self.leases:
            pool = [n for n in self.durable_messages() if n not in self.leases]
            if not pool:
                return
            n = data.draw(st.sampled_from(pool), label="num")
            version = data.draw(st.integers(0, 3), label="version")
        else:
            n = data.draw(st.sampled_from(sorted(self.leases)), label="num")
            current = self.leases[n][1]
            version = {"current": current, "any": 0, "stale": current + data.draw(st.sampled_from([-1, 1]))}[which]
            if version == 0 and which == "stale":
                version = current + 1
        live = self.sub.leases.get(n)
        applied = live is not None and version in (0, live[1]) and (seconds <= 0 or live[0] > self.now)
        self.record(R.Modack(self.sub.uid, self.now, seconds, [n], [version]))
        lease = self.leases.get(n)
        expect = lease is not None and (version == 0 or version == lease[1]) and (seconds <= 0 or lease[0] > self.now)
        assert applied == expect
        if expect:
            if seconds <= 0:
                _, v, _ = self.end_lease(n)
                self.versions[n] = v
                self.groups.append({n})
            else:
                self.leases[n] = (self.now + seconds, lease[1], lease[2])
        self.last_take = None

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 5.0, 9.99, 10.0, 30.0, 61.0, 700.0]), expire=st.booleans())
    def advance(self, dt, expire):
        self.clock.advance(dt)
        if expire:
            got = self.sub.expire(self.now)
            before = sum(len(g) for g in self.groups)
            self.model_expire()
            assert got == sum(len(g) for g in self.groups) - before
        self.last_take = None

    @rule(owner=st.integers(1, 2))
    def owner_gone(self, owner):
        """A stream ends (closed, or its client died): its leases stay until their deadline, owned by nobody."""
        gone = self.owners[owner]
        self.sub.disown(gone, [n for n, lease in self.leases.items() if lease[2] is gone])  # not a record: owners
        # live in one process only
        for n, (deadline, version, holder) in list(self.leases.items()):
            if holder is gone:
                self.leases[n] = (deadline, version, None)
        self.last_take = None

    @rule(data=st.data())
    def reset(self, data):
        floors, above = [], []
        for sh in range(self.n):
            d = self.durable(sh)
            f = data.draw(st.integers(0, d + 2), label=f"floor{sh}")
            a = data.draw(st.lists(st.integers(f, d - 1), max_size=4, unique=True), label=f"acked{sh}") if f < d else []
            floors.append(f)
            above.append(a)
        self._reset(floors, above)

    @rule()
    def export_then_reset(self):
        floors, above = self.sub.export_state()
        fresh = SubscriptionState(3, "projects/p/subscriptions/copy", self.topic, self.sub.config)
        fresh.reset(floors, above)
        assert fresh.export_state() == (floors, above)
        for n in self.durable_messages():
            o, sh = split(n)
            assert fresh.shards[sh].is_acked(o) == self.sub.shards[sh].is_acked(o)
        self._reset(floors, above)
        assert self.sub.export_state() == (floors, above)

    def _reset(self, floors, above):
        self.record(R.Seek(self.sub.uid, floors, above))
        for n in list(self.leases):
            self.end_lease(n)
        self.groups.clear()
        self.versions.clear()
        self.acked = [set(range(f)) | set(a) for f, a in zip(floors, above)]
        self.cursor = list(floors)
        self.last_take = None

    @rule(data=st.data())
    def drop_before(self, data):
        sh = data.draw(st.integers(0, self.n - 1), label="shard")
        offset = data.draw(st.integers(0, self.durable(sh) + 2), label="offset")
        self.record(R.Trim(self.sub.uid, sh, offset))
        self.acked[sh] |= set(range(offset))
        gone = lambda n: split(n)[1] == sh and split(n)[0] < offset  # noqa: E731
        for n in [n for n in self.leases if gone(n)]:
            self.end_lease(n)
        self.forget_waiting(gone)
        self.last_take = None

    @rule(owner=st.integers(0, 2))
    def drain(self, owner):
        """After every lease ran out, every durable unacked message can be taken (each once)."""
        self.clock.advance(limits.modify_deadline_s_max + 1)
        out = self.do_take(10**6, 10.0, self.owners[owner])
        unacked = {n for n in self.durable_messages() if not self.is_acked(n)}
        assert {n for n, _ in out} == unacked
        assert not self.sub.has_ready(self.now) or self.sub.redeliver  # only stale entries may remain
        self.last_take = out

    # --- invariants ----------------------------------------------------------------------------
    @invariant()
    def releases_match(self):
        self.check_releases()

    @invariant()
    def every_message_in_exactly_one_state(self):
        s = self.sub
        assert len(s.shards) == self.n
        in_redeliver = set(s.redeliver)
        for sh in range(self.n):
            ss = s.shards[sh]
            assert all(o > ss.floor for o in ss.acked), "acked set holds offsets at or below the floor"
            assert ss.cursor >= ss.floor
            for o in range(self.topic.shards[sh].next):
                n = num(o, sh)
                acked = ss.is_acked(o)
                leased = n in s.leases
                waiting = n in in_redeliver and not acked
                new = o >= ss.cursor and not acked
                if o >= self.durable(sh):
                    assert not leased and not waiting, f"non-durable message {o}/{sh} handed out"
                    continue
                states = [acked, leased, waiting, new]
                assert sum(states) == 1, (f"message offset {o} shard {sh}", dict(zip(
                    ["acked", "leased", "waiting", "new"], states)))
                # and it is the model's state
                assert acked == (o in self.acked[sh])
                assert leased == (n in self.leases)
                assert waiting == (n in self.waiting())
                if leased:
                    assert s.leases[n][:3] == self.leases[n]
                if waiting:
                    assert s.versions.get(n, 0) == self.versions.get(n, 0)

    @invariant()
    def replay_gives_the_same_durable_state(self):
        """Applying the log to an empty state with dispatch off (recovery, a replica) ends where the live state
        is: same acks, same leases (deadline, version, key), same delivery counts — once the leases that ran
        out by now are counted as ended on both sides (expiry is time's, not a record's)."""
        fresh = BrokerState()
        fresh.dispatch_off()
        for rec, at in self.log:
            fresh.apply(rec, at)
        assert normalized(fresh.subs_by_uid[2], self.now) == normalized(self.sub, self.now)
        fresh.rebuild(self.now)  # and it can dispatch: everything unacked, unlocked, is deliverable
        got = take(fresh.subs_by_uid[2], 10**6, self.now + limits.modify_deadline_s_max + 1, 10.0)
        logged = (num(o, sh) for sh in range(self.n) for o in range(self.topic.shards[sh].next))
        assert {n for n, _ in got} == {n for n in logged if not self.is_acked(n)}  # what the log holds is durable

    @invariant()
    def export_matches_model(self):
        floors, above = self.sub.export_state()
        for sh in range(self.n):
            assert set(range(floors[sh])) | set(above[sh]) == self.acked[sh]

    @invariant()
    def backlog_counts_durable_unacked(self):
        want = sum(1 for n in self.durable_messages() if not self.is_acked(n))
        assert self.sub.backlog() == want

    @invariant()
    def has_ready_when_something_is_deliverable(self):
        if self.deliverable():
            assert self.sub.has_ready(self.now)

    @invariant()
    def next_deadline_bounds_leases(self):
        if self.leases:
            nd = self.sub.next_deadline()
            assert nd is not None and nd <= min(d for d, _, _ in self.leases.values())


def normalized(s: SubscriptionState, now: float) -> tuple:
    leases = {n: (d, v, k) for n, (d, v, _, k) in s.leases.items() if d > now}
    counts = dict(s.versions)
    counts.update({n: v for n, (d, v, _, _) in s.leases.items() if d <= now})
    return s.export_state(), leases, counts, dict(s.parked)


SubscriptionMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestSubscriptionState = SubscriptionMachine.TestCase


# --- direct examples ---------------------------------------------------------------------------
def _sub(shards=1, published=(0,), deadline=10):
    t = TopicState(1, "projects/p/topics/t", None, shards)
    s = SubscriptionState(2, "projects/p/subscriptions/s", t, Subscription(ack_deadline_seconds=deadline))
    for sh, count in enumerate(published):
        if count:
            t.shards[sh].append(count, 0, 0)
            t.shards[sh].durable = t.shards[sh].visible = t.shards[sh].next
    return t, s


def test_message_is_not_visible_until_durable():
    t, s = _sub()
    t.shards[0].append(3, 0, 0)
    assert take(s, 10, 0.0, 10) == []
    assert not s.has_ready(0.0)
    t.shards[0].durable = t.shards[0].visible = 2
    assert take(s, 10, 0.0, 10) == [(num(0, 0), 1), (num(1, 0), 1)]
    t.shards[0].durable = t.shards[0].visible = 3
    assert take(s, 10, 0.0, 10) == [(num(2, 0), 1)]


def test_lease_expiry_redelivers_with_next_version():
    _, s = _sub(published=(1,))
    owner = Owner("x")
    assert take(s, 1, 100.0, 10, owner) == [(0, 1)]
    assert take(s, 1, 109.9, 10) == []
    assert owner.released == []
    assert take(s, 1, 110.0, 10) == [(0, 2)]
    assert owner.released == [0]
    assert s.ack([0]) == [0]
    assert s.ack([0]) == []
    assert take(s, 1, 1000.0, 10) == []


def test_nack_with_stale_version_is_ignored():
    _, s = _sub(published=(1,))
    take(s, 1, 0.0, 10)
    modify_deadline(s, 0, 1, 0, 1.0)  # nack
    assert take(s, 1, 1.0, 10) == [(0, 2)]
    assert modify_deadline(s, 0, 1, 0, 2.0) is False  # version 1 is gone
    assert modify_deadline(s, 0, 2, 30, 2.0) is True
    assert take(s, 1, 20.0, 10) == []  # extended to 32
    assert take(s, 1, 32.0, 10) == [(0, 3)]


def test_untake_keeps_the_delivery_version():
    _, s = _sub(published=(2,))
    first = take(s, 2, 0.0, 10)
    modify_deadline(s, first[0][0], 0, 0, 0.0)
    picks = s.take(2, 0.0)
    assert picks.out == [(0, 2)]
    s.untake(picks, 0)  # nothing fitted: given back unleased
    assert 0 not in s.leases and picks.out == []
    assert take(s, 2, 0.0, 10) == [(0, 2)]


def test_untake_of_a_refused_delivery_gives_back_its_dead_letters_too():
    """A Deliver record refused (the shard moved meanwhile) gives every pick back — also a message taken out for
    the dead-letter topic, which nothing else would ever hand out again (it is in no queue until it is leased)."""
    t = TopicState(1, "projects/p/topics/t", None, 1)
    s = SubscriptionState(2, "projects/p/subscriptions/s", t, Subscription(
        ack_deadline_seconds=10, dead_letter_policy=types.DeadLetterPolicy.pb()(
            dead_letter_topic="projects/p/topics/dead", max_delivery_attempts=5)))
    s.dead_letter_open = True
    t.shards[0].append(1, 0, 0)
    t.shards[0].durable = t.shards[0].visible = 1
    for i in range(5):  # delivered and given back (nacked) up to the attempts allowed
        assert take(s, 1, float(i), 10) == [(0, i + 1)]
        modify_deadline(s, 0, i + 1, 0, float(i))
    picks = s.take(1, 10.0)
    assert picks.out == [] and picks.dead == [(0, 5)]
    s.untake(picks, 0, dead=True)  # its Deliver record refused
    assert not picks and 0 not in s.leases
    again = s.take(1, 10.0)
    assert again.dead == [(0, 5)], "the message taken out for dead-lettering was lost from the queue"


def test_lease_deadline_entries_are_invisible_to_the_collector():
    """A stream's deadline keeps a minute of entries (one per batch handed out or extended); they hold numbers
    only, so the collector stops tracking them and its full passes, which pause the event loop, skip them."""
    _, s = _sub(published=(50,))
    for i in range(5):
        assert len(take(s, 10, float(i), 10)) == 10
    assert s.modify_deadlines([(num(0, 0), 0), (num(1, 0), 0)], 30, 5.0) == 2
    gc.collect()
    gc.collect()  # an entry is let go once a pass has found its numbers untracked: at most two passes
    assert len(s._heap) == 6
    assert not any(gc.is_tracked(entry) for entry in s._heap)


def test_a_batch_ack_tells_each_owner_only_of_its_own_messages():
    """One ack batch can hold a stream's messages and a Pull's (leases without an owner): the stream is told of
    its own only (its flow control counts what it holds)."""
    _, s = _sub(published=(3,))
    stream = Owner("stream")
    assert take(s, 2, 0.0, 10, stream) == [(num(0, 0), 1), (num(1, 0), 1)]
    assert take(s, 1, 0.0, 10) == [(num(2, 0), 1)]  # pulled: no owner
    assert s.ack([num(1, 0), num(2, 0)]) == [num(1, 0), num(2, 0)]
    assert stream.released == [num(1, 0)]
    assert s.ack([num(0, 0)]) == [num(0, 0)]
    assert stream.released == [num(1, 0), num(0, 0)]


def test_leases_of_a_closed_stream_run_out_into_redelivery():
    """A stream that ends holding messages (its client died) leaves them leased to nobody until their deadline;
    then they are delivered again with the next version, ordered or not."""
    t = TopicState(1, "projects/p/topics/t", None, 1)
    s = SubscriptionState(2, "projects/p/subscriptions/s", t, Subscription(ack_deadline_seconds=10,
                                                                           enable_message_ordering=True))
    t.shards[0].append(2, 0, 0)
    t.shards[0].append(1, 1, 0, key=7)  # an ordering key's message
    t.shards[0].durable = t.shards[0].visible = t.shards[0].next
    stream = Owner("stream")
    taken = take(s, 10, 0.0, 10, stream)
    assert sorted(taken) == [(num(0, 0), 1), (num(1, 0), 1), (num(2, 0), 1)]
    s.disown(stream, [n for n, _ in taken])
    assert all(lease[2] is None for lease in s.leases.values())
    assert take(s, 10, 9.9, 10) == []
    assert sorted(take(s, 10, 10.0, 10)) == [(num(0, 0), 2), (num(1, 0), 2), (num(2, 0), 2)]
    assert stream.released == []  # the stream is gone: nobody tells it


def test_ack_deadline_default():
    _, s = _sub(deadline=0)
    assert s.ack_deadline_s == limits.ack_deadline_s_default
    _, s = _sub(deadline=42)
    assert s.ack_deadline_s == 42


def test_subshard_floor_absorbs_contiguous_acks():
    ss = SubShard(5)
    assert ss.mark(7) and ss.mark(6)
    assert (ss.floor, ss.acked) == (5, {6, 7})
    assert ss.mark(5)
    assert (ss.floor, ss.acked, ss.cursor) == (8, set(), 8)
    assert not ss.mark(4) and not ss.mark(7)
    ss.mark(10)
    ss.drop_before(9)
    assert (ss.floor, ss.acked) == (9, {10})
    ss.drop_before(3)
    assert ss.floor == 9


def test_subshard_batches_of_unacked_offsets_agree_with_one_by_one():
    """Two streams' batches acked out of order, runs with gaps, single offsets: mark_unacked ends where
    marking each offset would."""
    batches = [list(range(10, 20)), list(range(0, 10)), [25, 21, 23], [20], [22, 24], list(range(30, 40))[::-1],
               [26, 28], [27], [29]]
    fast, slow = SubShard(0), SubShard(0)
    for b in batches:
        fast.mark_unacked(b)
        for o in b:
            assert slow.mark(o)
        assert (fast.floor, fast.acked, fast.cursor) == (slow.floor, slow.acked, slow.cursor), b
    assert (fast.floor, fast.acked) == (40, set())


def test_rebuild_keeps_locks_and_redelivers_everything_else_not_acked():
    """After recovery the locks of the log stand until their deadline (a client may still ack them); what is
    unacked and not locked goes out again at once, with its delivery count."""
    _, s = _sub(published=(5,))
    take(s, 4, 0.0, 10)
    s.ack([num(1, 0)])
    modify_deadline(s, num(2, 0), 0, 0, 0.0)  # nacked: delivered once, waiting
    s.dispatching = False  # what recovery leaves: durable state only
    s.rebuild(1.0)
    assert sorted(take(s, 10, 1.0, 10)) == [(num(2, 0), 2), (num(4, 0), 1)]
    assert take(s, 10, 9.9, 10) == []
    assert sorted(take(s, 10, 10.0, 10)) == [(num(0, 0), 2), (num(3, 0), 2)]


def test_rebuild_keeps_an_ordered_keys_locked_batch_outstanding():
    """A lock kept across a restart is its key's outstanding batch: nothing later of the key goes out before it
    ends, and when it fails, it goes out again first."""
    t = TopicState(1, "projects/p/topics/t", None, 1)
    s = SubscriptionState(2, "projects/p/subscriptions/s", t, Subscription(enable_message_ordering=True))
    t.shards[0].append(2, 0, 0, key=7)
    t.shards[0].durable = t.shards[0].visible = 2
    assert take(s, 1, 0.0, 10) == [(num(0, 0), 1)]
    s.dispatching = False
    s.rebuild(1.0)
    assert take(s, 10, 1.0, 10) == []  # key 7 waits for its locked message
    assert take(s, 10, 10.0, 10) == [(num(0, 0), 2)]  # which ran out: it goes out again, alone
    s.ack([num(0, 0)])
    assert take(s, 10, 10.0, 10) == [(num(1, 0), 1)]


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_take_goes_shard_by_shard_within_one_log_position(shards):
    _, s = _sub(shards=shards, published=[2] * shards)  # every batch at log position 0
    out = take(s, 100, 0.0, 10)
    assert out == [(num(o, sh), 1) for sh in range(shards) for o in range(2)]


def test_new_messages_go_out_in_log_order_across_shards():
    """Shards interleave in the log: a backlog goes out oldest first, a batch at a time, so it is read from disk
    front to back instead of one shard's every n-th record at a time."""
    t = TopicState(1, "projects/p/topics/t", None, 3)
    s = SubscriptionState(2, "projects/p/subscriptions/s", t, Subscription(ack_deadline_seconds=10))
    for pos, sh in enumerate([2, 0, 1, 0, 2]):  # publish batches of 2, in this order
        t.shards[sh].append(2, pos, 0)
    for ix in t.shards:
        ix.durable = ix.visible = ix.next
    order = [(num(0, 2), num(1, 2)), (num(0, 0), num(1, 0)), (num(0, 1), num(1, 1)), (num(2, 0), num(3, 0)),
             (num(2, 2), num(3, 2))]
    assert [n for n, _ in take(s, 3, 0.0, 10)] == [*order[0], order[1][0]]  # a batch is left midway at the limit
    assert [n for n, _ in take(s, 100, 0.0, 10)] == [order[1][1], *order[2], *order[3], *order[4]]


def test_subscription_without_topic_delivers_nothing():
    s = SubscriptionState(2, "projects/p/subscriptions/s", None, Subscription())
    assert s.shards == [] and s.backlog() == 0
    assert not s.has_ready(0.0)
    assert take(s, 10, 0.0, 10) == []
    assert s.ack([0, 64]) == []
    assert s.export_state() == ([], [])


def test_acks_ahead_of_the_cursor_and_behind_it_shape_the_next_take():
    _, s = _sub(published=(10,))
    assert take(s, 4, 0.0, 10) == [(num(o, 0), 1) for o in range(4)]  # a first stream holds 0-3
    assert s.ack([num(2, 0)]) == [num(2, 0)]  # acked behind the cursor: the next run may skip checks
    assert s.ack([num(6, 0)]) == [num(6, 0)]  # acked before it was handed out (an ack id of an earlier life)
    assert take(s, 10, 0.0, 10) == [(num(o, 0), 1) for o in (4, 5, 7, 8, 9)]
    assert take(s, 10, 0.0, 10) == []


def test_a_keys_resend_keeps_members_acked_meanwhile_even_past_the_floor():
    """A nack sends its key's later messages back with it, acked or not (Pub/Sub's rule: after a redelivery every
    later message of the key comes again). Found by a full run (the official client: beta ended at 28 after 29):
    a resend cut by flow control leaves the key's last message waiting in its redo list; the client acks that
    message's first delivery meanwhile, every message before it is acked too, the ack floor moves past it — and
    the resend skipped it as no longer there. It is in the log as long as the topic indexes it: it goes out."""
    t = TopicState(1, "projects/p/topics/t", None, 1)
    s = SubscriptionState(2, "projects/p/subscriptions/s", t, Subscription(enable_message_ordering=True))
    t.shards[0].append(6, 0, 0, key=7)  # messages 0..5 of one key
    t.shards[0].durable = t.shards[0].visible = 6
    assert take(s, 10, 0.0, 10) == [(num(i, 0), 1) for i in range(6)]
    s.ack([num(1, 0)])
    assert modify_deadline(s, num(0, 0), 1, 0, 0.0)  # a nack of 0: 0..5 go back, 1 acked among them
    again = take(s, 4, 0.0, 10)  # room for four
    assert again == [(num(0, 0), 2), (num(1, 0), 1), (num(2, 0), 2), (num(3, 0), 2)]
    s.ack([num(4, 0), num(5, 0)])  # the first delivery's acks of 4 and 5, arriving late
    s.ack([num(0, 0), num(2, 0), num(3, 0)])  # the resend's: every message of the key is acked now
    assert s.shards[0].floor == 6
    assert take(s, 10, 0.0, 10) == [(num(4, 0), 1), (num(5, 0), 1)]  # the rest of the resend, acked meanwhile
    assert take(s, 10, 0.0, 10) == [] and not s.leases
