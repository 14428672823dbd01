"""`make chaos`, its second part: rounds of random faults against a real cluster (pigeon.testing.fault_rounds) —
three nodes over a three-member etcd, publishers and StreamingPull subscribers through different nodes, one fault
every ~20 s (kill -9 and restart of a node, SIGSTOP of a node, kill -9 of an etcd member, every etcd member down,
a node added and later killed). Prints each round as it comes, then a table of the rounds with, for every node
killed, the time from the kill to the first publish answered through a survivor (the slowest of four probe
topics), and the history check. Exits 1 on any acknowledged publish lost, acknowledged ack undone or message out
of order, or when a kill took longer than --kill-to-publish-max to be served again.

    python scripts/fault_rounds.py [--rounds 50] [--seed 1] [--round-s 20] [--kill-to-publish-max 3] [--dir DIR]
                                   [--topic-layout spread]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

from pigeon.testing import fault_rounds
from pigeon.testing.fault_rounds import ROUND_S, run


class _KeptProbes(fault_rounds.Probes):
    """The run's probes, kept for the rounds that are not kills (run() times only those)."""

    last: "_KeptProbes | None" = None

    def start(self) -> None:
        _KeptProbes.last = self
        super().start()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--round-s", type=float, default=ROUND_S, help="seconds from one fault's start to the next's")
    ap.add_argument("--kill-to-publish-max", type=float, default=3.0,
                    help="seconds a kill may keep the probe topics from being published to through a survivor")
    ap.add_argument("--dir", default=None, help="where the cluster lives (default: a temporary directory)")
    ap.add_argument("--topic-layout", default="together", choices=("together", "spread"),
                    help="the nodes' topic layout (spread: each topic over every node)")
    args = ap.parse_args()
    console = Console(width=None if sys.stdout.isatty() else 160)
    root = args.dir or tempfile.mkdtemp(prefix="pigeon-rounds-")
    os.makedirs(root, exist_ok=True)
    if os.listdir(root):  # (an earlier run's etcd would start with that cluster's state and never elect a leader)
        sys.exit(f"{root} is not empty: give a new directory, or none (a temporary one)")
    t0 = time.monotonic()
    console.print(f"[bold]{args.rounds} rounds of random faults[/bold], seed {args.seed}, topics "
                  f"{args.topic_layout} ({root})")
    fault_rounds.Probes = _KeptProbes
    rep = run(args.seed, root, args.rounds, round_s=args.round_s, layout=args.topic_layout,
              say=lambda m: console.print(f"  [{time.monotonic() - t0:6.0f} s] {m}"))
    table = Table("round", "fault", "target", "kill → publish through a survivor",
                  "other fault → publish through a survivor", title="pigeon fault rounds")
    probes = _KeptProbes.last
    for r in rep.rounds:
        slow = r.kill_to_publish is not None and r.kill_to_publish > args.kill_to_publish_max
        took = "-" if r.kill_to_publish is None else f"{r.kill_to_publish:.2f} s"
        other = probes.first_after(r.at) if probes is not None and r.kill_to_publish is None else None
        table.add_row(str(r.number), r.kind, r.target, f"[red]{took}[/red]" if slow else took,
                      "-" if other is None else f"{other:.2f} s")
    console.print(table)
    slowest = rep.slowest_kill_to_publish
    console.print(f"{rep.published} publishes acknowledged, {rep.delivered} deliveries; lost {len(rep.lost)}, acks "
                  f"undone {len(rep.undone)}, out of order {len(rep.disorder)}; publish errors {rep.publish_failed}, "
                  f"ack errors {rep.ack_failed}, probe publishes refused {rep.probe_failed}; copies late after their "
                  f"ack {len(rep.late)}; slowest kill → publish "
                  + (f"{slowest:.2f} s" if slowest is not None else "-")
                  + f"; {time.monotonic() - t0:.0f} s in all")
    for line in (rep.lost + rep.undone + rep.disorder)[:20] + [f"(late) {x}" for x in rep.late[:5]]:
        console.print(f"  {line}")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    too_slow = slowest is not None and slowest > args.kill_to_publish_max
    return 0 if rep.ok and not too_slow else 1


if __name__ == "__main__":
    sys.exit(main())
