"""Cross-region copies (docs/regions.md): a topic labelled `pigeon-copy-to: east` has the west's messages copied
into the east as they are stored, with its subscriptions' ack state. While the west serves, nothing of the copy is
handed out (each message comes once); once the west is lost for good (its node and etcd killed) and declared lost
(`pigeon cluster lose-region west`), the east's subscribers receive every west message not acknowledged before —
same ids, per-key order — and none that was. Real etcds and nodes, the official Python client."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from pigeon.testing.cluster import clients_of, stop_subscriber
from pigeon.testing.regions import Deployment

pytestmark = pytest.mark.e2e

P = "projects/regions"
SHARDS = 2
SHARD_MASK = 63


def _ordering_publisher(node):
    import os

    from google.cloud import pubsub_v1

    os.environ["PUBSUB_EMULATOR_HOST"] = node.address
    try:
        return pubsub_v1.PublisherClient(publisher_options=pubsub_v1.types.PublisherOptions(
            enable_message_ordering=True))
    finally:
        del os.environ["PUBSUB_EMULATOR_HOST"]


def _metric(node, name: str, topic: str | None = None) -> float | None:
    with urllib.request.urlopen(f"{node.http}/metrics", timeout=30) as r:
        text = r.read().decode()
    labels = f'{{region="west",topic="{re.escape(topic)}"}}' if topic else ""
    m = re.search(rf'^{name}{labels} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def _until(what: str, check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _receive(subscriber, sub: str, want: set[str], timeout: float = 60.0) -> list:
    """(message id, data, ordering key) of each message a StreamingPull receives, in order, acked as they come,
    until every id of `want` came."""
    got, done, lock = [], threading.Event(), threading.Lock()

    def on(message):
        with lock:
            got.append((message.message_id, message.data, message.ordering_key))
            if want <= {g[0] for g in got}:
                done.set()
        message.ack()

    future = subscriber.subscribe(sub, on)
    done.wait(timeout)
    stop_subscriber(future)
    return got


def test_a_region_lost_for_good_is_served_from_its_copy(tmp_path):
    from google.api_core import exceptions
    from google.protobuf import field_mask_pb2

    dep = Deployment(str(tmp_path), shards_per_topic=SHARDS, region_slots=4).start()
    try:
        east, west = dep.node("east"), dep.node("west")
        pub_e, sub_e = clients_of(east)
        pub_w = _ordering_publisher(west)
        topic, sub = f"{P}/topics/copied", f"{P}/subscriptions/copied"
        pub_e.create_topic(request={"name": topic, "labels": {"pigeon-copy-to": "east"}})
        sub_e.create_subscription(request={"name": sub, "topic": topic, "ack_deadline_seconds": 10,
                                           "enable_message_ordering": True})

        keyed = [pub_w.publish(topic, f"k{i}".encode(), ordering_key="a").result(timeout=30) for i in range(10)]
        loose = [pub_w.publish(topic, f"m{i}".encode()).result(timeout=30) for i in range(10)]
        assert {(int(m) & SHARD_MASK) // SHARDS for m in keyed + loose} == {1}  # stored in the west

        # received through the east from the west, which leases them: the copy is held back (the east leases
        # nothing of it); the first of each kind acknowledged as they come (the key's next wait for its acks)
        acked, pending = keyed[:4] + loose[:5], set(keyed[:4] + loose[:5])
        deadline = time.monotonic() + 60
        while pending:
            assert time.monotonic() < deadline, f"{len(pending)} of {len(acked)} to acknowledge not received"
            resp = sub_e.pull(request={"subscription": sub, "max_messages": 50}, timeout=30)
            ack = [r.ack_id for r in resp.received_messages if r.message.message_id in pending]
            pending -= {r.message.message_id for r in resp.received_messages}
            if ack:
                sub_e.acknowledge(subscription=sub, ack_ids=ack)
        assert _metric(east, "pigeon_outstanding_messages") == 0 and _metric(west, "pigeon_outstanding_messages") > 0
        acked_at = time.monotonic()

        # the copy caught up, and followed the acks
        _until("the copy", lambda: _metric(east, "pigeon_region_copied_messages_total", topic) == 20 and
               _metric(east, "pigeon_region_copy_lag_messages", topic) == 0)
        _until("the copy's ack state", lambda: (_metric(east, "pigeon_region_copy_acks_age_seconds", topic)
                                                or float("inf")) < time.monotonic() - acked_at)
        assert _metric(east, "pigeon_region_copy_lag_seconds", topic) < 5  # (caught up: its last read's age)

        west.kill()  # lost for good: its node and its etcd
        dep.etcds["west"].kill()
        out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "lose-region", "west", "--global-etcd",
                              dep.etcds["global"].endpoint], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        shown = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "regions", "--global-etcd",
                                dep.etcds["global"].endpoint, "-f", "json"], capture_output=True, text=True,
                               timeout=60)
        assert [(r["region"], r["lost"]) for r in json.loads(shown.stdout)["regions"]] == [
            ("east", False), ("west", True)]

        def seen_lost():  # the console's view: the east's node read it from the global store
            with urllib.request.urlopen(f"{east.http}/v1/cluster", timeout=30) as r:
                return {v["region"]: v.get("lost", False) for v in json.load(r)["regions"]} == {"east": False,
                                                                                                "west": True}
        _until("the east to read that the west is lost", seen_lost)

        # every west message not acknowledged comes from the copy: same ids and data, the key's in order
        want = set(keyed[4:] + loose[5:])
        got = _receive(sub_e, sub, want)
        ids = [g[0] for g in got]
        assert want <= set(ids) and not set(ids) & set(acked)
        assert [g[0] for g in got if g[2] == "a"] == keyed[4:]
        assert sorted(g[1] for g in got) == sorted([f"k{i}".encode() for i in range(4, 10)] +
                                                   [f"m{i}".encode() for i in range(5, 10)])
        time.sleep(11)  # (past the ack deadline: the acks reached the copy, nothing comes again)
        assert sub_e.pull(request={"subscription": sub, "max_messages": 50, "return_immediately": True},
                          timeout=30).received_messages == []

        # the east publishes on, in its own shards; the copy region cannot be changed
        assert (int(pub_e.publish(topic, b"after").result(timeout=30)) & SHARD_MASK) // SHARDS == 0
        with pytest.raises(exceptions.InvalidArgument, match="cannot change"):
            pub_e.update_topic(request={"topic": {"name": topic, "labels": {}},
                                        "update_mask": field_mask_pb2.FieldMask(paths=["labels"])})
    finally:
        dep.stop()
