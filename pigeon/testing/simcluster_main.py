"""`python -m pigeon.testing.simcluster_main` (`make sim-cluster`): the cluster simulator (pigeon.testing.simcluster)
over many seeds, in processes side by side, each failure printed with the command that replays it."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import multiprocessing
import os
import sys
import time

from pigeon.testing.simcluster import SimFailure, run_seed
from pigeon.testing.simnode import NODE


def _one(job: tuple[int, int, bool]) -> str | None:
    """A seed's failure as text (None when clean): what a worker process sends back."""
    seed, steps, spread = job
    try:
        run_seed(seed, steps, spread)
    except SimFailure as e:
        return f"FAILED {e}\n  replay: PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', '?')} python -m " \
               f"pigeon.testing.simcluster_main --seed {seed} --steps {steps} --layout {'spread' if spread else 'together'}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run the cluster simulator over seeds.")
    ap.add_argument("--seed", type=int, help="run this one seed")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes running seeds side by side")
    ap.add_argument("--verbose", action="store_true", help="the nodes' logs on stderr (one process)")
    ap.add_argument("--layout", choices=("together", "spread", "both"), default="both",
                    help="the topics' layout: each topic one bundle's, each shard a bundle's, or spread for odd seeds")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL, stream=sys.stderr,
                        format="%(vtime)9.3f %(node)s %(name)s %(message)s")
    old_factory = logging.getLogRecordFactory()

    def record(*a, **kw):  # virtual time and the node, on every line
        r = old_factory(*a, **kw)
        try:
            r.vtime = asyncio.get_running_loop().time()
        except RuntimeError:
            r.vtime = 0.0
        life = NODE.get()
        r.node = life.node.id if life is not None else "--"
        return r
    logging.setLogRecordFactory(record)
    # What is imported now lives as long as the process: the collector leaves it out (and forked workers share it
    # untouched); a seed's run collects once, at its end (simcluster.run_seed).
    gc.freeze()
    seeds = [args.seed] if args.seed is not None else range(args.first_seed, args.first_seed + args.seeds)
    jobs = [(seed, args.steps, args.layout == "spread" or (args.layout == "both" and seed % 2 == 1)) for seed in seeds]
    t0 = time.monotonic()
    failed = done = 0
    workers = 1 if args.verbose or len(jobs) == 1 else max(1, args.jobs)
    pool = multiprocessing.get_context("fork").Pool(workers) if workers > 1 else None
    try:
        for out in (pool.imap_unordered(_one, jobs) if pool is not None else map(_one, jobs)):
            done += 1
            if out is not None:
                failed += 1
                print(out, flush=True)
            if done % 100 == 0:
                print(f"{done} seeds, {failed} failed, {done / (time.monotonic() - t0) * 60:.0f} seeds a minute",
                      flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    took = time.monotonic() - t0
    print(f"{len(jobs)} seeds in {took:.1f} s ({len(jobs) / took * 60:.0f} a minute, {workers} process(es)): "
          f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
