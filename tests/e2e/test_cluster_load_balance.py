"""Placement by measured load (docs/cluster.md, "Scale-out" 4.1–4.2) on three real nodes and etcd: topics whose
bundles the hash gives one node are published to hard; the nodes report their bundles' loads, the planner (the
lowest id) moves a busy bundle to an idle node, and every node follows — while the official client publishes on
through it, with no call failed and every message received once."""

from __future__ import annotations

import threading
import time

import pytest

from pigeon.cluster import metadata as M
from pigeon.cluster.placement import decode_moves
from pigeon.core.bundles import bundle_of
from pigeon.testing.cluster import clients_of, settled_owners, start_nodes

pytestmark = pytest.mark.e2e

P = "projects/load"
BUNDLES = 16


@pytest.fixture
def balancing_nodes(etcd, tmp_path):
    started = start_nodes(str(tmp_path), etcd.endpoint, env={"PIGEON_LOAD_BALANCE_S": "2"}, http=True)
    yield started
    for n in started.values():
        n.kill()


def _with_meta(endpoint: str, fn):
    import asyncio

    from pigeon.node.meta_etcd import EtcdMetadata

    async def go():
        meta = EtcdMetadata(endpoint)
        try:
            return await fn(meta)
        finally:
            await meta.close()

    return asyncio.run(go())


def _read(endpoint: str, key: str) -> bytes | None:
    async def get(meta):
        kv = await meta.get(key)
        return kv.value if kv else None

    return _with_meta(endpoint, get)


def test_a_busy_node_gives_a_bundle_to_an_idle_one_under_load(balancing_nodes, etcd):
    owner_of = settled_owners(etcd.endpoint, BUNDLES)
    busy = owner_of[0]
    names: list[str] = []  # topics in two distinct bundles of one node
    for i in range(10_000):
        name = f"{P}/topics/hot-{i}"
        b = bundle_of(name, BUNDLES)
        if owner_of[b] == busy and b not in {bundle_of(n, BUNDLES) for n in names}:
            names.append(name)
            if len(names) == 2:
                break
    hot = {bundle_of(n, BUNDLES) for n in names}
    others = [n for n in balancing_nodes if n != busy]
    pub, sub = clients_of(balancing_nodes[others[0]])
    for t in names:
        pub.create_topic(name=t)
        sub.create_subscription(name=t.replace("/topics/", "/subscriptions/"), topic=t)

    sent: set[str] = set()
    failures: list[BaseException] = []
    stop = threading.Event()

    def publish(topic: str) -> None:
        i = 0
        while not stop.is_set():
            futures = [pub.publish(topic, f"{topic}-{i + k}".encode() * 32) for k in range(200)]
            i += 200
            for f in futures:
                try:
                    sent.add(f.result(timeout=60))
                except BaseException as e:  # noqa: BLE001 — the assertion below reports it
                    failures.append(e)

    assert not decode_moves(_read(etcd.endpoint, M.PLACEMENT_KEY)).keys() & hot, "moved before any load"
    threads = [threading.Thread(target=publish, args=(t,), daemon=True) for t in names]
    for th in threads:
        th.start()
    moved: dict[int, str] = {}
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and not (moved.keys() & hot):
            time.sleep(0.5)
            moved = decode_moves(_read(etcd.endpoint, M.PLACEMENT_KEY))
    finally:
        time.sleep(3)  # publishes keep going through the move itself
        stop.set()
        for th in threads:
            th.join(timeout=90)
    assert moved.keys() & hot, f"no busy bundle moved off {busy} within 60 s (moves: {moved})"
    from tests.e2e.test_metrics import scrape

    m = scrape(balancing_nodes[busy].http)  # what the planner read, in the busy node's metrics
    assert m[("pigeon_cluster_node_load_cores", ())] > 0
    assert any(v > 0 for (name, labels), v in m.items() if name == "pigeon_cluster_bundle_load_cores"), \
        "no bundle of the busy node shows a load"
    went = {b: moved[b] for b in moved.keys() & hot}
    assert all(n in others for n in went.values())
    now = settled_owners(etcd.endpoint, BUNDLES)
    assert all(now[b] == n for b, n in went.items()), "the planner's move was not followed"
    assert not failures, f"publishes failed while a bundle moved: {failures[:3]}"
    from pigeon.node.membership import status_of

    st = _with_meta(etcd.endpoint, status_of)  # what `pigeon cluster status` shows
    assert {int(b): n for b, n in st["moves"].items()}.items() >= went.items()
    assert all(r["cores"] is not None and r["cores"] >= 0 for r in st["nodes"]), st["nodes"]

    got: dict[str, int] = {}
    deadline = time.monotonic() + 90
    for t in names:
        s = t.replace("/topics/", "/subscriptions/")
        while len(got) < len(sent) and time.monotonic() < deadline:
            r = sub.pull(subscription=s, max_messages=1000, timeout=30)
            if not r.received_messages:
                break
            for m in r.received_messages:
                got[m.message.message_id] = got.get(m.message.message_id, 0) + 1
            sub.acknowledge(subscription=s, ack_ids=[m.ack_id for m in r.received_messages])
    assert set(got) == sent, f"{len(sent - set(got))} published messages never delivered"
    assert all(c == 1 for c in got.values()), "a message was delivered twice though nothing was leased as it moved"
