"""The `pigeon bench` command's body (the typer declaration lives in pigeon.cli.main)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys

from rich.console import Console

from pigeon.bench import report, scale_report
from pigeon.bench.plan import PLANS, SCALE_PLANS, SCALE_WORKLOADS, WORKLOADS
from pigeon.bench.run import CLUSTERS, TARGETS, machine, machine_tag, run


def bench_command(plan: str, peers: str, address: str | None, no_pigeon: bool, out: str | None,
                  json_path: str | None, quiet_wait_s: float = 0.0, report_from: str | None = None,
                  workloads: str | None = None, scale_nodes: str | None = None,
                  node_cpu: float | None = None, topic_layout: str | None = None) -> int:
    console = Console()
    # SIGTERM unwinds like Ctrl-C: every started server is stopped on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if report_from:
        with open(report_from) as f:
            doc = json.load(f)
        views = scale_report if doc.get("kind") == "scale" else report
        views.print_table(doc, console)
        stem = report_from[:-5] if report_from.endswith(".json") else report_from
        for p in views.write_views(doc, stem):
            console.print(f"wrote {p}")
        return 0
    if plan in SCALE_PLANS:
        return scale_command(plan, workloads, scale_nodes, node_cpu, out, json_path, console, quiet_wait_s,
                             topic_layout)
    if plan not in PLANS:
        console.print(f"[red]unknown plan {plan!r}: choose one of {', '.join([*PLANS, *SCALE_PLANS])}")
        return 2
    chosen_plan = PLANS[plan]
    if workloads:
        picked = tuple(w.strip() for w in workloads.split(",") if w.strip())
        unknown = [w for w in picked if w not in WORKLOADS]
        if unknown:
            console.print(f"[red]unknown workloads {unknown}: choose from {', '.join(WORKLOADS)}")
            return 2
        try:
            chosen_plan = chosen_plan.scaled(workloads=tuple(w for w in WORKLOADS if w in picked))
        except AssertionError as e:
            console.print(f"[red]{e.args[0] if e.args else 'these workloads cannot run alone'}")
            return 2
    if peers == "none":
        chosen = []
    elif peers == "all":
        chosen = [t for t in TARGETS if t != "pigeon"]
    elif peers == "cluster":  # the replicated targets
        chosen = list(CLUSTERS)
    else:
        chosen = [p.strip() for p in peers.split(",") if p.strip()]
        unknown = [p for p in chosen if p not in TARGETS or p == "pigeon"]
        if unknown:
            console.print(f"[red]unknown peers {unknown}: choose from {', '.join(TARGETS[1:])}")
            return 2
    targets = ([] if no_pigeon else ["pigeon"]) + chosen
    if not targets:
        console.print("[red]nothing to run")
        return 2
    doc = run(chosen_plan, targets, address=address, console=console, quiet_wait_s=quiet_wait_s)
    report.print_table(doc, console)
    save(doc, out, json_path, console)
    # a peer's failure is reported in the table; Pigeon's makes the command fail
    return 1 if (doc["targets"].get("pigeon") or {}).get("errors") else 0


def save(doc: dict, out: str | None, json_path: str | None, console: Console, suffix: str = "",
         views=None) -> None:
    """The document to `json_path`, and with its views under `out` as <start time>-<machine><suffix>.*"""
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
    if out:
        started = datetime.datetime.fromisoformat(doc["when"]).astimezone(datetime.timezone.utc)
        # the start time (UTC) in the name: a second run on the same day must not overwrite the first
        stem = os.path.join(out, f"{started:%Y-%m-%dT%H%M}-{machine_tag(machine())}{suffix}")
        for p in report.write(doc, stem, views):
            console.print(f"wrote {p}")


def scale_command(plan: str, workloads: str | None, scale_nodes: str | None, node_cpu: float | None,
                  out: str | None, json_path: str | None, console: Console, quiet_wait_s: float = 0.0,
                  topic_layout: str | None = None) -> int:
    """`--plan scale` (or scale-quick): the cluster at each node count, every node under a CPU cgroup."""
    from pigeon.bench.cgroups import find
    from pigeon.bench.cluster import PigeonClusterServer
    from pigeon.bench.scale import run_scale

    changes: dict = {}
    try:
        if scale_nodes:
            changes["nodes"] = tuple(int(n) for n in scale_nodes.split(",") if n.strip())
        if node_cpu is not None:
            changes["node_cpu"] = float(node_cpu)
        if topic_layout:
            changes["topic_layout"] = topic_layout
        if workloads:
            picked = {w.strip() for w in workloads.split(",") if w.strip()}
            changes["workloads"] = tuple(w for w in SCALE_WORKLOADS if w in picked)
            unknown = picked - set(SCALE_WORKLOADS)
            if unknown:
                raise ValueError(f"unknown workloads {sorted(unknown)}: choose from {', '.join(SCALE_WORKLOADS)}")
        chosen = SCALE_PLANS[plan].scaled(**changes)
    except (AssertionError, ValueError) as e:
        console.print(f"[red]{e.args[0] if e.args else 'these settings cannot run'}")
        return 2
    missing = PigeonClusterServer.missing()
    hierarchy, why = find()
    if missing or hierarchy is None:
        console.print(f"[red]{missing or why}")
        return 2
    console.print(f"{chosen.name}: N = {', '.join(map(str, chosen.nodes))} nodes, each held to {chosen.node_cpu:g} "
                  f"core (cgroup {hierarchy.kind}, {hierarchy.root}); {len(chosen.workloads)} runs of "
                  f"{chosen.run_s:g} s per N, about {chosen.estimate_s() / 60:.0f} minutes in all")
    doc = run_scale(chosen, hierarchy, console, quiet_wait_s)
    scale_report.print_table(doc, console)
    save(doc, out, json_path, console, "-scale", scale_report.write_views)
    return 1 if any(r.get("errors") for r in doc["runs"].values()) else 0
