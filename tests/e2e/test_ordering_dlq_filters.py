"""Ordering keys, dead-letter topics, retry backoff and filters with the official client and the real server."""

import threading
import time
from collections import defaultdict

import pytest
from google.cloud import pubsub_v1

from pigeon.testing.ordering import key_runs

pytestmark = pytest.mark.e2e


def _ordered_publisher():
    return pubsub_v1.PublisherClient(publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True))


def test_ordered_delivery_per_key_survives_nacks(clients):
    _, sub = clients
    pub = _ordered_publisher()
    topic = pub.topic_path("proj", "ordered-topic")
    subscription = sub.subscription_path("proj", "ordered-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(request={"name": subscription, "topic": topic, "enable_message_ordering": True})
    keys = ["alpha", "beta", "gamma"]
    for i in range(30):
        for k in keys:
            pub.publish(topic, f"{k}-{i}".encode(), ordering_key=k)
    pub.stop()  # flushes

    seen = defaultdict(list)
    nacked = set()
    lock = threading.Lock()
    done = threading.Event()

    def callback(m):
        key, n = m.data.decode().rsplit("-", 1)
        with lock:
            seen[key].append(int(n))
            if int(n) % 7 == 3 and m.data not in nacked:  # refuse some once: the rest of the key comes back
                nacked.add(m.data)
                m.nack()
                return
            if all(v and v[-1] == 29 for v in seen.values()) and len(seen) == len(keys):
                done.set()
        m.ack()

    future = sub.subscribe(subscription, callback)
    done.wait(60)
    time.sleep(0.5)  # a late redelivery would show up as an extra run
    future.cancel()
    for k in keys:
        got = seen[k]
        # publish order, and a redelivery restarts at a refused message and repeats every later one in order
        runs = key_runs(got) or [[]]
        # a run ends at 29 or where the delivery the nack caught ended (the first batch of a key may not hold
        # all 30 when the publisher's batches came apart): a later run goes back, never skips ahead
        said = f"{k}: runs {runs} (every key: {dict(seen)}; all ended at 29 in time: {done.is_set()})"  # whole
        assert runs[0][:1] == [0] and runs[-1][-1:] == [29], said
        assert all(r[0] % 7 == 3 and r[0] <= prev[-1] for prev, r in zip(runs, runs[1:])), said


def test_dead_letter_after_max_attempts_survives_restart(server_factory, tmp_path, monkeypatch):
    srv = server_factory()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", srv.address)
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic, dlt = pub.topic_path("proj", "work"), pub.topic_path("proj", "work-dead")
    subscription, dls = sub.subscription_path("proj", "work-sub"), sub.subscription_path("proj", "work-dead-sub")
    pub.create_topic(name=topic)
    pub.create_topic(name=dlt)
    sub.create_subscription(name=dls, topic=dlt)
    sub.create_subscription(request={"name": subscription, "topic": topic,
                                     "dead_letter_policy": {"dead_letter_topic": dlt, "max_delivery_attempts": 5}})
    pub.publish(topic, b"poison").result(timeout=10)

    def nack_once(expected_attempt):
        got = sub.pull(subscription=subscription, max_messages=1, timeout=10).received_messages
        assert len(got) == 1 and got[0].delivery_attempt == expected_attempt
        sub.modify_ack_deadline(subscription=subscription, ack_ids=[got[0].ack_id], ack_deadline_seconds=0)

    for attempt in (1, 2, 3):
        nack_once(attempt)
    srv.kill()  # the count is durable
    sub.close()
    srv2 = server_factory(data_dir=srv.data_dir, port=srv.port)
    sub = pubsub_v1.SubscriberClient()
    for attempt in (4, 5):
        nack_once(attempt)
    deadline = time.monotonic() + 15
    dead = []
    while not dead and time.monotonic() < deadline:
        sub.pull(subscription=subscription, max_messages=1, timeout=5, return_immediately=True)
        dead = sub.pull(subscription=dls, max_messages=1, timeout=5, return_immediately=True).received_messages
    assert dead and dead[0].message.data == b"poison"
    attrs = dead[0].message.attributes
    assert attrs["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert attrs["CloudPubSubDeadLetterSourceSubscription"] == "work-sub"
    assert sub.pull(subscription=subscription, max_messages=1, timeout=5,
                    return_immediately=True).received_messages == []
    sub.close()
    srv2.kill()


def test_retry_backoff_delays_redelivery(clients):
    pub, sub = clients
    topic = pub.topic_path("proj", "backoff-topic")
    subscription = sub.subscription_path("proj", "backoff-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(request={"name": subscription, "topic": topic,
                                     "retry_policy": {"minimum_backoff": {"seconds": 2},
                                                      "maximum_backoff": {"seconds": 10}}})
    pub.publish(topic, b"later").result(timeout=10)
    got = sub.pull(subscription=subscription, max_messages=1, timeout=10).received_messages
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[got[0].ack_id], ack_deadline_seconds=0)
    t0 = time.monotonic()
    assert sub.pull(subscription=subscription, max_messages=1, timeout=5,
                    return_immediately=True).received_messages == []
    again = sub.pull(subscription=subscription, max_messages=1, timeout=15).received_messages
    assert again and again[0].message.data == b"later"
    assert time.monotonic() - t0 >= 1.5  # coarse: the simulated-clock tests check the exact schedule


def test_filter_delivers_only_matching_messages(clients):
    pub, sub = clients
    topic = pub.topic_path("proj", "filtered-topic")
    subscription = sub.subscription_path("proj", "filtered-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(request={"name": subscription, "topic": topic,
                                     "filter": 'attributes.region = "eu" AND NOT attributes:test'})
    for region, test in [("eu", False), ("us", False), ("eu", True), ("eu", False)]:
        attrs = {"region": region, **({"test": "1"} if test else {})}
        pub.publish(topic, f"{region}-{test}".encode(), **attrs).result(timeout=10)
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        resp = sub.pull(subscription=subscription, max_messages=10, timeout=5)
        got += [m.message.data for m in resp.received_messages]
        if resp.received_messages:
            sub.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in resp.received_messages])
    assert got == [b"eu-False", b"eu-False"]
    assert sub.pull(subscription=subscription, max_messages=10, timeout=5,
                    return_immediately=True).received_messages == []
    with pytest.raises(Exception, match="position"):
        sub.create_subscription(request={"name": subscription + "-bad", "topic": topic,
                                         "filter": "attributes:a AND attributes:b OR attributes:c"})


def test_dead_letter_topic_must_exist_and_its_deletion_keeps_the_messages(clients):
    from google.api_core import exceptions as gexc

    pub, sub = clients
    topic, dlt = pub.topic_path("proj", "dl-src"), pub.topic_path("proj", "dl-missing")
    subscription = sub.subscription_path("proj", "dl-src-sub")
    pub.create_topic(name=topic)
    policy = {"dead_letter_topic": dlt, "max_delivery_attempts": 5}
    with pytest.raises(gexc.NotFound, match="dl-missing"):
        sub.create_subscription(request={"name": subscription, "topic": topic, "dead_letter_policy": policy})
    with pytest.raises(gexc.NotFound):
        sub.get_subscription(subscription=subscription)  # nothing was created
    sub.create_subscription(name=subscription, topic=topic)
    with pytest.raises(gexc.NotFound, match="dl-missing"):
        sub.update_subscription(request={"subscription": {"name": subscription, "dead_letter_policy": policy},
                                         "update_mask": {"paths": ["dead_letter_policy"]}})
    assert not sub.get_subscription(subscription=subscription).dead_letter_policy.dead_letter_topic

    # With the topic there the policy is taken; deleting the topic afterwards is allowed, as on the service:
    # forwarding then fails and the message stays in the subscription, delivered again and again.
    pub.create_topic(name=dlt)
    sub.update_subscription(request={"subscription": {"name": subscription, "dead_letter_policy": policy},
                                     "update_mask": {"paths": ["dead_letter_policy"]}})
    pub.delete_topic(topic=dlt)
    assert sub.get_subscription(subscription=subscription).dead_letter_policy.dead_letter_topic == dlt
    pub.publish(topic, b"poison").result(timeout=10)
    attempts = []
    deadline = time.monotonic() + 30
    while len(attempts) < 7 and time.monotonic() < deadline:
        got = sub.pull(subscription=subscription, max_messages=1, timeout=10).received_messages
        for m in got:
            assert m.message.data == b"poison"
            attempts.append(m.delivery_attempt)
            sub.modify_ack_deadline(subscription=subscription, ack_ids=[m.ack_id], ack_deadline_seconds=0)
    assert len(attempts) == 7 and attempts[:5] == [1, 2, 3, 4, 5]  # past max_delivery_attempts, still here
