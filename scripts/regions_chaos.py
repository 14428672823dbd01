"""Faults of a deployment of regions under load (pigeon.testing.regions_chaos): a region cut off from the others
and the global store, the global store stopped — each for `--outage` seconds — and a region lost for good with its
topics copied to the other, each ending in the full history check (no acknowledged publish lost, no acknowledged
ack undone, per-key order; for a lost region, what its copy's reported lag promised). Prints each run and a
table; exits 1 if any run failed.

    python scripts/regions_chaos.py [--scenarios cut-region,stop-global,lose-region] [--seeds 1] [--outage 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from pigeon.testing.regions_chaos import SCENARIOS, run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--outage", type=float, default=60.0)
    args = ap.parse_args()
    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table("scenario", "seed", "published", "delivered", "lost", "acks undone", "out of order",
                  "acked during (east / west topic)", "delivered during (east / west topic)", "admin call during")
    failed = False
    for scenario in [s for s in args.scenarios.split(",") if s]:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            with tempfile.TemporaryDirectory(prefix="pigeon-regions-chaos-") as root:
                r = run(scenario, seed, root, outage_s=args.outage, say=lambda m: console.print(f"  {m}"))
            failed |= not r.ok
            console.print(f"{scenario} seed {seed}: {'clean' if r.ok else 'FAILED'} — {r.published} published, "
                          f"{len(r.lost)} lost, {len(r.undone)} acks undone, {len(r.disorder)} out of order"
                          + (f"; the copy {r.copy_lag_s:.2f} s behind at the loss: {r.at_risk} publishes within "
                             f"it, {r.at_risk_lost} of them lost; ack state {r.acks_age_s:.2f} s old, "
                             f"{r.acks_again} acks came again" if scenario == "lose-region" else "")
                          + "".join(f"\n    {x}" for x in (r.lost + r.undone + r.disorder)[:10]))
            table.add_row(scenario, str(seed), str(r.published), str(r.delivered), str(len(r.lost)),
                          str(len(r.undone)), str(len(r.disorder)), " / ".join(map(str, r.during.values())),
                          " / ".join(map(str, r.delivered_during.values())), r.admin_refused)
    console.print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
