"""Repair: a storage member dies for good and a new node joins — the closed ledgers that had the dead member (and
those opened narrower than E while it was down) are copied to the new node, `pigeon cluster status` counts no
under-replicated ledger any more, and the data is still all there when the owner is killed afterwards (the new
owner reads the log back through the repaired ledgers)."""

from __future__ import annotations

import time

import pytest

from pigeon.testing.cluster import await_status, clients_of, node_process, owners, topic_owned_by

pytestmark = pytest.mark.e2e

P = "projects/repair"


def test_ledgers_of_a_dead_member_are_copied_to_a_new_node(three_nodes, etcd, tmp_path):
    topic = topic_owned_by(owners(etcd.endpoint), "n1", f"{P}/topics/kept")
    pub, sub = clients_of(three_nodes["n2"])
    pub.create_topic(name=topic)
    name = f"{P}/subscriptions/readers"
    sub.create_subscription(name=name, topic=topic)
    sent = {pub.publish(topic, f"a{i}".encode()).result(timeout=30) for i in range(50)}

    three_nodes["n3"].kill()  # a member of every ledger so far; it never comes back
    sent |= {pub.publish(topic, f"b{i}".encode()).result(timeout=30) for i in range(50)}
    n4 = node_process(str(tmp_path), etcd.endpoint, "n4").start()
    try:
        st = await_status(etcd.endpoint, lambda st: st["ledgers"]["under_replicated"] == 0
                          and not any(r["node"] == "n3" for r in st["nodes"] if r["state"] == "up"),
                          timeout=60, what="every ledger to have members that are up")
        assert st["ledgers"]["total"] > st["bundles"], "ledgers were closed (rolls) and kept"
        sent |= {pub.publish(topic, f"c{i}".encode()).result(timeout=30) for i in range(50)}

        three_nodes["n1"].kill()  # the owner: another node reads the log back from the repaired ledgers
        got: set[str] = set()
        deadline = time.monotonic() + 60
        while got != sent and time.monotonic() < deadline:
            try:
                r = sub.pull(subscription=name, max_messages=200, timeout=10)
            except Exception:  # noqa: BLE001 — the bundle is moving for a moment
                time.sleep(0.2)
                continue
            got |= {m.message.message_id for m in r.received_messages}
            if r.received_messages:
                sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in r.received_messages])
        assert got == sent, f"{len(sent - got)} acknowledged publishes lost"
    finally:
        n4.kill()
