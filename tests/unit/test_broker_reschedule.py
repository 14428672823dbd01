"""Retention of rescheduled messages in the broker: a message's retention counts from its latest reschedule's
activation when that is later than its publish. Driven by records applied by BrokerState.apply, as the executor
does; after every step the live state, a replay of the log (recovery, a replica) and a checkpoint read back agree,
and each hands the job out when it is due."""

from __future__ import annotations

from pigeon.broker import commands, images
from pigeon.broker.dispatch import activation_of
from pigeon.broker.resources import Subscription, Topic
from pigeon.broker.state import BrokerState
from pigeon.core import ackid, limits
from pigeon.storage import checkpoint as ck
from pigeon.storage import records as R

T = "projects/p/topics/jobs"
S = "projects/p/subscriptions/workers"
RETENTION = 600
T0 = 1_700_000_000.0
SUB = 2


def n(offset: int, shard: int = 0) -> int:
    return offset << limits.shard_bits | shard


class Broker:
    """A live state and the log of every record applied to it."""

    def __init__(self, shards: int = 1):
        self.log: list[R.Record] = []
        self.state = BrokerState()
        self.commit(R.TopicPut(1, shards, Topic(name=T).SerializeToString()))
        cfg = Subscription(name=S, topic=T, message_retention_duration={"seconds": RETENTION})
        self.commit(R.SubPut(SUB, 1, cfg.SerializeToString(), [0] * shards))

    def commit(self, rec: R.Record):
        self.log.append(rec)
        out = self.state.apply(rec, len(self.log))
        self.state.all_durable()
        return out

    @property
    def sub(self):
        return self.state.subs_by_uid[SUB]

    def publish(self, count: int, now: float, shard: int = 0) -> None:
        ix = self.state.topics_by_uid[1].shards[shard]
        self.commit(R.Publish(1, shard, ix.next, int(now * 1000), count, 0, b""))

    def take(self, now: float, state: BrokerState | None = None) -> list[int]:
        """Hand out what is ready at `now` (leased for 60 s): from the live state, or from `state` (a copy)."""
        s = (state or self.state).subs_by_uid[SUB]
        picks = s.take(100, now)
        if not picks:
            return []
        rec = picks.record(SUB, now + 60)
        if state is None:
            self.commit(rec)
        else:
            state.apply(rec)
        return [num for num, _ in picks.out]

    def retention(self, now: float) -> list[R.Record]:
        recs = commands.retention(self.state, now)
        for rec in recs:
            self.commit(rec)
        self.state.trim_indexes(now)
        return recs

    def replayed(self, now: float) -> BrokerState:
        """What recovery (or a replica) builds from the log."""
        r = BrokerState()
        r.dispatch_off()
        for at, rec in enumerate(self.log, 1):
            r.apply(rec, at)
        r.rebuild(now)
        r.trim_indexes(now)
        return r

    def restored(self, now: float) -> BrokerState:
        """What a restart from a checkpoint of the live state builds."""
        buf = b"".join(ck.encode(ck.Header(0, self.state.next_uid), images.meta_records(self.state),
                                 images.images(self.state)))
        _, meta, imgs = ck.decode(buf)
        r = BrokerState()
        for rec in meta:
            r.apply(rec)
        for image in imgs:
            r.restore(image)
        r.rebuild(now)
        return r

    def copies(self, now: float) -> list[BrokerState]:
        """The replay and the checkpoint, each checked to hold the live durable state (locks that ran out by
        `now` ended, as the copies' `rebuild` ends them)."""
        self.sub.expire(now)
        out = [self.replayed(now), self.restored(now)]
        for r in out:
            assert durable(r) == durable(self.state)
        return out


def durable(r: BrokerState) -> tuple:
    s = r.subs_by_uid[SUB]
    ixs = r.topics_by_uid[1].shards
    return (s.export_state(), sorted(s.export_leases()), dict(s.versions), dict(s.parked), sorted(s.kept),
            [(ix.first(), ix.next) for ix in ixs])


def test_a_rescheduled_job_outlives_its_publish_by_its_activations_and_goes_once_they_are_past():
    b = Broker()
    job = n(0)
    b.publish(1, T0)  # the job
    b.publish(3, T0)  # other work, done at once
    assert sorted(b.take(T0)) == [n(0), n(1), n(2), n(3)]
    b.commit(R.Ack(SUB, [n(1), n(2), n(3)]))
    b.commit(R.Park(SUB, int((T0 + 300) * 1000), [job]))

    now = T0 + RETENTION + 50  # past the retention of its publish; its activation (+300) is not
    recs = b.retention(now)
    assert recs == [R.Trim(SUB, 0, 4, keeps_rescheduled=True)]  # everything below the end, but …
    s = b.sub
    assert s.shards[0].floor == 4 and s.kept == {job} and not s.is_acked(job)  # … the job stays, unacked
    assert s.backlog() == 1
    assert b.state.topics_by_uid[1].shards[0].first() == 0, "its batch stays in the index"
    for copy in b.copies(now):
        assert b.take(now, copy) == [job]  # due: delivered once, also after a restart
    assert b.take(now) == [job]
    assert s.leases[job][1] == 2  # the second delivery

    b.commit(R.Park(SUB, int((now + 300) * 1000), [job]))  # rescheduled again: active at T0 + 950
    assert b.take(T0 + 900) == []
    for now in (T0 + 1200, T0 + 1500):
        assert b.retention(now) == []  # its latest activation is younger than the retention
        b.copies(now)
        if now == T0 + 1200:
            assert b.take(now) == [job]
    # taken at +1200, neither acked nor rescheduled (its lock runs out): it stays, and goes once its latest
    # activation (+950) is older than the retention
    now = T0 + 950 + RETENTION + 1
    assert b.retention(now) == [R.Ack(SUB, [job])]
    assert s.is_acked(job) and not s.kept and not s.parked and not s.leases and not s.versions and s.backlog() == 0
    assert b.state.topics_by_uid[1].shards[0].first() == 4, "and its batch goes"
    for copy in b.copies(now):
        assert b.take(now, copy) == []


def test_a_message_never_rescheduled_goes_by_its_publish_time():
    b = Broker(shards=2)
    b.publish(2, T0, shard=0)  # 0: left unacked, 1: buried
    b.publish(1, T0, shard=1)  # rescheduled into the past: its activation counts for nothing
    b.take(T0)
    b.commit(R.Park(SUB, -1, [n(1)]))
    b.commit(R.Park(SUB, int((T0 - 3600) * 1000), [n(0, 1)]))
    assert b.retention(T0 + RETENTION - 1) == []
    now = T0 + RETENTION + 1
    assert b.retention(now) == [R.Trim(SUB, 0, 2), R.Trim(SUB, 1, 1, keeps_rescheduled=True), R.Ack(SUB, [n(0, 1)])]
    s = b.sub
    assert all(s.is_acked(m) for m in (n(0), n(1), n(0, 1)))
    assert not s.parked and not s.kept and not s.versions and not s.leases and s.backlog() == 0
    for copy in b.copies(now):
        assert b.take(now, copy) == []


def test_a_job_buried_after_a_reschedule_keeps_its_activation_and_a_kick_gives_it_back():
    b = Broker()
    job = n(0)
    b.publish(1, T0)
    b.take(T0)
    at = int((T0 + 100) * 1000)
    b.commit(R.Park(SUB, at, [job]))
    assert b.take(T0 + 100) == [job]
    b.commit(R.Park(SUB, -1, [job]))  # buried: kept with the activation it had
    s = b.sub
    assert s.parked[job] < -1 and activation_of(s.parked[job]) == at and s.buried() == [job]
    now = T0 + RETENTION + 10  # past its publish, not past its activation
    assert b.retention(now) == [R.Trim(SUB, 0, 1, keeps_rescheduled=True)]
    assert s.kept == {job} and b.take(now) == []  # kept, and still buried
    b.copies(now)
    b.commit(R.Kick(SUB, [job]))
    assert s.parked[job] == at  # active again, retention still counting from its activation
    for copy in b.copies(now):
        assert b.take(now, copy) == [job]
    assert b.take(now) == [job]
    assert s.ack([job]) == [job]  # acked below the floor: it leaves `kept`, the floor stays
    assert s.is_acked(job) and not s.kept and not s.parked and s.shards[0].floor == 1 and not s.shards[0].acked


def test_an_ack_id_from_before_a_reschedule_acks_nothing_while_the_job_waits():
    b = Broker()
    job = n(0)
    b.publish(1, T0)
    b.take(T0)
    old = ackid.make(SUB, job, 1)
    b.commit(R.Park(SUB, int((T0 + 100) * 1000), [job]))
    assert commands.acks(b.sub, [old], T0 + 99)[0] == []  # the reschedule won
    assert commands.acks(b.sub, [old], T0 + 101)[0] == [job]  # due and not locked: a late ack acks, as before


def test_a_due_rescheduled_message_goes_out_once_after_a_restart():
    """Rebuilt, it comes back by the redelivery queue only, not by the walk from the floor too (it did both,
    handed out twice in one response, while its parking was forgotten on activation)."""
    b = Broker()
    b.publish(2, T0)
    b.take(T0)
    b.commit(R.Park(SUB, int((T0 + 5) * 1000), [n(0)]))
    now = T0 + 100  # activation and the other lock are over
    for copy in b.copies(now):
        assert sorted(b.take(now, copy)) == [n(0), n(1)]


def test_a_trim_of_an_earlier_release_drops_rescheduled_messages_as_it_did_when_written():
    """A Trim record without the flag (every one an earlier release wrote) replays as it was applied then: it drops
    the rescheduled messages below it too — their batches may be gone from the journal since."""
    b = Broker()
    job = n(0)
    b.publish(2, T0)
    b.take(T0)
    b.commit(R.Park(SUB, int((T0 + RETENTION * 2) * 1000), [job]))
    b.commit(R.Trim(SUB, 0, 2))
    s = b.sub
    assert s.is_acked(job) and not s.kept and not s.parked
    old = R.Trim(SUB, 0, 2)
    assert b"".join(old.parts()) == b"".join(R.Trim(SUB, 0, 2, False).parts())  # the bytes it always had
    for rec in (old, R.Trim(SUB, 0, 2, keeps_rescheduled=True)):
        assert R.decode(R.RecordType.TRIM, b"".join(rec.parts())) == rec
