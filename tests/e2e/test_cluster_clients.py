"""Clients that outlive a node (docs/operations.md, "Clients of a cluster"): the official client given all three
nodes in one gRPC target, `PUBSUB_EMULATOR_HOST=ipv4:A,B,C` (gRPC's own resolver: the client library passes the
variable to `grpc.insecure_channel` as it is), publishes and streams through one of them (pick_first: the first
that answers). Killed (SIGKILL), that node's calls fail and the library's retries reach the next address; drained
and stopped (SIGTERM: GOAWAY, streams ended UNAVAILABLE, calls in flight finish), it is left without a single
publish failing. Either way every publish the client was told succeeded is delivered."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import pytest
from google.cloud import pubsub_v1

from pigeon.testing.cluster import await_status, owners, topic_owned_by

pytestmark = pytest.mark.e2e

P = "projects/outlive"
# UNAVAILABLE answers of a move, which the library retries: pigeon.api.router's while a bundle has no owner, and
# the old owner's to a call whose record was in flight as it gave the bundle up (pigeon.node.bundle_logs)
_MOVING = ("bundle is moving between nodes", "bundle moved to another node")


class _Retries(logging.Handler):
    """What the client library retried on its own (google.api_core logs each retry at DEBUG): the application
    never sees these, the test counts them to tell a killed node (calls broken) from a stopped one."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Retrying due to"):
            self.seen.append(record.getMessage())


class _Traffic:
    """A publisher thread (one message at a time, each waited for) and a StreamingPull subscriber acking all."""

    def __init__(self, pub, sub, topic: str, subscription: str):
        self.pub, self.topic = pub, topic
        self.published: list[str] = []
        self.failed: list[str] = []
        self.received: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # A message on its way down a stream that breaks is leased until the stream's ack deadline ends, 60 s by
        # default in this client: 10 s (the least it takes) brings such a message back within the test's waits.
        self.streaming = sub.subscribe(subscription, self._on_message,
                                       flow_control=pubsub_v1.types.FlowControl(max_duration_per_lease_extension=10))
        self._thread = threading.Thread(target=self._publish, daemon=True)
        self._thread.start()

    def _on_message(self, message) -> None:
        with self._lock:
            self.received.add(message.message_id)
        message.ack()

    def _publish(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                self.published.append(self.pub.publish(self.topic, f"m{i}".encode()).result(timeout=60))
            except Exception as e:  # noqa: BLE001 — the application would see this: the test fails on it
                self.failed.append(repr(e))
            i += 1
            time.sleep(0.005)

    def wait_flowing(self, what: str, more: int = 30, timeout: float = 30.0) -> None:
        """Until `more` further publishes succeeded and everything published so far was received."""
        want = len(self.published) + more
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                missing = set(self.published) - self.received
            if len(self.published) >= want and not missing:
                return
            assert not self.streaming.done(), f"the subscriber ended {what}: {self.streaming.exception()}"
            time.sleep(0.1)
        raise AssertionError(f"{what}: {len(self.published)} published (want {want}), {len(missing)} not received "
                             f"within {timeout:g} s; failed publishes: {self.failed[:3]}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=70)
        self.streaming.cancel()


def _connected_to(address: str) -> bool:
    """Whether this process holds an established TCP connection to `address` (host:port): its sockets' inodes
    (/proc/self/fd) among /proc/net/tcp's and tcp6's rows (gRPC dials IPv4 through IPv6 sockets) whose remote end
    is that port, in state ESTABLISHED."""
    import os

    port = int(address.rpartition(":")[2])
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows += [line.split() for line in f.readlines()[1:]]
    return any(r[3] == "01" and int(r[2].rpartition(":")[2], 16) == port and r[9] in mine for r in rows)


def _cluster(command: str, node: str, etcd: str) -> None:
    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", command, node, "--etcd", etcd],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def _owns_nothing(node: str):
    return lambda st: st["unowned"] == 0 and not any(r["node"] == node and r["bundles"] for r in st["nodes"])


def _all_share(st) -> bool:
    return st["unowned"] == 0 and len(st["nodes"]) == 3 and all(r["bundles"] and r["state"] == "up"
                                                                 for r in st["nodes"])


def test_clients_with_three_addresses_outlive_a_killed_node_and_a_drained_one(three_nodes, etcd, monkeypatch):
    # the clients' node (the first address) owns the topic: its death is the worst case, a takeover under them
    topic = topic_owned_by(owners(etcd.endpoint), "n1", f"{P}/topics/orders")
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "ipv4:" + ",".join(three_nodes[n].address for n in ("n1", "n2", "n3")))
    retries = _Retries()
    api_core = logging.getLogger("google.api_core")
    api_core.addHandler(retries)
    monkeypatch.setattr(api_core, "level", logging.DEBUG)
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    subscription = f"{P}/subscriptions/workers"
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    traffic = _Traffic(pub, sub, topic, subscription)
    try:
        traffic.wait_flowing("at the start")

        assert _connected_to(three_nodes["n1"].address), "the clients are not connected to n1 (pick_first)"
        three_nodes["n1"].kill()  # SIGKILL: its connections break; the clients move to n2, n3 takes bundles over
        traffic.wait_flowing("after the clients' node was killed")
        three_nodes["n1"].start()
        await_status(etcd.endpoint, _all_share, timeout=30, what="n1 to be back with a share of the bundles")
        traffic.wait_flowing("after n1 came back")

        # the planned restart of the node the clients use now (pick_first: n2, the first that answered)
        planned = len(retries.seen)
        _cluster("drain", "n2", etcd.endpoint)
        await_status(etcd.endpoint, _owns_nothing("n2"), timeout=30, what="n2's bundles to move away")
        assert three_nodes["n2"].stop() == 0
        traffic.wait_flowing("while n2 is stopped")
        three_nodes["n2"].start()
        _cluster("undrain", "n2", etcd.endpoint)
        await_status(etcd.endpoint, _all_share, timeout=30, what="n2 to be back with a share of the bundles")
        traffic.wait_flowing("after n2 came back")
        # Bundles moved (drain, undrain) and the library retried what their owners refused meanwhile (UNAVAILABLE,
        # "moving"), as it does at any move; the stop itself broke no call: a CANCELLED or a broken connection
        # here would be a call the stopping node dropped.
        broken = [r for r in retries.seen[planned:] if not any(m in r for m in _MOVING)]
        assert not broken, f"calls broken by the planned restart: {broken[:5]}"
    finally:
        traffic.stop()
        api_core.removeHandler(retries)
        sub.close()
        pub.stop()
    assert not traffic.failed, f"the application saw failed publishes: {traffic.failed[:3]}"
