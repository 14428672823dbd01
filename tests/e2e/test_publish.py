"""End to end: Publish through the official client (batched, high level) and the generated client (one RPC,
no client-side checks) against `pigeon serve`: ids, round trip and every documented limit."""

import functools
import concurrent.futures

import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1 import types

from e2e_helpers import topic_and_subscription, E2E_MARKS, collect, raw_publish

pytestmark = E2E_MARKS

P = "pub-proj"


_setup = functools.partial(topic_and_subscription, project=P)


def test_batched_publish_500_unique_ids_and_round_trip(server, monkeypatch):
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
    pub = pubsub_v1.PublisherClient(
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=100, max_latency=0.05))
    sub = pubsub_v1.SubscriberClient()
    try:
        topic, subscription = _setup(pub, sub, "batch500")
        futures = [pub.publish(topic, f"msg-{i}".encode(), seq=str(i)) for i in range(500)]
        done, not_done = concurrent.futures.wait(futures, timeout=30)
        assert not not_done
        ids = [f.result() for f in futures]
        assert len(ids) == 500
        assert len(set(ids)) == 500
        assert all(isinstance(i, str) and i for i in ids)
        got = collect(sub, subscription, 500, timeout=30)
        assert set(got) == set(ids)
        for i, mid in enumerate(ids):
            m = got[mid].message
            assert m.data == f"msg-{i}".encode()
            assert dict(m.attributes) == {"seq": str(i)}
            assert m.publish_time is not None and m.publish_time.year >= 2024
    finally:
        sub.close()
        pub.stop()


def test_ids_unique_across_requests_and_topics(clients):
    pub, sub = clients
    t1, _ = _setup(pub, sub, "ids-a")
    t2, _ = _setup(pub, sub, "ids-b")
    ids = []
    for _ in range(5):
        ids += raw_publish(pub, t1, [{"data": b"a"}] * 20)
        ids += raw_publish(pub, t2, [{"data": b"b"}] * 20)
    assert len(ids) == 200
    assert len(set(ids)) == 200


def test_attributes_only_message_is_accepted(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "attr-only")
    mid = raw_publish(pub, topic, [{"attributes": {"k": "v"}}])[0]
    got = collect(sub, subscription, 1)
    assert got[mid].message.data == b""
    assert dict(got[mid].message.attributes) == {"k": "v"}


def test_empty_message_is_invalid(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "empty")
    with pytest.raises(gexc.InvalidArgument) as ei:
        raw_publish(pub, topic, [{"data": b""}])
    assert "empty" in ei.value.message.lower()
    # one empty message fails the whole request
    with pytest.raises(gexc.InvalidArgument):
        raw_publish(pub, topic, [{"data": b"fine"}, {"data": b""}])
    # the high-level publisher surfaces the same error through its future
    with pytest.raises(gexc.InvalidArgument):
        pub.publish(topic, b"").result(timeout=30)
    # nothing was stored
    raw_publish(pub, topic, [{"data": b"marker"}])
    got = collect(sub, subscription, 1)
    assert [r.message.data for r in got.values()] == [b"marker"]


def _too_many_attributes():
    return {"attributes": {f"k{i}": "v" for i in range(101)}, "data": b"x"}


BAD_MESSAGES = [
    ("101 attributes", [_too_many_attributes()], "100"),
    ("attribute key of 257 bytes", [{"data": b"x", "attributes": {"k" * 257: "v"}}], "256"),
    ("attribute key of 257 multi-byte bytes", [{"data": b"x", "attributes": {"é" * 128 + "k": "v"}}], "256"),
    ("attribute value of 1025 bytes", [{"data": b"x", "attributes": {"k": "v" * 1025}}], "1024"),
    ("reserved goog attribute key", [{"data": b"x", "attributes": {"googclient_x": "v"}}], "goog"),
    ("ordering key of 1025 bytes", [{"data": b"x", "ordering_key": "o" * 1025}], "1024"),
    ("mixed ordering keys", [{"data": b"x", "ordering_key": "a"}, {"data": b"y", "ordering_key": "b"}], "ordering"),
]


def test_server_side_message_limits(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "limits")
    for what, messages, rule in BAD_MESSAGES:
        with pytest.raises(gexc.InvalidArgument) as ei:
            raw_publish(pub, topic, messages)
        assert rule in ei.value.message, (what, ei.value.message)
    # nothing of the rejected requests was stored
    raw_publish(pub, topic, [{"data": b"marker"}])
    got = collect(sub, subscription, 1)
    assert [r.message.data for r in got.values()] == [b"marker"]


def test_limits_at_the_boundary_are_accepted(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "bounds")
    msgs = [
        {"data": b"x", "attributes": {f"k{i}": "v" for i in range(100)}},
        {"data": b"x", "attributes": {"k" * 256: "v" * 1024}},
        {"data": b"x", "attributes": {"é" * 128: "ü" * 512}},  # 256 / 1024 bytes in UTF-8
    ]
    ids = raw_publish(pub, topic, msgs)
    ids += raw_publish(pub, topic, [{"data": b"o", "ordering_key": "o" * 1024}])
    ids += raw_publish(pub, topic, [{"data": b"y", "attributes": {"notgoog": "v", "x-goog": "v"}}])
    assert len(set(ids)) == 5
    got = collect(sub, subscription, 5)
    assert set(got) == set(ids)
    assert len(got[ids[0]].message.attributes) == 100
    assert got[ids[1]].message.attributes["k" * 256] == "v" * 1024
    assert got[ids[2]].message.attributes["é" * 128] == "ü" * 512
    assert got[ids[3]].message.ordering_key == "o" * 1024


def test_too_many_messages_in_one_request(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "count")
    with pytest.raises(gexc.InvalidArgument) as ei:
        raw_publish(pub, topic, [{"data": b"x"}] * 1001)
    assert "1000" in ei.value.message.replace(",", "")
    ids = raw_publish(pub, topic, [{"data": b"x"}] * 1000)
    assert len(set(ids)) == 1000
    assert len(collect(sub, subscription, 1000)) == 1000


def test_message_data_over_10mb_is_invalid(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "big")
    with pytest.raises(gexc.InvalidArgument) as ei:
        raw_publish(pub, topic, [{"data": b"z" * 10_000_001}])
    assert "10000000" in ei.value.message.replace(",", "") or "10 MB" in ei.value.message


def test_publish_request_over_10mb_is_invalid(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "bigreq")
    with pytest.raises(gexc.InvalidArgument):
        raw_publish(pub, topic, [{"data": b"q" * 5_500_000}, {"data": b"r" * 5_500_000}])
    raw_publish(pub, topic, [{"data": b"marker"}])
    got = collect(sub, subscription, 1)
    assert [r.message.data for r in got.values()] == [b"marker"]


def test_large_messages_fit_the_clients_4mib_receive_limit(clients):
    """Three 1.5 MB messages do not fit one 4 MiB Pull response: the server must split them."""
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "large")
    payloads = [bytes([65 + i]) * 1_500_000 for i in range(3)]
    ids = raw_publish(pub, topic, [{"data": d} for d in payloads])
    got = collect(sub, subscription, 3, timeout=20)
    assert [got[i].message.data for i in ids] == payloads


def test_publish_to_missing_topic_is_not_found(clients):
    pub, _ = clients
    missing = pub.topic_path(P, "missing-topic")
    with pytest.raises(gexc.NotFound):
        raw_publish(pub, missing, [{"data": b"x"}])
    with pytest.raises(gexc.NotFound):
        pub.publish(missing, b"x").result(timeout=30)


def test_publish_to_deleted_topic_is_not_found(clients):
    pub, sub = clients
    topic, _ = _setup(pub, sub, "deleted")
    raw_publish(pub, topic, [{"data": b"x"}])
    pub.delete_topic(topic=topic)
    with pytest.raises(gexc.NotFound):
        raw_publish(pub, topic, [{"data": b"x"}])


def test_client_set_server_fields_are_replaced(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "srvfields")
    msg = types.PubsubMessage(data=b"d", message_id="forged-id", publish_time={"seconds": 1})
    mid = raw_publish(pub, topic, [msg])[0]
    assert mid != "forged-id"
    got = collect(sub, subscription, 1)
    m = got[mid].message
    assert m.message_id == mid
    assert m.publish_time.year >= 2024
    assert m.data == b"d"
