"""Where the server's time goes under one benchmark workload: py-spy samples the Pigeon server (native frames
included) only while that workload runs, then prints the hottest functions by own time and the Pigeon
functions by inclusive time, and writes a speedscope file (open it at https://www.speedscope.app/).

    python scripts/profile_server.py consume          # drains a 1M backlog published first (not profiled)
    python scripts/profile_server.py latency          # 1,000 msg/s open loop, durable
    python scripts/profile_server.py publish --plan quick
    python scripts/profile_server.py idle             # publish + consume while 10,000 idle streams are held
    python scripts/profile_server.py latency --cluster            # a 3-node cluster: the topic's owner
    python scripts/profile_server.py latency --cluster --member   # … one of its ledger's other members
    python scripts/profile_server.py latency --cluster --seconds 20 --native   # one 20 s run, native frames too
    python scripts/profile_server.py publish --batch 100 --after 1000   # as the benchmark runs it: after × 1,000
    python scripts/profile_server.py publish --cluster --perf     # Linux perf: the kernel's and C libraries' share

(py-spy 0.4.1 crashed — exit −11 — on a cluster owner at 1,000 publishes a second, with or without `--threads`,
`--subprocesses` or `--gil`; `--perf` profiles it.)

Sizes come from the benchmark's plans (`--plan full` by default); loopback only; bounded like the benchmark.
With `--cluster` the nodes run without the load planner (`--load-balance-s 0`; `--balance` keeps it): under a
minute of one hot topic it splits the topic's bundle mid-run, and the benchmark's client, which does not retry,
fails on the UNAVAILABLE that sends it to the shard's new home. The latency workload then runs once (on the one
topic whose owner is profiled; the benchmark's further runs use other topics, likely other owners), for
`--seconds` (default: the plan's run).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.bench import workloads as w  # noqa: E402
from pigeon.bench.peers import PigeonServer  # noqa: E402
from pigeon.bench.plan import PLANS  # noqa: E402
from pigeon.bench.procs import python_pid  # noqa: E402
from pigeon.bench.workers import Background  # noqa: E402

console = Console(width=150)


def _tick(fraction: float, done: int) -> None:
    pass


def run_workload(name: str, server, plan) -> tuple[dict, callable]:
    """Prepare (unprofiled) and return the workload's call."""
    d = server.driver
    if name == "publish":
        w.setup(d, "publish")
        return lambda: w.publish_best(d, plan, "publish", plan.publish_batches[0], _tick)
    if name == "consume":
        w.setup(d, "publish")
        pub = w.publish_best(d, plan, "publish", plan.publish_batches[0], _tick)
        n = min(pub["published_total"], plan.consume_messages)
        console.print(f"backlog: {pub['published_total']:,} messages published, consuming {n:,}")
        return lambda: w.consume(d, plan, "publish", n, _tick)
    if name == "latency":
        return lambda: w.latency(d, plan, "latency", _tick)
    if name == "connections":
        return lambda: w.connections(d, plan, "conns", _tick)
    if name == "idle":  # publish + consume at once while `idle_streams` streams are held open (not profiled)
        opened, release = w._CTX.Value("i", 0), w._CTX.Event()
        w.setup(d, "idle")
        holder = Background(d.hold_idle, ("idle", plan.idle_streams, plan.idle_channels, opened, release))
        while opened.value < plan.idle_streams and holder.alive() and plan.idle_streams:
            time.sleep(0.2)
        time.sleep(3 * plan.settle_s)
        console.print(f"{opened.value:,} idle streams open")

        def probe():
            try:
                return w.mixed(d, plan.scaled(mixed_s=plan.idle_probe_s), "idle_probe", _tick)
            finally:
                release.set()
                holder.result(plan.idle_open_s_max)
        return probe
    raise SystemExit(f"unknown workload {name}")


def summarize(path: str, top: int) -> None:
    with open(path, errors="replace") as f:  # (a sample taken without pausing may hold a torn name)
        doc = json.load(f)
    frames = doc["shared"]["frames"]
    for prof in doc["profiles"]:
        if "MainThread" not in prof["name"] and "wal" not in prof["name"]:
            continue
        total = sum(prof["weights"]) or 1
        own: collections.Counter = collections.Counter()
        incl: collections.Counter = collections.Counter()
        for stack, weight in zip(prof["samples"], prof["weights"]):
            if not stack:
                continue
            fr = frames[stack[-1]]
            own[(fr["name"], os.path.basename(fr.get("file", "")))] += weight
            for i in set(stack):
                incl[i] += weight
        table = Table(title=f"{prof['name']}: own time", show_lines=False)
        table.add_column("share", justify="right")
        table.add_column("function")
        table.add_column("file")
        for (fn, file), c in own.most_common(top):
            table.add_row(f"{100 * c / total:.1f} %", fn, file)
        console.print(table)
        table = Table(title=f"{prof['name']}: Pigeon functions, inclusive time")
        table.add_column("share", justify="right")
        table.add_column("function")
        table.add_column("where")
        shown = 0
        for i, c in incl.most_common():
            fr = frames[i]
            file = fr.get("file", "")
            if "/pigeon/" not in file or "/pigeon/cli/" in file or fr["name"] in ("run", "serve"):
                continue
            table.add_row(f"{100 * c / total:.1f} %", fr["name"], f"{os.path.basename(file)}:{fr.get('line')}")
            shown += 1
            if shown >= top:
                break
        console.print(table)


def perf_profile(pid: int, call, root: str, top: int) -> int:
    """Sample `pid` with perf while `call` runs; print the hottest symbols by own time, with their library."""
    data = os.path.join(root, "perf.data")
    pids = [pid]
    for p in pids:  # the server and whatever it started (the target may be a wrapper of the Python process)
        for task in os.listdir(f"/proc/{p}/task"):
            with open(f"/proc/{p}/task/{task}/children") as f:
                pids += [int(c) for c in f.read().split()]
    perf = subprocess.Popen(["perf", "record", "-g", "-e", "cpu-clock", "-F", "999", "-p", ",".join(map(str, pids)),
                             "-o", data],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    result = call()
    perf.send_signal(signal.SIGINT)
    perf.communicate(timeout=60)
    console.print({k: v for k, v in result.items() if k != "cpu"})
    report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "comm,dso,sym", "--stdio",
                             "-g", "none", "--percent-limit", "0.4"], capture_output=True, text=True)
    lines = [ln for ln in report.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    console.print("\n".join(lines[:top * 2]), markup=False, highlight=False)
    console.print(f"perf data: {data}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=("publish", "consume", "latency", "connections", "idle"))
    ap.add_argument("--plan", default="full", choices=sorted(PLANS))
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--idle-streams", type=int, default=None, help="idle: how many streams (default: the plan's)")
    ap.add_argument("--batch", type=int, default=None, help="publish: messages per request (default: the plan's "
                                                              "first)")
    ap.add_argument("--after", type=int, default=0, help="publish: first publish (not profiled) as long at this "
                                                          "many per request, as the benchmark does before")
    ap.add_argument("--no-native", action="store_true", help="Python frames only (py-spy pauses the server less: "
                                                               "the shares of Python functions come out closer)")
    ap.add_argument("--perf", action="store_true", help="sample with Linux perf instead (the kernel's and the C "
                                                          "libraries' own time, by library and symbol)")
    ap.add_argument("--out", default=None, help="speedscope file (default: a temporary file, printed)")
    ap.add_argument("--cluster", action="store_true", help="a 3-node cluster (pigeon bench's pigeon-cluster): "
                                                            "profile the node that owns the workload's topic "
                                                            "(without pausing it: no native frames)")
    ap.add_argument("--member", action="store_true", help="with --cluster: profile another node instead")
    ap.add_argument("--balance", action="store_true", help="with --cluster: keep the load planner on (it may move "
                                                           "or split the workload's bundle mid-run)")
    ap.add_argument("--native", action="store_true", help="with --cluster: native frames too (py-spy pauses the "
                                                          "node for each sample)")
    ap.add_argument("--seconds", type=float, default=None, help="latency: how long the run is (default: the "
                                                                 "plan's)")
    args = ap.parse_args()
    plan = PLANS[args.plan]
    if args.idle_streams is not None:
        plan = plan.scaled(idle_streams=args.idle_streams)
    if args.batch is not None:
        plan = plan.scaled(publish_batches=(args.batch,))
    if args.seconds is not None:
        plan = plan.scaled(latency_s=args.seconds)
    if args.cluster:  # the profiled owner's topic alone
        plan = plan.scaled(latency_runs=1)
    root = tempfile.mkdtemp(prefix="pigeon-profile-")
    out = args.out or os.path.join(root, f"{args.workload}.speedscope.json")
    if args.cluster:
        from pigeon.bench.cluster import PigeonClusterServer

        server = PigeonClusterServer(root, plan)
        if not args.balance:
            server.node_args = ("--load-balance-s", "0")
    else:
        server = PigeonServer(root, plan)
    server.start()
    try:
        call = run_workload(args.workload, server, plan)
        if args.after:
            first = w.publish(server.driver, plan, "publish", args.after, _tick, inflight=4)
            console.print(f"first: {first['msgs_per_s']:,} msg/s at {args.after} per request (not profiled)")
        target = server.main()
        if args.cluster:
            key = {"consume": "publish"}.get(args.workload, args.workload)
            owner = server.owner_of(server.driver.topic(key))
            name = next(n for n in server.nodes if n != owner) if args.member else owner
            target = server.nodes[name]
            console.print(f"profiling {name} ({'a member' if args.member else 'the owner'} of {key}'s topic)")
        if args.perf:
            return perf_profile(target.pid, call, root, args.top)
        spy = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid", str(python_pid(target.pid)),
             "--subprocesses", "--threads",
             *(["--native"] if args.cluster and args.native else ["--nonblocking"] if args.cluster
               else [] if args.no_native else ["--native"]),
             "--rate", str(args.rate), "--format", "speedscope",
             "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attaches
        result = call()
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        if spy.returncode not in (0, -signal.SIGINT) and not os.path.exists(out):
            console.print(f"py-spy ended with {spy.returncode}:", err.decode(errors="replace"))
            return 1
    finally:
        server.stop()
        server.discard()
    console.print({k: v for k, v in result.items() if k != "cpu"})
    summarize(out, args.top)
    console.print(f"speedscope file: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
