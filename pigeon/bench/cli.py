"""The `pigeon bench` command's body (the typer declaration lives in pigeon.cli.main)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys

from rich.console import Console

from pigeon.bench import report
from pigeon.bench.plan import PLANS, WORKLOADS
from pigeon.bench.run import CLUSTERS, TARGETS, machine, machine_tag, run


def bench_command(plan: str, peers: str, address: str | None, no_pigeon: bool, out: str | None,
                  json_path: str | None, quiet_wait_s: float = 0.0, report_from: str | None = None,
                  workloads: str | None = None) -> int:
    console = Console()
    # SIGTERM unwinds like Ctrl-C: every started server is stopped on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if report_from:
        with open(report_from) as f:
            doc = json.load(f)
        report.print_table(doc, console)
        stem = report_from[:-5] if report_from.endswith(".json") else report_from
        for p in report.write_views(doc, stem):
            console.print(f"wrote {p}")
        return 0
    if plan not in PLANS:
        console.print(f"[red]unknown plan {plan!r}: choose one of {', '.join(PLANS)}")
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
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
    if out:
        started = datetime.datetime.fromisoformat(doc["when"]).astimezone(datetime.timezone.utc)
        # the start time (UTC) in the name: a second run on the same day must not overwrite the first
        stem = os.path.join(out, f"{started:%Y-%m-%dT%H%M}-{machine_tag(machine())}")
        for p in report.write(doc, stem):
            console.print(f"wrote {p}")
    # a peer's failure is reported in the table; Pigeon's makes the command fail
    return 1 if (doc["targets"].get("pigeon") or {}).get("errors") else 0
