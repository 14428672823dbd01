"""The per-method SLIs on /metrics against known traffic: gRPC calls of the official client and REST requests, each
counted once under its method (or route) and response code, with a latency histogram per method; a StreamingPull
counts once, when it ends, and is not timed."""

from __future__ import annotations

import time

import pytest

from tests.e2e.test_metrics import scrape
from tests.e2e.test_rest import call

pytestmark = pytest.mark.e2e

P = "projects/slis"
PUBLISH = "/google.pubsub.v1.Publisher/Publish"
GET_TOPIC = "/google.pubsub.v1.Publisher/GetTopic"
STREAMING_PULL = "/google.pubsub.v1.Subscriber/StreamingPull"


def count(m: dict, api: str, method: str, code: str) -> float:
    return m.get(("pigeon_request_count_total", (("api", api), ("method", method), ("response_code", code))), 0)


def test_calls_are_counted_once_by_method_and_code_with_their_latency(server_factory, monkeypatch):
    srv = server_factory(http=True)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", srv.address)
    from google.api_core import exceptions
    from google.cloud import pubsub_v1

    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    try:
        topic, subscription = f"{P}/topics/orders", f"{P}/subscriptions/workers"
        pub.create_topic(name=topic)
        sub.create_subscription(name=subscription, topic=topic)
        for i in range(5):  # one request each: the client sends what is waiting when the previous one returns
            pub.publish(topic, b"m%d" % i).result(timeout=30)
        with pytest.raises(exceptions.NotFound):
            pub.get_topic(topic=f"{P}/topics/missing", retry=None)
        got: list = []
        streaming = sub.subscribe(subscription, lambda m: (got.append(m), m.ack()))
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        streaming.cancel()
        streaming.result(timeout=20)
        assert len(got) >= 5
    finally:
        sub.close()
        pub.stop()

    # REST: a route counts under its template, and its answer's code
    assert call(srv.http, "GET", f"/v1/{topic}")[0] == 200
    assert call(srv.http, "GET", f"/v1/{P}/topics/missing")[0] == 404
    assert call(srv.http, "GET", "/v1/no/such/route")[0] == 404

    deadline = time.monotonic() + 10  # the stream's end reaches the server after the client closed it
    while True:
        m = scrape(srv.http)
        ended = sum(count(m, "grpc", STREAMING_PULL, c) for c in ("OK", "CANCELLED", "UNAVAILABLE"))
        if ended or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    published = count(m, "grpc", PUBLISH, "OK")
    assert 1 <= published <= 5  # (the client may batch publishes that wait together)
    assert m[("pigeon_request_latency_seconds_count", (("api", "grpc"), ("method", PUBLISH)))] == published
    assert m[("pigeon_request_latency_seconds_sum", (("api", "grpc"), ("method", PUBLISH)))] > 0
    assert count(m, "grpc", "/google.pubsub.v1.Publisher/CreateTopic", "OK") == 1
    # the stream counts once, when it ended, and has no latency
    assert ended == 1, {k: v for k, v in m.items() if k[0] == "pigeon_request_count_total"}
    assert not any(k[0].startswith("pigeon_request_latency_seconds") and ("method", STREAMING_PULL) in k[1]
                   for k in m)

    route = "GET /v1/{topic=projects/*/topics/*}"
    assert count(m, "rest", route, "OK") == 1 and count(m, "rest", route, "NOT_FOUND") == 1
    assert count(m, "rest", "(no route)", "NOT_FOUND") == 1
    assert m[("pigeon_request_latency_seconds_count", (("api", "rest"), ("method", route)))] == 2
    # a REST request is a gRPC call over loopback: both APIs saw the found and the missing topic
    assert count(m, "grpc", GET_TOPIC, "OK") == 1 and count(m, "grpc", GET_TOPIC, "NOT_FOUND") == 2
