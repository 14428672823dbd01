"""Regions (docs/regions.md): two Pigeon clusters, each with an etcd of its own, sharing a third etcd as their
global store. Through the official client, unchanged: a topic and a subscription made in one region exist in the
other; a message is stored in the region of the node that took its publish (its id's shard says which); a
subscriber in either region receives every region's messages once, and its acks reach the storing region and
stick; with a region down, the other's subscribers keep receiving their own region's messages, and the cut
region's arrive once it is back."""

from __future__ import annotations

import json
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
SHARDS = 2  # a topic's shards in each region slot
SLOTS = 4
SHARD_MASK = 63


@pytest.fixture
def regions(tmp_path):
    """Region "east" (slot 0) and "west" (slot 1): one node each over its own etcd, and the global store; nodes
    reach each other through the test network (pigeon.testing.regions)."""
    dep = Deployment(str(tmp_path), shards_per_topic=SHARDS, region_slots=SLOTS).start()
    yield {"east": dep.node("east"), "west": dep.node("west")}, dep
    dep.stop()


def _slot(message_id: str) -> int:
    return (int(message_id) & SHARD_MASK) // SHARDS


def _receive(subscriber, sub: str, want, timeout: float = 30.0) -> dict[str, bytes]:
    """Messages a StreamingPull receives (acked as they come) until `want` came — a number of distinct ids, or a
    set of ids all received: id → data."""
    got: dict[str, bytes] = {}
    done = threading.Event()
    lock = threading.Lock()

    def on(message):
        with lock:
            got[message.message_id] = message.data
            if (len(got) >= want) if isinstance(want, int) else want <= got.keys():
                done.set()
        message.ack()

    future = subscriber.subscribe(sub, on)
    done.wait(timeout)
    stop_subscriber(future)
    return got


def _pull_all(subscriber, sub: str, timeout: float = 5.0) -> list:
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = subscriber.pull(request={"subscription": sub, "max_messages": 100, "return_immediately": True},
                               timeout=10)
        out += resp.received_messages
        if not resp.received_messages:
            time.sleep(0.2)
    return out


def _made(nodes, name: str, subscribed_in: str):
    """Official clients of both regions, and a topic made in the east with a subscription made in `subscribed_in`:
    (east's publisher, east's subscriber, west's publisher, west's subscriber, topic, subscription)."""
    pub_e, sub_e = clients_of(nodes["east"])
    pub_w, sub_w = clients_of(nodes["west"])
    topic, sub = f"{P}/topics/{name}", f"{P}/subscriptions/{name}"
    pub_e.create_topic(name=topic)
    (sub_w if subscribed_in == "west" else sub_e).create_subscription(name=sub, topic=topic, ack_deadline_seconds=10)
    return pub_e, sub_e, pub_w, sub_w, topic, sub


def test_publish_nearby_consume_anywhere(regions):
    nodes, dep = regions
    pub_e, sub_e, pub_w, sub_w, topic, sub = _made(nodes, "orders", "west")  # made in the other region
    assert sub_e.get_subscription(subscription=sub).topic == topic  # … and there in the first at once

    east = [pub_e.publish(topic, f"east-{i}".encode()).result(timeout=30) for i in range(20)]
    west = [pub_w.publish(topic, f"west-{i}".encode()).result(timeout=30) for i in range(20)]
    assert {_slot(m) for m in east} == {0} and {_slot(m) for m in west} == {1}  # stored where published

    got = _receive(sub_w, sub, 40)  # a subscriber in the west gets both regions' messages
    assert set(got) == set(east) | set(west)
    assert sorted(got[m] for m in east) == sorted(f"east-{i}".encode() for i in range(20))
    # every ack reached the region that stores the message: nothing comes again, through either region
    time.sleep(11)  # (past the ack deadline)
    assert _pull_all(sub_e, sub) == [] and _pull_all(sub_w, sub) == []

    # the operator's view of the deployment, from its global store
    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "regions", "--global-etcd",
                          dep.etcds["global"].endpoint, "-f", "json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["slots"] == SLOTS
    assert [(r["region"], r["slot"], [g["address"] for g in r["gateways"]]) for r in shown["regions"]] == [
        ("east", 0, [nodes["east"].address]), ("west", 1, [nodes["west"].address])]
    with urllib.request.urlopen(f"{nodes['east'].http}/v1/cluster", timeout=30) as r:  # the console's view
        seen = json.load(r)
    assert seen["region"] == "east"
    assert [(v["region"], v["gateways"]) for v in seen["regions"]] == [
        ("east", [nodes["east"].address]), ("west", [nodes["west"].address])]
    assert next(v for v in seen["regions"] if v["region"] == "west")["roundTripMs"] > 0


def test_a_region_down_delays_only_its_own_messages(regions):
    nodes, _ = regions
    pub_e, sub_e, pub_w, _, topic, sub = _made(nodes, "cut", "east")
    first = pub_w.publish(topic, b"west-1").result(timeout=30)
    assert first in _receive(sub_e, sub, {first})  # the east's subscriber reaches the west's shards
    held = pub_w.publish(topic, b"west-2").result(timeout=30)  # durable in the west, not delivered yet
    nodes["west"].kill()  # kill -9 of the west's only node

    east = [pub_e.publish(topic, f"east-{i}".encode()).result(timeout=30) for i in range(10)]
    got = _receive(sub_e, sub, set(east))  # the east's own messages flow meanwhile
    assert set(east) <= set(got) and held not in got

    nodes["west"].start()  # back: its message arrives through the east's subscriber
    assert held in _receive(sub_e, sub, {held}, timeout=60)


def test_a_storage_policy_stores_where_it_allows(regions):
    from google.api_core import exceptions

    nodes, _ = regions
    pub_e, sub_e = clients_of(nodes["east"])
    pub_w, sub_w = clients_of(nodes["west"])
    kept, enforced = f"{P}/topics/kept-west", f"{P}/topics/enforced-west"
    pub_e.create_topic(request={"name": kept, "message_storage_policy": {"allowed_persistence_regions": ["west"]}})
    pub_e.create_topic(request={"name": enforced, "message_storage_policy": {
        "allowed_persistence_regions": ["west"], "enforce_in_transit": True}})
    assert list(pub_w.get_topic(topic=kept).message_storage_policy.allowed_persistence_regions) == ["west"]
    for name in (kept, enforced):
        sub_w.create_subscription(name=name.replace("/topics/", "/subscriptions/"), topic=name)

    # published in the east, stored in the west (its ids' shards are the west's), delivered as any other
    ids = [pub_e.publish(kept, f"m{i}".encode(), k="v").result(timeout=30) for i in range(5)]
    assert {_slot(m) for m in ids} == {1}
    assert set(_receive(sub_e, kept.replace("/topics/", "/subscriptions/"), 5)) == set(ids)

    # enforced in transit: the east refuses publishes and pulls (FAILED_PRECONDITION); the west takes them
    with pytest.raises(exceptions.FailedPrecondition, match="enforces it in transit"):
        pub_e.publish(enforced, b"refused").result(timeout=30)
    sub = enforced.replace("/topics/", "/subscriptions/")
    with pytest.raises(exceptions.FailedPrecondition):
        sub_e.pull(request={"subscription": sub, "max_messages": 1}, timeout=10)
    mid = pub_w.publish(enforced, b"taken").result(timeout=30)
    assert _slot(mid) == 1
    assert [m.message.message_id for m in _pull_all(sub_w, sub)] == [mid]

    with pytest.raises(exceptions.InvalidArgument, match="not a valid configuration"):
        pub_e.create_topic(request={"name": f"{P}/topics/nowhere", "message_storage_policy": {
            "enforce_in_transit": True}})


def test_a_region_cut_off_publishes_on_and_its_messages_arrive_after(regions):
    from google.api_core import exceptions

    nodes, dep = regions
    pub_e, sub_e, pub_w, _, topic, sub = _made(nodes, "island", "east")
    _, sub_w = clients_of(nodes["west"])
    assert sub_w.get_subscription(subscription=sub).topic == topic  # (the west has them: it caught up)
    dep.cut_off("west")  # from the east and from the global store (which lies in the east)
    west = [pub_w.publish(topic, f"west-{i}".encode()).result(timeout=30) for i in range(5)]  # on, in the west
    east = [pub_e.publish(topic, f"east-{i}".encode()).result(timeout=30) for i in range(5)]
    assert set(_receive(sub_e, sub, 5)) == set(east)  # the east's own flow on
    with pytest.raises(exceptions.ServiceUnavailable):  # an admin change needs the global store
        sub_w.create_subscription(request={"name": f"{P}/subscriptions/later", "topic": topic},
                                  timeout=15, retry=None)
    with pytest.raises(exceptions.ServiceUnavailable):  # a seek needs every region's part: refused, retried whole
        sub_e.seek(request={"subscription": sub, "time": {"seconds": int(time.time())}}, timeout=30, retry=None)
    with pytest.raises(exceptions.ServiceUnavailable):  # … and so does a snapshot (each region's cursor)
        sub_e.create_snapshot(request={"name": f"{P}/snapshots/cut", "subscription": sub}, timeout=30, retry=None)
    dep.heal()
    assert set(west) <= set(_receive(sub_e, sub, set(west), timeout=60))  # the west's, once it is back


def test_the_console_shows_the_regions(regions):
    """The console's cluster page (real Chromium) lists every region, this node's marked, the others with where
    they are reached and their round trip."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from pigeon.testing.browser import chromium

    nodes, _ = regions
    d = chromium()
    try:
        d.get(f"{nodes['east'].http}/#/cluster")

        def rows(d):
            panel = next((p for p in d.find_elements(By.CSS_SELECTOR, ".panel")
                          if p.find_elements(By.TAG_NAME, "h2") and p.find_element(By.TAG_NAME, "h2").text == "Regions"),
                         None)
            return [r.text for r in panel.find_elements(By.CSS_SELECTOR, "tbody tr")] if panel else None

        shown = WebDriverWait(d, 30, poll_frequency=0.2).until(lambda d: (r := rows(d)) and " ms" in r[-1] and r)
    finally:
        d.quit()
    assert shown[0].startswith("east (this one) 0")
    assert shown[1].startswith(f"west 1 {nodes['west'].address}") and shown[1].endswith(" ms")
