"""`python -m pigeon.bench`: `pigeon bench` with the scale plan's own options, until the `pigeon bench` command
declares them (`--scale-nodes 3,4`, `--node-cpu 0.2`, `--quick`); every other option as `pigeon bench`'s."""

from __future__ import annotations

import argparse
import sys

from pigeon.bench.cli import bench_command


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pigeon.bench", description=__doc__)
    p.add_argument("--plan", default="scale", help="scale | scale-quick (or any plan of `pigeon bench`)")
    p.add_argument("--quick", action="store_true", help="the plan's quick variant (scale → scale-quick)")
    p.add_argument("--scale-nodes", help="comma-separated node counts, ascending (default 3,4,5,6)")
    p.add_argument("--node-cpu", type=float, help="cores each node may use (default 0.2)")
    p.add_argument("--workloads", help="comma-separated subset: publish, mixed, topics_publish, topics")
    p.add_argument("--topic-layout", help="the nodes' topic layout: spread (default: a topic over every node) or "
                   "together (a topic one node's)")
    p.add_argument("--peers", default="none")
    p.add_argument("--out", help="directory for <date>-<machine>-scale.json/.md/.png")
    p.add_argument("--json", dest="json_path", help="write the JSON results here")
    p.add_argument("--quiet-wait", type=float, default=0.0, help="before each node count (each target), wait up "
                   "to this many seconds for other programs on the machine to go quiet")
    p.add_argument("--report-from", help="measure nothing: print and re-render the results in this JSON file")
    a = p.parse_args(argv)
    plan = ("scale-quick" if a.plan.startswith("scale") else "quick") if a.quick else a.plan
    return bench_command(plan, a.peers, None, False, a.out, a.json_path, a.quiet_wait, a.report_from,
                         workloads=a.workloads, scale_nodes=a.scale_nodes, node_cpu=a.node_cpu,
                         topic_layout=a.topic_layout)


if __name__ == "__main__":
    sys.exit(main())
