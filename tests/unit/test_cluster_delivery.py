"""A delivery in a cluster (the cluster simulator's nodes: the real executor over replicated logs): its lease is
taken as soon as its batch is committed — the Deliver record follows the Publish record into the same log, so one
quorum round trip covers both — and its messages go out only once that record is held by Qa members and their
publisher has its answer (a subscriber never gets a message before its publisher's answer is on its way)."""

from __future__ import annotations

import asyncio

import pytest
from google.pubsub_v1 import types

from pigeon.broker.topic import SHARD_MASK
from pigeon.core import ackid, limits
from pigeon.core.errors import Unavailable
from pigeon.testing import simloop
from pigeon.testing.simcluster import ClusterSim
from pigeon.testing.simnode import BUNDLES

_Req, _Msg, _Resp = (getattr(types, n).pb() for n in ("PublishRequest", "PubsubMessage", "PullResponse"))


pytestmark = pytest.mark.usefixtures("quiet_logs")


async def _started(sim: ClusterSim):
    """The simulated cluster at work: its first topic, that topic's plain subscription, and their owner."""
    await sim.start_workload()
    topic = sim.topics[0]
    return topic, topic.replace("/topics/", "/subscriptions/") + "-plain", sim.owner_of(0)


async def _waiting_stream(e, sub: str):
    """A stream of `sub` on `e` (60 s leases) and its first `stream_next`, waiting (a task)."""
    stream = e.delivery.open_stream(sub, "client", 60, 100, 1 << 20)
    sent = asyncio.ensure_future(e.delivery.stream_next(stream))
    await asyncio.sleep(0.1)
    return stream, sent


async def _one_leased_ahead(sim: ClusterSim):
    """`_started`, then a stream at the owner waiting for messages, "one" published and leased, and "two" published
    and leased while "one"'s lease is on its way to the members: (the owner, the subscription's state, the stream,
    its first `stream_next` — a task —, the two publishes)."""
    topic, sub, node = await _started(sim)
    s = node.engine.state.subs[sub]
    stream, sent = await _waiting_stream(node.engine, sub)
    return node, s, stream, sent, await _publish_while_leasing(node.engine, topic, s, [b"one", b"two"])


async def _publish_while_leasing(e, topic: str, s, datas: list[bytes]) -> list[asyncio.Future]:
    """Publish each of `datas` on `e` (the owner) once the one before is leased — in turns of the loop, no time
    passing: the members have not answered the earlier lease's record yet. The publishes, unanswered."""
    publishes = []
    for data in datas:
        raw = _Req(topic=topic, messages=[_Msg(data=data)]).SerializeToString()
        publishes.append(asyncio.ensure_future(e.publish(topic, raw, 1, "")))
        for _ in range(1000):
            if len(s.leases) == len(publishes):
                break
            await asyncio.sleep(0)
    return publishes


def test_a_delivery_is_leased_before_its_publish_is_durable_and_sent_after_its_publisher_is_answered():
    sim = ClusterSim(5, steps=0)

    async def go():
        topic, sub, node = await _started(sim)
        e = node.engine
        stream, sent = await _waiting_stream(e, sub)
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
        topic, sub, node = await _started(sim)
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
    Publish record instead of waiting for the earlier round trip to end, then for one of its own. Recorded by
    the time the first goes out, it goes with it, in one response (gRPC writes a stream's responses one at a
    time: as a second response it waited for the first one's write). (Links of one delay: with rounds to a
    quorum, R4, "one"'s round and "two"'s go to different members, which answer both at once only then.)"""
    sim = ClusterSim(5, steps=0)
    sim.net.delay_s = sim.net.delay_s[:1] * 2

    async def go():
        node, s, stream, sent, publishes = await _one_leased_ahead(sim)
        e = node.engine
        assert len(s.leases) == 2 and not any(p.done() for p in publishes), \
            "b'two' waited for an earlier lease's round trip"
        first = _Resp.FromString(b"".join(await asyncio.wait_for(sent, 5))).received_messages
        assert [m.message.data for m in first] == [b"one", b"two"] and not stream.unsent
        e.delivery.close_stream(stream)

    simloop.run(go())


def test_deliveries_recorded_meanwhile_go_in_one_response_up_to_its_limit(monkeypatch):
    """… but no more messages than a response holds (limits.stream_response_messages_max): the rest go next."""
    monkeypatch.setattr(limits, "stream_response_messages_max", 1)
    sim = ClusterSim(5, steps=0)

    async def go():
        node, s, stream, sent, _ = await _one_leased_ahead(sim)
        e = node.engine
        first = _Resp.FromString(b"".join(await asyncio.wait_for(sent, 5))).received_messages
        second = _Resp.FromString(b"".join(await asyncio.wait_for(e.delivery.stream_next(stream), 5)))
        assert [m.message.data for m in (*first, *second.received_messages)] == [b"one", b"two"]
        e.delivery.close_stream(stream)

    simloop.run(go())


def test_a_stream_broken_by_a_hand_over_sends_what_it_had_leased_before_it_ends(monkeypatch):
    """A stream holds deliveries whose leases are recorded and not sent yet (limits.stream_deliveries_ahead) when
    a shard of its topic is handed to another owner: those leases ride to the shard's new home in the pair's image,
    and nothing there would send the messages before their deadline (a drain across a load planner's split stalled
    a minute on a few thousand of them). The stream sends them before it ends; the client acks them at the new
    owner, through the stream that follows."""
    monkeypatch.setattr(limits, "stream_response_messages_max", 1)  # ("two" is not sent with "one")
    sim = ClusterSim(5, steps=0)

    async def go():
        node, s, stream, sent, _ = await _one_leased_ahead(sim)
        e, topic, sub = node.engine, sim.topics[0], s.name
        first = _Resp.FromString(b"".join(await asyncio.wait_for(sent, 5))).received_messages
        assert [m.message.data for m in first] == [b"one"] and len(stream.unsent) == 1
        ahead = next(num for num in s.leases if ackid.parse(s.uid, first[0].ack_id, s.generations)[0] != num)
        shard = ahead & SHARD_MASK
        src = e.state.shard_logs(e.state.topics[topic], BUNDLES)[shard]
        other = next(n for n in sim.nodes.values() if n is not node)
        to_log = next(log for log in range(1, BUNDLES + 1) if log != src and other.engine.owns(log))
        await node.call(lambda: node.cluster.handovers.hand_over(topic, shard, to_log))
        new = other.engine.state.subs[sub]
        assert ahead in new.leases, "the lease rode to the new home"
        stream.error = Unavailable("A shard of the topic is moving to another node; retry.")  # (an ack refused)

        got = _Resp.FromString(b"".join(await asyncio.wait_for(e.delivery.stream_next(stream), 5)))
        assert [m.message.data for m in got.received_messages] == [b"two"], "the recorded lease went out"
        with pytest.raises(Unavailable):
            await e.delivery.stream_next(stream)
        other.engine.delivery.ack_nowait(new, [got.received_messages[0].ack_id])
        assert ahead not in new.leases, "its ack holds at the new owner"
        e.delivery.close_stream(stream)

    simloop.run(go())
