"""Scale of the queue (issue 4): a backlog of N messages (100 million by default) on one node.

Publishes N × 100-byte messages durably (fsync=always, 1,000 per request, several client processes), and at
every tenth of the way records: publish latency per request (p50/p99 over the last stretch), the latency of
taking and acking a batch of 1,000 from the head of the backlog, and the server's RSS per backlogged message.
At the end: restart time with the whole backlog (kill -9, then until the port serves). Prints a table and
writes JSON. Loopback only; bounded by N and by --max-minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time

import grpc
from google.pubsub_v1 import types
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.testing.server import ServerProcess  # noqa: E402

console = Console(width=160)


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _request(topic: str, size: int, batch: int) -> bytes:
    msgs = [types.PubsubMessage(data=os.urandom(size)) for _ in range(batch)]
    return types.PublishRequest.pb(types.PublishRequest(topic=topic, messages=msgs)).SerializeToString()


async def _publish(address: str, req: bytes, requests: int, concurrency: int, lat_out) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary("/google.pubsub.v1.Publisher/Publish", request_serializer=None,
                              response_deserializer=None)
        left = [requests]
        lats = []

        async def worker():
            while left[0] > 0:
                left[0] -= 1
                t0 = time.perf_counter()
                await call(req)
                lats.append(time.perf_counter() - t0)

        await asyncio.gather(*[worker() for _ in range(concurrency)])
        lat_out.put(lats)


def _publish_proc(address, req, requests, concurrency, lat_out):
    asyncio.run(_publish(address, req, requests, concurrency, lat_out))


def publish_stretch(address: str, req: bytes, requests: int, procs: int) -> tuple[float, list[float]]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    per = requests // procs
    ps = [ctx.Process(target=_publish_proc, args=(address, req, per, 4, q)) for _ in range(procs)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    lats = []
    for _ in ps:
        lats += q.get()
    for p in ps:
        p.join()
    return time.perf_counter() - t0, lats


def take_probe(address: str, subscription: str) -> float:
    """Seconds to pull 1,000 from the head of the backlog and ack them."""
    ch = grpc.insecure_channel(address)
    pull = ch.unary_unary("/google.pubsub.v1.Subscriber/Pull", request_serializer=types.PullRequest.serialize,
                          response_deserializer=types.PullResponse.deserialize)
    ack = ch.unary_unary("/google.pubsub.v1.Subscriber/Acknowledge",
                         request_serializer=types.AcknowledgeRequest.serialize, response_deserializer=lambda b: b)
    t0 = time.perf_counter()
    resp = pull(types.PullRequest(subscription=subscription, max_messages=1000))
    ack(types.AcknowledgeRequest(subscription=subscription, ack_ids=[m.ack_id for m in resp.received_messages]))
    dt = time.perf_counter() - t0
    ch.close()
    return dt


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--max-minutes", type=float, default=40.0)
    ap.add_argument("--data-dir", default=None, help="where the server keeps its data (default: a temp dir)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    root = args.data_dir or tempfile.mkdtemp(prefix="pigeon-scale-")
    srv = ServerProcess(os.path.join(root, "data"), fsync="always").start()
    os.environ["PUBSUB_EMULATOR_HOST"] = srv.address
    from google.cloud import pubsub_v1

    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = pub.topic_path("scale", "backlog")
    subscription = sub.subscription_path("scale", "backlog-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=600)
    req = _request(topic, args.size, 1000)
    base_rss = rss(srv.proc.pid)
    rows = []
    started = time.monotonic()
    step_requests = args.messages // 1000 // args.steps
    done = 0
    try:
        with Progress(console=console) as progress:
            task = progress.add_task("backlog", total=args.messages)
            for step in range(args.steps):
                if time.monotonic() - started > args.max_minutes * 60:
                    console.print(f"stopping early: --max-minutes {args.max_minutes} reached")
                    break
                dt, lats = publish_stretch(srv.address, req, step_requests, args.procs)
                done += step_requests * 1000
                progress.update(task, completed=done)
                probe = take_probe(srv.address, subscription)
                backlog = done - 1000 * (step + 1)
                r = rss(srv.proc.pid)
                rows.append({
                    "backlog": backlog, "publish_msgs_per_s": round(step_requests * 1000 / dt),
                    "publish_p50_ms": round(pct(lats, 0.5) * 1000, 2), "publish_p99_ms": round(pct(lats, 0.99) * 1000, 2),
                    "take_ack_1000_ms": round(probe * 1000, 2), "rss_mib": round(r / 2**20, 1),
                    "rss_bytes_per_msg": round((r - base_rss) / max(1, backlog), 2),
                })
        srv.kill()
        t0 = time.perf_counter()
        srv.start(timeout=600)
        restart_s = time.perf_counter() - t0
        after = take_probe(srv.address, subscription)
        srv.stop(timeout=120)
    finally:
        srv.kill()
        if not args.data_dir:
            shutil.rmtree(root, ignore_errors=True)
    table = Table(title=f"Backlog scale: {done:,} × {args.size} B published, fsync=always")
    for k in rows[0]:
        table.add_column(k, justify="right")
    for row in rows:
        table.add_row(*[f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()])
    console.print(table)
    console.print(f"restart (kill -9) to serving with the backlog: {restart_s:.2f} s; "
                  f"take+ack of 1,000 after restart: {after * 1000:.1f} ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "restart_s": round(restart_s, 2), "take_after_restart_ms": round(after * 1000, 1),
                       "messages": done, "size": args.size, "when": time.strftime("%Y-%m-%d %H:%M")}, f, indent=2)


if __name__ == "__main__":
    main()
