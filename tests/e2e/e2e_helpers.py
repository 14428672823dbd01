"""Helpers shared by the end-to-end tests: polling pulls (never bare long sleeps), raw (gapic) publish
that skips the high-level publisher's client-side batching, and clients for restarted servers."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1 import types
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisher

# Pull with return_immediately=True is deprecated in the client (it warns) but is the only way to poll
# without racing a client-side deadline against a server that holds the Pull open.
E2E_MARKS = [
    pytest.mark.e2e,
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def raw_publish(pub, topic: str, messages: list) -> list[str]:
    """One Publish RPC through the generated client (no client-side batching or checks)."""
    msgs = [m if isinstance(m, types.PubsubMessage) else types.PubsubMessage(**m) for m in messages]
    # no retry: a server error must fail the test at once, not be retried for minutes
    resp = GapicPublisher.publish(pub, request={"topic": topic, "messages": msgs}, retry=None, timeout=60)
    return list(resp.message_ids)


def pull_now(sub, subscription: str, max_messages: int = 1000) -> list:
    """One Pull that returns at once (possibly empty)."""
    resp = sub.pull(subscription=subscription, max_messages=max_messages, return_immediately=True,
                    retry=None, timeout=10)
    return list(resp.received_messages)


def ack(sub, subscription: str, received) -> None:
    ids = [r.ack_id for r in received]
    for i in range(0, len(ids), 1000):
        sub.acknowledge(subscription=subscription, ack_ids=ids[i : i + 1000], retry=None, timeout=30)


def collect(sub, subscription: str, count: int, *, timeout: float = 15.0, do_ack: bool = True,
            max_messages: int = 1000) -> dict:
    """Poll until `count` distinct message ids arrived (acking each batch when `do_ack`).
    Returns {message_id: ReceivedMessage (the first delivery)}; fails on timeout."""
    got: dict = {}
    deadline = time.monotonic() + timeout
    while len(got) < count:
        batch = pull_now(sub, subscription, max_messages)
        for r in batch:
            got.setdefault(r.message.message_id, r)
        if batch and do_ack:
            ack(sub, subscription, batch)
        if len(got) >= count:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"received {len(got)} of {count} messages within {timeout}s")
        if not batch:
            time.sleep(0.05)
    return got


def watch(sub, subscription: str, seconds: float, *, stop_when=None, do_ack: bool = False) -> list:
    """Poll for `seconds` (or until `stop_when(received_so_far)` is true); return every ReceivedMessage seen."""
    seen: list = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = pull_now(sub, subscription)
        seen.extend(batch)
        if batch and do_ack:
            ack(sub, subscription, batch)
        if stop_when is not None and stop_when(seen):
            break
        time.sleep(0.05)
    return seen


def ids_of(received) -> list[str]:
    return [r.message.message_id for r in received]


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@pytest.fixture
def client_factory(monkeypatch):
    """Make (publisher, subscriber) pointed at a given ServerProcess (e.g. a restarted one)."""
    made = []

    def make(server):
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
        pub = pubsub_v1.PublisherClient()
        sub = pubsub_v1.SubscriberClient()
        made.append((pub, sub))
        return pub, sub

    yield make
    for pub, sub in made:
        close_clients(pub, sub)


def close_clients(pub, sub) -> None:
    try:
        sub.close()
    except Exception:
        pass
    try:
        pub.stop()
    except Exception:
        pass


def topic_and_subscription(pub, sub, name: str, *, project: str, **sub_fields) -> tuple[str, str]:
    """Create `{name}-topic` and a subscription `{name}-sub` to it (with `sub_fields`); return both names."""
    topic = pub.topic_path(project, f"{name}-topic")
    subscription = sub.subscription_path(project, f"{name}-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(request={"name": subscription, "topic": topic, **sub_fields})
    return topic, subscription
