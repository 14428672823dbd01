"""A shard handed from one bundle log to another (docs/cluster.md, "Scale-out" 4.3) on three real nodes and etcd:
a topic of four shards, all in one bundle of n1, has a backlog, messages acked and messages out on lease when
`pigeon cluster move-shard` asks for one of its shards in a bundle of n2. n1 hands it over while the official
client publishes on through n3: no publish fails, every message is delivered, none acked before is delivered
again, the shard's old messages are read from the old log's ledgers and its new ones are stored in the new log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from pigeon.core.bundles import bundle_of
from pigeon.testing.cluster import RawStream, clients_of, settled_owners, start_nodes, topic_owned_by

pytestmark = pytest.mark.e2e

P = "projects/handover"
BUNDLES = 16


class _Publishing:
    """Publishers on threads, `batch` messages at a time each, until `stop`: (ids answered, failures)."""

    def __init__(self, pub, topic: str, data: bytes, batch: int, threads: int):
        self.pub, self.topic, self.data, self.batch = pub, topic, data, batch
        self.sent: set[str] = set()
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for th in self._threads:
            th.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            futures = [self.pub.publish(self.topic, self.data + f"-{i + k}".encode()) for k in range(self.batch)]
            i += self.batch
            for f in futures:
                try:
                    self.sent.add(f.result(timeout=60))
                except BaseException as e:  # noqa: BLE001 — the test reports it
                    self.failures.append(e)

    def stop(self) -> tuple[set[str], list[BaseException]]:
        self._stop.set()
        for th in self._threads:
            th.join(timeout=90)
        return self.sent, self.failures


def _log_line(path: str, pattern: str, timeout: float) -> re.Match | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            m = re.search(pattern, f.read())
        if m:
            return m
        time.sleep(0.2)
    return None


def _pull(sub, name: str, until: set[str], timeout: float = 60.0, ack: bool = True) -> dict[str, int]:
    got: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while not until <= got.keys() and time.monotonic() < deadline:
        try:
            r = sub.pull(subscription=name, max_messages=500, timeout=10)
        except Exception:  # noqa: BLE001 — the shard is between owners for a moment
            time.sleep(0.2)
            continue
        for m in r.received_messages:
            got[m.message.message_id] = got.get(m.message.message_id, 0) + 1
        if ack and r.received_messages:
            _ack(sub, name, [m.ack_id for m in r.received_messages])
    return got


def _ack(sub, name: str, ack_ids: list[str]) -> None:
    for _ in range(50):  # (refused while the shard is between owners: the call is retried, as clients do)
        try:
            sub.acknowledge(subscription=name, ack_ids=ack_ids)
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    raise AssertionError("acks refused for 10 s")


def test_a_shard_handed_to_another_owner_keeps_its_messages_and_acks(etcd, tmp_path):
    nodes = start_nodes(str(tmp_path), etcd.endpoint, http=True)
    try:
        owner_of = settled_owners(etcd.endpoint, BUNDLES)
        topic = topic_owned_by(owner_of, "n1", f"{P}/topics/t")
        to_bundle = min(b for b, n in owner_of.items() if n == "n2")
        pub, sub = clients_of(nodes["n3"])
        pub.create_topic(name=topic)
        name = f"{P}/subscriptions/readers"
        sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)

        early = {pub.publish(topic, f"early-{i}".encode()).result(timeout=30) for i in range(400)}
        r = sub.pull(subscription=name, max_messages=150, timeout=10)
        sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in r.received_messages])
        acked = {m.message.message_id for m in r.received_messages}
        r = sub.pull(subscription=name, max_messages=50, timeout=10)  # out on lease (600 s) as the shard moves
        leased = {m.message.message_id: m.ack_id for m in r.received_messages}
        assert acked and leased

        publishing = _Publishing(pub, topic, b"during", batch=50, threads=1)
        try:
            time.sleep(0.5)
            cli = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "move-shard", topic, "--shard", "1",
                                  "--bundle", str(to_bundle), "--etcd", etcd.endpoint],
                                 capture_output=True, text=True, timeout=60, env=dict(os.environ))
            assert cli.returncode == 0, cli.stderr
            homed = _log_line(str(tmp_path / "n1.log"), rf"shard 1 of {re.escape(topic)} is homed in log "
                                                        rf"{to_bundle + 1} \(hand-over 1\)", 60)
            assert homed, "n1 did not hand the shard over within 60 s"
            came = _log_line(str(tmp_path / "n2.log"), rf"shard 1 of {re.escape(topic)} comes into log "
                                                       rf"{to_bundle + 1} from log {bundle_of(topic, BUNDLES) + 1}", 5)
            assert came, "n2 did not take the shard in"
            time.sleep(1.0)  # publishes go on after the move, to the new home
        finally:
            sent, failures = publishing.stop()
        assert not failures, f"publishes failed while the shard moved: {failures[:3]}"
        assert len(sent) > 100

        # the leases given before the move hold at the new owner too: their acks count, wherever the shard is
        _ack(sub, name, list(leased.values()))
        want = (early - acked - set(leased)) | sent
        got = _pull(sub, name, want, timeout=90)
        assert want <= got.keys(), f"{len(want - got.keys())} published messages never delivered"
        assert not got.keys() & acked, "messages acked before the hand-over came back"
        assert not got.keys() & set(leased), "messages acked after the hand-over (leased before) came back"
        assert all(c == 1 for c in got.values()), "a message was delivered twice"
    finally:
        for n in nodes.values():
            n.kill()


def test_a_hot_bundles_busiest_topic_is_split_over_other_nodes_under_load(etcd, tmp_path):
    """Placement by load on (`--load-balance-s 2`): one topic, its four shards in one bundle of n1, published to
    hard through the other nodes. The planner finds the bundle busier alone than a node's share and names it hot;
    n1 asks for half the topic's shards in other nodes' bundles and hands them over — while the client publishes
    on, with no call failed and every message received once."""
    nodes = start_nodes(str(tmp_path), etcd.endpoint, env={"PIGEON_LOAD_BALANCE_S": "2"}, http=True)
    try:
        owner_of = settled_owners(etcd.endpoint, BUNDLES)
        topic = topic_owned_by(owner_of, "n1", f"{P}/topics/hot")
        pub, sub = clients_of(nodes["n2"])
        pub.create_topic(name=topic)
        name = f"{P}/subscriptions/hot-readers"
        sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)

        publishing = _Publishing(pub, topic, b"hot" * 200, batch=200, threads=2)
        try:
            split = _log_line(str(tmp_path / "n1.log"), rf"is hot: splitting {re.escape(topic)}", 90)
            assert split, "n1 never split the hot bundle"
            homed = _log_line(str(tmp_path / "n1.log"), rf"shard \d+ of {re.escape(topic)} is homed in log", 30)
            assert homed, "no shard was handed over"
            time.sleep(2.0)  # publishes go on to the topic's new layout
        finally:
            sent, failures = publishing.stop()
        assert not failures, f"publishes failed while the bundle split: {failures[:3]}"
        got = _pull(sub, name, sent, timeout=120)
        assert sent <= got.keys(), f"{len(sent - got.keys())} published messages never delivered"
        assert all(c == 1 for c in got.values()), "a message was delivered twice"
        from pigeon.node.membership import status_of
        from tests.e2e.test_cluster_load_balance import _with_meta

        st = _with_meta(etcd.endpoint, status_of)  # what `pigeon cluster status` shows: the shards asked to move
        assert st["homes"].get(topic), st["homes"]
        assert all(owner_of[int(b)] != "n1" for b in st["homes"][topic].values())
    finally:
        for n in nodes.values():
            n.kill()


def test_a_streaming_subscriber_gets_every_message_of_a_shard_handed_over_under_it(etcd, tmp_path):
    """The official client's StreamingPull through n3 while n1 hands a shard to n2: n1 ends its stream, n3 opens
    one to each shard's owner in its place, and the client's stream brings every shard's messages — the moved
    one's from its new owner, the old backlog read from the old log's ledgers. A stream of another subscription
    served by n1 itself is not ended either: n1 goes on serving it through every shard's owner."""
    nodes = start_nodes(str(tmp_path), etcd.endpoint, http=True)
    try:
        owner_of = settled_owners(etcd.endpoint, BUNDLES)
        topic = topic_owned_by(owner_of, "n1", f"{P}/topics/streamed")
        to_bundle = min(b for b, n in owner_of.items() if n == "n2")
        pub, sub = clients_of(nodes["n3"])
        pub.create_topic(name=topic)
        name = f"{P}/subscriptions/streamed"
        sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=30)
        at_owner = f"{P}/subscriptions/streamed-at-owner"
        sub.create_subscription(name=at_owner, topic=topic, ack_deadline_seconds=30)
        before = {pub.publish(topic, f"before-{i}".encode()).result(timeout=30) for i in range(300)}
        direct = RawStream(clients_of(nodes["n1"])[1], at_owner)  # (served by n1 itself: it follows the shard)

        got: set[str] = set()
        lock = threading.Lock()

        def received(message) -> None:
            with lock:
                got.add(message.message_id)
            message.ack()

        future = sub.subscribe(name, received)
        try:
            publishing = _Publishing(pub, topic, b"streamed", batch=50, threads=1)
            try:
                time.sleep(0.5)
                cli = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "move-shard", topic, "--shard", "2",
                                      "--bundle", str(to_bundle), "--etcd", etcd.endpoint],
                                     capture_output=True, text=True, timeout=60)
                assert cli.returncode == 0, cli.stderr
                assert _log_line(str(tmp_path / "n1.log"), rf"shard 2 of {re.escape(topic)} is homed in log", 60)
                time.sleep(1.0)
            finally:
                sent, failures = publishing.stop()
            assert not failures, f"publishes failed while the shard moved: {failures[:3]}"
            want = before | sent
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not want <= got:
                time.sleep(0.2)
            missing = direct.wait_for(want, 60)
            assert not direct.ended, f"the stream served by the shard's old owner ended: {direct.ended[0]}"
            assert not missing, f"{len(missing)} published messages never reached the stream at the old owner"
        finally:
            future.cancel()
            direct.close()
        assert want <= got, f"{len(want - got)} published messages never reached the streaming subscriber"
    finally:
        for n in nodes.values():
            n.kill()
