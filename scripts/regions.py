"""`make regions`: a deployment of regions on loopback (docs/regions.md), in the foreground — a global etcd, and
for each region an etcd and its nodes, the links between regions delayed (each way) by the test network's
proxies; prints each node's address and the line to reach it with a client. Ctrl-C (or SIGTERM) stops everything
it started.

    python scripts/regions.py [--regions east,west,north] [--nodes 1] [--delay-ms 50] [--dir ./regions]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.testing.regions import Deployment  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regions", default="east,west,north")
    ap.add_argument("--nodes", type=int, default=1, help="nodes per region (replicas: up to 3 of them)")
    ap.add_argument("--delay-ms", type=float, default=50.0, help="each way, on every link between two regions")
    ap.add_argument("--dir", default="./regions", help="data directories and logs (emptied first)")
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    dep = Deployment(os.path.abspath(args.dir), regions=args.regions.split(","), nodes=args.nodes,
                     delay_s=args.delay_ms / 1000)
    try:
        dep.start()
        print(f"global store: etcd at {dep.etcds['global'].endpoint} (in region {dep.regions[0]}); links between "
              f"regions delayed {args.delay_ms:g} ms each way")
        for node_id, node in dep.nodes.items():
            print(f"  {node_id:12s} region {dep.region_of[node_id]:8s} PUBSUB_EMULATOR_HOST={node.address}   "
                  f"console {node.http}/   (etcd {dep.etcds[dep.region_of[node_id]].endpoint}, log {node.log_path})")
        print("Ctrl-C stops everything.", flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        dep.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
