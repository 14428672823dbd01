"""End to end: the limits that keep clients from exhausting a server — project and server quotas on resources,
open streams, streams whose client never reads, publishes waiting to be written. Each refusal is
RESOURCE_EXHAUSTED naming the limit, changes nothing, and the server keeps serving everyone else."""

from __future__ import annotations

import asyncio
import collections
import re
import threading
import time

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.pubsub_v1 import types

from e2e_helpers import E2E_MARKS, client_factory, collect, raw_publish  # noqa: F401 (fixture)

pytestmark = E2E_MARKS

P = "limits-proj"
MiB = 1024 * 1024


class QuietStream:
    """A StreamingPull whose client sends its first request and never reads a response (grpc's own channel, so the
    HTTP/2 window fills and the server's write waits)."""

    def __init__(self, address: str, subscription: str, max_messages: int = 1000):
        # its receive window fixed: left to grow with gRPC's bandwidth probe, a client that reads nothing took in
        # a few MB a stream on a busy machine before the server's write waited, and eight of them took every
        # message of the test again and again as its lease ran out, ahead of the reader that polls
        self.channel = grpc.insecure_channel(address, options=[("grpc.http2.bdp_probe", 0)])
        self.done = threading.Event()
        call = self.channel.stream_stream(
            "/google.pubsub.v1.Subscriber/StreamingPull",
            request_serializer=types.StreamingPullRequest.serialize,
            response_deserializer=types.StreamingPullResponse.deserialize,
        )
        self.call = call(self._requests(subscription, max_messages), timeout=120)

    def _requests(self, subscription, max_messages):
        yield types.StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=10,
                                         max_outstanding_messages=max_messages)
        self.done.wait(120)

    def ended(self, timeout: float) -> grpc.StatusCode | None:
        """The status once the server ended the call (None if it has not within `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.call.is_active():
                return self.call.code()
            time.sleep(0.1)
        return None

    def close(self):
        self.done.set()
        self.call.cancel()
        self.channel.close()


def test_a_burst_of_calls_is_answered_whole_while_the_loop_catches_up(server, client_factory):
    """8,000 calls at once over 10 connections: the event loop takes them from gRPC one at a time, so thousands
    wait in gRPC meanwhile. With gRPC's default bounds on that queue, 40-50 % of them ended CANCELLED — no log,
    and a status the client cannot tell from a cancel of its own. Every one is answered."""
    pub, _ = client_factory(server)
    topic = pub.create_topic(name=f"projects/{P}/topics/burst").name
    request = types.GetTopicRequest.serialize(types.GetTopicRequest(topic=topic))

    async def burst(n: int, connections: int) -> collections.Counter:
        opts = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own each
        channels = [grpc.aio.insecure_channel(server.address, options=opts) for _ in range(connections)]
        try:
            for c in channels:
                await c.channel_ready()
            calls = [c.unary_unary("/google.pubsub.v1.Publisher/GetTopic") for c in channels]

            async def one(i: int) -> str:
                try:
                    await calls[i % connections](request, timeout=60)
                    return "OK"
                except grpc.aio.AioRpcError as e:
                    return e.code().name

            return collections.Counter(await asyncio.gather(*(one(i) for i in range(n))))
        finally:
            for c in channels:
                await c.close()

    assert asyncio.run(burst(8_000, 10)) == {"OK": 8_000}
    assert pub.get_topic(topic=topic).name == topic  # and the server serves on


def test_project_quotas_refuse_in_pubsubs_words_and_hold_across_a_restart(server_factory, client_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("PIGEON_TOPICS_PER_PROJECT", "3")
    monkeypatch.setenv("PIGEON_SUBSCRIPTIONS_PER_PROJECT", "2")
    data = str(tmp_path / "data")
    srv = server_factory(data_dir=data)
    pub, sub = client_factory(srv)
    topics = [pub.create_topic(name=f"projects/{P}/topics/t-{i}").name for i in range(3)]
    with pytest.raises(gexc.ResourceExhausted) as e:
        pub.create_topic(name=f"projects/{P}/topics/t-3", retry=None)
    assert 'Your project has exceeded a limit: (type="topics-per-project", current=3, maximum=3).' in str(e.value)
    pub.create_topic(name="projects/other-proj/topics/t-0")  # each project has its own
    for i in range(2):
        sub.create_subscription(name=f"projects/{P}/subscriptions/s-{i}", topic=topics[0])
    with pytest.raises(gexc.ResourceExhausted, match='type="subscriptions-per-project", current=2, maximum=2'):
        sub.create_subscription(name=f"projects/{P}/subscriptions/s-2", topic=topics[0], retry=None)
    listed = sorted(t.name for t in pub.list_topics(project=f"projects/{P}"))
    assert listed == topics, "a refused create changed nothing"

    srv.stop()  # the count is rebuilt from the log: a restart does not reset it
    srv = server_factory(data_dir=data)
    pub, sub = client_factory(srv)
    with pytest.raises(gexc.ResourceExhausted, match="topics-per-project"):
        pub.create_topic(name=f"projects/{P}/topics/t-3", retry=None)
    pub.delete_topic(topic=topics[2])  # room again
    pub.create_topic(name=f"projects/{P}/topics/t-3")


def test_open_streams_are_bounded_and_a_closed_one_makes_room(server_factory, client_factory, monkeypatch):
    monkeypatch.setenv("PIGEON_STREAMS_MAX", "3")
    srv = server_factory()
    pub, sub = client_factory(srv)
    topic = pub.create_topic(name=f"projects/{P}/topics/streams").name
    s = sub.create_subscription(name=f"projects/{P}/subscriptions/streams", topic=topic).name
    unary = sub.create_subscription(name=f"projects/{P}/subscriptions/unary", topic=topic).name
    held = [QuietStream(srv.address, s) for _ in range(3)]
    try:
        time.sleep(0.5)  # the three are open on the server
        extra = QuietStream(srv.address, s)
        assert extra.ended(10) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "streams_max: 3" in extra.call.details()
        extra.close()
        held.pop().close()
        raw_publish(pub, topic, [{"data": b"after"}])
        got = collect(sub, unary, 1, timeout=15)  # unary pull still works, and so does a new stream:
        assert [r.message.data for r in got.values()] == [b"after"]
        again = QuietStream(srv.address, s)
        assert again.ended(1.5) is None, "a stream fits again once one closed"
        held.append(again)
    finally:
        for q in held:
            q.close()


def test_streams_that_never_read_hold_one_fair_share_each_and_readers_get_everything(server_factory, client_factory,
                                                                                    monkeypatch):
    """Clients that open streams and never read: each is given one response of at most its fair share of the
    budget (the budget over the open streams, one message at least) and nothing more; readers on the same
    subscription and on others are not held up by them; what the quiet streams were handed goes to a reader
    once its ack deadline passed; and the server says which clients leave responses untaken."""
    monkeypatch.setenv("PIGEON_STREAM_UNSENT_BYTES", str(4 * MiB))
    monkeypatch.setenv("PIGEON_STREAM_WRITE_STALL_S", "1")
    srv = server_factory()
    pub, sub = client_factory(srv)
    topic = pub.create_topic(name=f"projects/{P}/topics/quiet").name
    s = sub.create_subscription(name=f"projects/{P}/subscriptions/quiet", topic=topic,
                                ack_deadline_seconds=10).name
    other = sub.create_subscription(name=f"projects/{P}/subscriptions/reader", topic=topic).name
    blob = b"x" * (300 * 1024)
    ids = []
    for i in range(8):
        ids += raw_publish(pub, topic, [{"data": blob, "attributes": {"i": str(i * 8 + j)}} for j in range(8)])

    # share: 4 MiB / 8 streams = 512 KiB, so one message a response. What a quiet client's HTTP/2 window takes
    # in is in its memory, not the server's; the response that no longer fits is the one the server holds.
    quiet = [QuietStream(srv.address, s) for _ in range(8)]
    try:
        got = collect(sub, other, len(ids), timeout=30)  # a reader elsewhere is served meanwhile
        assert set(got) == set(ids)
        # a reader of the same subscription gets everything: at once what the quiet ones were not handed, the
        # rest once its ack deadline passed (a stream whose write waits is given nothing more)
        got = collect(sub, s, len(ids), timeout=60)
        assert set(got) == set(ids)
        assert all(q.call.is_active() for q in quiet), "a client that stops reading is not cut off by this"
        deadline = time.monotonic() + 15
        while srv.log().count("has left a response of") < 8 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for q in quiet:
            q.close()
    with open(srv.log_path) as f:
        log = f.read()
    assert "Traceback" not in log, "a client that leaves is not an error"
    held = [int(n) for n in re.findall(r"has left a response of (\d+) bytes untaken", log)]
    assert held, log
    assert sum(held) <= 2 * 4 * MiB + len(held) * 310 * 1024, f"the quiet streams hold more than twice the " \
                                                                f"budget: {held}"


def test_publishes_waiting_to_be_written_are_bounded(server_factory, client_factory, monkeypatch):
    """With a tiny budget and fsync on every write, concurrent big publishes: some are refused with the limit's
    name (the client library retries those), none is lost, and every accepted one is durable."""
    monkeypatch.setenv("PIGEON_PUBLISH_PENDING_BYTES", str(2 * MiB))
    srv = server_factory()
    pub, sub = client_factory(srv)
    topic = pub.create_topic(name=f"projects/{P}/topics/pending").name
    s = sub.create_subscription(name=f"projects/{P}/subscriptions/pending", topic=topic).name
    blob = b"y" * MiB
    refused, accepted, errors = [], [], []

    def one(i):
        try:
            accepted.extend(raw_publish(pub, topic, [{"data": blob, "attributes": {"i": str(i)}}]))
        except gexc.ResourceExhausted as e:
            refused.append(str(e))
        except Exception as e:  # noqa: BLE001 — handed to the test
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert refused, "24 concurrent 1 MiB publishes against a 2 MiB budget: some must wait their turn"
    assert all("publish_pending_bytes: 2 MiB" in r for r in refused)
    assert len(accepted) + len(refused) == 24
    got = collect(sub, s, len(accepted), timeout=30)
    assert set(got) == set(accepted)
    # and the default client, which retries RESOURCE_EXHAUSTED, gets every one through
    futures = [pub.publish(topic, blob, i=str(100 + i)) for i in range(12)]
    published = [f.result(timeout=120) for f in futures]
    got = collect(sub, s, len(published), timeout=30)
    assert set(published) <= set(got)
