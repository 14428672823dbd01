"""An export subscription in a 3-node cluster, its owner killed: etcd and three nodes on loopback sharing one export
root (`--export-root`, as every node of a cluster must), a topic whose bundle n1 owns and a subscription with a
`cloud_storage_config` (text, 1,000 messages a file) created through n2 with the official client; 5,000 messages
published, n1 killed (-9) as soon as the first file appears, then 5,000 more through n2. Prints which node runs the
export before and after, how long each step took, and whether every message is in the files exactly once (exit 0)
or not (exit 1).

    python scripts/export_cluster_failover.py           # needs etcd on the PATH and the spark extra

Spark starts twice (on n1, then on the new owner): a minute or two on an idle 2-core machine.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.testing.cluster import await_status, owners, start_nodes, topic_owned_by  # noqa: E402
from pigeon.testing.etcd import EtcdProcess  # noqa: E402

P = "export-proj"
ROUND = 5000
WAIT_S = 600.0


def lines(root: str) -> list[bytes]:
    out = []
    for f in glob.glob(os.path.join(root, "cluster-bucket", "*.txt")):
        with open(f, "rb") as fh:
            out += fh.read().splitlines()
    return out


def runs_on(base: str, nodes) -> list[str]:
    """The nodes whose export job is running (their status file names a live pid)."""
    out = []
    for n in nodes:
        try:
            with open(os.path.join(base, n, "exports", "status.json")) as f:
                pid = json.load(f)["pid"]
            os.kill(pid, 0)
            out.append(n)
        except (OSError, ValueError, KeyError):
            pass
    return out


def wait(what: str, done, t0: float) -> float:
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > WAIT_S:
            raise SystemExit(f"{what}: not within {WAIT_S:.0f} s")
        time.sleep(0.05)
    took = time.monotonic() - start
    print(f"  {what}: {took:.1f} s (at {time.monotonic() - t0:.1f} s)", flush=True)
    return took


def main() -> int:
    base = tempfile.mkdtemp(prefix="pigeon-export-cluster-")
    root = os.path.join(base, "export")
    etcd = EtcdProcess(os.path.join(base, "etcd")).start()
    nodes = {}
    try:
        env = {"PIGEON_EXPORT_ROOT": root, "PIGEON_EXPORT_MASTER": "local[2]", "PIGEON_SHARDS_PER_TOPIC": "1"}
        nodes = start_nodes(base, etcd.endpoint, env=env)
        topic = topic_owned_by(owners(etcd.endpoint), "n1", f"projects/{P}/topics/clicks")
        os.environ["PUBSUB_EMULATOR_HOST"] = nodes["n2"].address
        from google.cloud import pubsub_v1

        from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisher

        pub = pubsub_v1.PublisherClient()
        sub = pubsub_v1.SubscriberClient()
        pub.create_topic(name=topic)
        name = f"projects/{P}/subscriptions/clicks-files"
        sub.create_subscription(request={"name": name, "topic": topic, "cloud_storage_config": {
            "bucket": "cluster-bucket", "filename_suffix": ".txt", "text_config": {}, "max_messages": 1000}})
        sent = []

        def publish(first: int) -> None:  # 1,000 a request: what waits is whole files (max_messages)
            for start in range(first, first + ROUND, 1000):
                data = [b"click-%d" % i for i in range(start, start + 1000)]
                GapicPublisher.publish(pub, request={"topic": topic, "messages": [{"data": d} for d in data]},
                                       timeout=120)
                sent.extend(data)

        t0 = time.monotonic()
        publish(0)
        print(f"published {ROUND} through n2; the topic's bundle is n1's", flush=True)
        wait("the first file (Spark starting on n1)", lambda: glob.glob(os.path.join(root, "cluster-bucket", "*")),
             t0)
        print(f"  the export runs on {runs_on(base, nodes)}; n1 killed (-9)", flush=True)
        nodes["n1"].kill()
        await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and "n1" not in
                     {n for b, n in st["owners"].items()}, timeout=60, what="n1's bundles to move")
        publish(ROUND)
        print(f"published {ROUND} more through n2", flush=True)
        wait("every message in the files (Spark starting on the new owner)",
             lambda: len(lines(root)) >= 2 * ROUND, t0)
        print(f"  the export runs on {runs_on(base, [n for n in nodes if n != 'n1'])}", flush=True)
        time.sleep(5)  # (a duplicate would come with a replayed batch)
        got = lines(root)
        ok = len(got) == len(set(got)) == 2 * ROUND and sorted(got) == sorted(sent)
        print(f"{len(got)} lines, {len(set(got))} distinct, {2 * ROUND} sent: "
              f"{'every message exactly once' if ok else 'LOST OR DUPLICATED'}")
        state = sub.get_subscription(subscription=name).state
        print(f"state through n2: {state.name}")
        sub.close()
        pub.stop()
        return 0 if ok else 1
    finally:
        for n in nodes.values():
            n.kill()
        etcd.kill()
        time.sleep(2)  # (the jobs end with their nodes)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
