"""A single node with `--topic-layout spread`: every shard of a topic is the node's own, each in a log of its own in
the node's journal; through the official client everything works as with a topic together — publish with and
without keys, streaming pull with acks, seek — and a kill -9 and restart rebuild the same state from the logs."""

from __future__ import annotations

import os
import threading

import pytest

from pigeon.testing.cluster import stop_subscriber
from pigeon.testing.server import ServerProcess

pytestmark = pytest.mark.e2e

P = "projects/spread1"


def _clients(address: str):
    from google.cloud import pubsub_v1

    saved = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = address
    try:
        return pubsub_v1.PublisherClient(publisher_options=pubsub_v1.types.PublisherOptions(
            enable_message_ordering=True)), pubsub_v1.SubscriberClient()
    finally:
        if saved is None:
            del os.environ["PUBSUB_EMULATOR_HOST"]
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = saved


def _stream(sub, name: str, want: int) -> dict[str, str]:
    got: dict[str, str] = {}
    lock, done = threading.Lock(), threading.Event()

    def callback(msg):
        with lock:
            got[msg.message_id] = msg.data.decode()
            if len(got) >= want:
                done.set()
        msg.ack()

    future = sub.subscribe(name, callback)
    try:
        assert done.wait(30), f"{len(got)} of {want}"
    finally:
        stop_subscriber(future)
    return got


def test_a_spread_topic_on_one_node_serves_and_survives_a_kill(tmp_path):
    data = str(tmp_path / "data")
    srv = ServerProcess(data, env={"PIGEON_TOPIC_LAYOUT": "spread"}).start()
    try:
        pub, sub = _clients(srv.address)
        topic, name = f"{P}/topics/wide", f"{P}/subscriptions/every-shard"
        pub.create_topic(name=topic)
        sub.create_subscription(request={"name": name, "topic": topic, "retain_acked_messages": True})
        sent = {pub.publish(topic, f"m{i}".encode(), ordering_key=f"k{i % 5}" if i % 2 else "").result(timeout=30):
                f"m{i}" for i in range(200)}
        assert len({int(m) & 63 for m in sent}) == 4  # every shard took some
        assert _stream(sub, name, 200) == sent
        srv.kill()
        srv.start()  # the acks and the topic's layout come back from the shards' logs
        pub, sub = _clients(srv.address)
        r = sub.pull(subscription=name, max_messages=10, return_immediately=True, timeout=20)
        assert list(r.received_messages) == []
        sub.seek(request={"subscription": name, "time": {"seconds": 0}})  # every shard's, its generation bumped
        assert _stream(sub, name, 200) == sent
        with open(os.path.join(data, "FORMAT")) as f:
            assert f.read() == "pigeon-data 2\n"
    finally:
        srv.kill()
