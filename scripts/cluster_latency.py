"""Publish → deliver latency through a 3-node cluster at a given rate, with each node's CPU while it ran: the
benchmark's latency workload (open loop, one message per durable publish, a StreamingPull consumer acking) against
`pigeon bench`'s pigeon-cluster target, the topic's owner named.

    python scripts/cluster_latency.py --rate 300 --rate 1000 [--seconds 6]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.bench import workloads as w  # noqa: E402
from pigeon.bench.cluster import PigeonClusterServer  # noqa: E402
from pigeon.bench.plan import PLANS  # noqa: E402


def _tree(pid: int) -> list[int]:
    out = [pid]
    for child in subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                                text=True).stdout.split():
        out += _tree(int(child))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children so far."""
    total = 0.0
    for p in _tree(pid):
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, action="append", help="messages per second (repeat for several runs)")
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    for rate in args.rate or [1000]:
        plan = PLANS["quick"].scaled(latency_s=args.seconds, latency_runs=1, latency_rate=rate)
        server = PigeonClusterServer(tempfile.mkdtemp(prefix="pigeon-cluster-latency-"), plan)
        server.start()
        try:
            owner = server.owner_of(server.driver.topic("latency"))
            pids = {n: d.pid for n, d in server.nodes.items()}
            before, t0 = {n: cpu_seconds(p) for n, p in pids.items()}, time.monotonic()
            r = w.latency(server.driver, plan, "latency", lambda f, done: None)
            dt = time.monotonic() - t0
            share = ", ".join(f"{n}{' (owner)' if n == owner else ''} {100 * (cpu_seconds(p) - before[n]) / dt:.0f} %"
                              for n, p in pids.items())
            print(f"{rate} msg/s: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, publish answered p50 "
                  f"{r.get('ack_p50_ms')} ms; received {r['received']} of {r['sent']} (failed: {r.get('failed_why') or 0}); slowest fdatasync of the "
                  f"disk probe {r.get('disk_probe_max_ms')} ms; CPU over {dt:.1f} s (setup included): {share}",
                  flush=True)
        finally:
            server.stop()
            server.discard()
    return 0


if __name__ == "__main__":
    sys.exit(main())
