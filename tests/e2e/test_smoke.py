import pytest

pytestmark = pytest.mark.e2e


def test_publish_then_pull_round_trip(clients):
    pub, sub = clients
    topic = pub.topic_path("proj", "smoke-topic")
    subscription = sub.subscription_path("proj", "smoke-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    ids = [pub.publish(topic, f"m{i}".encode(), n=str(i)).result(timeout=10) for i in range(3)]
    assert len(set(ids)) == 3
    got = {}
    for _ in range(20):
        resp = sub.pull(subscription=subscription, max_messages=10, timeout=10)
        for m in resp.received_messages:
            got[m.message.message_id] = (m.message.data, m.message.attributes["n"])
        sub.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in resp.received_messages]) if resp.received_messages else None
        if len(got) == 3:
            break
    assert got == {ids[i]: (f"m{i}".encode(), str(i)) for i in range(3)}
