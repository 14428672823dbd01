"""A delivery in a cluster (the cluster simulator's nodes: the real executor over replicated logs): its lease is
taken as soon as its batch is committed — the Deliver record follows the Publish record into the same log, so one
quorum round trip covers both — and its messages go out only once that record is held by Qa members and their
publisher has its answer (a subscriber never gets a message before its publisher's answer is on its way)."""

from __future__ import annotations

import asyncio

import pytest
from google.pubsub_v1 import types

from pigeon.core import ackid
from pigeon.testing import simloop
from pigeon.testing.simcluster import ClusterSim

_Req, _Msg, _Resp = (getattr(types, n).pb() for n in ("PublishRequest", "PubsubMessage", "PullResponse"))


pytestmark = pytest.mark.usefixtures("quiet_logs")


def test_a_delivery_is_leased_before_its_publish_is_durable_and_sent_after_its_publisher_is_answered():
    sim = ClusterSim(5, steps=0)

    async def go():
        await sim.start_workload()
        topic = sim.topics[0]
        sub = topic.replace("/topics/", "/subscriptions/") + "-plain"
        e = sim.owner_of(0).engine
        stream = e.delivery.open_stream(sub, "client", 60, 100, 1 << 20)
        sent = asyncio.ensure_future(e.delivery.stream_next(stream))
        await asyncio.sleep(0.1)
        assert not sent.done()
        answers: list = []
        raw = _Req(topic=topic, messages=[_Msg(data=b"one")]).SerializeToString()
        publish = asyncio.ensure_future(e.publish(topic, raw, 1, "", answered=answers.append))
        s = e.state.subs[sub]
        for _ in range(1000):  # (turns of the loop, no time passing: the members have not answered yet)
            if s.leases:
                break
            await asyncio.sleep(0)
        assert s.leases and not publish.done(), "the lease waited for the publish's round trip"
        ids = await publish
        await asyncio.sleep(1)
        assert not sent.done(), "a message went out before its publisher's answer"
        answers.pop()()  # the publisher's handler has its answer
        got = _Resp.FromString(b"".join(await asyncio.wait_for(sent, 5))).received_messages
        assert [m.message.message_id for m in got] == ids and got[0].message.data == b"one"
        e.delivery.close_stream(stream)

    simloop.run(go())


def test_a_delivery_whose_lease_ran_out_while_it_was_recorded_is_not_sent():
    """A node paused (SIGSTOP) right after it sent a Deliver record finds the members' answers waiting when it runs
    again: the record is confirmed — the members had it before any fence — but the lease it took ran out while the
    node stood still, and the log's next owner may have handed the message out and had it acknowledged meanwhile.
    Sent then, it came to its subscriber after that ack (a round of faults: 234 messages). Such a delivery is
    dropped; the message goes out again under a new lease."""
    sim = ClusterSim(5, steps=0)

    async def go():
        await sim.start_workload()
        topic = sim.topics[0]
        sub = topic.replace("/topics/", "/subscriptions/") + "-plain"
        node = sim.owner_of(0)
        e = node.engine
        raw = _Req(topic=topic, messages=[_Msg(data=b"one")]).SerializeToString()
        await e.publish(topic, raw, 1, "")
        s = e.state.subs[sub]
        stream = e.delivery.open_stream(sub, "client", 10, 100, 1 << 20)
        sent = asyncio.ensure_future(e.delivery.stream_next(stream))
        for _ in range(1000):  # (turns of the loop, no time passing: its Deliver record is on its way)
            if s.leases:
                break
            await asyncio.sleep(0)
        first = dict(s.leases)
        assert first and not sent.done()
        e.clock.skew += 11  # the node stood still past the lease (10 s) while the members answered
        got = _Resp.FromString(b"".join(await asyncio.wait_for(sent, 30))).received_messages
        assert [m.message.data for m in got] == [b"one"]
        (num, lease), = first.items()
        assert ackid.parse(s.uid, got[0].ack_id, s.generations) == (num, lease[1] + 1), \
            "not sent under a new lease"
        e.delivery.close_stream(stream)

    simloop.run(go())


def test_a_message_published_while_an_earlier_lease_is_recorded_is_leased_at_once():
    """A stream whose delivery waits for its lease's record takes what is published meanwhile at once (up to
    limits.stream_deliveries_ahead deliveries): that message's Deliver record rides to the members with its
    Publish record instead of waiting for the earlier round trip to end, then for one of its own."""
    sim = ClusterSim(5, steps=0)

    async def go():
        await sim.start_workload()
        topic = sim.topics[0]
        sub = topic.replace("/topics/", "/subscriptions/") + "-plain"
        e = sim.owner_of(0).engine
        s = e.state.subs[sub]
        stream = e.delivery.open_stream(sub, "client", 60, 100, 1 << 20)
        sent = asyncio.ensure_future(e.delivery.stream_next(stream))
        await asyncio.sleep(0.1)
        publishes = []
        for data in (b"one", b"two"):
            raw = _Req(topic=topic, messages=[_Msg(data=data)]).SerializeToString()
            publishes.append(asyncio.ensure_future(e.publish(topic, raw, 1, "")))
            for _ in range(1000):  # (turns of the loop, no time passing: the members have not answered yet)
                if len(s.leases) == len(publishes):
                    break
                await asyncio.sleep(0)
            assert len(s.leases) == len(publishes) and not any(p.done() for p in publishes), \
                f"{data!r} waited for an earlier lease's round trip"
        first = _Resp.FromString(b"".join(await asyncio.wait_for(sent, 5))).received_messages
        second = _Resp.FromString(b"".join(await asyncio.wait_for(e.delivery.stream_next(stream), 5)))
        assert [m.message.data for m in (*first, *second.received_messages)] == [b"one", b"two"]
        e.delivery.close_stream(stream)

    simloop.run(go())
