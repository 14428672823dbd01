"""What a message transform costs: messages/s through one `pigeon serve` with no transform, and with a trivial
JavaScript UDF (it returns its message) on the topic (run at publish) and on the subscription (run at delivery).

    .venv/bin/python scripts/transform_bench.py [--messages 200000] [--batch 1000] [--size 100]

Publish: one client publishing requests of --batch messages, --depth requests in flight. Delivery: Pull of up to
1,000 messages at a time from a backlog of the same messages, each batch acknowledged before the next pull."""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import tempfile
import time

from pigeon.testing.server import ServerProcess

TRIVIAL = {"javascript_udf": {"function_name": "same", "code": "function same(message, metadata) { return message; }"}}


def publish_rate(pub, topic: str, n: int, batch: int, size: int, depth: int) -> float:
    from google.pubsub_v1.services.publisher import PublisherClient as Gapic
    from google.pubsub_v1 import types

    msgs = [types.PubsubMessage(data=os.urandom(size // 2).hex().encode()[:size]) for _ in range(batch)]
    req = types.PublishRequest(topic=topic, messages=msgs)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(depth) as pool:
        list(pool.map(lambda _: Gapic.publish(pub, request=req, retry=None, timeout=60), range(n // batch)))
    return n // batch * batch / (time.perf_counter() - t0)


def delivery_rate(sub, subscription: str, n: int) -> float:
    got, t0 = 0, time.perf_counter()
    while got < n:
        resp = sub.pull(subscription=subscription, max_messages=1000, timeout=30, retry=None)
        if resp.received_messages:
            sub.acknowledge(subscription=subscription, ack_ids=[r.ack_id for r in resp.received_messages])
        got += len(resp.received_messages)
    return got / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--depth", type=int, default=4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        srv = ServerProcess(d, fsync="never").start()
        try:
            os.environ["PUBSUB_EMULATOR_HOST"] = srv.address
            from google.cloud import pubsub_v1

            pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
            rows = []
            for label, topic_smt, sub_smt in (("none", [], []), ("trivial UDF on the topic", [TRIVIAL], []),
                                              ("trivial UDF on the subscription", [], [TRIVIAL])):
                name = label.split()[-1] + str(len(rows))
                topic, subscription = pub.topic_path("bench", name), sub.subscription_path("bench", name)
                pub.create_topic(request={"name": topic, "message_transforms": topic_smt})
                sub.create_subscription(request={"name": subscription, "topic": topic, "message_transforms": sub_smt,
                                                 "ack_deadline_seconds": 600})
                p = publish_rate(pub, topic, a.messages, a.batch, a.size, a.depth)
                r = delivery_rate(sub, subscription, a.messages // a.batch * a.batch)
                rows.append((label, p, r))
                print(f"{label:34s} publish {p:>10,.0f} msg/s   delivery (pull + ack) {r:>10,.0f} msg/s", flush=True)
            sub.close()
            pub.stop()
        finally:
            srv.kill()


if __name__ == "__main__":
    main()
