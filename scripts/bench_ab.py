"""Before/after: the same benchmark workloads for two git revisions, alternating A B B A … in one sitting, so
both sides see the same machine (these VMs are shared and noisy: a ratio from one sitting is worth more than two
figures from different hours).

    python scripts/bench_ab.py HEAD~3 HEAD --workloads publish,consume --rounds 2
    python scripts/bench_ab.py 161ec0c HEAD --workloads connections
    python scripts/bench_ab.py HEAD~1 HEAD --workloads publish --target pigeon-cluster

Each revision is checked out into a temporary git worktree; the benchmark of this checkout starts the server from
it (PIGEON_BENCH_SERVER_TREE), so both sides face the same load generator. The table shows every run and the
median ratio B ÷ A per figure. Loopback only, bounded by the plan like `pigeon bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
console = Console(width=150)

# (label, results key, field)
FIGURES = [
    ("publish 1 KiB × 1,000 msg/s", "publish_b1000", "msgs_per_s"),
    ("publish 1 KiB × 100 msg/s", "publish_b100", "msgs_per_s"),
    ("consume with acks msg/s", "consume", "msgs_per_s"),
    ("publish + consume at once: publish msg/s", "mixed", "publish_msgs_per_s"),
    ("publish + consume at once: consume msg/s", "mixed", "consume_msgs_per_s"),
    ("latency p50 ms", "latency", "p50_ms"),
    ("latency p99 ms", "latency", "p99_ms"),
    ("latency p999 ms", "latency", "p999_ms"),
    ("publish-ack latency p50 ms", "latency", "ack_p50_ms"),
    ("publish-ack latency p99 ms", "latency", "ack_p99_ms"),
    ("disk probe: slowest fdatasync ms", "latency", "disk_probe_max_ms"),
    ("ordered publish msg/s", "ordered", "publish_msgs_per_s"),
    ("ordered consume msg/s", "ordered", "consume_msgs_per_s"),
    ("many clients publish msg/s", "connections", "publish_msgs_per_s"),
    ("many clients receive msg/s", "connections", "receive_msgs_per_s"),
    ("streams that received", "connections", "subscribers_active"),
    ("few clients, same request size: publish msg/s", "connections_few", "publish_msgs_per_s"),
    ("few clients, same request size: consume msg/s", "connections_few", "consume_msgs_per_s"),
    ("RAM per backlogged message B", "backlog", "bytes_per_msg"),
    ("restart s", "restart", "seconds"),
    ("failover s (pigeon-cluster)", "failover", "seconds"),
]


def run(rev_dir: str, plan: str, workloads: str, out: str, target: str) -> dict:
    env = dict(os.environ, PIGEON_BENCH_SERVER_TREE=rev_dir)
    cmd = [sys.executable, "-m", "pigeon", "bench", "--plan", plan, "--workloads", workloads, "--json", out]
    if target != "pigeon":
        cmd += ["--peers", target, "--no-pigeon"]
    subprocess.run(cmd, cwd=ROOT, env=env, check=False, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return (json.load(f)["targets"].get(target) or {}).get("results") or {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="the revision before (A)")
    ap.add_argument("b", help="the revision after (B)")
    ap.add_argument("--workloads", required=True, help="comma-separated, as for `pigeon bench --workloads`")
    ap.add_argument("--plan", default="full")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--target", default="pigeon", help="pigeon (one node) or pigeon-cluster (3 nodes and etcd)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pigeon-ab-")
    dirs = {}
    try:
        for side, rev in (("A", args.a), ("B", args.b)):
            dirs[side] = os.path.join(tmp, side)
            subprocess.run(["git", "worktree", "add", "--detach", dirs[side], rev], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if os.path.exists(os.path.join(dirs[side], "setup.py")):  # its compiled part, as its install builds it
                subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=dirs[side],
                               check=True, stdout=subprocess.DEVNULL)
        runs: dict[str, list[dict]] = {"A": [], "B": []}
        for i in range(args.rounds):
            # A B, then B A, …: the run after another meets its leftovers (its data directory's dirty pages being
            # written back, its removal), and a side always second would pay for them in every round — the same
            # revision on both sides measured B 1.2–1.3× A with a fixed order
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                console.print(f"round {i + 1}/{args.rounds}: {side} ({args.a if side == 'A' else args.b})")
                os.sync()  # (what the last run left dirty goes to the disk now, not during this one)
                runs[side].append(run(dirs[side], args.plan, args.workloads, os.path.join(tmp, f"{side}{i}.json"),
                                      args.target))
    finally:
        for d in dirs.values():
            subprocess.run(["git", "worktree", "remove", "--force", d], cwd=ROOT, check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)  # the runs' JSON files: the table below has their figures
    table = Table(title=f"A = {args.a}, B = {args.b}: {args.workloads}, {args.rounds} rounds, A B then B A")
    table.add_column("figure")
    table.add_column("A runs", justify="right")
    table.add_column("B runs", justify="right")
    table.add_column("B ÷ A (medians)", justify="right")
    for label, key, field in FIGURES:
        va = [r[key][field] for r in runs["A"] if isinstance((r.get(key) or {}).get(field), (int, float))]
        vb = [r[key][field] for r in runs["B"] if isinstance((r.get(key) or {}).get(field), (int, float))]
        if not va and not vb:
            continue
        ratio = statistics.median(vb) / statistics.median(va) if va and vb and statistics.median(va) else None
        table.add_row(label, " / ".join(f"{v:,.4g}" for v in va), " / ".join(f"{v:,.4g}" for v in vb),
                      f"{ratio:.2f}×" if ratio is not None else "–")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
