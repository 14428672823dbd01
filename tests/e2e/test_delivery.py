"""End to end: delivery through StreamingPull (subscribe with flow control) and Pull — ack, nack, modack,
redelivery after the ack deadline — with the official client against `pigeon serve`."""

import functools
import concurrent.futures
import threading
import time

import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1

from e2e_helpers import topic_and_subscription, E2E_MARKS, ack, collect, ids_of, pull_now, raw_publish, watch

pytestmark = E2E_MARKS

P = "dlv-proj"


_setup = functools.partial(topic_and_subscription, project=P)


def _wait(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_subscribe_with_flow_control_receives_everything(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "flow")
    before = []
    for b in range(4):
        before += raw_publish(pub, topic, [{"data": f"b{b}-{i}".encode()} for i in range(40)])

    lock = threading.Lock()
    received: dict[str, bytes] = {}
    deliveries = []
    state = {"inflight": 0, "max_inflight": 0}
    max_messages = 5

    def callback(message):
        with lock:
            state["inflight"] += 1
            state["max_inflight"] = max(state["max_inflight"], state["inflight"])
            deliveries.append(message.message_id)
        time.sleep(0.002)
        with lock:
            received.setdefault(message.message_id, message.data)
            state["inflight"] -= 1
        message.ack()

    future = sub.subscribe(subscription, callback,
                           flow_control=pubsub_v1.types.FlowControl(max_messages=max_messages))
    try:
        # messages published while the stream is open arrive too
        after = raw_publish(pub, topic, [{"data": f"late-{i}".encode()} for i in range(40)])
        expected = set(before) | set(after)
        assert _wait(lambda: expected <= set(received), 40), \
            f"received {len(set(received) & expected)} of {len(expected)}"
    finally:
        future.cancel()
        try:
            future.result(timeout=10)
        except Exception:
            pass
    assert set(received) == expected
    assert received[before[0]] == b"b0-0" and received[after[-1]] == b"late-39"
    assert state["max_inflight"] <= max_messages
    # acked messages were delivered once each (no deadline expired here)
    assert len(deliveries) == len(set(deliveries))


def test_subscribe_nack_is_redelivered_quickly(clients):
    pub, sub = clients
    # a long ack deadline: a quick redelivery can only come from the nack
    topic, subscription = _setup(pub, sub, "sub-nack", ack_deadline_seconds=120)
    ids = raw_publish(pub, topic, [{"data": f"n{i}".encode()} for i in range(10)])
    lock = threading.Lock()
    counts: dict[str, int] = {}
    acked: set[str] = set()

    def callback(message):
        with lock:
            counts[message.message_id] = counts.get(message.message_id, 0) + 1
            first = counts[message.message_id] == 1
            if not first:
                acked.add(message.message_id)
        if first:
            message.nack()
        else:
            message.ack()

    t0 = time.monotonic()
    future = sub.subscribe(subscription, callback, flow_control=pubsub_v1.types.FlowControl(max_messages=100))
    try:
        assert _wait(lambda: acked >= set(ids), 15), f"redelivered after nack: {sorted(acked)}"
    finally:
        future.cancel()
        try:
            future.result(timeout=10)
        except Exception:
            pass
    assert time.monotonic() - t0 < 15
    assert all(counts[i] >= 2 for i in ids)


def test_pull_and_ack(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "pullack", ack_deadline_seconds=60)
    ids = raw_publish(pub, topic, [{"data": f"p{i}".encode(), "attributes": {"i": str(i)}} for i in range(5)])
    got = collect(sub, subscription, 5, do_ack=False)
    assert set(got) == set(ids)
    for i, mid in enumerate(ids):
        r = got[mid]
        assert r.message.data == f"p{i}".encode()
        assert r.message.attributes["i"] == str(i)
        assert r.ack_id
        assert r.delivery_attempt == 0  # no dead-letter policy
    assert len({r.ack_id for r in got.values()}) == 5
    ack(sub, subscription, got.values())
    # leased or acked: nothing more to pull
    assert pull_now(sub, subscription) == []


def test_pull_respects_max_messages(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "pullmax")
    ids = raw_publish(pub, topic, [{"data": b"m"}] * 10)
    first = pull_now(sub, subscription, max_messages=3)
    assert 1 <= len(first) <= 3
    rest = collect(sub, subscription, 10 - len(first))
    assert set(ids_of(first)) | set(rest) == set(ids)
    assert not set(ids_of(first)) & set(rest)


def test_pull_waits_for_a_message(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "longpoll")
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        fut = pool.submit(sub.pull, subscription=subscription, max_messages=10, timeout=9)
        time.sleep(0.5)
        t0 = time.monotonic()
        mid = raw_publish(pub, topic, [{"data": b"wake"}])[0]
        resp = fut.result(timeout=10)
        assert time.monotonic() - t0 < 3
        assert ids_of(resp.received_messages) == [mid]
    finally:
        pool.shutdown()


def test_pull_with_nothing_to_deliver_answers_empty_before_the_deadline(clients):
    """Not DEADLINE_EXCEEDED as on Google's service: an empty answer shortly before the caller's deadline."""
    pub, sub = clients
    _, subscription = _setup(pub, sub, "empty-pull")
    for timeout in (2, 4):
        t0 = time.monotonic()
        resp = sub.pull(subscription=subscription, max_messages=10, timeout=timeout)
        waited = time.monotonic() - t0
        assert list(resp.received_messages) == []
        assert timeout / 2 < waited < timeout  # it did wait for messages, and answered in time


def test_pull_invalid_arguments(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "pullbad")
    with pytest.raises(gexc.InvalidArgument):
        sub.pull(subscription=subscription, max_messages=0, return_immediately=True, timeout=10)
    with pytest.raises(gexc.InvalidArgument):
        sub.acknowledge(subscription=subscription, ack_ids=["not-an-ack-id"])
    raw_publish(pub, topic, [{"data": b"x"}])
    r = collect(sub, subscription, 1, do_ack=False)
    ack_id = next(iter(r.values())).ack_id
    for bad in (601, -1):
        with pytest.raises(gexc.InvalidArgument):
            sub.modify_ack_deadline(subscription=subscription, ack_ids=[ack_id], ack_deadline_seconds=bad)


def test_nack_via_modack_zero_is_redelivered_quickly(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "modack0", ack_deadline_seconds=120)
    ids = raw_publish(pub, topic, [{"data": f"z{i}".encode()} for i in range(3)])
    got = collect(sub, subscription, 3, do_ack=False)
    nacked = got[ids[1]]
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[nacked.ack_id], ack_deadline_seconds=0)
    t0 = time.monotonic()
    again = watch(sub, subscription, 5, stop_when=lambda seen: bool(seen))
    assert time.monotonic() - t0 < 3
    assert ids_of(again) == [ids[1]]
    assert again[0].message.data == b"z1"
    ack(sub, subscription, again)
    # the other two stay leased (120 s deadline)
    assert watch(sub, subscription, 0.5) == []


def test_ack_deadline_expiry_modack_extend_and_shorten(clients):
    """ack_deadline 10 s. Pulled and left alone: redelivered after ~10 s. Modacked to 40 s: not redelivered
    then. Modacked to 2 s: redelivered after ~2 s. Acked: never redelivered. A second subscription created
    with a 600 s deadline and updated to 10 s redelivers after ~10 s too (the update takes effect)."""
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "deadline", ack_deadline_seconds=10)
    updated = sub.subscription_path(P, "deadline-updated-sub")
    sub.create_subscription(request={"name": updated, "topic": topic, "ack_deadline_seconds": 600})
    sub.update_subscription(request={"subscription": {"name": updated, "ack_deadline_seconds": 10},
                                     "update_mask": {"paths": ["ack_deadline_seconds"]}})
    a, b, c, d = raw_publish(pub, topic, [{"data": x} for x in (b"a", b"b", b"c", b"d")])
    t_before = time.monotonic()
    got = collect(sub, subscription, 4, do_ack=False)
    got_updated = collect(sub, updated, 4, do_ack=False)
    t_after = time.monotonic()
    ack(sub, updated, [got_updated[i] for i in (b, c, d)])
    sub.acknowledge(subscription=subscription, ack_ids=[got[c].ack_id])
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[got[b].ack_id], ack_deadline_seconds=40)
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[got[d].ack_id], ack_deadline_seconds=2)

    first_seen: dict[str, float] = {}

    def note(seen):
        for r in seen:
            first_seen.setdefault(r.message.message_id, time.monotonic())
        return a in first_seen

    seen = watch(sub, subscription, 16, stop_when=note)
    note(seen)
    # keep watching a little past A's redelivery: B (extended) and C (acked) must stay away
    seen += watch(sub, subscription, 1.0)
    note(seen)
    assert d in first_seen, "modack to 2 s did not bring the message back"
    assert 1.5 <= first_seen[d] - t_before and first_seen[d] - t_after < 7, first_seen[d] - t_after
    assert a in first_seen, "message not redelivered after the ack deadline"
    assert 9.0 <= first_seen[a] - t_before and first_seen[a] - t_after < 15, first_seen[a] - t_after
    assert b not in first_seen, "redelivered although its deadline was extended to 40 s"
    assert c not in first_seen, "redelivered although it was acked"
    assert {r.message.message_id for r in seen} == {a, d}
    # the subscription whose deadline was updated from 600 s to 10 s redelivered `a` by now as well
    again = watch(sub, updated, 3, stop_when=lambda seen: bool(seen))
    assert ids_of(again) == [a], "ack deadline updated to 10 s did not take effect"


def test_message_published_before_subscription_is_not_delivered(clients):
    pub, sub = clients
    topic = pub.topic_path(P, "early-topic")
    pub.create_topic(name=topic)
    early = raw_publish(pub, topic, [{"data": f"early{i}".encode()} for i in range(8)])
    subscription = sub.subscription_path(P, "early-sub")
    sub.create_subscription(name=subscription, topic=topic)
    late = raw_publish(pub, topic, [{"data": f"late{i}".encode()} for i in range(8)])
    got = collect(sub, subscription, 8)
    assert set(got) == set(late)
    assert not set(got) & set(early)
    assert watch(sub, subscription, 0.5) == []


def test_each_subscription_gets_every_message(clients):
    pub, sub = clients
    topic, s1 = _setup(pub, sub, "fanout")
    s2 = sub.subscription_path(P, "fanout-sub-2")
    sub.create_subscription(name=s2, topic=topic)
    ids = raw_publish(pub, topic, [{"data": f"f{i}".encode()} for i in range(6)])
    assert set(collect(sub, s1, 6)) == set(ids)  # acked on s1 ...
    assert set(collect(sub, s2, 6)) == set(ids)  # ... still delivered on s2


def test_subscribe_to_missing_subscription_fails_not_found(clients):
    _, sub = clients
    future = sub.subscribe(sub.subscription_path(P, "missing-sub"), lambda m: m.ack())
    with pytest.raises(gexc.NotFound):
        future.result(timeout=20)


def test_blocked_pull_is_woken_by_an_expiring_deadline(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "wakeexp", ack_deadline_seconds=60)
    mid = raw_publish(pub, topic, [{"data": b"x"}])[0]
    got = collect(sub, subscription, 1, do_ack=False)
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[got[mid].ack_id], ack_deadline_seconds=1)
    t0 = time.monotonic()
    resp = sub.pull(subscription=subscription, max_messages=10, timeout=9)  # blocks until something is ready
    assert ids_of(resp.received_messages) == [mid]
    assert time.monotonic() - t0 < 4


def test_blocked_pull_on_deleted_subscription_fails_not_found(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "pulldel")
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        fut = pool.submit(sub.pull, subscription=subscription, max_messages=10, timeout=9)
        time.sleep(0.5)
        t0 = time.monotonic()
        sub.delete_subscription(subscription=subscription)
        with pytest.raises(gexc.NotFound):
            fut.result(timeout=10)
        assert time.monotonic() - t0 < 3
    finally:
        pool.shutdown()


def test_streaming_subscriber_ends_not_found_when_subscription_is_deleted(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "streamdel")
    received = []
    future = sub.subscribe(subscription, lambda m: (received.append(m.message_id), m.ack()))
    try:
        mid = raw_publish(pub, topic, [{"data": b"x"}])[0]
        assert _wait(lambda: mid in received, 10)
        sub.delete_subscription(subscription=subscription)
        with pytest.raises(gexc.NotFound):
            future.result(timeout=15)
    finally:
        future.cancel()


def test_streaming_large_messages_fit_the_clients_4mib_receive_limit(clients):
    """Three 1.5 MB messages do not fit one 4 MiB StreamingPull response: the server must split them."""
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "streambig")
    payloads = [bytes([97 + i]) * 1_500_000 for i in range(3)]
    ids = raw_publish(pub, topic, [{"data": d} for d in payloads])
    received = {}
    lock = threading.Lock()

    def callback(message):
        with lock:
            received[message.message_id] = message.data
        message.ack()

    future = sub.subscribe(subscription, callback)
    try:
        assert _wait(lambda: len(received) == 3 or future.done(), 20)
        assert not future.done(), f"stream ended: {future.exception()}"
    finally:
        future.cancel()
        try:
            future.result(timeout=10)
        except Exception:
            pass
    assert [received[i] for i in ids] == payloads


def test_backlog_stays_available_after_topic_deletion(clients):
    """Deleting a topic keeps its subscriptions and their backlog (they move to _deleted-topic_)."""
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "orphan")
    ids = raw_publish(pub, topic, [{"data": f"o{i}".encode()} for i in range(5)])
    pub.delete_topic(topic=topic)
    assert sub.get_subscription(subscription=subscription).topic == "_deleted-topic_"
    got = collect(sub, subscription, 5)
    assert set(got) == set(ids)


def test_delivery_attempt_counts_nacks_with_a_dead_letter_policy(clients):
    pub, sub = clients
    dlq = pub.topic_path(P, "attempts-dlq")
    pub.create_topic(name=dlq)
    topic, subscription = _setup(
        pub, sub, "attempts", ack_deadline_seconds=60,
        dead_letter_policy={"dead_letter_topic": dlq, "max_delivery_attempts": 10})
    mid = raw_publish(pub, topic, [{"data": b"x"}])[0]
    attempts = []
    for _ in range(3):
        r = collect(sub, subscription, 1, do_ack=False)[mid]
        attempts.append(r.delivery_attempt)
        sub.modify_ack_deadline(subscription=subscription, ack_ids=[r.ack_id], ack_deadline_seconds=0)
    assert attempts == [1, 2, 3]
