"""Where one message's time goes: a single node started with its hop timestamps on (PIGEON_HOPS, pigeon.node.hops),
driven as the benchmark's latency workload drives it — one message per durable publish at a fixed rate (open loop),
a StreamingPull consumer in a process of its own acking what it gets — and each step between two hops, from the
publisher's send to the consumer's receipt, as percentiles. Every stamp is CLOCK_MONOTONIC, which all processes of
the machine share.

    python scripts/latency_hops.py [--rate 1000] [--seconds 10] [--server-env NAME=VALUE]
    python scripts/latency_hops.py --cluster [--members] [--rate 1000]
    python scripts/latency_hops.py --cluster --nodes 1 --node-args "--replicas 1 --ack-quorum 1"

`--cluster`: the benchmark's three nodes over etcd instead (pigeon.bench.cluster: fsync=always, ledgers on 3,
answered at 2), the publisher and the consumer at the topic's owner, and the owner's steps — its sends to the
members, their answers, the record held by two (`confirmed`), the handler resumed — with, last, how long a call
waited before the owner's loop had it by how many publishes were in flight when it was sent: a wait that grows
with them is a queue in front of a loop at its capacity (bench/results/2026-12-07T0630-owner-capacity.md).
`--members` puts the member's steps between the owner's send and its answer (`frame` whole, its journal's writer
asked, the fdatasync, the answer written), from the other nodes' hop files.

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
from pigeon.node.hops import read as read_hops  # noqa: E402

TOPIC, SUB = "projects/hops/topics/hops", "projects/hops/subscriptions/hops"
# the server's hops in a publish's order; then the delivery's, which start from the loop hearing of the fdatasync
PUBLISH_HOPS = ("publish", "committed", "asked", "taken", "syncing", "synced", "posted")
DELIVERY_HOPS = ("posted", "woken", "sending")
# a cluster owner's: its record goes to the members, is held by two, and the handler resumes to answer; the
# subscriber's delivery goes out once its lease's record is held too
CLUSTER_PUBLISH_HOPS = ("publish", "committed", "replicating", "acked", "confirmed", "resumed")
CLUSTER_DELIVERY_HOPS = ("confirmed", "sending")
# `--members`: between the owner's send and its answer, the member's own (from the other nodes' files, "member "
# before each: the first of either member's after the owner's hop — with rounds to a quorum, the one it was sent to)
MEMBER_HOPS = ("frame", "asked", "taken", "syncing", "synced", "posted", "answering")
SKIP = 200  # the first messages warm both sides up


async def _setup(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        await ch.unary_unary("/google.pubsub.v1.Publisher/CreateTopic")(
            types.Topic.pb()(name=TOPIC).SerializeToString(), timeout=10)
        await ch.unary_unary("/google.pubsub.v1.Subscriber/CreateSubscription")(
            types.Subscription.pb()(name=SUB, topic=TOPIC, ack_deadline_seconds=60).SerializeToString(), timeout=10)


async def _consume(address: str, sub: str, n: int, ready, out) -> None:
    got: list[tuple[int, int]] = []
    async with grpc.aio.insecure_channel(address) as ch:
        stream = StreamingPull(ch, sub, 1000)
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


def _consumer(address: str, sub: str, n: int, ready, out) -> None:
    import uvloop

    uvloop.run(_consume(address, sub, n, ready, out))


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


def _steps(hops: dict[str, list[int]], published: list[tuple[int, int]], received: dict[int, int],
           chain: tuple[tuple[str, ...], tuple[str, ...]] = (PUBLISH_HOPS, DELIVERY_HOPS)):
    """{step: [µs]} for every message whose hops were all found. `chain`: the publish's hops, then the delivery's
    (from the publish hop it starts at); the answer is the first after the publish's last hop."""
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
        publish_hops, delivery_hops = chain
        t = {"sent": sent, "publish": starts[k]}
        for a, b in zip(publish_hops, publish_hops[1:]):
            t[b] = after(b, t[a]) if t[a] is not None else None
        for a, b in zip(delivery_hops, delivery_hops[1:]):
            t[b] = after(b, t[a]) if t[a] is not None else None
        t["answered"] = after("answered", t[publish_hops[-1]]) if t[publish_hops[-1]] is not None else None
        if None in t.values():
            continue
        t["received"], t["acknowledged"] = received[sent], answered
        path = ("sent",) + publish_hops  # then the delivery from where it starts (the single node: the last)
        delivery = delivery_hops + ("received",)
        for a, b in list(zip(path, path[1:])) + list(zip(delivery, delivery[1:])) + \
                [(publish_hops[-1], "answered"), ("answered", "acknowledged")]:
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


def _drive(address: str, n: int, rate: int, console: Console) -> tuple[list[tuple[int, int]], dict[int, int]]:
    """The consumer in a process of its own, then `n` publishes at `rate`: (sent, answered) each, and when each
    publish's message was received."""
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    consumer = ctx.Process(target=_consumer, args=(address, SUB, n, ready, out), daemon=True)
    consumer.start()
    ready.wait(30)
    time.sleep(0.5)
    with console.status(f"{n:,} publishes at {rate:,}/s …"):
        published = asyncio.run(_publish(address, n, rate))
        received = dict(out.get(timeout=60))
    consumer.join(10)
    return published, received


def _single(a, console: Console):
    data, port = tempfile.mkdtemp(prefix="pigeon-hops-"), free_port()
    hops_file = os.path.join(data, "hops.txt")
    env = {**os.environ, **dict(kv.split("=", 1) for kv in a.server_env), "PIGEON_HOPS": hops_file}
    log_path = os.path.join(data, "server.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "pigeon", "serve", "--port", str(port), "--http-port",
                                   str(free_port()), "--data-dir", os.path.join(data, "d")], cwd=ROOT, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        await_listening(server, port, 30, "pigeon serve", log_path)
        asyncio.run(_setup(address))
        published, received = _drive(address, int(a.rate * a.seconds), a.rate, console)
    finally:
        server.terminate()
        server.wait(30)
    try:
        return read_hops(hops_file), published, received
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _cluster(a, console: Console):
    global TOPIC, SUB
    from pigeon.bench import workloads
    from pigeon.bench.cluster import PigeonClusterServer
    from pigeon.bench.plan import PLANS

    data = tempfile.mkdtemp(prefix="pigeon-hops-")
    os.environ.update(dict(kv.split("=", 1) for kv in a.server_env))
    os.environ["PIGEON_HOPS"] = os.path.join(data, "%p.hops")  # (each node's process writes its own)
    cls = PigeonClusterServer
    if a.node_args or a.nodes:
        cls = type(cls.__name__, (cls,), {"node_args": cls.node_args + tuple(a.node_args.split()),
                                          "size": a.nodes or cls.size})
    server = cls(os.path.join(data, "cluster"), PLANS["quick"])
    try:
        try:
            server.start()
        finally:
            os.environ.pop("PIGEON_HOPS", None)
        driver = server.driver
        workloads.setup(driver, "hops")
        TOPIC, SUB = driver.topic("hops"), driver.subscription("hops")
        owner = server.owner_of(TOPIC)
        driver._at("hops")  # (the owner's address: no forwarding hop)
        published, received = _drive(driver.address, int(a.rate * a.seconds), a.rate, console)
        pids = {str(p) for p in _tree(server.nodes[owner].pid)}
    finally:
        server.stop()
    try:
        files = [f for f in os.listdir(data) if f.endswith(".hops")]
        (mine,) = [f for f in files if f.split(".")[0] in pids]
        hops = read_hops(os.path.join(data, mine))
        for f in files:
            if f != mine:
                for hop, xs in read_hops(os.path.join(data, f)).items():
                    hops.setdefault(f"member {hop}", []).extend(xs)
        for hop in hops:
            if hop.startswith("member "):
                hops[hop].sort()
        return hops, published, received
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _tree(pid: int) -> list[int]:
    """A process and its descendants (a node runs under `timeout`)."""
    out = [pid]
    for child in subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split():
        out += _tree(int(child))
    return out


def _queued(hops: dict[str, list[int]], published: list[tuple[int, int]]) -> dict[int, list[float]]:
    """sent → arrived (µs) by the publishes in flight when each was sent (answered later than its send)."""
    starts, arrived = hops.get("publish", []), hops.get("arrived", [])
    answers = sorted(answered for _, answered in published)
    out: dict[int, list[float]] = {}
    for k, (sent, _) in enumerate(published[:len(starts)]):
        i = bisect.bisect_right(arrived, starts[k]) - 1
        if k < SKIP or i < 0 or arrived[i] < sent:
            continue
        in_flight = k - bisect.bisect_right(answers, sent)
        out.setdefault(min(in_flight, 16), []).append((arrived[i] - sent) / 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=1000, help="publishes per second, one message each")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--server-env", action="append", default=[], help="NAME=VALUE for the server (repeatable)")
    ap.add_argument("--cluster", action="store_true", help="three nodes over etcd, the calls at the topic's owner")
    ap.add_argument("--members", action="store_true", help="with --cluster: the member's steps between the owner's "
                    "send and its answer too")
    ap.add_argument("--node-args", default="", metavar="OPTIONS",
                    help='with --cluster: more `pigeon serve` options for every node, e.g. '
                         '"--replicas 1 --ack-quorum 1"')
    ap.add_argument("--nodes", type=int, default=0,
                    help="with --cluster: how many nodes (default the benchmark's 3; 1 needs --replicas 1)")
    a = ap.parse_args()
    console = Console()
    hops, published, received = (_cluster if a.cluster else _single)(a, console)
    chain = (CLUSTER_PUBLISH_HOPS, CLUSTER_DELIVERY_HOPS) if a.cluster else (PUBLISH_HOPS, DELIVERY_HOPS)
    if a.cluster and "replicating" not in hops:  # (no member but the owner's own store: no append channel)
        chain = (tuple(h for h in chain[0] if h not in ("replicating", "acked")), chain[1])
    elif a.cluster and a.members:
        at = chain[0].index("acked")
        chain = (chain[0][:at] + tuple(f"member {h}" for h in MEMBER_HOPS) + chain[0][at:], chain[1])
    steps = _steps(hops, published, received, chain)
    table = Table(title=f"one message's steps at {a.rate:,} publishes/s, 1 message of 256 bytes each "
                        f"({len(next(iter(steps.values()), [])):,} messages)"
                        + (", inside the topic's owner" if a.cluster else ""))
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
    if a.cluster:
        queued = Table(title="sent → arrived by the publishes in flight when it was sent")
        for c in ("in flight", "publishes", "p50 µs", "p90 µs"):
            queued.add_column(c, justify="right")
        for n, xs in sorted(_queued(hops, published).items()):
            xs = sorted(xs)
            queued.add_row(f"{n}{'+' if n == 16 else ''}", f"{len(xs):,}", f"{xs[len(xs) // 2]:.0f}",
                           f"{xs[int(len(xs) * 0.9)]:.0f}")
        console.print(queued)


if __name__ == "__main__":
    main()
