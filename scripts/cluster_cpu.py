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
import urllib.request

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


def _threads(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of `pid` (the Python process: the wrapper's child when there is one), by name;
    the event loop's thread is "loop"."""
    while not os.path.exists(f"/proc/{pid}/task/{pid}/comm") or _comm(pid, pid) not in ("python", "pigeon"):
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
        if not kids:
            break
        pid = int(kids[0])
    out: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        name = "loop" if int(task) == pid else _comm(pid, int(task))
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _fsyncs(port: int) -> tuple[float, float]:
    """(count, total seconds) of the journal's fdatasyncs so far, from the node's /metrics (its HTTP port; the
    benchmark's single node has none: zeros)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port + 1}/metrics", timeout=5).read().decode()
    except OSError:
        return 0.0, 0.0
    got = dict(line.split()[:2] for line in text.splitlines()
               if line.startswith(("pigeon_fsync_seconds_count", "pigeon_fsync_seconds_sum")))
    return float(got.get("pigeon_fsync_seconds_count", 0)), float(got.get("pigeon_fsync_seconds_sum", 0))


def _comm(pid: int, task: int) -> str:
    with open(f"/proc/{pid}/task/{task}/comm") as f:
        return f.read().strip()


def measure(kind: str, batch: int, inflight: int, after: int = 0) -> None:
    plan = PLANS["cluster"]
    root = tempfile.mkdtemp(prefix="pigeon-cpu-")
    server = PigeonClusterServer(root, plan) if kind == "cluster" else PigeonServer(root, plan)
    server.start()
    try:
        nodes = server.nodes if kind == "cluster" else {"node": server.main()}
        procs = {n: d.pid for n, d in nodes.items()}
        procs.update({d.name: d.pid for d in server.daemons if d.name == "etcd"})
        w.setup(server.driver, "publish")
        owner = server.owner_of(server.driver.topic("publish")) if kind == "cluster" else "node"
        if after:
            first = w.publish(server.driver, plan, "publish", after, lambda f, n: None, inflight=4)
            print(f"{kind}: first {first['msgs_per_s']:,} msg/s ({after} per request, 4 in flight per publisher)")
        before = {n: _cpu_s(p) for n, p in procs.items()}
        threads0 = _threads(procs[owner])
        syncs0 = {n: _fsyncs(d.port) for n, d in nodes.items()}
        ru0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        r = w.publish(server.driver, plan, "publish", batch, lambda f, n: None, inflight=inflight)
        seconds, ru1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        used = {n: tuple(a - b for a, b in zip(_cpu_s(p), before[n])) for n, p in procs.items()}
        threads = {t: c - threads0.get(t, 0.0) for t, c in _threads(procs[owner]).items()}
        syncs = {n: tuple(a - b for a, b in zip(_fsyncs(d.port), syncs0[n])) for n, d in nodes.items()}
        system = ru1.ru_stime - ru0.ru_stime
        used["load generators"] = (ru1.ru_utime - ru0.ru_utime + system, system)
        print(f"{kind}: {r['msgs_per_s']:,} msg/s ({batch} per request, {inflight} in flight per publisher)")
        for name, (cpu, system) in used.items():
            mark = " (owner)" if name == owner and kind == "cluster" else ""
            print(f"   {name + mark:18s} {cpu / seconds:5.2f} cores ({system / seconds:4.2f} in the kernel)  "
                  f"{cpu / r['count'] * 1e6:6.2f} µs per message")
        print(f"   {owner}'s threads: " + ", ".join(f"{t} {c / seconds:.2f}" for t, c in
                                                  sorted(threads.items(), key=lambda tc: -tc[1]) if c > 0))
        print("   fdatasync: " + ", ".join(f"{n} {count / seconds:,.0f}/s of {total / max(count, 1) * 1e3:.2f} ms"
                                           for n, (count, total) in syncs.items() if count))
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
