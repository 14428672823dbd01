"""The cluster's metadata log on etcd, with real nodes and the official clients: a topic or subscription made
through one node is there on every node, a change raced from two nodes is taken once, and a node killed while
others change metadata comes back with its copy completed from etcd."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry

from pigeon.testing.cluster import clients_of, await_status, node_process, wipe

pytestmark = pytest.mark.e2e

P = "projects/meta"


@pytest.fixture
def nodes(etcd, tmp_path):
    wipe(etcd.endpoint)
    started = {i: node_process(str(tmp_path), etcd.endpoint, i).start() for i in ("n1", "n2")}
    await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == 2)
    yield started
    for n in started.values():
        n.kill()


def eventually(fn, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (AssertionError, gexc.NotFound):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def names(pub) -> set[str]:
    return {t.name for t in pub.list_topics(project=P)}


def test_metadata_made_through_one_node_is_on_every_node(nodes):
    (pub1, sub1), (pub2, sub2) = clients_of(nodes["n1"]), clients_of(nodes["n2"])
    pub1.create_topic(request={"name": f"{P}/topics/tp1", "labels": {"team": "a"}})
    sub2.create_subscription(name=f"{P}/subscriptions/sb1", topic=f"{P}/topics/tp1", ack_deadline_seconds=42)
    assert eventually(lambda: pub2.get_topic(topic=f"{P}/topics/tp1")).labels == {"team": "a"}
    assert eventually(lambda: sub1.get_subscription(subscription=f"{P}/subscriptions/sb1")).ack_deadline_seconds == 42
    with pytest.raises(gexc.AlreadyExists):  # n1 knows of what n2 made
        eventually(lambda: sub1.create_subscription(name=f"{P}/subscriptions/sb1", topic=f"{P}/topics/tp1"))
    pub2.delete_topic(topic=f"{P}/topics/tp1")
    eventually(lambda: assert_gone(pub1, f"{P}/topics/tp1"))
    assert sub1.get_subscription(subscription=f"{P}/subscriptions/sb1").topic == "_deleted-topic_"


def assert_gone(pub, name):
    with pytest.raises(gexc.NotFound):
        pub.get_topic(topic=name)


def test_the_same_topic_created_through_two_nodes_at_once_is_created_once(nodes):
    pubs = [clients_of(nodes["n1"])[0], clients_of(nodes["n2"])[0]]
    no_retry = Retry(predicate=lambda e: False)
    for round_ in range(10):
        name = f"{P}/topics/race-{round_}"

        def create(pub):
            try:
                pub.create_topic(name=name, retry=no_retry)
                return "created"
            except gexc.AlreadyExists:
                return "exists"
            except gexc.ServiceUnavailable as e:
                assert "changed the cluster's metadata at the same moment" in e.message
                return "conflict"

        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            outcomes = sorted(ex.map(create, pubs))
        assert outcomes.count("created") == 1, outcomes
        for pub in pubs:
            eventually(lambda: pub.get_topic(topic=name))


def test_a_node_killed_while_others_change_metadata_comes_back_complete(nodes, etcd):
    pub1, _ = clients_of(nodes["n1"])
    for i in range(5):
        pub1.create_topic(name=f"{P}/topics/before-{i}")
    pub2, _ = clients_of(nodes["n2"])
    def has_them():
        assert names(pub2) >= {f"{P}/topics/before-{i}" for i in range(5)}
    eventually(has_them)
    nodes["n2"].kill()
    for i in range(5):
        pub1.create_topic(name=f"{P}/topics/after-{i}")
    pub1.delete_topic(topic=f"{P}/topics/before-0")
    nodes["n2"].start()
    want = {f"{P}/topics/before-{i}" for i in range(1, 5)} | {f"{P}/topics/after-{i}" for i in range(5)}
    assert names(clients_of(nodes["n2"])[0]) == want  # caught up before it listened
