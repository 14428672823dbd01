"""Queue-server semantics against the real server, through pigeon.client and the official client."""

import functools
import threading
import time
from datetime import datetime, timedelta, timezone

import grpc
import pytest
from google.cloud import pubsub_v1

from pigeon.client import PigeonClient
from e2e_helpers import topic_and_subscription

pytestmark = pytest.mark.e2e


_setup = functools.partial(topic_and_subscription, project="proj")


def _take_until(pigeon, subscription, n, timeout=10.0, lock=60):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += pigeon.take(subscription, max_messages=n - len(got), lock=lock)
        if len(got) < n:
            time.sleep(0.05)
    return got


def test_periodic_job_rescheduled_three_times_fires_three_times(clients, server):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "periodic")
    pigeon = PigeonClient(server.address, publisher=pub)
    job_id = pigeon.publish(topic, b"send-digest").result(timeout=10)
    fired = []
    for _ in range(3):
        (job,) = _take_until(pigeon, subscription, 1)
        fired.append(time.monotonic())
        assert job.message.message_id == job_id  # the same message, rescheduled
        pigeon.reschedule(subscription, [job.ack_id], delay=0.6)
        assert pigeon.take(subscription, max_messages=1) == []  # not before its time
    (last,) = _take_until(pigeon, subscription, 1)
    fired.append(time.monotonic())
    assert last.delivery_attempt == 0
    gaps = [b - a for a, b in zip(fired, fired[1:])]
    assert len(gaps) == 3 and all(g >= 0.55 for g in gaps), gaps
    assert pigeon.ack(subscription, [last.ack_id]) == 1


def test_delayed_messages_come_out_in_activation_order_after_restart(server_factory, monkeypatch):
    srv = server_factory()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", srv.address)
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic, subscription = _setup(pub, sub, "delayed")
    pigeon = PigeonClient(srv.address, publisher=pub)
    now = datetime.now(timezone.utc)
    for name, offset in [("third", 2.4), ("first", 1.6), ("second", 2.0)]:
        pigeon.publish(topic, name.encode(), activate_at=now + timedelta(seconds=offset)).result(timeout=10)
    pigeon.publish(topic, b"yesterday", activate_at=now - timedelta(days=1)).result(timeout=10)
    assert [t.data for t in pigeon.take(subscription, lock=1)] == [b"yesterday"]  # the past comes first
    srv.kill()
    pigeon.close()
    srv2 = server_factory(data_dir=srv.data_dir, port=srv.port)
    pigeon = PigeonClient(srv2.address, publisher=pub)
    time.sleep(max(0.0, (now + timedelta(seconds=2.5) - datetime.now(timezone.utc)).total_seconds()))
    got = _take_until(pigeon, subscription, 4)
    assert [t.data for t in got] == [b"yesterday", b"first", b"second", b"third"]
    pigeon.close()


def test_duplicate_publish_across_restart_returns_the_first_id(server_factory, monkeypatch):
    srv = server_factory()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", srv.address)
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic, subscription = _setup(pub, sub, "idem")
    first = pub.publish(topic, b"charge card", **{"pigeon-idempotency-key": "order-42"}).result(timeout=10)
    srv.kill()
    srv2 = server_factory(data_dir=srv.data_dir, port=srv.port)
    pub2 = pubsub_v1.PublisherClient()
    again = pub2.publish(topic, b"charge card (retry)", **{"pigeon-idempotency-key": "order-42"}).result(timeout=10)
    assert again == first
    got = sub.pull(subscription=subscription, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in got] == [b"charge card"]
    srv2.kill()


def test_racing_reschedule_and_ack_have_one_winner(clients, server):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "race")
    pigeon = PigeonClient(server.address, publisher=pub)
    for i in range(20):
        pigeon.publish(topic, b"job-%d" % i).result(timeout=10)
    jobs = _take_until(pigeon, subscription, 20)
    outcomes = {}

    def act(kind, job):
        try:
            if kind == "ack":
                pigeon.ack(subscription, [job.ack_id])
            else:
                pigeon.reschedule(subscription, [job.ack_id], delay=3600)
            outcomes.setdefault(job.ack_id, []).append(kind)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    threads = []
    for job in jobs:
        for kind in ("ack", "reschedule"):
            threads.append(threading.Thread(target=act, args=(kind, job)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(v) == 1 for v in outcomes.values()) and len(outcomes) == 20, outcomes
    # the winners' effects hold: acked ones are gone for good, rescheduled ones wait an hour
    for job in jobs:
        peeked = pigeon.peek(subscription, job.message.message_id)
        assert peeked.state == ("acked" if outcomes[job.ack_id] == ["ack"] else "scheduled")


def test_buried_messages_wait_until_kicked(clients, server):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "bury")
    pigeon = PigeonClient(server.address, publisher=pub)
    for i in range(3):
        pigeon.publish(topic, b"m%d" % i).result(timeout=10)
    jobs = _take_until(pigeon, subscription, 3, lock=1)
    assert pigeon.bury(subscription, [j.ack_id for j in jobs[:2]]) == 2
    time.sleep(1.2)  # the third one's lock runs out: it comes back; the buried ones do not
    back = _take_until(pigeon, subscription, 1)
    assert [b.data for b in back] == [jobs[2].data]
    time.sleep(0.3)
    assert pigeon.take(subscription) == []
    assert pigeon.peek(subscription, jobs[0].message.message_id).state == "buried"
    assert pigeon.kick(subscription, max_messages=1) == 1
    assert len(_take_until(pigeon, subscription, 1)) == 1
    assert pigeon.kick(subscription) == 1
    assert len(_take_until(pigeon, subscription, 1)) == 1


def test_update_peek_delete_and_long_locks(clients, server):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "update")
    pigeon = PigeonClient(server.address, publisher=pub)
    ids = [pigeon.publish(topic, b"v1", step="1").result(timeout=10), pigeon.publish(topic, b"x").result(timeout=10)]
    assert pigeon.peek(subscription, ids[0]).state == "active"
    assert pigeon.delete(subscription, [ids[1]]) == 1
    (job,) = pigeon.take(subscription, lock=timedelta(hours=2))  # longer than Pub/Sub's 600 s
    assert pigeon.peek(subscription, ids[0]).state == "locked"
    pigeon.update(subscription, job.ack_id, b"v2", {"step": "2"})
    pigeon.reschedule(subscription, [job.ack_id], delay=0)
    (again,) = _take_until(pigeon, subscription, 1)
    assert again.data == b"v2" and again.attributes == {"step": "2"}
    assert again.message.message_id == ids[0]
    with pytest.raises(grpc.RpcError) as err:
        pigeon.ack(subscription, [job.ack_id])  # the old lock
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert pigeon.ack(subscription, [again.ack_id]) == 1
    assert pigeon.take(subscription) == []


def test_a_keyed_message_cannot_be_scheduled_and_nothing_of_its_request_is_stored(clients):
    """Accepted, the schedule and the key would contradict each other (a key's messages go out in publish order, a
    scheduled one at its time): refused whole, with the reason, and nothing stored."""
    from google.api_core import exceptions
    from google.pubsub_v1 import types

    pub, sub = clients
    topic, subscription = _setup(pub, sub, "keyed-scheduled")
    messages = [types.PubsubMessage(data=b"later", ordering_key="k1", attributes={"pigeon-delay": "1s"}),
                types.PubsubMessage(data=b"now", ordering_key="k1")]
    with pytest.raises(exceptions.InvalidArgument, match="A message with an ordering key cannot be scheduled"):
        pub.api.publish(topic=topic, messages=messages)
    pub.api.publish(topic=topic, messages=[types.PubsubMessage(data=b"keyed", ordering_key="k1")])
    time.sleep(1.2)  # (past the refused message's delay: had it been stored, it would be due now)
    got = sub.pull(subscription=subscription, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in got] == [b"keyed"]
