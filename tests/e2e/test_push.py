"""End to end: push subscriptions created with the official client; `pigeon serve` POSTs to an HTTP
receiver run by the test on loopback — wrapped and unwrapped formats, retries after an error answer,
OIDC tokens, and ModifyPushConfig switching push → pull → push."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from e2e_helpers import E2E_MARKS, ack, pull_now, raw_publish

pytestmark = E2E_MARKS

P = "push-proj"


class Receiver:
    """A threaded HTTP server recording every POST; `answer(record) -> status` decides the reply."""

    def __init__(self):
        self.got: list[dict] = []
        self.answer = lambda rec: 200
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                rec = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                if rec["headers"].get("content-type") == "application/json":
                    rec["json"] = json.loads(body)
                status = receiver.answer(rec)  # (before it is recorded: a test reading it sees what the answer noted)
                with receiver.lock:
                    receiver.got.append(rec)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/push"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def datas(self) -> list[bytes]:
        with self.lock:
            return [base64.b64decode(r["json"]["message"]["data"]) if "json" in r else r["body"] for r in self.got]

    def wait_for(self, count: int, timeout: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.got) >= count:
                    return list(self.got)
            time.sleep(0.02)
        pytest.fail(f"received {len(self.got)} of {count} pushes within {timeout}s")


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _topic(pub, name):
    topic = pub.topic_path(P, f"{name}-topic")
    pub.create_topic(name=topic)
    return topic


def _pull_some(sub, subscription, timeout=10.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pull_now(sub, subscription)
        if got:
            return got
        time.sleep(0.02)
    return []


def test_wrapped_push_with_retry_after_an_error(clients, receiver):
    pub, sub = clients
    topic = _topic(pub, "wrapped")
    subscription = sub.subscription_path(P, "wrapped-sub")
    sub.create_subscription(request={
        "name": subscription, "topic": topic, "push_config": {"push_endpoint": receiver.url},
        "retry_policy": {"minimum_backoff": {"seconds": 0}, "maximum_backoff": {"seconds": 1}},
    })
    answers = iter([500])
    receiver.answer = lambda rec: next(answers, 200)
    (mid,) = raw_publish(pub, topic, [{"data": b"hello push", "attributes": {"k": "v"}}])
    first, second = receiver.wait_for(2)
    for rec in (first, second):
        m = rec["json"]["message"]
        assert rec["headers"]["content-type"] == "application/json"
        assert base64.b64decode(m["data"]) == b"hello push"
        assert m["attributes"] == {"k": "v"}
        assert m["messageId"] == m["message_id"] == mid
        assert m["publishTime"] == m["publish_time"] and m["publishTime"].endswith("Z")
        assert "orderingKey" not in m
        assert rec["json"]["subscription"] == subscription
        assert "deliveryAttempt" not in rec["json"]  # no dead-letter policy
    time.sleep(0.3)
    assert len(receiver.got) == 2  # the 200 acked it: no third push
    got = sub.get_subscription(subscription=subscription)
    assert got.push_config.push_endpoint == receiver.url


def test_unwrapped_push_with_metadata_and_oidc(clients, receiver):
    pub, sub = clients
    topic = _topic(pub, "raw")
    subscription = sub.subscription_path(P, "raw-sub")
    sa = "pusher@push-proj.iam.gserviceaccount.com"
    sub.create_subscription(request={
        "name": subscription, "topic": topic,
        "push_config": {"push_endpoint": receiver.url, "no_wrapper": {"write_metadata": True},
                        "oidc_token": {"service_account_email": sa, "audience": "https://my.app"}},
    })
    (mid,) = raw_publish(pub, topic, [{"data": b"\x01\x02 raw", "attributes": {"colour": "green"}}])
    (rec,) = receiver.wait_for(1)
    h = rec["headers"]
    assert rec["body"] == b"\x01\x02 raw"
    assert h["colour"] == "green"
    assert h["x-goog-pubsub-message-id"] == mid
    assert h["x-goog-pubsub-subscription-name"] == subscription
    assert h["x-goog-pubsub-publish-time"].endswith("Z")
    scheme, token = h["authorization"].split(" ")
    assert scheme == "Bearer"
    head, claims = (json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))) for p in token.split(".")[:2])
    assert head["alg"] == "RS256"
    assert claims["iss"] == "https://accounts.google.com" and claims["aud"] == "https://my.app"
    assert claims["email"] == sa and claims["email_verified"] is True
    assert claims["exp"] - claims["iat"] == 3600


def test_modify_push_config_switches_push_to_pull_and_back(clients, receiver):
    pub, sub = clients
    topic = _topic(pub, "switch")
    subscription = sub.subscription_path(P, "switch-sub")
    sub.create_subscription(name=subscription, topic=topic, push_config={"push_endpoint": receiver.url})
    raw_publish(pub, topic, [{"data": b"one"}])
    receiver.wait_for(1)

    sub.modify_push_config(subscription=subscription, push_config={})  # → pull
    assert sub.get_subscription(subscription=subscription).push_config.push_endpoint == ""
    raw_publish(pub, topic, [{"data": b"two"}])
    pulled = _pull_some(sub, subscription)
    assert [r.message.data for r in pulled] == [b"two"]
    ack(sub, subscription, pulled)

    sub.modify_push_config(subscription=subscription, push_config={"push_endpoint": receiver.url})  # → push
    raw_publish(pub, topic, [{"data": b"three"}])
    receiver.wait_for(2)
    time.sleep(0.2)
    assert receiver.datas() == [b"one", b"three"]
    assert pull_now(sub, subscription) == []  # everything pushed was acked


def test_push_resumes_after_a_crash(server_factory, server, clients, receiver):
    pub, sub = clients
    topic = _topic(pub, "crash")
    subscription = sub.subscription_path(P, "crash-sub")
    sub.create_subscription(request={
        "name": subscription, "topic": topic, "push_config": {"push_endpoint": receiver.url},
        "retry_policy": {"minimum_backoff": {"seconds": 600}},  # no retry before the crash
    })
    receiver.answer = lambda rec: 503
    raw_publish(pub, topic, [{"data": b"survivor"}])
    receiver.wait_for(1)
    # the 503's nack is on disk before the crash (a crash between the delivery's record and the nack's would bring
    # the lease back: the push would come after the ack deadline and the 600 s backoff, as the retry policy says)
    time.sleep(0.5)
    server.kill()
    receiver.answer = lambda rec: 200
    server_factory(data_dir=server.data_dir, port=server.port)
    receiver.wait_for(2, timeout=15)
    time.sleep(0.2)
    assert receiver.datas() == [b"survivor", b"survivor"]
