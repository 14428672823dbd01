"""The engine in-process on a simulated clock: retention, leases, seek, snapshots, segment deletion and
restart equivalence. Real files (fsync=never: durability itself is the e2e suites' business)."""

from __future__ import annotations

import asyncio
import os

import pytest
from google.protobuf import field_mask_pb2
from google.pubsub_v1 import types

from pigeon.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from pigeon.node.engine import Engine
from pigeon.ops.config import Config
from pigeon.storage import records as R
from pigeon.testing.clock import SimClock

PB = {n: getattr(types, n).pb() for n in ("Topic", "Subscription", "PublishRequest", "PubsubMessage", "ReceivedMessage",
                                         "PullResponse")}
PB["FieldMask"] = field_mask_pb2.FieldMask
T = "projects/p/topics/topic-a"
S = "projects/p/subscriptions/sub-a"


def run(coro):
    return asyncio.run(coro)


def config(tmp_path, **kw) -> Config:
    base = dict(data_dir=str(tmp_path / "data"), fsync="never", shards_per_topic=2)
    base.update(kw)
    return Config(**base)


async def started(cfg, clock) -> Engine:
    e = Engine(cfg, clock)
    await e.start()
    e._maintenance.cancel()  # the tests drive maintenance themselves
    return e


def request(topic: str, datas: list[bytes], **attrs) -> tuple[bytes, int]:
    msgs = [PB["PubsubMessage"](data=d, attributes=attrs) for d in datas]
    return PB["PublishRequest"](topic=topic, messages=msgs).SerializeToString(), len(msgs)


async def publish(e: Engine, datas: list[bytes], topic: str = T) -> list[str]:
    raw, n = request(topic, datas)
    return await e.publish(topic, raw, n, "")


def received(entries: list[bytes]):
    return list(PB["PullResponse"].FromString(b"".join(entries)).received_messages)


async def pull_all(e: Engine, sub: str = S, n: int = 1000):
    return received(await e.delivery.pull(sub, n, True))


async def setup(e: Engine, **sub_fields):
    await e.create_topic(PB["Topic"](name=T))
    await e.create_subscription(PB["Subscription"](name=S, topic=T, **sub_fields))


def test_messages_round_trip_with_ids_and_publish_time(tmp_path):
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path), clock)
        await setup(e)
        ids = await publish(e, [b"a", b"b", b"c"])
        got = await pull_all(e)
        assert sorted(m.message.data for m in got) == [b"a", b"b", b"c"]
        assert {m.message.message_id for m in got} == set(ids)
        assert all(m.message.publish_time.seconds == 1_700_000_000 for m in got)
        assert all(m.delivery_attempt == 0 for m in got)  # no dead-letter policy
        await e.stop()

    run(go())


def test_lease_expiry_redelivers_and_ack_is_final(tmp_path):
    async def go():
        clock = SimClock()
        e = await started(config(tmp_path), clock)
        await setup(e, ack_deadline_seconds=10)
        await publish(e, [b"x", b"y"])
        first = await pull_all(e)
        assert len(first) == 2
        assert await pull_all(e) == []  # locked
        await e.delivery.acknowledge(S, [first[0].ack_id])
        clock.advance(9.9)
        assert await pull_all(e) == []
        clock.advance(0.2)
        again = await pull_all(e)
        assert [m.message.data for m in again] == [first[1].message.data]
        assert again[0].ack_id != first[1].ack_id  # a new delivery version
        await e.delivery.acknowledge(S, [again[0].ack_id])
        clock.advance(3600)
        assert await pull_all(e) == []
        await e.stop()

    run(go())


def test_nack_and_modack(tmp_path):
    async def go():
        clock = SimClock()
        e = await started(config(tmp_path), clock)
        await setup(e)
        await publish(e, [b"m"])
        (m,) = await pull_all(e)
        await e.delivery.modify_ack_deadline(S, [m.ack_id], 60)
        clock.advance(30)
        assert await pull_all(e) == []  # extended past the 10 s default
        await e.delivery.modify_ack_deadline(S, [m.ack_id], 0)  # nack
        (again,) = await pull_all(e)
        assert again.message.data == b"m"
        with pytest.raises(InvalidArgument):
            await e.delivery.modify_ack_deadline(S, [again.ack_id], 601)
        with pytest.raises(InvalidArgument):
            await e.delivery.acknowledge(S, ["not-an-ack-id"])
        await e.stop()

    run(go())


def test_restart_keeps_acks_and_redelivers_unacked(tmp_path):
    async def go():
        clock = SimClock()
        cfg = config(tmp_path)
        e = await started(cfg, clock)
        await setup(e)
        await publish(e, [b"%d" % i for i in range(10)])
        got = await pull_all(e)
        acked = {m.message.data for m in got[:4]}
        await e.delivery.acknowledge(S, [m.ack_id for m in got[:4]])
        await e.stop()
        e2 = await started(cfg, clock)
        assert await pull_all(e2) == []  # the locks survive the restart, until their deadline
        await e2.delivery.acknowledge(S, [got[4].ack_id])  # so an ack id from before the restart still acks
        clock.advance(10)
        again = await pull_all(e2)
        assert {m.message.data for m in again} == {b"%d" % i for i in range(10)} - acked - {got[4].message.data}
        assert {m.delivery_attempt for m in again} == {0}  # not shown without a dead-letter policy
        assert e2.get_subscription(S).topic == T
        await e2.stop()

    run(go())


def test_restart_from_checkpoint_equals_restart_from_wal(tmp_path):
    async def go():
        clock = SimClock()
        cfg = config(tmp_path)
        e = await started(cfg, clock)
        await setup(e)
        await publish(e, [b"a%d" % i for i in range(20)])
        got = await pull_all(e, n=7)
        await e.delivery.acknowledge(S, [m.ack_id for m in got])
        await e.checkpoint()
        await publish(e, [b"b%d" % i for i in range(5)])
        more = await pull_all(e, n=1000)
        await e.delivery.acknowledge(S, [m.ack_id for m in more if m.message.data.startswith(b"b")])
        expect = sorted(m.message.data for m in more if m.message.data.startswith(b"a"))
        await e.journal.close()  # a crash after the checkpoint: no final checkpoint
        e2 = await started(cfg, clock)
        assert e2.report.checkpoint is not None and e2.report.replayed_records > 0
        clock.advance(10)  # the locks of the pulls before the crash run out
        assert sorted(m.message.data for m in await pull_all(e2)) == expect
        await e2.stop()

    run(go())


def test_retention_drops_old_unacked_messages(tmp_path):
    async def go():
        clock = SimClock()
        e = await started(config(tmp_path), clock)
        await setup(e, message_retention_duration={"seconds": 600})
        await publish(e, [b"old"])
        clock.advance(601)
        await publish(e, [b"new"])
        await e.maintain_once()
        assert [m.message.data for m in await pull_all(e)] == [b"new"]
        await e.stop()

    run(go())


def test_seek_to_time_and_snapshot(tmp_path):
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path), clock)
        await setup(e, retain_acked_messages=True)
        await publish(e, [b"one"])
        clock.advance(10)
        middle = clock.now()
        await publish(e, [b"two"])
        got = await pull_all(e)
        await e.delivery.acknowledge(S, [m.ack_id for m in got])
        assert await pull_all(e) == []
        await e.seek(S, int(middle * 1000), None)  # "two" becomes unacked again, "one" stays acked
        assert [m.message.data for m in await pull_all(e)] == [b"two"]
        await e.seek(S, 0, None)
        back = await pull_all(e)
        assert sorted(m.message.data for m in back) == [b"one", b"two"]
        snap = await e.create_snapshot("projects/p/snapshots/snap-a", S, {})
        assert snap.topic == T
        await e.delivery.acknowledge(S, [m.ack_id for m in back])
        await e.seek(S, None, "projects/p/snapshots/snap-a")
        assert sorted(m.message.data for m in await pull_all(e)) == [b"one", b"two"]
        with pytest.raises(AlreadyExists):
            await e.create_snapshot("projects/p/snapshots/snap-a", S, {})
        with pytest.raises(NotFound):
            await e.seek(S, None, "projects/p/snapshots/missing")
        await e.stop()

    run(go())


@pytest.mark.parametrize("restart", ["replay", "checkpoint"])
def test_an_ack_of_a_delivery_before_a_seek_acks_nothing(tmp_path, restart):
    """The client acks and seeks at once; its batched Acknowledge arrives after the Seek. The message is unacked
    again by the seek and must come back — before and after a restart (from the log, or from a checkpoint)."""
    async def go():
        clock = SimClock(1_700_000_000.0)
        cfg = config(tmp_path)
        e = await started(cfg, clock)
        await setup(e, ack_deadline_seconds=10)
        await e.create_snapshot("projects/p/snapshots/before", S, {})
        await publish(e, [b"m"])
        first = await pull_all(e)
        await e.seek(S, None, "projects/p/snapshots/before")
        await e.delivery.acknowledge(S, [first[0].ack_id])  # issued before the seek: acks nothing
        again = await pull_all(e)
        assert [m.message.data for m in again] == [b"m"]
        assert again[0].ack_id != first[0].ack_id
        if restart == "checkpoint":
            await e.checkpoint()
        await e.journal.close()  # a crash: recovery replays the seek, or reads the checkpoint
        e = await started(cfg, clock)
        await e.delivery.acknowledge(S, [first[0].ack_id])  # still nothing
        clock.advance(11)  # the lease of `again` runs out: unacked, it comes back
        third = await pull_all(e)
        assert [m.message.data for m in third] == [b"m"]
        await e.delivery.acknowledge(S, [third[0].ack_id])  # issued after the seek: acks
        clock.advance(11)
        assert await pull_all(e) == []
        await e.stop()

    run(go())


def test_seek_to_snapshot_of_another_topic_fails(tmp_path):
    async def go():
        clock = SimClock()
        e = await started(config(tmp_path), clock)
        await setup(e)
        await e.create_topic(PB["Topic"](name=T + "-2"))
        await e.create_subscription(PB["Subscription"](name=S + "-2", topic=T + "-2"))
        await e.create_snapshot("projects/p/snapshots/other", S + "-2", {})
        with pytest.raises(FailedPrecondition):
            await e.seek(S, None, "projects/p/snapshots/other")
        await e.stop()

    run(go())


def test_snapshot_expires(tmp_path):
    async def go():
        clock = SimClock()
        e = await started(config(tmp_path), clock)
        await setup(e)
        await e.create_snapshot("projects/p/snapshots/snap-b", S, {})
        clock.advance(7 * 86400 + 1)
        await e.maintain_once()
        with pytest.raises(NotFound):
            e.get_snapshot("projects/p/snapshots/snap-b")
        await e.stop()

    run(go())


def test_acked_segments_are_deleted(tmp_path):
    async def go():
        clock = SimClock()
        cfg = config(tmp_path, segment_bytes=16 * 1024 * 1024 + 1, checkpoint_wal_bytes=1)
        e = await started(cfg, clock)
        await setup(e)
        payload = b"x" * 1_000_000
        for _ in range(40):  # ~40 MB: at least two segments
            await publish(e, [payload])
        wal_dir = os.path.join(cfg.data_dir, "wal")
        assert len(os.listdir(wal_dir)) >= 3
        while got := await pull_all(e, n=100):
            await e.delivery.acknowledge(S, [m.ack_id for m in got])
        for _ in range(3):  # two checkpoints must lie past the acked data before segments go
            await e.maintain_once()
            await publish(e, [b"tick"])
        assert len(os.listdir(wal_dir)) == 1
        await e.stop()
        e2 = await started(cfg, clock)  # and the state still recovers
        assert [m.message.data for m in await pull_all(e2)] == [b"tick"] * 3
        await e2.stop()

    run(go())


def test_segments_a_ledger_store_borrows_from_are_kept_until_it_lets_them_go(tmp_path):
    """A cluster node's ledger store borrows its own copies from the journal (node.ledger_store): the segments
    from the floor it names stay, whatever the checkpoints allow, until it names none."""
    async def go():
        clock = SimClock()
        cfg = config(tmp_path, segment_bytes=16 * 1024 * 1024 + 1, checkpoint_wal_bytes=1)
        e = await started(cfg, clock)
        await setup(e)
        for i in range(40):  # ~40 MB: at least two segments
            if i == 20:
                floor = e.journal.tail
            await publish(e, [b"x" * 1_000_000])
        e.journal_floor = lambda: floor
        wal_dir = os.path.join(cfg.data_dir, "wal")
        while got := await pull_all(e, n=100):
            await e.delivery.acknowledge(S, [m.ack_id for m in got])
        for _ in range(3):
            await e.maintain_once()
            await publish(e, [b"tick"])
        starts = sorted(int(f.split(".")[0]) for f in os.listdir(wal_dir))
        assert len(starts) >= 2 and starts[0] <= floor < starts[1], "cut up to the floor's segment, not past it"
        e.journal_floor = lambda: None
        await e.maintain_once()
        await publish(e, [b"tick"])
        await e.maintain_once()
        assert len(os.listdir(wal_dir)) == 1
        await e.stop()

    run(go())


def test_deleted_topic_leaves_subscription_with_backlog(tmp_path):
    async def go():
        clock = SimClock()
        cfg = config(tmp_path)
        e = await started(cfg, clock)
        await setup(e)
        await publish(e, [b"keep"])
        await e.delete_topic(T)
        assert e.get_subscription(S).topic == "_deleted-topic_"
        with pytest.raises(NotFound):
            await publish(e, [b"nope"])
        await e.create_topic(PB["Topic"](name=T))  # the name can be reused
        await e.stop()
        e2 = await started(cfg, clock)
        assert e2.get_subscription(S).topic == "_deleted-topic_"
        assert [m.message.data for m in await pull_all(e2)] == [b"keep"]
        assert e2.get_topic(T).name == T
        await e2.stop()

    run(go())


def test_update_subscription_mask_rules(tmp_path):
    async def go():
        e = await started(config(tmp_path), SimClock())
        await setup(e)
        upd = PB["Subscription"](name=S, ack_deadline_seconds=30)
        mask = PB["FieldMask"](paths=["ack_deadline_seconds"])
        assert (await e.update_subscription(upd, mask)).ack_deadline_seconds == 30
        with pytest.raises(InvalidArgument):
            await e.update_subscription(PB["Subscription"](name=S, filter="x"), PB["FieldMask"](paths=["filter"]))
        with pytest.raises(InvalidArgument):
            await e.update_subscription(upd, PB["FieldMask"]())
        await e.stop()

    run(go())


def test_detach_drops_backlog_and_refuses_pulls(tmp_path):
    async def go():
        e = await started(config(tmp_path), SimClock())
        await setup(e)
        await publish(e, [b"gone"])
        await e.detach_subscription(S)
        assert e.get_subscription(S).detached
        with pytest.raises(FailedPrecondition):
            await e.delivery.pull(S, 10, True)
        assert e.state.sub(S).backlog() == 0
        await e.stop()

    run(go())


def test_inactive_subscription_expires(tmp_path):
    async def go():
        clock = SimClock()
        e = await started(config(tmp_path), clock)
        day = 86400  # the ttl must be at least the retention (1 day here)
        short = dict(expiration_policy={"ttl": {"seconds": day}}, message_retention_duration={"seconds": day})
        await setup(e, **short)
        await e.create_subscription(PB["Subscription"](name=S + "-busy", topic=T, **short))
        await e.create_subscription(PB["Subscription"](name=S + "-forever", topic=T, expiration_policy={}))
        clock.advance(day - 400)
        await e.delivery.pull(S + "-busy", 1, True)  # activity resets the clock
        clock.advance(1000)
        await e.maintain_once()
        with pytest.raises(NotFound):
            e.get_subscription(S)
        assert e.get_subscription(S + "-busy").name == S + "-busy"
        assert e.get_subscription(S + "-forever").name == S + "-forever"
        await e.stop()

    run(go())


def test_statistics_are_plain_values_of_every_part(tmp_path):
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path, fsync="always"), clock)
        await setup(e, ack_deadline_seconds=10)
        await publish(e, [b"a", b"b", b"c"])
        clock.advance(5)
        got = await pull_all(e, n=2)
        await e.delivery.acknowledge(S, [got[0].ack_id])
        clock.advance(11)  # the other pulled message's lease runs out
        assert len(await pull_all(e)) == 2  # it and the third one
        stream = e.delivery.open_stream(S, "client", 10, 100, 0)
        st = e.statistics()
        (sub,) = st.subscriptions
        assert (sub.undelivered, sub.outstanding, sub.delivered, sub.acked, sub.expired) == (2, 2, 4, 1, 1)
        assert sub.oldest_unacked_age_s == 16.0
        assert [s.client_id for s in st.streams] == ["client"] and st.streams[0].held == 0
        assert st.topics == 1
        assert st.journal.syncs >= 1 and st.journal.group_commits >= 1 and st.journal.failed == ""
        assert st.journal.sync_buckets[-1] <= st.journal.syncs
        assert {lg.log_id for lg in st.journal.logs} == {0, e.state.log_of(R.Ack(e.state.sub(S).uid, []), 16)}
        assert all(lg.durable <= lg.end for lg in st.journal.logs)
        assert st.reader.cached_batches >= 1
        e.delivery.close_stream(stream)
        assert e.statistics().streams == ()
        await e.stop()

    run(go())


def test_batches_every_subscription_acked_leave_the_read_cache(tmp_path):
    """The cache holds what is still to be read: once every subscription acked a batch, maintenance drops it
    (memory follows the unconsumed window, not the cache's bound); a batch one subscription still needs stays."""
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path, fsync="always"), clock)
        await setup(e)
        await e.create_subscription(PB["Subscription"](name=S + "-slow", topic=T))
        await publish(e, [b"a"])
        await publish(e, [b"b"])
        got = await pull_all(e)  # read from the journal into the cache
        await e.delivery.acknowledge(S, [m.ack_id for m in got])
        await e.maintain_once()
        assert [m.message.data for m in got] == [b"a", b"b"] and e.reader.statistics().cached_batches == 2  # the slow subscription has read neither
        (first,) = await pull_all(e, S + "-slow", n=1)
        await e.delivery.acknowledge(S + "-slow", [first.ack_id])
        await e.maintain_once()
        st = e.reader.statistics()
        assert st.cached_batches == 1 and 0 < st.cached_bytes
        rest = await pull_all(e, S + "-slow")
        assert [m.message.data for m in rest] == [b"b"]
        await e.delivery.acknowledge(S + "-slow", [m.ack_id for m in rest])
        await e.maintain_once()
        assert e.reader.statistics() == type(st)(st.disk_reads, 0, 0)
        await e.stop()

    run(go())


def test_a_loaded_log_is_served_once_its_state_is_durable_with_its_messages_read_from_the_ledgers(tmp_path,
                                                                                                   monkeypatch):
    """A new owner applies the log it read back from the ledgers (load_log) without copying it: each batch is named
    by its log address and read when delivered (the reader's fetcher: here the entries themselves stand in for
    the ledgers). Nothing is handed out before the state it built is durable in the journal; a pull that finds a
    batch not yet read gives it back untaken and is answered once it was read."""
    import threading

    from pigeon.broker import commands
    from pigeon.core.bundles import bundle_log, log_address
    from pigeon.node import disk as disk_mod
    from pigeon.node.reader import batch_of_entry

    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path), clock)
        await setup(e)
        t = e.state.topic(T)
        log_id = bundle_log(T, e.config.bundles)
        raw, n = request(T, [b"x", b"y"])
        rec = commands.publish(t, raw, n, "", int(clock.now() * 1000))
        entries = [(rec.TYPE, b"".join(rec.parts()))]
        asked = []

        async def fetch(address):  # the ledger holding offsets 5.. of the log
            asked.append(address)
            e.reader.remember(address, batch_of_entry(entries[address - log_address(log_id, 5)][1]))
        e.reader.fetcher = fetch
        gate = threading.Event()
        real = disk_mod.OsDisk.commit

        def held_commit(self, handle, chunks, sync, post, end):  # the group commit's write
            gate.wait(10)
            return real(self, handle, chunks, sync, post, end)

        monkeypatch.setattr(disk_mod.OsDisk, "commit", held_commit)
        loaded = asyncio.ensure_future(e.load_log(log_id, entries, 5))
        for _ in range(20):
            await asyncio.sleep(0.005)
            assert await pull_all(e) == [], "handed out before its state was durable"
        assert not loaded.done()
        gate.set()
        await asyncio.wait_for(loaded, 10)
        assert e.state.topic(T).shards[rec.shard].pos.tolist() == [log_address(log_id, 5)]
        got = received(await e.delivery.pull(S, 1000, False, time_left_s=5.0))
        assert sorted(m.message.data for m in got) == [b"x", b"y"]
        assert asked == [log_address(log_id, 5)], "read from its ledger once, not from the journal"
        await e.stop()

    run(go())


def test_no_checkpoint_is_written_while_a_hand_overs_homing_is_not_held_by_its_logs_quorum(tmp_path):
    """(broker.log_state.landings_pending; tests/unit/test_shard_landing.py shows what such a checkpoint lost.)"""
    async def go():
        e = await started(config(tmp_path), SimClock())
        await setup(e)
        await publish(e, [b"m"])
        t = e.state.topic(T)
        t.landed[0] = (2, 1, None, None)  # a ShardIn of this node homed shard 0 in log 2, not yet held there
        before = list(e.checkpoints.positions)
        await e.checkpoint()
        assert e.checkpoints.positions == before
        del t.landed[0]  # the log's quorum holds it
        await e.checkpoint()
        assert e.checkpoints.positions[-1] == e.journal.tail != (before or [None])[-1]
        await e.stop()

    run(go())
