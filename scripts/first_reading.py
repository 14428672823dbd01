"""First reading of Pigeon's raw figures on this machine (the full peer benchmark is `pigeon bench`, later).

Measures, against a real `pigeon serve` process on loopback with fsync=always:
  1. durable publish msg/s — 1 KiB messages, 1,000 per request, pre-serialized, several client processes;
  2. StreamingPull consume msg/s with acks on the stream, draining that backlog;
  3. server RSS per backlogged message with 1,000,000 backlogged 100-byte messages, and restart time with them.
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
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.testing.server import ServerProcess  # noqa: E402

PROJECT = "bench"


def _raw_response_type():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name="bench/raw.proto", package="bench", syntax="proto3")
    m = f.message_type.add(name="StreamingPullResponseRaw")
    m.field.add(name="received_messages", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.StreamingPullResponseRaw"))


RawResponse = _raw_response_type()
console = Console()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def admin(address: str):
    os.environ["PUBSUB_EMULATOR_HOST"] = address
    from google.cloud import pubsub_v1

    return pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()


def publish_request(topic: str, size: int, batch: int) -> bytes:
    msgs = [types.PubsubMessage(data=os.urandom(size // 2).hex().encode()[:size]) for _ in range(batch)]
    return types.PublishRequest.pb(types.PublishRequest(topic=topic, messages=msgs)).SerializeToString()


async def _publisher(address: str, req: bytes, requests: int, concurrency: int) -> None:
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 32 << 20)]) as ch:
        call = ch.unary_unary("/google.pubsub.v1.Publisher/Publish", request_serializer=None, response_deserializer=None)
        left = [requests]

        async def worker():
            while left[0] > 0:
                left[0] -= 1
                await call(req)

        await asyncio.gather(*[worker() for _ in range(concurrency)])


def _publisher_proc(address, req, requests, concurrency):
    asyncio.run(_publisher(address, req, requests, concurrency))


def publish_load(address: str, topic: str, size: int, batch: int, total: int, procs: int, concurrency: int) -> float:
    req = publish_request(topic, size, batch)
    per_proc = total // batch // procs
    ctx = mp.get_context("fork")
    workers = [ctx.Process(target=_publisher_proc, args=(address, req, per_proc, concurrency)) for _ in range(procs)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    dt = time.perf_counter() - t0
    return per_proc * procs * batch / dt


async def _consumer(address: str, subscription: str, expect: int, counter, result) -> None:
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 32 << 20)]) as ch:
        call = ch.stream_stream(
            "/google.pubsub.v1.Subscriber/StreamingPull",
            request_serializer=types.StreamingPullRequest.pb().SerializeToString,
            response_deserializer=None,
        )
        queue: asyncio.Queue = asyncio.Queue()
        req_cls = types.StreamingPullRequest.pb()
        await queue.put(req_cls(subscription=subscription, stream_ack_deadline_seconds=60,
                                max_outstanding_messages=5000))

        async def requests():
            while True:
                r = await queue.get()
                if r is None:
                    return
                yield r

        stream = call(requests())
        got = 0
        t0 = None
        it = stream.__aiter__()
        while True:
            try:
                resp = await asyncio.wait_for(it.__anext__(), 0.5)
            except asyncio.TimeoutError:
                if counter.value >= expect:  # another consumer took the last ones
                    break
                continue
            if t0 is None:
                t0 = time.perf_counter()
            # a lean client: split received_messages in C, slice each ack id (field 1, short) out of the bytes
            ids = [rm[2 : 2 + rm[1]] for rm in RawResponse.FromString(resp).received_messages]
            got += len(ids)
            await queue.put(req_cls(ack_ids=[i.decode() for i in ids]))
            with counter.get_lock():
                counter.value += len(ids)
                done = counter.value >= expect
            if done:
                await asyncio.sleep(0.2)  # let the last acks leave
                break
        result.put((got, time.perf_counter() - (t0 or time.perf_counter())))
        await queue.put(None)
        stream.cancel()


def _consumer_proc(address, subscription, expect, counter, result):
    asyncio.run(_consumer(address, subscription, expect, counter, result))


def consume_load(address: str, subscription: str, total: int, procs: int) -> float:
    ctx = mp.get_context("fork")
    result = ctx.Queue()
    counter = ctx.Value("q", 0)
    workers = [ctx.Process(target=_consumer_proc, args=(address, subscription, total, counter, result)) for _ in range(procs)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    outs = [result.get() for _ in workers]
    for w in workers:
        w.join()
    dt = max(o[1] for o in outs)
    return sum(o[0] for o in outs) / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--publish-total", type=int, default=400_000)
    ap.add_argument("--backlog", type=int, default=1_000_000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--fsync", default="always")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="pigeon-reading-")
    results: dict = {"fsync": args.fsync, "machine": f"{os.cpu_count()} cores", "when": time.strftime("%Y-%m-%d %H:%M")}
    try:
        srv = ServerProcess(os.path.join(root, "data"), fsync=args.fsync).start()
        pub, sub = admin(srv.address)
        topic = pub.topic_path(PROJECT, "publish-1k")
        pub.create_topic(name=topic)
        subscription = sub.subscription_path(PROJECT, "drain-1k")
        sub.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=60)

        with console.status("durable publish, 1 KiB × 1,000 per request ..."):
            publish_load(srv.address, topic, 1024, 1000, 20_000, args.procs, 4)  # warm-up
            rate = publish_load(srv.address, topic, 1024, 1000, args.publish_total, args.procs, 4)
        results["publish_1k_msgs_per_s"] = round(rate)
        console.print(f"durable publish: {rate:,.0f} msg/s")

        backlog = 20_000 + args.publish_total // 1000 // args.procs * 1000 * args.procs
        with console.status(f"StreamingPull consume with acks, {backlog:,} messages ..."):
            rate = consume_load(srv.address, subscription, backlog, args.procs)
        results["consume_1k_msgs_per_s"] = round(rate)
        console.print(f"consume with acks: {rate:,.0f} msg/s")

        srv.stop()  # a fresh server for the memory reading: nothing left over from the runs above
        srv = ServerProcess(os.path.join(root, "data-backlog"), fsync=args.fsync).start()
        pub, sub = admin(srv.address)
        topic2 = pub.topic_path(PROJECT, "backlog-100b")
        pub.create_topic(name=topic2)
        sub.create_subscription(name=sub.subscription_path(PROJECT, "backlog-100b"), topic=topic2)
        before = rss_bytes(srv.proc.pid)
        with console.status(f"backlog of {args.backlog:,} × 100 B ..."):
            publish_load(srv.address, topic2, 100, 1000, args.backlog, args.procs, 4)
        time.sleep(1)
        after = rss_bytes(srv.proc.pid)
        results["backlog_messages"] = args.backlog
        results["rss_before_bytes"] = before
        results["rss_after_bytes"] = after
        results["rss_bytes_per_backlogged_msg"] = round((after - before) / args.backlog, 1)
        console.print(f"RSS {before / 2**20:.0f} MiB → {after / 2**20:.0f} MiB: "
                      f"{(after - before) / args.backlog:.1f} B per backlogged message")

        srv.kill()
        t0 = time.perf_counter()
        srv.start()
        results["restart_with_backlog_s"] = round(time.perf_counter() - t0, 2)
        results["rss_after_restart_bytes"] = rss_bytes(srv.proc.pid)
        srv.stop()
        t0 = time.perf_counter()
        srv.start()
        results["restart_after_checkpoint_s"] = round(time.perf_counter() - t0, 2)
        srv.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    table = Table(title="Pigeon first reading")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in results.items():
        table.add_row(k, f"{v:,}" if isinstance(v, (int, float)) else str(v))
    console.print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
