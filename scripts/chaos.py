"""`make chaos`: every fault scenario of pigeon.testing.chaos against a real 3-node cluster on loopback, for
several seeds, each ending in a full check of the history (no acknowledged publish lost, no acknowledged ack
undone, per-key order). Prints each run as it ends and a table at the end; exits 1 if any run failed.

    python scripts/chaos.py [--scenarios kill-owner,pause-owner] [--seeds 3] [--first-seed 1] [--outage 10]
                            [--etcd-outage 60] [--dir /tmp/pigeon-chaos] [--topic-layout spread]
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

from pigeon.testing.chaos import SCENARIOS, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated: {', '.join(SCENARIOS)}")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--outage", type=float, default=10.0, help="seconds a node stays down, paused or drained")
    ap.add_argument("--etcd-outage", type=float, default=60.0, help="seconds etcd stays down")
    ap.add_argument("--dir", default=None, help="where the clusters live (default: a temporary directory)")
    ap.add_argument("--topic-layout", default="together", choices=("together", "spread"),
                    help="the nodes' topic layout (spread: each topic over every node)")
    args = ap.parse_args()
    console = Console(width=None if sys.stdout.isatty() else 160)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        console.print(f"unknown scenarios: {unknown}; known: {list(SCENARIOS)}")
        return 2
    base = args.dir or tempfile.mkdtemp(prefix="pigeon-chaos-")
    reports = []
    total = len(names) * args.seeds
    t_all = time.monotonic()
    for i, (name, seed) in enumerate([(n, s) for n in names for s in range(args.first_seed,
                                                                             args.first_seed + args.seeds)]):
        root = os.path.join(base, f"{name}-{seed}")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        console.print(f"[bold][{i + 1}/{total}][/bold] {name} seed {seed} ({root})")
        t0 = time.monotonic()
        outage = args.etcd_outage if name == "stop-etcd" else args.outage
        try:
            rep = run(name, seed, root, outage_s=outage, say=lambda m: console.print(f"    {m}"),
                      layout=args.topic_layout)
        except Exception as e:  # noqa: BLE001 — a run that could not finish is a failed run, reported
            console.print(f"    [red]the run itself failed: {type(e).__name__}: {e}[/red]")
            reports.append((name, seed, None, time.monotonic() - t0))
            continue
        reports.append((name, seed, rep, time.monotonic() - t0))
        mark = "[green]ok[/green]" if rep.ok else "[red]FAILED[/red]"
        console.print(f"    {mark}: {rep.published} publishes acknowledged, {rep.delivered} deliveries, "
                      f"lost {len(rep.lost)}, acks undone {len(rep.undone)}, out of order {len(rep.disorder)}"
                      + (f", acked while cut off {len(rep.unreplicated)}" if rep.unreplicated else "")
                      + (f", publishes answered again {rep.recovery_s:.1f} s after the fault"
                         if rep.recovery_s is not None else "")
                      + (f" ({rep.served_s:.2f} s through any node up)" if rep.served_s is not None else ""))
        for line in (rep.lost + rep.undone + rep.disorder + rep.unreplicated)[:10]:
            console.print(f"      {line}")
    table = Table("scenario", "seed", "acked publishes", "deliveries", "lost", "acks undone", "out of order",
                  "publish errors", "ack errors", "publishes again after",
                  "… through any node up", "run", title="pigeon chaos")
    failed = 0
    for name, seed, rep, took in reports:
        if rep is None:
            failed += 1
            table.add_row(name, str(seed), "-", "-", "-", "-", "-", "-", "-", "-", "-",
                          f"{took:.0f} s  [red]error[/red]")
            continue
        failed += not rep.ok
        table.add_row(name, str(seed), str(rep.published), str(rep.delivered), str(len(rep.lost)),
                      str(len(rep.undone)), str(len(rep.disorder)), str(rep.publish_failed), str(rep.ack_failed),
                      f"{rep.recovery_s:.1f} s" if rep.recovery_s is not None else "-",
                      f"{rep.served_s:.2f} s" if rep.served_s is not None else "-", f"{took:.0f} s")
    console.print(table)
    console.print(f"{len(reports) - failed} of {len(reports)} runs clean in {time.monotonic() - t_all:.0f} s")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
