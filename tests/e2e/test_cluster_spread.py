"""A topic spread over a cluster's nodes (`--topic-layout spread`: docs/cluster.md, "Scale-out", step 3): each of
its shards is in a bundle of its own, so three real nodes own a share of one topic each. Through the official
clients: a keyless publish is stored by a shard of the node that took it (no hop); a keyed one by its key's shard,
in order; a StreamingPull or a Pull through any node receives the messages of every shard once, and the acks
reach each shard's owner and stick."""

from __future__ import annotations

import threading
import time

import pytest

from pigeon.core.bundles import shard_log
from pigeon.testing.cluster import RawStream, clients_of, owners, start_nodes, stop_subscriber

pytestmark = pytest.mark.e2e

P = "projects/spread"
BUNDLES, SHARDS = 16, 4


@pytest.fixture
def spread_nodes(etcd, tmp_path):
    started = start_nodes(str(tmp_path), etcd.endpoint, env={"PIGEON_TOPIC_LAYOUT": "spread"})
    yield started
    for n in started.values():
        n.kill()


def _spanning_topic(owner_of: dict[int, str]) -> tuple[str, list[str]]:
    """A topic name whose four shards' bundles are owned by all three nodes, and each shard's owner."""
    for i in range(10_000):
        name = f"{P}/topics/wide-{i}"
        shard_owners = [owner_of.get(shard_log(name, k, BUNDLES, True) - 1) for k in range(SHARDS)]
        if set(shard_owners) == {"n1", "n2", "n3"}:
            return name, shard_owners
    raise AssertionError("no topic name spans the three nodes")


def _shard_of_key(key: str) -> int:
    import crc32c

    return crc32c.crc32c(key.encode()) % SHARDS


def _ordered_publisher(node):
    import os

    from google.cloud import pubsub_v1

    saved = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = node.address
    try:
        return pubsub_v1.PublisherClient(publisher_options=pubsub_v1.types.PublisherOptions(
            enable_message_ordering=True))
    finally:
        if saved is None:
            del os.environ["PUBSUB_EMULATOR_HOST"]
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = saved


def _publish_without_n3(nodes, clients, topic: str, shard_owners: list[str], n: int) -> set[str]:
    """With n3 dead: `n` keyless publishes through n1 and through n2 (answered by their own shards), and n // 10 for
    each of five keys whose shards were n3's (stored by their new owners): the ids answered."""
    sent: set[str] = set()
    for node in ("n1", "n2"):
        pub = clients[node][0]
        sent.update(f.result(timeout=60) for f in [pub.publish(topic, f"{node}-after-{i}".encode())
                                                   for i in range(n)])
    keyed = _ordered_publisher(nodes["n1"])
    keys = [k for k in (f"key-{i}" for i in range(1000)) if shard_owners[_shard_of_key(k)] == "n3"][:5]
    sent.update(f.result(timeout=60) for f in [keyed.publish(topic, f"{k}-{i}".encode(), ordering_key=k)
                                               for k in keys for i in range(n // 10)])
    return sent


def test_one_topic_is_served_by_every_node_and_consumed_through_any(spread_nodes, etcd):
    topic, shard_owners = _spanning_topic(owners(etcd.endpoint))
    (pub1, sub1), (pub2, sub2), (pub3, sub3) = (clients_of(spread_nodes[i]) for i in ("n1", "n2", "n3"))
    pub1.create_topic(name=topic)
    streamed_sub, pulled_sub = f"{P}/subscriptions/streamed", f"{P}/subscriptions/pulled"
    sub2.create_subscription(name=streamed_sub, topic=topic)
    sub3.create_subscription(request={"name": pulled_sub, "topic": topic, "enable_message_ordering": True})

    sent: dict[str, tuple[str, str]] = {}  # message id → (data, ordering key)
    for i in range(90):  # keyless, through n3: stored by n3's own shards
        mid = pub3.publish(topic, f"plain-{i}".encode()).result(timeout=30)
        sent[mid] = (f"plain-{i}", "")
        assert shard_owners[int(mid) & 63] == "n3", "a keyless publish went to another node's shard"
    keyed = _ordered_publisher(spread_nodes["n1"])
    for i in range(60):  # keyed, through n1: each key's shard, wherever its owner is
        key = f"k{i % 6}"
        mid = keyed.publish(topic, f"keyed-{i}".encode(), ordering_key=key).result(timeout=30)
        sent[mid] = (f"keyed-{i}", key)
    by_key = {}
    for mid, (_, key) in sent.items():
        if key:
            by_key.setdefault(key, set()).add(int(mid) & 63)
    assert all(len(shards) == 1 for shards in by_key.values())  # a key is one shard's

    got: dict[str, str] = {}
    done = threading.Event()
    lock = threading.Lock()

    def callback(msg):
        with lock:
            got[msg.message_id] = msg.data.decode()
            if len(got) == len(sent):
                done.set()
        msg.ack()

    future = sub2.subscribe(streamed_sub, callback)  # StreamingPull through n2: merged from the three owners
    try:
        assert done.wait(60), f"{len(got)} of {len(sent)} streamed"
    finally:
        stop_subscriber(future)
    assert got == {m: d for m, (d, _) in sent.items()}

    pulled: dict[str, str] = {}
    order: dict[str, list[int]] = {}  # ordering key → the keyed messages' numbers, in the order they came
    deadline = time.monotonic() + 60
    while len(pulled) < len(sent) and time.monotonic() < deadline:  # unary Pull and Acknowledge through n1
        r = sub1.pull(subscription=pulled_sub, max_messages=40, timeout=20)
        for m in r.received_messages:
            pulled[m.message.message_id] = m.message.data.decode()
            if m.message.ordering_key:
                order.setdefault(m.message.ordering_key, []).append(int(m.message.data.decode().split("-")[1]))
        if r.received_messages:
            sub1.acknowledge(subscription=pulled_sub, ack_ids=[m.ack_id for m in r.received_messages])
    assert pulled == {m: d for m, (d, _) in sent.items()}
    assert order == {f"k{k}": list(range(k, 60, 6)) for k in range(6)}  # per key, in publish order, once

    time.sleep(1)  # the stream's acks reach their owners; then nothing comes back, through any node
    for sub in (sub1, sub2, sub3):
        for name in (streamed_sub, pulled_sub):
            r = sub.pull(subscription=name, max_messages=50, return_immediately=True, timeout=20)
            assert list(r.received_messages) == [], name


def test_an_owner_of_some_shards_killed_mid_stream_loses_nothing(spread_nodes, etcd):
    """kill -9 of the node owning a third of a topic's shards while a stream through another node consumes it:
    its shards move to the survivors, the client's stream reopens, and every publish that was answered arrives."""
    topic, shard_owners = _spanning_topic(owners(etcd.endpoint))
    clients = {i: clients_of(spread_nodes[i]) for i in ("n1", "n2", "n3")}
    clients["n1"][0].create_topic(name=topic)
    name = f"{P}/subscriptions/failover"
    clients["n2"][1].create_subscription(name=name, topic=topic)

    sent: set[str] = set()
    for node in ("n1", "n2", "n3"):  # keyless: each node's own shards, n3's among them
        pub = clients[node][0]
        sent.update(f.result(timeout=30) for f in [pub.publish(topic, f"{node}-{i}".encode()) for i in range(200)])
    assert {shard_owners[int(m) & 63] for m in sent} == {"n1", "n2", "n3"}

    got: set[str] = set()
    lock = threading.Lock()
    enough = threading.Event()

    def callback(msg):
        time.sleep(0.005)  # (a consumer that takes its time: n3's shards still hold messages when it dies)
        with lock:
            got.add(msg.message_id)
            if len(got) >= 100:
                enough.set()
        msg.ack()

    from google.cloud import pubsub_v1

    future = clients["n1"][1].subscribe(name, callback, flow_control=pubsub_v1.types.FlowControl(max_messages=12))
    try:  # (merged from the three owners through n1)
        assert enough.wait(60), f"{len(got)} before the kill"
        spread_nodes["n3"].kill()
        with lock:
            assert not {m for m in sent if shard_owners[int(m) & 63] == "n3"} <= got, "n3's were all in already"
        sent |= _publish_without_n3(spread_nodes, clients, topic, shard_owners, 200)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not sent <= got:
            time.sleep(0.2)
        with lock:
            missing = sent - got
        assert not missing, f"{len(missing)} of {len(sent)} answered publishes never arrived"
    finally:
        stop_subscriber(future)


def test_a_stream_through_any_node_goes_on_while_an_owner_of_its_shards_dies(spread_nodes, etcd):
    """kill -9 of a node owning some of a topic's shards, under a StreamingPull through another node: the client's
    stream is not ended (that node opens streams to the shards' new owners in place of the dead one's), and every
    answered publish arrives on it — those stored by the dead node's shards' new owners too."""
    topic, shard_owners = _spanning_topic(owners(etcd.endpoint))
    clients = {i: clients_of(spread_nodes[i]) for i in ("n1", "n2", "n3")}
    clients["n1"][0].create_topic(name=topic)
    name = f"{P}/subscriptions/outlives"
    clients["n2"][1].create_subscription(name=name, topic=topic, ack_deadline_seconds=10)
    sent: set[str] = set()
    for node in ("n1", "n2", "n3"):
        pub = clients[node][0]
        sent.update(f.result(timeout=30) for f in [pub.publish(topic, f"{node}-{i}".encode()) for i in range(100)])

    stream = RawStream(clients["n1"][1], name)  # (merged from the three owners through n1)
    try:
        assert not stream.wait_for(sorted(sent)[:100], 60), f"{len(stream.received())} before the kill"
        assert not stream.ended, stream.ended
        spread_nodes["n3"].kill()
        sent |= _publish_without_n3(spread_nodes, clients, topic, shard_owners, 100)
        missing = stream.wait_for(sent, 90)
        assert not stream.ended, f"the client's stream ended: {stream.ended[0]}"
        assert not missing, f"{len(missing)} of {len(sent)} answered publishes never arrived"
    finally:
        stream.close()


def test_seek_and_snapshots_act_on_every_shard_at_its_owner(spread_nodes, etcd):
    """A snapshot holds each shard's cursor as its owner has it; a seek to it, or to a time, through any node,
    moves every shard at its owner: what was acked after the snapshot, or published after the time, comes again;
    the Spark ranges read each shard at its owner."""
    from pigeon.api.proto import pigeon_ranges_pb2 as ranges_pb
    from pigeon.api.pigeon_api import SERVICE
    import grpc

    topic, _ = _spanning_topic(owners(etcd.endpoint))
    (pub1, sub1), (pub2, sub2), (pub3, sub3) = (clients_of(spread_nodes[i]) for i in ("n1", "n2", "n3"))
    pub1.create_topic(name=topic)
    name = f"{P}/subscriptions/sought"
    sub2.create_subscription(request={"name": name, "topic": topic, "retain_acked_messages": True})
    before = {f.result(timeout=30) for pub in (pub1, pub2, pub3) for f in [pub.publish(topic, b"before")
                                                                           for _ in range(30)]}

    def drain(sub, want: set[str]) -> set[str]:
        """What comes until `want` has (and one more look finds nothing else), all acked."""
        got: set[str] = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = want <= got
            r = sub.pull(subscription=name, max_messages=100, return_immediately=done, timeout=20)
            got.update(m.message.message_id for m in r.received_messages)
            if r.received_messages:
                sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in r.received_messages])
            elif done:
                break
        return got

    assert drain(sub1, before) == before
    snap = f"{P}/snapshots/after-before"
    sub3.create_snapshot(name=snap, subscription=name)  # through n3: every shard's cursor from its owner
    after = {f.result(timeout=30) for pub in (pub1, pub2, pub3) for f in [pub.publish(topic, b"after")
                                                                          for _ in range(30)]}
    assert drain(sub2, after) == after
    sub1.seek(request={"subscription": name, "snapshot": snap})  # through n1: each owner seeks its shards
    assert drain(sub3, after) == after  # what was acked after the snapshot comes again; nothing from before it
    sub2.seek(request={"subscription": name, "time": {"seconds": 0}})  # (acked ones retained: all come again)
    assert drain(sub1, before | after) == before | after

    with grpc.insecure_channel(spread_nodes["n1"].address) as ch:  # the Spark ranges: every shard at its owner
        latest = ch.unary_unary(f"/{SERVICE}/LatestOffsets", request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=ranges_pb.LatestOffsetsResponse.FromString)(
            ranges_pb.LatestOffsetsRequest(topic=topic), timeout=20)
        assert sum(s.latest for s in latest.shards) == len(before | after)
        read = ch.unary_unary(f"/{SERVICE}/ReadRange", request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=ranges_pb.ReadRangeResponse.FromString)
        total = sum(len(read(ranges_pb.ReadRangeRequest(topic=topic, shard=s.shard, start_offset=0,
                                                         end_offset=s.latest, max_messages=1000), timeout=20).lengths)
                    // 4 for s in latest.shards)
        assert total == len(before | after)


def test_a_detached_subscription_drops_every_shards_backlog(spread_nodes, etcd):
    """DetachSubscription through one node: it is detached everywhere (each owner drops its shards' backlog), and a
    pull through any node is refused as Pub/Sub refuses it."""
    from google.api_core import exceptions as gexc

    topic, _ = _spanning_topic(owners(etcd.endpoint))
    (pub1, sub1), (pub2, sub2), (pub3, sub3) = (clients_of(spread_nodes[i]) for i in ("n1", "n2", "n3"))
    pub1.create_topic(name=topic)
    name = f"{P}/subscriptions/detached"
    sub1.create_subscription(name=name, topic=topic)
    for pub in (pub1, pub2, pub3):
        for f in [pub.publish(topic, b"x") for _ in range(20)]:
            f.result(timeout=30)
    pub2.detach_subscription(request={"subscription": name})
    for sub in (sub1, sub2, sub3):
        with pytest.raises(gexc.FailedPrecondition):
            sub.pull(subscription=name, max_messages=10, timeout=20)
    assert sub3.get_subscription(subscription=name).detached


def test_an_idempotent_publish_retried_through_another_node_is_stored_once(spread_nodes, etcd):
    """Idempotency keys of a spread topic: each message is stored by its key's shard, so a retry — through
    another node, batched otherwise — meets the window that holds its key and answers with the first id."""
    topic, _ = _spanning_topic(owners(etcd.endpoint))
    (pub1, sub1), (pub2, _), (pub3, _) = (clients_of(spread_nodes[i]) for i in ("n1", "n2", "n3"))
    pub1.create_topic(name=topic)
    name = f"{P}/subscriptions/idempotent"
    sub1.create_subscription(name=name, topic=topic)
    from google.pubsub_v1 import types

    def publish(client, keys) -> list[str]:
        req = types.PublishRequest(topic=topic, messages=[
            types.PubsubMessage(data=k.encode(), attributes={"pigeon-idempotency-key": k}) for k in keys])
        return list(client.api.publish(request=req, timeout=30).message_ids)

    keys = [f"order-{i}" for i in range(40)]
    first = dict(zip(keys, publish(pub1, keys)))
    assert len(set(first.values())) == 40
    again = dict(zip(keys[::-1], publish(pub2, keys[::-1])))  # another node, another order
    again.update(zip(keys[10:30], publish(pub3, keys[10:30])))
    assert again == first
    got: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = sub1.pull(subscription=name, max_messages=100, return_immediately=len(got) >= 40, timeout=20)
        if not r.received_messages and len(got) >= 40:
            break
        got.update(m.message.message_id for m in r.received_messages)
        if r.received_messages:
            sub1.acknowledge(subscription=name, ack_ids=[m.ack_id for m in r.received_messages])
    assert got == set(first.values())  # each once


def test_a_cursor_of_a_spread_topic_is_made_read_and_moved_at_each_shards_owner(spread_nodes, etcd):
    """The Spark connector's cursors (CreateCursor, GetCursor, CommitCursor) through three nodes: each shard's
    place is its owner's."""
    import grpc

    from pigeon.api.pigeon_api import SERVICE
    from pigeon.api.proto import pigeon_ranges_pb2 as ranges_pb

    topic, _ = _spanning_topic(owners(etcd.endpoint))
    pubs = [clients_of(spread_nodes[i])[0] for i in ("n1", "n2", "n3")]
    pubs[0].create_topic(name=topic)
    name = f"{P}/subscriptions/cursor"

    def call(node: str, method: str, req, resp):
        with grpc.insecure_channel(spread_nodes[node].address) as ch:
            return ch.unary_unary(f"/{SERVICE}/{method}", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=resp.FromString)(req, timeout=20)

    made = call("n1", "CreateCursor", ranges_pb.CreateCursorRequest(name=name, topic=topic), ranges_pb.Cursor)
    assert made.created and list(made.offsets) == [0] * SHARDS
    for pub in pubs:
        for f in [pub.publish(topic, b"x") for _ in range(30)]:
            f.result(timeout=30)
    seen = call("n2", "GetCursor", ranges_pb.GetCursorRequest(name=name), ranges_pb.Cursor)
    assert seen.backlog == 90 and sum(seen.latest) == 90 and list(seen.offsets) == [0] * SHARDS
    moved = call("n3", "CommitCursor", ranges_pb.CommitCursorRequest(name=name, offsets=list(seen.latest)),
                 ranges_pb.Cursor)
    assert list(moved.offsets) == list(seen.latest) and moved.backlog == 0
    assert list(call("n1", "GetCursor", ranges_pb.GetCursorRequest(name=name), ranges_pb.Cursor).offsets) == \
        list(seen.latest)


def test_the_queue_extension_works_on_every_shard_at_its_owner(spread_nodes, etcd):
    """Take, Ack, Bury, Kick, Peek and Delete of a spread topic's subscription through any node: each message
    handled by its shard's owner, the counts summed."""
    import grpc

    from pigeon.api.proto import pigeon_queue_pb2 as q
    from pigeon.api.queue_api import SERVICE

    topic, _ = _spanning_topic(owners(etcd.endpoint))
    (pub1, sub1), (pub2, _), (pub3, _) = (clients_of(spread_nodes[i]) for i in ("n1", "n2", "n3"))
    pub1.create_topic(name=topic)
    name = f"{P}/subscriptions/queue"
    sub1.create_subscription(name=name, topic=topic)
    ids = [f.result(timeout=30) for pub in (pub1, pub2, pub3) for f in [pub.publish(topic, b"job") for _ in range(30)]]

    def call(node: str, method: str, req, resp):
        with grpc.insecure_channel(spread_nodes[node].address) as ch:
            return ch.unary_unary(f"/{SERVICE}/{method}", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=resp.FromString)(req, timeout=20)

    taken = call("n1", "Take", q.TakeRequest(subscription=name, max_messages=200, lock_seconds=60), q.TakeResponse)
    assert sorted(_mid(m.message) for m in taken.messages) == sorted(ids)  # every shard's, through one node
    acks = [m.ack_id for m in taken.messages]
    assert call("n2", "Ack", q.AckRequest(subscription=name, ack_ids=acks[:40]), q.AckResponse).acked == 40
    assert call("n3", "Bury", q.BuryRequest(subscription=name, ack_ids=acks[40:60]), q.BuryResponse).buried == 20
    buried = _mid(taken.messages[45].message)
    assert call("n2", "Peek", q.PeekRequest(subscription=name, message_id=buried), q.PeekResponse).state == "buried"
    assert call("n1", "Kick", q.KickRequest(subscription=name), q.KickResponse).kicked == 20
    rest = [_mid(m.message) for m in taken.messages[40:]]
    assert call("n3", "Delete", q.DeleteRequest(subscription=name, message_ids=rest), q.DeleteResponse).deleted == 50
    again = call("n2", "Take", q.TakeRequest(subscription=name, max_messages=200, lock_seconds=60), q.TakeResponse)
    assert list(again.messages) == []  # acked or deleted, every one


def _mid(raw: bytes) -> str:
    from google.pubsub_v1 import types

    return types.PubsubMessage.pb().FromString(raw).message_id


def test_a_merged_stream_gives_its_flow_control_to_the_owners_that_deliver(spread_nodes, etcd):
    """A client's flow control is shared among the owners' streams by demand: with every message in one shard,
    that shard's owner gets nearly all of it (split evenly, it would send a third and wait for acks)."""
    from google.cloud import pubsub_v1

    topic, shard_owners = _spanning_topic(owners(etcd.endpoint))
    holder = shard_owners[0]  # keyless publishes through it are stored by its own shards: one owner has them all
    pub = clients_of(spread_nodes[holder])[0]
    sub = clients_of(spread_nodes[next(n for n in ("n1", "n2", "n3") if n != holder)])[1]
    pub.create_topic(name=topic)
    name = f"{P}/subscriptions/steered"
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=60)
    for f in [pub.publish(topic, f"s{i}".encode()) for i in range(60)]:
        assert shard_owners[int(f.result(timeout=30)) & 63] == holder

    held: list = []  # never acked: each stays outstanding
    lock = threading.Lock()

    def callback(msg) -> None:
        with lock:
            held.append(msg)

    future = sub.subscribe(name, callback, flow_control=pubsub_v1.types.FlowControl(max_messages=30))
    try:
        deadline = time.monotonic() + 20
        while len(held) < 24 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(held) >= 24, f"{len(held)} of 30 outstanding: the owner with the messages got no more than " \
                                "its even share"
    finally:
        stop_subscriber(future)


def test_the_figures_of_a_spread_topic_add_every_owners_shards_up(spread_nodes, etcd):
    """pigeon.v1.Monitoring (the console's figures) through any node: one row for a spread topic and for its
    subscription, holding every shard's messages, whichever nodes own them."""
    import grpc

    from pigeon.api.proto import pigeon_monitoring_pb2 as m

    topic, shard_owners = _spanning_topic(owners(etcd.endpoint))
    clients = {i: clients_of(spread_nodes[i]) for i in ("n1", "n2", "n3")}
    clients["n1"][0].create_topic(name=topic)
    name = f"{P}/subscriptions/figures"
    clients["n1"][1].create_subscription(name=name, topic=topic)
    sent = 0
    for node, n in (("n1", 4), ("n2", 5), ("n3", 6)):  # keyless: each stored by a shard of the node that took it
        for f in [clients[node][0].publish(topic, b"x") for _ in range(n)]:
            f.result(timeout=30)
        sent += n

    with grpc.insecure_channel(spread_nodes["n2"].address) as ch:
        call = lambda method, req, resp: ch.unary_unary(  # noqa: E731
            f"/pigeon.v1.Monitoring/{method}", request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=resp.FromString)(req, timeout=30)
        subs = [s for s in call("ListSubscriptionStats", m.ListStatsRequest(project=P),
                                m.ListSubscriptionStatsResponse).subscriptions if s.name == name]
        assert len(subs) == 1, "a row per owner instead of one for the subscription"
        assert subs[0].num_undelivered_messages == sent and subs[0].topic == topic
        assert set(subs[0].node.split(",")) == set(shard_owners)
        topics = [t for t in call("ListTopicStats", m.ListStatsRequest(project=P),
                                  m.ListTopicStatsResponse).topics if t.name == topic]
        assert len(topics) == 1 and topics[0].messages == sent and topics[0].subscriptions == 1
