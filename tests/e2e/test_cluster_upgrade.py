"""A rolling upgrade under load (docs/operations.md, "Upgrades"): a three-node cluster started on the first commit of
this repository whose formats are numbered is upgraded node by node to this tree — drain, SIGTERM, start on the new
code on the same data directory and port, undrain — while the official client, given all three addresses,
publishes and consumes. No client call fails, nothing acknowledged is lost, no message is delivered again after its
ack was confirmed (an exactly-once subscription confirms each ack), and the cluster speaks its older format until
the last node runs the new code, then the new one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from google.cloud import pubsub_v1

from pigeon.storage import formats
from pigeon.testing.cluster import await_status, node_process, status, wipe

pytestmark = pytest.mark.e2e

P = "projects/upgrade"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IDS = ("n1", "n2", "n3")


def _first_versioned_commit() -> str:
    out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", "pigeon/storage/formats.py"],
                         cwd=ROOT, capture_output=True, text=True)
    commits = out.stdout.split()
    if out.returncode != 0 or not commits:
        pytest.skip(f"this checkout has no history to upgrade from (a shallow clone?): {out.stderr.strip()}")
    return commits[-1]


@pytest.fixture
def old_tree(tmp_path) -> str:
    """The first versioned commit's tree, unpacked beside (`git archive`: the repository is left as it is)."""
    commit, tree = _first_versioned_commit(), tmp_path / "old"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return str(tree)


class _Traffic:
    """A publisher (one message at a time, each waited for) and a StreamingPull subscriber on an exactly-once
    subscription, acking every message and noting when each ack was confirmed."""

    def __init__(self, pub, sub, topic: str, subscription: str):
        self.pub, self.topic = pub, topic
        self.published: list[str] = []
        self.failed: list[str] = []
        self.deliveries: list[tuple[str, float]] = []  # (message id, when it was delivered)
        self.confirmed: dict[str, float] = {}  # message id → when its ack was confirmed
        self.ack_failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.streaming = sub.subscribe(subscription, self._on_message,
                                       flow_control=pubsub_v1.types.FlowControl(max_duration_per_lease_extension=10))
        self._thread = threading.Thread(target=self._publish, daemon=True)
        self._thread.start()

    def _on_message(self, message) -> None:
        mid = message.message_id
        with self._lock:
            self.deliveries.append((mid, time.monotonic()))

        def confirmed(f) -> None:
            try:
                f.result()
            except Exception as e:  # noqa: BLE001 — an ack not confirmed may be delivered again, legitimately
                with self._lock:
                    self.ack_failures.append(f"{mid}: {e!r}")
                return
            with self._lock:
                self.confirmed.setdefault(mid, time.monotonic())
        message.ack_with_response().add_done_callback(confirmed)

    def _publish(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                self.published.append(self.pub.publish(self.topic, f"m{i}".encode()).result(timeout=60))
            except Exception as e:  # noqa: BLE001 — the application would see this: the test fails on it
                self.failed.append(repr(e))
            i += 1
            time.sleep(0.01)

    def received(self) -> set[str]:
        with self._lock:
            return {mid for mid, _ in self.deliveries}

    def wait_flowing(self, what: str, more: int = 20, timeout: float = 60.0) -> None:
        """Until `more` further publishes succeeded and everything published so far was received."""
        want = len(self.published) + more
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            missing = set(self.published) - self.received()
            if len(self.published) >= want and not missing:
                return
            assert not self.streaming.done(), f"the subscriber ended {what}: {self.streaming.exception()}"
            time.sleep(0.1)
        raise AssertionError(f"{what}: {len(self.published)} published (want {want}), {len(missing)} not received "
                             f"within {timeout:g} s; failed publishes: {self.failed[:3]}")

    def delivered_after_ack(self) -> list[str]:
        with self._lock:
            return [mid for mid, at in self.deliveries if mid in self.confirmed and at > self.confirmed[mid]]

    def stop(self, drain_s: float = 30.0) -> None:
        """Stop publishing, wait (a while) for everything published to arrive, stop the subscriber."""
        self._stop.set()
        self._thread.join(timeout=70)
        deadline = time.monotonic() + drain_s
        while set(self.published) - self.received() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.streaming.cancel()


def _cluster(command: str, node: str, etcd: str) -> None:
    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", command, node, "--etcd", etcd],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def _row(st: dict, node: str) -> dict:
    return next((r for r in st["nodes"] if r["node"] == node), {})


def _all_share(st) -> bool:
    return st["unowned"] == 0 and len(st["nodes"]) == 3 and all(r["bundles"] and r["state"] == "up"
                                                                 for r in st["nodes"])


def test_a_cluster_upgraded_node_by_node_under_load_loses_nothing_and_fails_no_call(old_tree, etcd, tmp_path,
                                                                                       monkeypatch):
    root, endpoint = str(tmp_path / "cluster"), etcd.endpoint
    os.makedirs(root)
    wipe(endpoint)
    nodes = {n: node_process(root, endpoint, n, cwd=old_tree).start() for n in IDS}
    traffic = None
    try:
        st = await_status(endpoint, _all_share, timeout=60, what="the old release's cluster to share its bundles")
        assert st["format"] == 1 and {r["format"] for r in st["nodes"]} == {1}, st  # (the first versioned commit's)
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "ipv4:" + ",".join(nodes[n].address for n in IDS))
        pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        topic, subscription = f"{P}/topics/orders", f"{P}/subscriptions/workers"
        pub.create_topic(name=topic)
        sub.create_subscription(request={"name": subscription, "topic": topic, "enable_exactly_once_delivery": True})
        traffic = _Traffic(pub, sub, topic, subscription)
        traffic.wait_flowing("on the old release")

        for i, n in enumerate(IDS):
            _cluster("drain", n, endpoint)
            await_status(endpoint, lambda st: st["unowned"] == 0 and not _row(st, n).get("bundles"), timeout=60,
                         what=f"{n}'s bundles to move away")
            assert nodes[n].stop() == 0, nodes[n].log()
            nodes[n] = node_process(root, endpoint, n, port=nodes[n].port).start()  # this tree, the same data
            st = await_status(endpoint, lambda st: _row(st, n).get("format") == formats.CLUSTER
                              and _row(st, n).get("state") in ("up", "draining"), timeout=60,
                              what=f"{n} back on the new release")
            assert st["format"] == (formats.CLUSTER if i == len(IDS) - 1 else 1), st  # the oldest member's
            _cluster("undrain", n, endpoint)
            await_status(endpoint, _all_share, timeout=60, what=f"{n} to take its share again")
            traffic.wait_flowing(f"after {n} was upgraded")

        assert status(endpoint)["format"] == formats.CLUSTER
        traffic.wait_flowing("on the new release", more=50)
        traffic.stop()
        missing = set(traffic.published) - traffic.received()
        assert not traffic.failed, f"client calls failed during the upgrade: {traffic.failed[:5]}"
        assert not missing, f"{len(missing)} acknowledged publishes never delivered"
        assert not traffic.delivered_after_ack(), f"delivered again after its ack was confirmed: " \
                                                  f"{traffic.delivered_after_ack()[:5]}"
        assert len(traffic.published) > 200
    finally:
        if traffic is not None:
            traffic.stop(drain_s=0)
        for n in nodes.values():
            n.kill()
