"""Dead letters across a cluster: a subscription's messages past their delivery attempts go to its dead-letter
topic also when another node owns that topic's bundle (the source's owner publishes them there as a forwarded
call), and are then acknowledged on the source. Before, such a publish was refused on the source's owner ("the
topic's bundle moved to another node"), the messages came back at every lease's end and never left."""

from __future__ import annotations

import time

import pytest
from google.pubsub_v1 import types

from pigeon.testing.cluster import clients_of, owners, topic_owned_by

pytestmark = pytest.mark.e2e

P = "projects/dead"


def test_messages_past_their_attempts_reach_a_dead_letter_topic_another_node_owns(three_nodes, etcd):
    owner_of = owners(etcd.endpoint)
    source = topic_owned_by(owner_of, "n1", f"{P}/topics/work")
    dead = topic_owned_by(owner_of, "n2", f"{P}/topics/dead")
    pub, sub = clients_of(three_nodes["n3"])  # through a third node: every call forwarded
    pub.create_topic(name=source)
    pub.create_topic(name=dead)
    name, dead_sub = f"{P}/subscriptions/work", f"{P}/subscriptions/dead"
    sub.create_subscription(name=dead_sub, topic=dead)
    sub.create_subscription(request={"name": name, "topic": source, "ack_deadline_seconds": 10,
                                     "dead_letter_policy": types.DeadLetterPolicy(dead_letter_topic=dead,
                                                                                  max_delivery_attempts=5)})
    ids = {pub.publish(source, f"poison{i}".encode()).result(timeout=30) for i in range(3)}

    attempts = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = sub.pull(subscription=name, max_messages=10, timeout=10)
        if r.received_messages:
            attempts += 1
            sub.modify_ack_deadline(subscription=name, ack_ids=[m.ack_id for m in r.received_messages],
                                    ack_deadline_seconds=0)  # a nack: the next delivery is at once
        elif attempts >= 5:
            break
    got: dict[str, dict] = {}
    deadline = time.monotonic() + 30
    while len(got) < len(ids) and time.monotonic() < deadline:
        r = sub.pull(subscription=dead_sub, max_messages=10, timeout=10)
        for m in r.received_messages:
            got[m.message.data.decode()] = dict(m.message.attributes)
        if r.received_messages:
            sub.acknowledge(subscription=dead_sub, ack_ids=[m.ack_id for m in r.received_messages])
    assert sorted(got) == [f"poison{i}" for i in range(3)], f"dead-lettered: {sorted(got)}"
    assert all(a["CloudPubSubDeadLetterSourceSubscription"] == "work" and
               a["CloudPubSubDeadLetterSourceDeliveryCount"] == "5" for a in got.values()), got
    r = sub.pull(subscription=name, max_messages=10, timeout=5)
    assert not r.received_messages, "acknowledged on the source once dead-lettered"
