"""Publish → deliver latency in a deployment of regions (docs/regions.md) whose links between regions are delayed:
the benchmark's latency workload (open loop, one 1 KiB message per durable publish, a StreamingPull consumer
acking) published through a node of one region and received through a node of another, against one region
alone. Each case on a fresh deployment (pigeon.testing.regions: a global etcd, an etcd and one node a region,
every node-to-node and node-to-etcd connection through the test network's proxies, which delay the links between
regions by `--delay-ms` each way).

    python scripts/regions_latency.py [--delay-ms 50] [--rate 200] [--seconds 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.bench import workloads as w  # noqa: E402
from pigeon.bench.grpc_client import GrpcDriver  # noqa: E402
from pigeon.bench.plan import PLANS  # noqa: E402
from pigeon.testing.regions import Deployment  # noqa: E402

# (name, the deployment's regions, the region published to, the region received from)
CASES = (("one region alone: east → east", ("east",), "east", "east"),
         ("two regions: east → east", ("east", "west"), "east", "east"),
         ("two regions: west → east", ("east", "west"), "west", "east"))


def run_case(regions, pub: str, sub: str, delay_s: float, plan) -> dict:
    with tempfile.TemporaryDirectory(prefix="pigeon-regions-latency-") as root:
        dep = Deployment(root, regions=regions, delay_s=delay_s).start()
        try:
            return w.latency(GrpcDriver(dep.node(pub).address), plan, "latency", lambda f, done: None,
                             consumer=GrpcDriver(dep.node(sub).address))
        finally:
            dep.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay-ms", type=float, default=50.0, help="each way, on every link between two regions")
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    plan = PLANS["quick"].scaled(latency_s=args.seconds, latency_runs=1, latency_rate=args.rate)
    rows: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for name, regions, pub, sub in CASES:
            got = run_case(regions, pub, sub, args.delay_ms / 1000, plan)
            rows.setdefault(name, []).append(got)
            print(f"round {r + 1} {name}: p50 {got['p50_ms']} ms, p99 {got['p99_ms']} ms; received "
                  f"{got['received']} of {got['sent']}", flush=True)
    print(f"\nlinks between regions delayed {args.delay_ms:g} ms each way; {args.rate} msg/s for {args.seconds:g} s")
    print("| published → received | p50 ms (each round) | p99 ms (each round) |\n|---|---|---|")
    for name, got in rows.items():
        print(f"| {name} | {' / '.join(str(g['p50_ms']) for g in got)} | "
              f"{' / '.join(str(g['p99_ms']) for g in got)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
