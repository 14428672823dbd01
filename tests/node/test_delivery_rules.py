"""Ordering keys, retry backoff and dead-lettering, in-process on a simulated clock."""

from __future__ import annotations

import asyncio

from test_engine import PB, S, T, config, pull_all, setup, started

from pigeon.testing.clock import SimClock

DLT = "projects/p/topics/dead-letters"
DLS = "projects/p/subscriptions/dead-letters-sub"


def run(coro):
    return asyncio.run(coro)


async def publish_keyed(e, datas, key):
    msgs = [PB["PubsubMessage"](data=d, ordering_key=key) for d in datas]
    raw = PB["PublishRequest"](topic=T, messages=msgs).SerializeToString()
    return await e.publish(T, raw, len(msgs), key)


def data(ms):
    return [m.message.data for m in ms]


def test_one_outstanding_batch_per_key_in_publish_order(tmp_path):
    async def go():
        e = await started(config(tmp_path), SimClock())
        await setup(e, enable_message_ordering=True)
        await publish_keyed(e, [b"a1"], "A")
        await publish_keyed(e, [b"a2"], "A")
        await publish_keyed(e, [b"b1"], "B")
        first = await pull_all(e)
        assert sorted(data(first)) == [b"a1", b"b1"]  # a2 waits behind a1
        assert await pull_all(e) == []
        a1 = next(m for m in first if m.message.data == b"a1")
        await e.delivery.acknowledge(S, [a1.ack_id])
        assert data(await pull_all(e)) == [b"a2"]
        await e.stop()

    run(go())


def test_keys_are_independent(tmp_path):
    async def go():
        e = await started(config(tmp_path), SimClock())
        await setup(e, enable_message_ordering=True)
        await publish_keyed(e, [b"a1"], "A")
        assert data(await pull_all(e)) == [b"a1"]  # A is now blocked (unacked)
        for i in range(5):
            await publish_keyed(e, [b"a-late"], "A")
            await publish_keyed(e, [b"b%d" % i], "B%d" % i)
        got = data(await pull_all(e))
        assert sorted(got) == [b"b%d" % i for i in range(5)]
        await e.stop()

    run(go())


def test_redelivery_sends_later_messages_of_the_batch_back_even_if_acked(tmp_path):
    async def go():
        e = await started(config(tmp_path), SimClock())
        await setup(e, enable_message_ordering=True)
        await publish_keyed(e, [b"k1", b"k2", b"k3"], "K")
        await publish_keyed(e, [b"k4"], "K")
        batch = await pull_all(e)
        assert data(batch) == [b"k1", b"k2", b"k3"]
        by = {m.message.data: m for m in batch}
        await e.delivery.acknowledge(S, [by[b"k1"].ack_id, by[b"k3"].ack_id])
        await e.delivery.modify_ack_deadline(S, [by[b"k2"].ack_id], 0)  # nack k2
        again = await pull_all(e)
        assert data(again) == [b"k2", b"k3"]  # k3 comes back with it, in order; k4 still waits
        await e.delivery.acknowledge(S, [m.ack_id for m in again])
        assert data(await pull_all(e)) == [b"k4"]
        await e.stop()

    run(go())


def test_ordered_lease_expiry_redelivers_in_order(tmp_path):
    async def go():
        clock = SimClock()
        e = await started(config(tmp_path), clock)
        await setup(e, enable_message_ordering=True, ack_deadline_seconds=10)
        await publish_keyed(e, [b"x1", b"x2"], "X")
        assert data(await pull_all(e)) == [b"x1", b"x2"]
        clock.advance(11)
        assert data(await pull_all(e)) == [b"x1", b"x2"]
        await e.stop()

    run(go())


def test_retry_backoff_grows_exponentially(tmp_path):
    async def go():
        clock = SimClock()
        e = await started(config(tmp_path), clock)
        await setup(e, retry_policy={"minimum_backoff": {"seconds": 10}, "maximum_backoff": {"seconds": 15}})
        await e.publish(T, *_plain(b"r"), "")
        (m,) = await pull_all(e)
        await e.delivery.modify_ack_deadline(S, [m.ack_id], 0)
        clock.advance(9)
        assert await pull_all(e) == []
        clock.advance(1.5)
        (m,) = await pull_all(e)
        await e.delivery.modify_ack_deadline(S, [m.ack_id], 0)
        clock.advance(14)  # second failure: min(15, 10 * 2) = 15 s
        assert await pull_all(e) == []
        clock.advance(1.5)
        assert data(await pull_all(e)) == [b"r"]
        await e.stop()

    run(go())


def _plain(d: bytes):
    raw = PB["PublishRequest"](topic=T, messages=[PB["PubsubMessage"](data=d)]).SerializeToString()
    return raw, 1


async def _dead_letter_setup(e):
    await e.create_topic(PB["Topic"](name=T))
    await e.create_topic(PB["Topic"](name=DLT))
    await e.create_subscription(PB["Subscription"](name=DLS, topic=DLT))
    await e.create_subscription(PB["Subscription"](
        name=S, topic=T, dead_letter_policy={"dead_letter_topic": DLT, "max_delivery_attempts": 5}))


async def _settle(e):
    for _ in range(20):
        await asyncio.sleep(0.01)
        if not e.delivery.dead_letters_in_flight:
            return


def test_dead_letter_after_max_attempts(tmp_path):
    async def go():
        e = await started(config(tmp_path), SimClock())
        await _dead_letter_setup(e)
        ids = await e.publish(T, *_plain(b"poison"), "")
        for attempt in range(1, 6):
            (m,) = await pull_all(e)
            assert m.delivery_attempt == attempt
            await e.delivery.modify_ack_deadline(S, [m.ack_id], 0)
        assert await pull_all(e) == []  # the sixth hand-out forwards instead
        await _settle(e)
        (dead,) = await pull_all(e, DLS)
        assert dead.message.data == b"poison"
        attrs = dict(dead.message.attributes)
        assert attrs["CloudPubSubDeadLetterSourceSubscription"] == "sub-a"
        assert attrs["CloudPubSubDeadLetterSourceSubscriptionProject"] == "p"
        assert attrs["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
        assert attrs["CloudPubSubDeadLetterSourceTopicPublishTime"].endswith("Z")
        assert dead.message.message_id != ids[0]
        assert e.state.sub(S).backlog() == 0  # acked on the source
        await e.stop()

    run(go())


def test_delivery_attempts_survive_restart(tmp_path):
    async def go():
        clock = SimClock()
        cfg = config(tmp_path)
        e = await started(cfg, clock)
        await _dead_letter_setup(e)
        await e.publish(T, *_plain(b"again"), "")
        for _ in range(3):
            (m,) = await pull_all(e)
            await e.delivery.modify_ack_deadline(S, [m.ack_id], 0)
        await e.journal.close()  # crash: no checkpoint
        e2 = await started(cfg, clock)
        (m,) = await pull_all(e2)
        assert m.delivery_attempt == 4
        await e2.delivery.modify_ack_deadline(S, [m.ack_id], 0)
        await e2.checkpoint()  # and through a checkpoint
        await e2.stop()
        e3 = await started(cfg, clock)
        (m,) = await pull_all(e3)
        assert m.delivery_attempt == 5
        await e3.delivery.modify_ack_deadline(S, [m.ack_id], 0)
        assert await pull_all(e3) == []
        await _settle(e3)
        assert data(await pull_all(e3, DLS)) == [b"again"]
        await e3.stop()

    run(go())


def test_dead_lettering_unblocks_an_ordering_key(tmp_path):
    async def go():
        e = await started(config(tmp_path), SimClock())
        await e.create_topic(PB["Topic"](name=T))
        await e.create_topic(PB["Topic"](name=DLT))
        await e.create_subscription(PB["Subscription"](
            name=S, topic=T, enable_message_ordering=True,
            dead_letter_policy={"dead_letter_topic": DLT, "max_delivery_attempts": 5}))
        await publish_keyed(e, [b"bad"], "K")
        await publish_keyed(e, [b"good"], "K")
        for _ in range(5):
            (m,) = await pull_all(e)
            assert m.message.data == b"bad"
            await e.delivery.modify_ack_deadline(S, [m.ack_id], 0)
        got = data(await pull_all(e))
        assert got == [b"good"]
        await e.stop()

    run(go())


def test_filter_delivers_only_matches_and_acks_the_rest(tmp_path):
    async def go():
        clock = SimClock()
        cfg = config(tmp_path)
        e = await started(cfg, clock)
        await setup(e, filter='attributes.kind = "red" OR hasPrefix(attributes.kind, "dark")')
        for kind in ["red", "blue", "darkred", ""]:
            attrs = {"kind": kind} if kind else {}
            msgs = [PB["PubsubMessage"](data=b"m-" + kind.encode(), attributes=attrs)]
            raw = PB["PublishRequest"](topic=T, messages=msgs).SerializeToString()
            await e.publish(T, raw, 1, "")
        await e.publish(T, *_plain(b"no-attributes"), "")
        assert sorted(data(await pull_all(e))) == [b"m-darkred", b"m-red"]
        assert e.state.sub(S).backlog() == 2  # the others are acked, not merely skipped
        await e.stop()
        e2 = await started(cfg, clock)  # and a restart agrees
        clock.advance(10)  # once the locks of the pull before it ran out
        assert sorted(data(await pull_all(e2))) == [b"m-darkred", b"m-red"]
        await e2.stop()

    run(go())


def test_bad_filter_is_rejected_with_its_position(tmp_path):
    async def go():
        import pytest
        from pigeon.core.errors import InvalidArgument

        e = await started(config(tmp_path), SimClock())
        await e.create_topic(PB["Topic"](name=T))
        with pytest.raises(InvalidArgument, match="position"):
            await e.create_subscription(PB["Subscription"](name=S, topic=T, filter='attributes:a AND attributes:b OR attributes:c'))
        await e.stop()

    run(go())


def test_hot_key_is_visible(tmp_path):
    async def go():
        from pigeon.broker.topic import key_hash

        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path), clock)
        await setup(e, enable_message_ordering=True)
        for i in range(5):
            await publish_keyed(e, [b"hot%d" % i], "HOT")
            clock.advance(1)
        await publish_keyed(e, [b"cold"], "COLD")
        await pull_all(e)  # HOT's first batch is out; the rest of HOT waits behind it
        rows = e.state.sub(S).hot_keys()
        assert rows[0][0] == key_hash("HOT") and rows[0][1] == 5
        assert rows[0][2] == 1_700_000_000_000  # its oldest waiting message
        await e.stop()

    run(go())
