"""A bundle owner cut off from its peers while it keeps its etcd session (three real nodes; every node-to-node
connection of the cut node goes through a proxy that stops carrying bytes): it can acknowledge nothing, so it
steps down — says so in etcd, gives its bundles up, the others fence and take them over — and publishes to its
topics are answered again by a node that can replicate them while the cut lasts. Healed, it takes bundles again;
every publish that was acknowledged is delivered."""

from __future__ import annotations

import time

import pytest

from pigeon.core.bundles import bundle_of
from pigeon.testing.chaos import Cluster
from pigeon.testing.cluster import await_status, clients_of, owners, topic_owned_by

pytestmark = pytest.mark.e2e

P = "projects/cut"


def _state(st: dict, node: str) -> tuple[str, int]:
    row = next(r for r in st["nodes"] if r["node"] == node)
    return row["state"], row["bundles"]


def test_an_owner_cut_off_from_its_peers_steps_down_and_takes_bundles_again_once_healed(tmp_path):
    cluster = Cluster(str(tmp_path), split=True).start()
    try:
        etcd = cluster.etcd.endpoint
        topic = topic_owned_by(owners(etcd), "n1", f"{P}/topics/t")
        subscription = f"{P}/subscriptions/all"
        (pub1, _), (pub2, sub2) = clients_of(cluster.nodes["n1"]), clients_of(cluster.nodes["n2"])
        pub2.create_topic(name=topic)
        sub2.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=60)
        acked = {pub2.publish(topic, f"before-{i}".encode()).result(timeout=30) for i in range(20)}

        cluster.network.cut("n1", etcd=False)
        stuck = [pub1.publish(topic, f"cut-{i}".encode()) for i in range(20)]  # n1 cannot replicate them
        st = await_status(etcd, lambda st: _state(st, "n1") == ("cut off", 0), timeout=40,
                          what="n1 to step down")
        assert st["owners"].get(str(bundle_of(topic, 16))) != "n1"
        # while the cut lasts, a node that can replicate answers for the topic
        acked |= {pub2.publish(topic, f"during-{i}".encode()).result(timeout=30) for i in range(20)}

        cluster.network.heal()
        await_status(etcd, lambda st: _state(st, "n1")[0] == "up" and _state(st, "n1")[1] > 0, timeout=40,
                     what="n1 to take bundles again")
        for f in stuck:  # each was acknowledged or failed; only the acknowledged ones are promised
            try:
                acked.add(f.result(timeout=60))
            except Exception:  # noqa: BLE001 — not acknowledged: nothing is promised about it
                pass
        acked |= {pub2.publish(topic, f"after-{i}".encode()).result(timeout=30) for i in range(20)}

        got: set[str] = set()
        deadline = time.monotonic() + 60
        while not acked <= got and time.monotonic() < deadline:
            r = sub2.pull(subscription=subscription, max_messages=100, timeout=10)
            got |= {m.message.message_id for m in r.received_messages}
            if r.received_messages:
                sub2.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in r.received_messages])
        assert acked <= got, f"{len(acked - got)} acknowledged publishes were not delivered"
    finally:
        cluster.stop()

