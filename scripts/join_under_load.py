"""A node joining a loaded cluster: on a 3-node cluster (`pigeon bench`'s pigeon-cluster target), the official
client publishes to 16 topics through all three nodes (and a StreamingPull subscriber per topic consumes) while
a fourth node is started; print how long from its start until every bundle is served by the node the placement
gives it to (the new node serving its share), how many client calls failed meanwhile, and how many of the streams
the cluster ended under the client (the official client reopens them unseen). The time is read two
ways: the status polls (each a `pigeon cluster status` process: a second or more apart on a loaded machine), and the
nodes' own logs — when the new node's process started, listened, and took its last bundle over.

    python scripts/join_under_load.py                    # 10 s of load first (a backlog in every bundle)
    python scripts/join_under_load.py --warm 30          # a bigger backlog first

Loopback only, bounded like the benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import re
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.bench import cluster as bench_cluster  # noqa: E402
from pigeon.bench.plan import PLANS  # noqa: E402
from pigeon.bench.procs import free_port  # noqa: E402

TOPICS = 16


class Reopened(logging.Handler):
    """Streams the official client opened again on its own (google.api_core logs each at INFO): the application
    never sees one, but each is a StreamingPull the cluster ended under it."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Re-established stream"):
            self.count += 1


class Load:
    """Publishers (one thread per topic, batches of 100 × 1 KiB in flight) and a streaming subscriber per topic."""

    def __init__(self, pub, sub, project: str):
        self.pub, self.sub = pub, sub
        self.topics = [f"projects/{project}/topics/topic{i}" for i in range(TOPICS)]
        self.failed: list[str] = []
        self.published = self.received = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        for t in self.topics:
            pub.create_topic(name=t)
            sub.create_subscription(name=t.replace("/topics/", "/subscriptions/"), topic=t)
        self.streams = [sub.subscribe(t.replace("/topics/", "/subscriptions/"), self._on_message)
                        for t in self.topics]
        self.threads = [threading.Thread(target=self._publish, args=(t,), daemon=True) for t in self.topics]
        for th in self.threads:
            th.start()

    def _on_message(self, message) -> None:
        with self._lock:
            self.received += 1
        message.ack()

    def _publish(self, topic: str) -> None:
        data = os.urandom(1024)
        while not self._stop.is_set():
            futures = [self.pub.publish(topic, data) for _ in range(100)]
            for f in futures:
                try:
                    f.result(timeout=60)
                    with self._lock:
                        self.published += 1
                except Exception as e:  # noqa: BLE001 — what the application would see
                    self.failed.append(repr(e)[:200])

    def stop(self) -> None:
        self._stop.set()
        for th in self.threads:
            th.join(timeout=70)
        for s in self.streams:
            s.cancel()


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ (.*)$")


def log_times(path: str, since: float) -> list[tuple[float, str]]:
    """(seconds after `since` (a time.time()), message) of each line of a node's log."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            m = _STAMP.match(line)
            if m:
                t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out.append((t - since, m.group(2)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm", type=float, default=10.0, help="seconds of load before the node joins")
    ap.add_argument("--after", type=float, default=10.0, help="seconds of load after it serves its share")
    ap.add_argument("--keep", action="store_true", help="keep the nodes' data and logs (the directory is printed)")
    args = ap.parse_args()
    plan = PLANS["cluster"]
    root = tempfile.mkdtemp(prefix="pigeon-join-")
    server = bench_cluster.PigeonClusterServer(root, plan)
    server.start()
    load = None
    try:
        os.environ["PUBSUB_EMULATOR_HOST"] = "ipv4:" + ",".join(f"127.0.0.1:{d.port}" for d in server.nodes.values())
        from google.cloud import pubsub_v1

        reopened = Reopened()
        bidi = logging.getLogger("google.api_core.bidi")
        bidi.addHandler(reopened)
        bidi.setLevel(logging.INFO)
        load = Load(pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient(), "join")
        time.sleep(args.warm)
        before = (load.published, load.received)
        print(f"load: {before[0]:,} published, {before[1]:,} received in {args.warm:g} s "
              f"({before[0] - before[1]:,} backlogged), {len(load.failed)} failed")
        t0, wall0 = time.monotonic(), time.time()
        server.nodes["n4"] = server._node("n4", free_port())
        listening = time.monotonic() - t0
        st = server._settle()
        served = time.monotonic() - t0
        share = sum(1 for n in st["owners"].values() if n == "n4")
        print(f"n4 listening after {listening:.2f} s; every bundle on its placed node (n4 serving {share} of "
              f"{st['bundles']}) {served:.2f} s after its start; {len(load.failed)} client calls failed so far")
        lines = log_times(server.nodes["n4"].log_path, wall0)
        joined = next((t for t, m in lines if "joined cluster" in m), None)
        took = [t for t, m in lines if "took bundle " in m and " over at epoch" in m]
        gave = [t for n in ("n1", "n2", "n3") for t, m in log_times(server.nodes[n].log_path, wall0)
                if t > 0 and "gave up" in m and "gave up none" not in m]
        print(f"from the logs: n4 joined {joined:.2f} s after its start; the others gave bundles up at "
              + ", ".join(f"{t:.2f}" for t in sorted(gave)) + " s; n4 took its bundles over at "
              + ", ".join(f"{t:.2f}" for t in took) + " s")
        time.sleep(args.after)
        load.stop()
        print(f"then: {load.published:,} published, {load.received:,} received; {len(load.failed)} failed in all"
              + (f", e.g. {load.failed[0]}" if load.failed else "")
              + f"; {reopened.count} of the {len(load.streams)} streams ended under the client (it reopened them)")
        return 1 if load.failed else 0
    finally:
        if load is not None:
            load.stop()
        server.stop()
        if args.keep:
            print(f"kept: {root}")
        else:
            server.discard()


if __name__ == "__main__":
    sys.exit(main())
