"""A takeover of a bundle that holds a big backlog: on a 3-node cluster (`pigeon bench`'s pigeon-cluster target),
publish at 1,000 messages per request for a while (nothing consumes), then kill -9 the topic's owner and time the
first publish to that topic answered after it (one message at a time, through a node that stays up); print the
new owner's "took bundle over" line (entries and megabytes read back, seconds reading, seconds applying) and the
memory of the nodes before the kill and after the takeover. With --consume, then drain the backlog through the
new owner and print the rate (its messages are read from the ledgers that hold them).

    python scripts/takeover_backlog.py                  # first a publish as the cluster plan's (8 s, 4 in flight)
    python scripts/takeover_backlog.py --wait 120       # allow up to 120 s for publishes to be answered again
    python scripts/takeover_backlog.py --nodes 4 --consume --seconds 20   # the new owner may hold no copy
    python scripts/takeover_backlog.py --gb 10          # a backlog of 10 GB (three copies of it on disk)

Loopback only, bounded like the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import glob
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.bench import cluster as bench_cluster  # noqa: E402
from pigeon.bench import workloads as w  # noqa: E402
from pigeon.bench.plan import PLANS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wait", type=float, default=90.0, help="seconds to wait for publishes after the kill")
    ap.add_argument("--nodes", type=int, default=3, help="nodes in the cluster (ledgers on 3 of them)")
    ap.add_argument("--seconds", type=float, default=0.0, help="seconds of publishing (the plan's when 0)")
    ap.add_argument("--gb", type=float, default=0.0, help="publish this many GB of messages instead (at most 15 min)")
    ap.add_argument("--consume", action="store_true", help="then drain the backlog through the new owner")
    ap.add_argument("--no-kill", action="store_true", help="kill nothing: drain through the owner (the baseline)")
    args = ap.parse_args()
    plan = PLANS["cluster"]
    if args.seconds:
        plan = dataclasses.replace(plan, publish_s=args.seconds)
    root = tempfile.mkdtemp(prefix="pigeon-takeover-")

    class Server(bench_cluster.PigeonClusterServer):
        size = args.nodes

    server = Server(root, plan)
    server.start()
    try:
        w.setup(server.driver, "publish")
        limit = int(args.gb * 1e9 / plan.message_bytes)
        first = w.publish(server.driver, plan, "publish", 1000, lambda f, n: None, inflight=4, limit=limit,
                          duration_s=900.0 if limit else None)
        print(f"backlog: {first['count']:,} messages of {plan.message_bytes} B, nothing consumed")
        rss = {n: d.rss() for n, d in server.nodes.items()}
        if args.no_kill:
            owner = server.owner_of(server.driver.topic("publish"))
            got = w.consume(server.driver, plan, "publish", first["count"], lambda f, n: None)
            print(f"drained through {owner} (no takeover): {got['count']:,} of {got['backlog']:,} messages in "
                  f"{got['seconds']:.1f} s, {got['msgs_per_s']:,} msgs/s")
            return 0

        async def exists(key: str, ordered: bool = False) -> None:  # the failover's setup: the topic is there
            return None

        server.driver.setup = exists
        measure = bench_cluster._measure
        bench_cluster._measure = lambda send, kill, p, tick: measure(send, kill, p, tick, after_s=args.wait)
        try:
            out = bench_cluster.pigeon_failover(server, plan, "publish", lambda f, n: None)
        finally:
            bench_cluster._measure = measure
        back = f"{out['seconds']:.2f} s" if out["seconds"] is not None else f"not within {args.wait:g} s"
        print(f"kill -9 of {out['killed']}: publishes answered again after {back} "
              f"({out['failed_publishes']} failed meanwhile, through {out['via']})")
        for path in sorted(glob.glob(os.path.join(root, "**", "n*.log"), recursive=True)):
            with open(path, errors="replace") as f:
                for line in f:
                    if " over at epoch " in line and "(0.0 MB)" not in line:
                        print(f"{os.path.basename(path)[:-4]}: {line.split(': ', 1)[1].strip()}")
        server.nodes.pop(out["killed"])
        server._settle()  # (the driver's routes follow the bundles to their new owners)
        owner = server.owner_of(server.driver.topic("publish"))
        print("memory (RSS, MB) before the kill → after the takeover: " + ", ".join(
            f"{n} {rss[n] / 1e6:.0f} → {d.rss() / 1e6:.0f}{' (new owner)' if n == owner else ''}"
            for n, d in server.nodes.items()))
        if args.consume:
            got = w.consume(server.driver, plan, "publish", first["count"], lambda f, n: None)
            print(f"drained through {owner}: {got['count']:,} of {got['backlog']:,} messages in {got['seconds']:.1f} "
                  f"s, {got['msgs_per_s']:,} msgs/s; its RSS then {server.nodes[owner].rss() / 1e6:.0f} MB")
    finally:
        server.stop()
        server.discard()
    return 0


if __name__ == "__main__":
    sys.exit(main())
