"""Where one message's time goes: a single node started with its hop timestamps on (PIGEON_HOPS, pigeon.node.hops),
driven as the benchmark's latency workload drives it — one message per durable publish at a fixed rate (open loop),
a StreamingPull consumer in a process of its own acking what it gets — and each step between two hops, from the
publisher's send to the consumer's receipt, as percentiles. Every stamp is CLOCK_MONOTONIC, which all processes of
the machine share.

    python scripts/latency_hops.py [--rate 1000] [--seconds 10] [--server-env NAME=VALUE]

The k-th publish sent is matched with the k-th the server started (sends are 1 ms apart, answers ~1 ms long:
the few that overtake one another blur a percentile, not a step). Loopback only; the server is stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import multiprocessing as mp
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import grpc  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from pigeon.bench.grpc_client import StreamingPull, messages, publish_request  # noqa: E402
from pigeon.bench.procs import await_listening, free_port  # noqa: E402
from pigeon.core.pubsub_types import types  # noqa: E402

TOPIC, SUB = "projects/hops/topics/hops", "projects/hops/subscriptions/hops"
# the server's hops in a publish's order; then the delivery's, which start from the loop hearing of the fdatasync
PUBLISH_HOPS = ("publish", "committed", "asked", "taken", "syncing", "synced", "posted")
DELIVERY_HOPS = ("posted", "woken", "sending")
SKIP = 200  # the first messages warm both sides up


async def _setup(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        await ch.unary_unary("/google.pubsub.v1.Publisher/CreateTopic")(
            types.Topic.pb()(name=TOPIC).SerializeToString(), timeout=10)
        await ch.unary_unary("/google.pubsub.v1.Subscriber/CreateSubscription")(
            types.Subscription.pb()(name=SUB, topic=TOPIC, ack_deadline_seconds=60).SerializeToString(), timeout=10)


async def _consume(address: str, n: int, ready, out) -> None:
    got: list[tuple[int, int]] = []
    async with grpc.aio.insecure_channel(address) as ch:
        stream = StreamingPull(ch, SUB, 1000)
        ready.set()
        async for resp in stream.responses():
            now = time.monotonic_ns()
            ids, datas, _ = messages(resp)
            stream.ack(ids)
            got.extend((struct.unpack_from(">q", d)[0], now) for d in datas)
            if len(got) >= n:
                break
        await stream.stop()
    out.put(got)


def _consumer(address: str, n: int, ready, out) -> None:
    import uvloop

    uvloop.run(_consume(address, n, ready, out))


async def _publish(address: str, n: int, rate: int) -> list[tuple[int, int]]:
    pad = os.urandom(248)  # 256-byte messages, as the benchmark's
    done: list[tuple[int, int]] = []
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary("/google.pubsub.v1.Publisher/Publish")
        await ch.channel_ready()

        async def send(sent: int) -> None:
            await call(publish_request(TOPIC, [struct.pack(">q", sent) + pad]), timeout=10)
            done.append((sent, time.monotonic_ns()))

        tasks = []
        t0 = time.monotonic()
        for i in range(n):
            if (wait := t0 + i / rate - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(send(time.monotonic_ns())))
        await asyncio.gather(*tasks)
    return sorted(done)


def _steps(hops: dict[str, list[int]], published: list[tuple[int, int]], received: dict[int, int]):
    """{step: [µs]} for every message whose hops were all found."""
    def after(hop: str, t: int) -> int | None:
        xs = hops.get(hop, [])
        i = bisect.bisect_left(xs, t)
        return xs[i] if i < len(xs) else None

    steps: dict[str, list[float]] = {}
    starts = hops.get("publish", [])
    arrived = hops.get("arrived", [])  # the loop has the call (pigeon.api.takers)
    for k, (sent, answered) in enumerate(published[:len(starts)]):
        if k < SKIP or sent not in received:
            continue
        t = {"sent": sent, "publish": starts[k]}
        for a, b in zip(PUBLISH_HOPS, PUBLISH_HOPS[1:]):
            t[b] = after(b, t[a])
        for a, b in zip(DELIVERY_HOPS, DELIVERY_HOPS[1:]):
            t[b] = after(b, t[a])
        t["answered"] = after("answered", t["posted"])
        if None in t.values():
            continue
        t["received"], t["acknowledged"] = received[sent], answered
        path = ("sent",) + PUBLISH_HOPS + DELIVERY_HOPS[1:] + ("received",)
        for a, b in list(zip(path, path[1:])) + [("posted", "answered"), ("answered", "acknowledged")]:
            steps.setdefault(f"{a} → {b}", []).append((t[b] - t[a]) / 1e3)
        i = bisect.bisect_right(arrived, t["publish"]) - 1
        if i >= 0 and arrived[i] >= sent:  # (a call grpc.aio's own ask took has no `arrived`)
            steps.setdefault("  of which sent → arrived", []).append((arrived[i] - sent) / 1e3)
            steps.setdefault("  of which arrived → publish", []).append((t["publish"] - arrived[i]) / 1e3)
        steps.setdefault("end to end: sent → received", []).append((t["received"] - sent) / 1e3)
        steps.setdefault("publish answered: sent → acknowledged", []).append((answered - sent) / 1e3)
    split = {k: steps.pop(k) for k in [k for k in steps if k.startswith("  of which")]}
    order = list(steps)
    at = order.index("sent → publish") + 1 if "sent → publish" in order else 0
    return {k: split.get(k, steps.get(k)) for k in order[:at] + list(split) + order[at:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=1000, help="publishes per second, one message each")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--server-env", action="append", default=[], help="NAME=VALUE for the server (repeatable)")
    a = ap.parse_args()
    console = Console()
    data, port = tempfile.mkdtemp(prefix="pigeon-hops-"), free_port()
    hops_file = os.path.join(data, "hops.txt")
    env = {**os.environ, **dict(kv.split("=", 1) for kv in a.server_env), "PIGEON_HOPS": hops_file}
    log_path = os.path.join(data, "server.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "pigeon", "serve", "--port", str(port), "--http-port",
                                   str(free_port()), "--data-dir", os.path.join(data, "d")], cwd=ROOT, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
    address, n = f"127.0.0.1:{port}", int(a.rate * a.seconds)
    try:
        await_listening(server, port, 30, "pigeon serve", log_path)
        asyncio.run(_setup(address))
        ctx = mp.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        consumer = ctx.Process(target=_consumer, args=(address, n, ready, out), daemon=True)
        consumer.start()
        ready.wait(30)
        time.sleep(0.5)
        with console.status(f"{n:,} publishes at {a.rate:,}/s …"):
            published = asyncio.run(_publish(address, n, a.rate))
            received = dict(out.get(timeout=60))
        consumer.join(10)
    finally:
        server.terminate()
        server.wait(30)
    try:
        hops: dict[str, list[int]] = {}
        with open(hops_file) as f:
            for line in f:
                t, hop = line.split()
                hops.setdefault(hop, []).append(int(t))
        for xs in hops.values():
            xs.sort()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    steps = _steps(hops, published, received)
    table = Table(title=f"one message's steps at {a.rate:,} publishes/s, 1 message of 256 bytes each "
                        f"({len(next(iter(steps.values()), [])):,} messages)")
    for c in ("step", "p50 µs", "p90 µs", "p99 µs", "mean µs", "mean µs, slowest 1 %"):
        table.add_column(c, justify="left" if c == "step" else "right")
    # the messages whose end to end is in its slowest 1 %: where their time went (a step's own p99 does not say)
    e2e = steps.get("end to end: sent → received", [])
    slow = {i for i, _ in sorted(enumerate(e2e), key=lambda x: x[1])[int(len(e2e) * 0.99):]}
    for step, xs in steps.items():
        tail = [x for i, x in enumerate(xs) if i in slow] if len(xs) == len(e2e) else []
        xs = sorted(xs)
        table.add_row(step, f"{xs[len(xs) // 2]:.0f}", f"{xs[int(len(xs) * 0.9)]:.0f}", f"{xs[int(len(xs) * 0.99)]:.0f}",
                      f"{sum(xs) / len(xs):.0f}", f"{sum(tail) / len(tail):.0f}" if tail else "",
                      end_section=step.startswith("answered"))
    console.print(table)


if __name__ == "__main__":
    main()
