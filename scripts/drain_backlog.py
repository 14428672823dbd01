"""Drain a backlog through the benchmark's consume workload, on a fresh single node or 3-node cluster: `--publish-s`
of publishing (1 KiB × 1,000 per request) makes the backlog, then the consume workload drains it (at most
`--consume-s`). Prints the rates, whether it drained, the messages received more than once, each node's CPU, and
the nodes' log lines about moves (a split of the topic's bundle by the load planner under the drain shows there).

    python scripts/drain_backlog.py --target cluster --publish-s 20 --consume-s 100
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from cluster_latency import cpu_seconds  # noqa: E402
from pigeon.bench import workloads as w  # noqa: E402
from pigeon.bench.cluster import PigeonClusterServer  # noqa: E402
from pigeon.bench.peers import PigeonServer  # noqa: E402
from pigeon.bench.plan import PLANS  # noqa: E402

MOVES = ("splitting", "leaves log", "lost its part")


def _metric(http_port: int, name: str) -> float:
    """A node's metric (0 when it has none: a tree from before it was counted)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=("single", "cluster"), default="cluster")
    ap.add_argument("--publish-s", type=float, default=20.0)
    ap.add_argument("--consume-s", type=float, default=100.0)
    args = ap.parse_args()
    plan = PLANS["quick"].scaled(consume_s_max=args.consume_s,
                                 peer_wall_s_max=max(900.0, 3 * (args.publish_s + args.consume_s)))
    cls = PigeonServer if args.target == "single" else PigeonClusterServer
    server = cls(tempfile.mkdtemp(prefix="pigeon-drain-"), plan)
    server.start()
    nothing = lambda f, done: None  # noqa: E731
    try:
        w.setup(server.driver, "drain")
        pub = w.publish(server.driver, plan, "drain", 1000, nothing, duration_s=args.publish_s)
        print(f"published {pub['count']:,} at {pub['msgs_per_s']:,} msg/s", flush=True)
        pids = {"single": server.main().pid} if args.target == "single" else \
            {n: d.pid for n, d in server.nodes.items()}
        before, t0 = {n: cpu_seconds(p) for n, p in pids.items()}, time.monotonic()
        got = w.consume(server.driver, plan, "drain", pub["count"], nothing)
        dt = time.monotonic() - t0
        cpu = ", ".join(f"{n} {100 * (cpu_seconds(p) - before[n]) / dt:.0f} %" for n, p in pids.items())
        print(f"consumed {got['count']:,} of {got['backlog']:,} in {got['seconds']} s: {got['msgs_per_s']:,} msg/s, "
              f"drained {got['drained']}, received more than once at least {max(0, got['count'] - got['backlog']):,}; "
              f"CPU {cpu}", flush=True)
        if args.target == "cluster":
            print("ledger reads that found their entries outside the page cache (read in by a thread): " + ", ".join(
                f"{n} {_metric(d.port + 1, 'pigeon_cluster_ledger_cold_reads_total'):,.0f} "
                f"({_metric(d.port + 1, 'pigeon_cluster_ledger_cold_read_bytes_total') / 1e6:,.0f} MB)"
                for n, d in server.nodes.items()))
        for path in sorted(glob.glob(os.path.join(server.root, "**", "*.log"), recursive=True)):
            for line in open(path, errors="replace"):
                if any(m in line for m in MOVES):
                    print(f"  {os.path.basename(path)}: {line.rstrip()[:200]}")
    finally:
        server.stop()
        server.discard()
    return 0


if __name__ == "__main__":
    sys.exit(main())
