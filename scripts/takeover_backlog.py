"""A takeover of a bundle that holds a big backlog: on a 3-node cluster (`pigeon bench`'s pigeon-cluster target),
publish at 1,000 messages per request for a while (nothing consumes), then kill -9 the topic's owner and time the
first publish to that topic answered after it (one message at a time, through a node that stays up); print the
new owner's "took bundle over" line (megabytes read back, seconds reading, seconds applying).

    python scripts/takeover_backlog.py                  # first a publish as the cluster plan's (8 s, 4 in flight)
    python scripts/takeover_backlog.py --wait 120       # allow up to 120 s for publishes to be answered again

Loopback only, bounded like the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
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
    args = ap.parse_args()
    plan = PLANS["cluster"]
    root = tempfile.mkdtemp(prefix="pigeon-takeover-")
    server = bench_cluster.PigeonClusterServer(root, plan)
    server.start()
    try:
        w.setup(server.driver, "publish")
        first = w.publish(server.driver, plan, "publish", 1000, lambda f, n: None, inflight=4)
        print(f"backlog: {first['count']:,} messages of {plan.message_bytes} B, nothing consumed")

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
    finally:
        server.stop()
        server.discard()
    return 0


if __name__ == "__main__":
    sys.exit(main())
