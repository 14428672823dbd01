"""Publish → deliver latency through a 3-node cluster at a given rate, with each node's CPU while it ran: the
benchmark's latency workload (open loop, one message per durable publish, a StreamingPull consumer acking) against
`pigeon bench`'s pigeon-cluster target, the topic's owner named. With `--single`, the single node (`pigeon bench`'s
pigeon target) runs in the same sitting, and each cluster figure is also given against it; with `--layout spread`
the nodes make spread topics (`--topic-layout spread`: the publish is stored in a shard of the node that took it);
with `--layout forwarded` the calls go to a node that does not own the topic (it forwards them).
Every target of a round runs on a fresh server, one after the other; `--rounds` alternates them, every other round in reverse

    python scripts/cluster_latency.py --rate 300 --rate 1000 [--seconds 6]
    python scripts/cluster_latency.py --single --layout together --layout spread --rounds 2 --seconds 10

Each node's CPU is given as a share of the run and as CPU milliseconds per 1,000 messages sent (user + system from
/proc, the node's process and its children): far steadier than the latency on a shared machine. `--tree DIR`
(repeatable) runs the servers from each worktree in turn (PIGEON_BENCH_SERVER_TREE), alternating within each round,
for a before/after in one sitting:

    python scripts/cluster_latency.py --tree /tmp/a --tree /tmp/b --rounds 3 --seconds 10

`--profile DIR --profiler syscalls` counts each node's system calls of the kinds that matter here and its context
switches while the workload runs (`perf stat`), and ends with a table of them per message sent.

Each node's event-loop thread is accounted too (/proc/PID/task/PID: schedstat and context switches): the share of
the run it was on a core, waiting in the run queue for one, and asleep (its loop idle) — the run counts the
workload's set-up and its grace of 2 s too — and how often it slept per message sent. Well under one sleep a message,
the loop is at its capacity: it finds more work at the end of every turn, each step of a message waits for the turns
ahead of it, and the latency is set by how long those turns are, not by any one wait. `--node-args "..."` gives the cluster's
nodes more `pigeon serve` options (`--replicas 1 --ack-quorum 1`: the owner alone holds each ledger). Each member's
Append requests per message sent (its /metrics) count the replication rounds the owner sent it: one a message when
every publish has its own, fewer when rounds carry several.

`--hops DIR` starts every server with its hop timestamps on (pigeon.node.hops) and prints, for the node that took
the publishes, where a message's time went inside it: publish → answered (the Publish handler to its answer:
commit, the node's fdatasync and, in a cluster, the members' quorum) and woken → sending (a stream woken for a
message to its response handed to gRPC: in a cluster, the Deliver record's quorum, docs/cluster.md invariant O3);
and a cluster delivery's steps from its lease: leased → lease-recorded (its Deliver record held by Qa members),
leased → answers-in (its publishers answered), leased → sending.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.bench import workloads as w  # noqa: E402
from pigeon.bench.cluster import BUNDLES, OwnerRoutedDriver, PigeonClusterServer  # noqa: E402
from pigeon.bench.peers import PigeonServer  # noqa: E402
from pigeon.bench.plan import PLANS  # noqa: E402
from pigeon.bench.procs import python_pid, wait_quiet  # noqa: E402
from pigeon.core.bundles import bundle_of  # noqa: E402
from pigeon.node.hops import read as read_hops  # noqa: E402


GENERATOR = "load generator"  # (this process: the publisher and the subscriber)


class SpreadClusterServer(PigeonClusterServer):
    name = "pigeon-cluster-spread"
    node_args = ("--topic-layout", "spread")


class ForwardingDriver(OwnerRoutedDriver):
    """Each topic's calls sent to a node that does not own it (as a load balancer sends two of three): the node
    forwards the publishes and serves the stream through one to the owner (api.merge)."""

    def _at(self, key: str) -> None:
        owner = self.owners[bundle_of(self.topic(key), BUNDLES)]
        self.address = min(a for a in set(self.owners.values()) if a != owner)


def _tree(pid: int) -> list[int]:
    out = [pid]
    for child in subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                                text=True).stdout.split():
        out += _tree(int(child))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children so far."""
    total = 0.0
    for p in _tree(pid):
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def loop_thread(pid: int) -> tuple[int, int, int]:
    """(ns on a core, ns runnable waiting for one, voluntary context switches) of a process's main thread — a
    node's event loop — so far."""
    on, waiting = map(int, open(f"/proc/{pid}/task/{pid}/schedstat").read().split()[:2])
    slept = next(int(line.split()[1]) for line in open(f"/proc/{pid}/task/{pid}/status")
                 if line.startswith("voluntary_ctxt_switches"))
    return on, waiting, slept


def append_requests(port: int) -> float:
    """Append requests a node took as a ledger member so far (its /metrics, on the gRPC port + 1)."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port + 1}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("pigeon_cluster_append_requests_total"))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def _last_before(starts: list[int], ends: list[int], skip: int = 200) -> list[float]:
    """µs from each of `ends` (after the first `skip`) back to the last of `starts` at or before it."""
    out, j = [], 0
    for e in ends[skip:]:
        while j + 1 < len(starts) and starts[j + 1] <= e:
            j += 1
        if starts and starts[j] <= e:
            out.append((e - starts[j]) / 1e3)
    return out


def hop_steps(path: str) -> dict[str, list[float]]:
    """Steps (µs) inside one node from its hop file: the k-th `publish` with the k-th `committed` and `answered`
    (publishes are committed and answered in order, give or take a few), each `sending` with the last `woken`
    before it, each `synced` with the last `syncing` before it (a node has two journals, its own and its ledger
    store's: both are counted)."""
    hops = read_hops(path)
    out: dict[str, list[float]] = {}
    pub, com, ans = hops.get("publish", []), hops.get("committed", []), hops.get("answered", [])
    if pub and len(pub) == len(com) == len(ans):
        out["publish → committed"] = [(c - p) / 1e3 for p, c in zip(pub[200:], com[200:])]
        out["committed → answered"] = [(a - c) / 1e3 for c, a in zip(com[200:], ans[200:])]
        out["publish → answered"] = [(a - p) / 1e3 for p, a in zip(pub[200:], ans[200:])]
    out["woken → sending"] = _last_before(hops.get("woken", []), hops.get("sending", []))
    leased, sending = hops.get("leased", []), hops.get("sending", [])
    if leased and len(leased) == len(sending):  # (one stream: its deliveries are leased, recorded and sent in order)
        for hop in ("lease-recorded", "answers-in"):
            if len(hops.get(hop, [])) == len(leased):
                out[f"leased → {hop}"] = [(r - x) / 1e3 for x, r in zip(leased[200:], hops[hop][200:])]
        out["leased → sending"] = [(y - x) / 1e3 for x, y in zip(leased[200:], sending[200:])]
        out["committed → leased"] = _last_before(hops.get("committed", []), leased)
    out["fdatasync"] = _last_before(hops.get("syncing", []), hops.get("synced", []))
    return {k: v for k, v in out.items() if v}


SYSCALLS = ("write", "writev", "sendmsg", "sendto", "read", "readv", "recvfrom", "recvmsg", "epoll_wait", "epoll_pwait",
            "futex", "getpid", "fdatasync", "mprotect", "madvise", "preadv2", "pwritev2")


def perf_counts(path: str) -> dict[str, int]:
    """The counts of a `perf stat -o` file, by event (`syscalls:sys_enter_futex` → `futex`); none it could not count."""
    out: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].replace(",", "").isdigit():
                out[parts[1].removeprefix("syscalls:sys_enter_")] = int(parts[0].replace(",", ""))
    return out


def _profile(pids: dict[str, int], profile_dir: str, kind: str, seconds: float,
             tool: str) -> tuple[list[subprocess.Popen], dict[str, str]]:
    """Sample every node's process for `seconds`, each into `profile_dir`: with py-spy (its Python stacks, every
    thread, without pausing the node: a node's gRPC poller and journal writer are threads) as collapsed stacks, or
    with perf (the native side too: the interpreter, gRPC's core, the kernel) as perf.data for `perf report`. With
    `syscalls`, also where each node's counts are (node → file), for the table of system calls per message."""
    exe = shutil.which("perf" if tool == "syscalls" else tool)
    if exe is None:
        sys.exit(f"--profile needs {tool} on PATH")
    stamp = time.strftime("%H%M%S")
    pids = {name: python_pid(pid) for name, pid in pids.items()}
    out = os.path.join(profile_dir, f"{kind}-{stamp}-%s")
    if tool == "syscalls":  # the process's system calls of each kind, counted in the kernel (cheap: no tracing)
        events = ",".join(f"syscalls:sys_enter_{c}" for c in SYSCALLS) + ",context-switches"
        files = {name: out % f"{name}.syscalls" for name in pids}
        return [subprocess.Popen([exe, "stat", "-e", events, "-p", str(pid), "-o", files[name],
                                  "--", "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for name, pid in pids.items()], files
    if tool == "perf":
        return [subprocess.Popen([exe, "record", "-F", "499", "-g", "-p", str(pid), "-o", out % f"{name}.perf",
                                  "--", "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for name, pid in pids.items()], {}
    return [subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250",
                              "--threads", "--format", "raw", "--gil", "--nonblocking", "--output", out % f"{name}.txt"],
                             stdout=subprocess.DEVNULL)
            for name, pid in pids.items()], {}


def run_one(kind: str, rate: int, seconds: float, hops_dir: str | None, profile: tuple[str, str] | None = None,
            node_args: list[str] | None = None) -> dict:
    plan = PLANS["quick"].scaled(latency_s=seconds, latency_runs=1, latency_rate=rate)
    cls = {"single": PigeonServer, "together": PigeonClusterServer, "forwarded": PigeonClusterServer,
           "spread": SpreadClusterServer}[kind]
    if kind != "single" and node_args:
        cls = type(cls.__name__, (cls,), {"node_args": cls.node_args + tuple(node_args)})
    if hops_dir:
        os.environ["PIGEON_HOPS"] = os.path.join(hops_dir, f"{kind}-{time.monotonic_ns()}-%p.hops")
    base = tempfile.mkdtemp(prefix="pigeon-cluster-latency-")
    server = cls(base, plan)
    try:
        server.start()
    finally:
        os.environ.pop("PIGEON_HOPS", None)
    try:
        if kind == "single":
            owner, pids = "pigeon", {"pigeon": server.main().pid}
        else:
            if kind == "forwarded":
                server.driver = ForwardingDriver(server.driver.owners)
            owner = server.owner_of(server.driver.topic("latency"))
            pids = {n: d.pid for n, d in server.nodes.items()}
        procs = {n: _tree(p) for n, p in pids.items()}
        loops = {n: python_pid(p) for n, p in pids.items()}
        loops0 = {n: loop_thread(p) for n, p in loops.items()}
        ports = {} if kind == "single" else {n: d.port for n, d in server.nodes.items() if n != owner}
        asked0 = {n: append_requests(port) for n, port in ports.items()}
        before, t0 = {n: cpu_seconds(p) for n, p in pids.items()}, time.monotonic()
        me0 = sum(os.times()[:4])
        spies, counted = _profile(pids, profile[0], kind, seconds, profile[1]) if profile else ([], {})
        r = w.latency(server.driver, plan, "latency", lambda f, done: None)
        dt = time.monotonic() - t0
        used = {n: cpu_seconds(p) - before[n] for n, p in pids.items()}
        r["loop"] = {}
        for n, p in loops.items():  # shares of the run: on a core, waiting for one, asleep; sleeps per message
            on, waiting, slept = (b - a for a, b in zip(loops0[n], loop_thread(p)))
            r["loop"][n] = (100 * on / 1e9 / dt, 100 * waiting / 1e9 / dt, max(0.0, 100 - 100 * (on + waiting) / 1e9 / dt),
                            slept / max(1, r["sent"]))
        used[GENERATOR] = sum(os.times()[:4]) - me0
        # each member's append requests a message: the replication rounds the owner sent it (the other nodes'
        # own bundles are idle, so theirs are the latency topic's)
        r["rounds"] = {n: (append_requests(port) - asked0[n]) / max(1, r["sent"]) for n, port in ports.items()}
        r["cpu"] = {n: 100 * u / dt for n, u in used.items()}
        r["cpu_ms_per_1000"] = {n: 1e6 * u / max(1, r["sent"]) for n, u in used.items()}
        r["owner"], r["seconds_run"] = owner, dt
        for spy in spies:
            spy.wait()
        r["syscalls"] = {n: {e: c / max(1, r["sent"]) for e, c in perf_counts(path).items()}
                         for n, path in counted.items()}
    finally:
        server.stop()
        server.discard()
        shutil.rmtree(base, ignore_errors=True)  # (discard removes the server's own directory inside it)
    if hops_dir:
        files = {n: [f for p in ps for f in glob.glob(os.path.join(hops_dir, f"{kind}-*-{p}.hops"))]
                 for n, ps in procs.items()}
        r["steps"] = hop_steps(files[owner][0]) if files[owner] else {}
        member = next((n for n in sorted(files) if n != owner and files[n]), None)
        if member is not None:  # a member's own fdatasyncs (its ledger store's journal)
            r["steps"]["a member's fdatasync"] = hop_steps(files[member][0]).get("fdatasync", [])
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, action="append", help="messages per second (repeat for several runs)")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--single", action="store_true", help="the single node too, in the same sitting")
    ap.add_argument("--layout", action="append", choices=("together", "forwarded", "spread"),
                    help="the cluster nodes' topic layout (repeat for several; default together); forwarded: "
                         "together, the calls sent to a node that does not own the topic")
    ap.add_argument("--rounds", type=int, default=1, help="times each target runs, alternating")
    ap.add_argument("--hops", metavar="DIR", help="hop timestamps on; their files go here")
    ap.add_argument("--profile", metavar="DIR", help="sample every node with py-spy while the workload runs; "
                                                     "collapsed stacks go here, a file a node")
    ap.add_argument("--profiler", choices=("py-spy", "perf", "syscalls"), default="py-spy", help="what --profile samples with")
    ap.add_argument("--tree", action="append", metavar="DIR", help="run the servers from this worktree (repeat: "
                                                                   "each in turn, alternating)")
    ap.add_argument("--node-args", default="", metavar="OPTIONS",
                    help='more `pigeon serve` options for every cluster node, e.g. "--replicas 1 --ack-quorum 1"')
    ap.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                    help="before each target, wait up to S seconds for other programs to go quiet")
    args = ap.parse_args()
    kinds = (["single"] if args.single else []) + (args.layout or ["together"])
    for d in (args.hops, args.profile):
        if d:
            os.makedirs(d, exist_ok=True)
    trees = args.tree or [None]
    if args.tree:
        kinds = [(k, t) for k in kinds for t in trees]
    else:
        kinds = [(k, None) for k in kinds]
    results: dict[tuple[int, tuple], list[dict]] = {}
    for rate in args.rate or [1000]:
        for rnd in range(args.rounds):
            for kind, tree in (kinds if rnd % 2 == 0 else kinds[::-1]):  # (no target always after another)
                os.sync()  # (the last run's dirty pages written back now, not during this one)
                quiet = wait_quiet(args.quiet_wait) if args.quiet_wait else None
                load = open("/proc/loadavg").read().split()[0] + (
                    f", others {quiet['other_pct']:.0f} % of the machine after {quiet['waited_s']} s" if quiet else "")
                if tree:
                    os.environ["PIGEON_BENCH_SERVER_TREE"] = tree
                try:
                    r = run_one(kind, rate, args.seconds, args.hops, (args.profile, args.profiler) if args.profile else None,
                                args.node_args.split())
                finally:
                    if tree:
                        os.environ.pop("PIGEON_BENCH_SERVER_TREE", None)
                results.setdefault((rate, (kind, tree)), []).append(r)
                cpu = ", ".join(f"{n}{' (owner)' if n == r['owner'] else ''} {c:.0f} % "
                                f"({r['cpu_ms_per_1000'][n]:.0f} ms / 1,000 msgs)" for n, c in r["cpu"].items())
                on, waiting, asleep, sleeps = r["loop"][r["owner"]]
                loop = (f"; its event loop's thread on a core {on:.0f} %, waiting for one {waiting:.0f} %, asleep "
                        f"{asleep:.0f} % of the run, {sleeps:.2f} sleeps a message")
                if r["rounds"]:
                    loop += "; append requests a message: " + ", ".join(f"{n} {v:.2f}" for n, v in r["rounds"].items())
                steps = "; ".join(f"{k} p50 {_pct(v, 0.5) / 1e3:.2f} ms p99 {_pct(v, 0.99) / 1e3:.2f} ms"
                                  for k, v in r.get("steps", {}).items() if v)
                r.pop("steps", None)
                print(f"round {rnd + 1} {kind}{f' [{tree}]' if tree else ''} {rate} msg/s (load {load}): "
                      f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
                      f"publish answered p50 {r.get('ack_p50_ms')} ms; received {r['received']} of {r['sent']} "
                      f"(failed: {r.get('failed_why') or 0}); slowest fdatasync of the disk probe "
                      f"{r.get('disk_probe_max_ms')} ms; CPU over {r['seconds_run']:.1f} s: {cpu}{loop}"
                      + (f"; inside the node that took the publishes: {steps}" if steps else ""), flush=True)
                print("  p50 each second, ms: " + " ".join(f"{x:g}" for x in r.get("p50_ms_each_second", [])),
                      flush=True)
    print()
    print("| rate | target | p50 ms (each round) | p99 ms (each round) | publish answered p50 ms | p50 / single's "
          "(each round) | owner's CPU ms / 1,000 msgs | members' | load generator's | owner's loop thread: on a core "
          "/ waiting / asleep %, sleeps a message |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate in args.rate or [1000]:
        for kind, tree in kinds:
            rs = results[(rate, (kind, tree))]
            single = results.get((rate, ("single", tree)))
            own = [r["cpu_ms_per_1000"][r["owner"]] for r in rs]
            members = [{n: c for n, c in r["cpu_ms_per_1000"].items() if n not in (r["owner"], GENERATOR)}
                       for r in rs]
            others = [sum(m.values()) / len(m) for m in members if m]
            gen = [r["cpu_ms_per_1000"][GENERATOR] for r in rs]
            loop = [r["loop"][r["owner"]] for r in rs]
            ratio = " / ".join(f"{r['p50_ms'] / s['p50_ms']:.2f}×" for r, s in zip(rs, single)) \
                if single and kind != "single" else "-"
            print(f"| {rate} | {kind}{f' [{tree}]' if tree else ''} | "
                  f"{statistics.median(r['p50_ms'] for r in rs):.2f} "
                  f"({' / '.join(str(r['p50_ms']) for r in rs)}) | "
                  f"{statistics.median(r['p99_ms'] for r in rs):.2f} ({' / '.join(str(r['p99_ms']) for r in rs)}) | "
                  f"{' / '.join(str(r.get('ack_p50_ms')) for r in rs)} | {ratio} | "
                  f"{statistics.median(own):.0f} ({' / '.join(f'{c:.0f}' for c in own)}) | "
                  f"{' / '.join(f'{c:.0f}' for c in others) or '-'} | {' / '.join(f'{c:.0f}' for c in gen)} | "
                  f"{' · '.join('/'.join(f'{x:.0f}' for x in t[:3]) + f', {t[3]:.2f}' for t in loop)} |")
    if args.profiler == "syscalls" and args.profile:
        _syscall_table(results, args.rate or [1000], kinds)
    return 0


def _syscall_table(results: dict, rates: list[int], kinds: list[tuple]) -> None:
    """System calls and context switches per message sent: the node that took the publishes, and the mean of the
    others (the members), median over the rounds."""
    columns = []
    for rate in rates:
        for kind, tree in kinds:
            rs = [r for r in results[(rate, (kind, tree))] if r.get("syscalls")]
            if not rs:
                continue
            label = f"{kind}{f' [{tree}]' if tree else ''} {rate}/s"
            own = [r["syscalls"][r["owner"]] for r in rs]
            columns.append((f"{label} {'node' if kind == 'single' else 'owner'}", own))
            members = [[c for n, c in r["syscalls"].items() if n != r["owner"]] for r in rs]
            if any(members):
                columns.append((f"{label} member", [{e: statistics.mean(m.get(e, 0) for m in ms) for e in ms[0]}
                                                    for ms in members if ms]))
    if not columns:
        return
    events = sorted({e for _, cs in columns for c in cs for e in c},
                    key=lambda e: -max(statistics.median(c.get(e, 0) for c in cs) for _, cs in columns))
    print()
    print("| per message sent | " + " | ".join(name for name, _ in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for e in events:
        if all(statistics.median(c.get(e, 0) for c in cs) < 0.05 for _, cs in columns):
            continue  # (none of this kind)
        print(f"| {e} | " + " | ".join(f"{statistics.median(c.get(e, 0) for c in cs):.1f}" for _, cs in columns) + " |")


if __name__ == "__main__":
    sys.exit(main())
