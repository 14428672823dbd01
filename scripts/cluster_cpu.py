"""CPU per process, and per message, while the benchmark's durable publish runs against a 3-node cluster (the
`pigeon-cluster` target) and, for comparison, a single node: where a replicated message's CPU goes, node by node.

    python scripts/cluster_cpu.py --batch 100 --inflight 16
    python scripts/cluster_cpu.py --batch 100 --after 1000      # after a publish at 1,000 per request, as in the
                                                                 # benchmark (its bytes still settling on the disk)
    PIGEON_BENCH_SERVER_TREE=/tmp/old python scripts/cluster_cpu.py --only cluster   # another tree's servers

Each process's CPU is read from /proc (the server and whatever it forked); the load generators' from their
rusage once they have exited. Loopback only, bounded like the benchmark.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.bench import workloads as w  # noqa: E402
from pigeon.bench.cluster import PigeonClusterServer  # noqa: E402
from pigeon.bench.peers import PigeonServer  # noqa: E402
from pigeon.bench.plan import PLANS  # noqa: E402


def _tree(pid: int) -> list[int]:
    out = [pid]
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for child in f.read().split():
                out += _tree(int(child))
    return out


def _cpu_s(pid: int) -> tuple[float, float]:
    """(user + system, system) CPU seconds of `pid` and its descendants."""
    total = system = 0
    for p in _tree(pid):
        with open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
        system += int(fields[12])
    return total / os.sysconf("SC_CLK_TCK"), system / os.sysconf("SC_CLK_TCK")


def measure(kind: str, batch: int, inflight: int, after: int = 0) -> None:
    plan = PLANS["cluster"]
    root = tempfile.mkdtemp(prefix="pigeon-cpu-")
    server = PigeonClusterServer(root, plan) if kind == "cluster" else PigeonServer(root, plan)
    server.start()
    try:
        procs = {n: d.pid for n, d in server.nodes.items()} if kind == "cluster" else {"node": server.main().pid}
        procs.update({d.name: d.pid for d in server.daemons if d.name == "etcd"})
        w.setup(server.driver, "publish")
        owner = server.owner_of(server.driver.topic("publish")) if kind == "cluster" else "node"
        if after:
            first = w.publish(server.driver, plan, "publish", after, lambda f, n: None, inflight=4)
            print(f"{kind}: first {first['msgs_per_s']:,} msg/s ({after} per request, 4 in flight per publisher)")
        before = {n: _cpu_s(p) for n, p in procs.items()}
        ru0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        r = w.publish(server.driver, plan, "publish", batch, lambda f, n: None, inflight=inflight)
        seconds, ru1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        used = {n: tuple(a - b for a, b in zip(_cpu_s(p), before[n])) for n, p in procs.items()}
        system = ru1.ru_stime - ru0.ru_stime
        used["load generators"] = (ru1.ru_utime - ru0.ru_utime + system, system)
        print(f"{kind}: {r['msgs_per_s']:,} msg/s ({batch} per request, {inflight} in flight per publisher)")
        for name, (cpu, system) in used.items():
            mark = " (owner)" if name == owner and kind == "cluster" else ""
            print(f"   {name + mark:18s} {cpu / seconds:5.2f} cores ({system / seconds:4.2f} in the kernel)  "
                  f"{cpu / r['count'] * 1e6:6.2f} µs per message")
    finally:
        server.stop()
        server.discard()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=100, help="messages per request")
    ap.add_argument("--inflight", type=int, default=16, help="requests in flight per publisher process")
    ap.add_argument("--only", choices=("cluster", "single"), default=None)
    ap.add_argument("--after", type=int, default=0, help="first publish for as long at this many per request")
    args = ap.parse_args()
    for kind in [args.only] if args.only else ["cluster", "single"]:
        measure(kind, args.batch, args.inflight, args.after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
