"""Any node answers for every topic: with three real nodes, the official clients publish through one node,
pull and stream through others, and every call about a bundle another node owns is forwarded to it — messages
arrive once, acks stick, errors come back as the owner gave them."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from google.api_core import exceptions as gexc

from pigeon.testing.cluster import clients_of, owners, topic_owned_by

pytestmark = pytest.mark.e2e

P = "projects/route"


def test_publish_pull_stream_and_ack_through_nodes_that_do_not_own_the_topic(three_nodes, etcd):
    owner_of = owners(etcd.endpoint)
    topic = topic_owned_by(owner_of, "n1", f"{P}/topics/routed")  # owned by n1; used through n2 and n3
    (pub1, sub1), (pub2, sub2), (pub3, sub3) = (clients_of(three_nodes[i]) for i in ("n1", "n2", "n3"))
    pub2.create_topic(name=topic)
    sub3.create_subscription(name=f"{P}/subscriptions/pulled", topic=topic)
    sub3.create_subscription(name=f"{P}/subscriptions/streamed", topic=topic)

    sent = {pub2.publish(topic, f"m{i}".encode(), k=str(i)).result(timeout=30): f"m{i}" for i in range(100)}
    assert len(sent) == 100

    got: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while len(got) < 100 and time.monotonic() < deadline:  # unary pull and ack through n3
        r = sub3.pull(subscription=f"{P}/subscriptions/pulled", max_messages=50, timeout=10)
        got.update({m.message.message_id: m.message.data.decode() for m in r.received_messages})
        if r.received_messages:
            sub3.acknowledge(subscription=f"{P}/subscriptions/pulled", ack_ids=[m.ack_id for m in r.received_messages])
    assert got == sent

    streamed: dict[str, str] = {}
    done = threading.Event()

    def callback(msg):
        streamed[msg.message_id] = msg.data.decode()
        msg.ack()
        if len(streamed) == 100:
            done.set()

    future = sub2.subscribe(f"{P}/subscriptions/streamed", callback)  # StreamingPull through n2
    try:
        assert done.wait(30), f"{len(streamed)} of 100 streamed"
    finally:
        future.cancel()
        future.result(timeout=30) if not future.done() else None
    assert streamed == sent

    time.sleep(1)  # acks sent on the stream reach the owner; then nothing comes back
    for sub in ("pulled", "streamed"):
        r = sub1.pull(subscription=f"{P}/subscriptions/{sub}", max_messages=10, return_immediately=True, timeout=10)
        assert list(r.received_messages) == [], sub


def test_the_owners_errors_come_back_as_it_gave_them(three_nodes, etcd):
    owner_of = owners(etcd.endpoint)
    topic = topic_owned_by(owner_of, "n2", f"{P}/topics/errors")
    (pub1, sub1), (pub2, sub2) = clients_of(three_nodes["n1"]), clients_of(three_nodes["n2"])
    with pytest.raises(gexc.NotFound, match="Resource not found"):  # published through n1, answered by n2
        pub1.publish(topic, b"x").result(timeout=30)
    pub2.create_topic(name=topic)
    sub1.create_subscription(request={"name": f"{P}/subscriptions/eod", "topic": topic,
                                      "enable_exactly_once_delivery": True})
    errors = []
    for sub in (sub1, sub2):  # forwarded by n1; answered by n2 itself
        with pytest.raises(gexc.InvalidArgument) as e:
            sub.acknowledge(subscription=f"{P}/subscriptions/eod", ack_ids=["not-an-ack-id"])
        errors.append((e.value.message, e.value.reason, e.value.domain, dict(e.value.metadata or {})))
    assert errors[0] == errors[1]
    assert errors[0][1] and errors[0][2] == "pubsub.googleapis.com"  # the ErrorInfo came along


def test_where_a_subscription_starts_and_where_a_seek_goes_are_the_owners_to_say(three_nodes, etcd):
    """A subscription created through another node starts at the owner's end of the topic (it gets only what is
    published after it), and a snapshot and a seek through another node act on the owner's state."""
    topic = topic_owned_by(owners(etcd.endpoint), "n3", f"{P}/topics/starts")
    (pub1, sub1), (pub3, _) = clients_of(three_nodes["n1"]), clients_of(three_nodes["n3"])
    pub1.create_topic(name=topic)
    sub1.create_subscription(name=f"{P}/subscriptions/early", topic=topic)
    for i in range(20):
        pub3.publish(topic, f"old{i}".encode()).result(timeout=30)
    late = f"{P}/subscriptions/late"
    sub1.create_subscription(name=late, topic=topic)  # through n1, which holds no messages of n3's topic
    pub3.publish(topic, b"new").result(timeout=30)
    r = sub1.pull(subscription=late, max_messages=50, timeout=10)
    assert [m.message.data for m in r.received_messages] == [b"new"]
    sub1.acknowledge(subscription=late, ack_ids=[m.ack_id for m in r.received_messages])

    snap = f"{P}/snapshots/before"
    early = f"{P}/subscriptions/early"
    sub1.create_snapshot(name=snap, subscription=early)  # the early subscription's 21 unacked messages
    got = []
    while len(got) < 21:
        r = sub1.pull(subscription=early, max_messages=50, timeout=10)
        got += [m.message.data for m in r.received_messages]
        sub1.acknowledge(subscription=early, ack_ids=[m.ack_id for m in r.received_messages])
    sub1.seek(request={"subscription": early, "snapshot": snap})
    again = []
    while len(again) < 21:
        r = sub1.pull(subscription=early, max_messages=50, timeout=10)
        again += [m.message.data for m in r.received_messages]
        sub1.acknowledge(subscription=early, ack_ids=[m.ack_id for m in r.received_messages])
    assert sorted(again) == sorted(got) and len(set(got)) == 21


def test_the_queue_extensions_are_answered_by_the_owner(three_nodes, etcd):
    """pigeon.v1.Queue (take, ack, peek, delete …) through a node that does not own the topic."""
    from pigeon.client import PigeonClient

    topic = topic_owned_by(owners(etcd.endpoint), "n2", f"{P}/topics/queue")
    pub, sub = clients_of(three_nodes["n1"])
    pub.create_topic(name=topic)
    name = f"{P}/subscriptions/jobs"
    sub.create_subscription(name=name, topic=topic)
    ids = [pub.publish(topic, f"job{i}".encode()).result(timeout=30) for i in range(5)]
    q = PigeonClient(three_nodes["n3"].address)
    try:
        assert q.peek(name, ids[0]).message.data == b"job0"
        assert q.delete(name, [ids[1]]) == 1
        taken = q.take(name, 10, lock=30)
        assert sorted(t.data for t in taken) == [b"job0", b"job2", b"job3", b"job4"]
        assert q.ack(name, [t.ack_id for t in taken]) == 4
        assert q.take(name, 10) == []
    finally:
        q.close()


def test_any_node_answers_the_figures_of_every_bundle(three_nodes, etcd):
    """pigeon.v1.Monitoring (the console's figures) through one node: each subscription's backlog as its bundle's
    owner counts it, whichever node owns it; the cluster's nodes and bundle owners."""
    import grpc

    from pigeon.api.proto import pigeon_monitoring_pb2 as m

    owner_of = owners(etcd.endpoint)
    pub, sub = clients_of(three_nodes["n1"])
    counts, published = {}, {}
    for node, n in (("n1", 3), ("n2", 5), ("n3", 7)):
        topic = topic_owned_by(owner_of, node, f"{P}/topics/figures-{node}")
        pub.create_topic(name=topic)
        sub.create_subscription(name=f"{P}/subscriptions/figures-{node}", topic=topic)
        for f in [pub.publish(topic, b"x") for _ in range(n)]:
            f.result(timeout=30)
        counts[f"{P}/subscriptions/figures-{node}"] = (n, node)
        published[topic] = n

    with grpc.insecure_channel(three_nodes["n3"].address) as ch:
        call = lambda method, req, resp: ch.unary_unary(  # noqa: E731
            f"/pigeon.v1.Monitoring/{method}", request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=resp.FromString)(req, timeout=30)
        got = call("ListSubscriptionStats", m.ListStatsRequest(project=P), m.ListSubscriptionStatsResponse)
        figures = {s.name: (s.num_undelivered_messages, s.node) for s in got.subscriptions
                   if s.name.startswith(f"{P}/subscriptions/figures-")}
        assert figures == counts
        page = call("ListSubscriptionStats", m.ListStatsRequest(project=P, page_size=1, page_token=min(counts)),
                    m.ListSubscriptionStatsResponse)
        assert [s.name for s in page.subscriptions] == [sorted(counts)[1]]  # pages merge in name order
        topics = call("ListTopicStats", m.ListStatsRequest(project=P), m.ListTopicStatsResponse)
        assert {t.name: t.messages for t in topics.topics if "figures-" in t.name} == published
        st = call("GetClusterStatus", m.GetClusterStatusRequest(), m.ClusterStatus)
        assert st.clustered and st.answered_by == "n3"
        assert sorted((n.node, n.state) for n in st.nodes) == [("n1", "up"), ("n2", "up"), ("n3", "up")]
        assert len(st.owners) == st.bundles and st.unowned == 0


def test_nodes_reach_each_other_on_an_interface_of_their_own(etcd, tmp_path):
    """--peer-host: the peer port and the append channel listen on the nodes' network (127.0.0.2 here), the client
    port on the clients' (127.0.0.1), and nothing of node to node is served on the other. Publishing through a node
    that does not own the topic needs the forward to the owner and the owner's appends to its ledger's members:
    both go over 127.0.0.2, or the publish is not answered."""
    from pigeon.testing.cluster import await_status, node_process, wipe
    from pigeon.testing.server import free_port

    wipe(etcd.endpoint)
    nodes, ports = {}, {}
    try:
        for i in ("n1", "n2", "n3"):
            ports[i] = free_port(), free_port()
            nodes[i] = node_process(str(tmp_path), etcd.endpoint, i, extra=[
                "--peer-host", "127.0.0.2", "--peer-port", str(ports[i][0]), "--append-port", str(ports[i][1])]).start()
        await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == 3
                     and all(r["bundles"] for r in st["nodes"]))
        for i, node in nodes.items():
            assert node.address.startswith("127.0.0.1:")
            for port in ports[i]:
                socket.create_connection(("127.0.0.2", port), timeout=5).close()
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection(("127.0.0.1", port), timeout=5).close()
        topic = topic_owned_by(owners(etcd.endpoint), "n2", f"{P}/topics/peer-host")
        (pub1, _), (_, sub3) = clients_of(nodes["n1"]), clients_of(nodes["n3"])
        pub1.create_topic(name=topic)
        sub3.create_subscription(name=f"{P}/subscriptions/peer-host", topic=topic)
        sent = {pub1.publish(topic, f"p{i}".encode()).result(timeout=30) for i in range(20)}
        got: set[str] = set()
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            r = sub3.pull(subscription=f"{P}/subscriptions/peer-host", max_messages=20, timeout=10)
            got.update(m.message.message_id for m in r.received_messages)
        assert got == sent
    finally:
        for n in nodes.values():
            n.kill()
