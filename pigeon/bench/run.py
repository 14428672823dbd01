"""The benchmark run: start each target in turn, run the plan's workloads against it with progress bars, stop
it, and collect one results document. Owns the rule: one target runs at a time on a fresh data directory, and is
stopped before the next starts, whatever its workloads did (an error is recorded, not raised)."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import socket
import tempfile
import time
import traceback

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from pigeon.bench import workloads as w
from pigeon.bench.cluster import NatsClusterServer, PigeonClusterServer, RabbitClusterServer, nats_failover, \
    pigeon_failover, rabbit_failover
from pigeon.bench.peers import PEERS, ExternalPigeon, PigeonServer
from pigeon.bench.plan import QUICK_PEER_WORKLOADS, Plan
from pigeon.bench.procs import CpuWatch, disk_bandwidth, wait_quiet

CLUSTERS = {c.name: c for c in (PigeonClusterServer, NatsClusterServer, RabbitClusterServer)}  # replicated, 3 each
FAILOVER = {PigeonClusterServer.name: pigeon_failover, NatsClusterServer.name: nats_failover,
            RabbitClusterServer.name: rabbit_failover}
TARGETS = ("pigeon", *PEERS, *CLUSTERS)


def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem,
            "kernel": platform.release(), "python": platform.python_version()}


def machine_tag(m: dict) -> str:
    gib = round(m["memory_bytes"] / 2**30)
    return f"{m['cores']}core-{gib}gib"


class Bars:
    """Rich progress: one bar per workload step."""

    def __init__(self, console: Console):
        self.progress = Progress(TextColumn("{task.description:<40}"), BarColumn(), TaskProgressColumn(),
                                 TextColumn("{task.fields[note]:>16}"), TimeElapsedColumn(), console=console,
                                 transient=False)

    def step(self, description: str):
        task = self.progress.add_task(description, total=1.0, note="")

        def tick(fraction: float, done: int) -> None:
            self.progress.update(task, completed=fraction, note=f"{done:,} msgs" if done else "")

        def finish(note: str) -> None:
            self.progress.update(task, completed=1.0, note=note)

        return tick, finish


def _note(r: dict) -> str:
    if "publish_msgs_per_s" in r and "consume_msgs_per_s" in r:
        return f"{r['publish_msgs_per_s']:,} / {r['consume_msgs_per_s']:,} msg/s"
    for k in ("msgs_per_s", "consume_msgs_per_s", "receive_msgs_per_s"):
        if k in r:
            return f"{r[k]:,} msg/s"
    if "p99_ms" in r:
        return f"p99 {r['p99_ms']} ms"
    if "bytes_per_msg" in r:
        return f"{r['bytes_per_msg']} B/msg"
    if "seconds" in r:
        return f"{r['seconds']} s"
    return r.get("error", "")[:16]


def _fresh(server, tick) -> dict:
    t0 = time.monotonic()
    server.fresh()
    return {"seconds": round(time.monotonic() - t0, 2)}


def run_target(server, plan: Plan, bars: Bars, workloads: tuple[str, ...]) -> dict:
    """Run `workloads` against a started server; errors are recorded per workload."""
    d = server.driver
    res: dict = {}
    errors: dict = {}
    failover = FAILOVER.get(server.name) if "failover" in workloads else None
    workloads = tuple(k for k in workloads if k != "failover")
    supports = d.supports | ({"topics"} if "mixed" in d.supports else set())  # `topics` is `mixed` spread out
    skipped = {k: "not supported by this target's driver" for k in workloads if k not in supports}
    todo = [k for k in workloads if k in supports]
    if not server.restartable and "restart" in todo:
        todo.remove("restart")
        skipped["restart"] = "state is not kept across a restart" if server.durable.startswith("no") \
            else "server started elsewhere"
    name = server.name

    def attempt(key: str, description: str, fn, *args):
        tick, finish = bars.step(f"{name}: {description}")
        cpu = CpuWatch(tuple(d.pid for d in server.daemons if d.running()))
        try:
            r = fn(*args, tick) if fn is not w.ordered else fn(*args, tick, tick)
        except Exception as e:  # noqa: BLE001 — record and go on with the next workload
            errors[key] = f"{type(e).__name__}: {e}"[:2000]
            finish("error")
            return None
        r["cpu"] = cpu.read()
        res[key] = r
        finish(_note(r))
        return r

    def fresh(step: str) -> bool:
        """Stop and start on an empty data directory: a backlog left behind would weigh on what follows (the
        emulator keeps it all on its heap)."""
        nonlocal d
        if attempt(step, "stop, start on an empty data dir", _fresh, server) is None:
            return False
        d = server.driver
        return True

    if "latency" in todo:  # first, on an idle server
        attempt("latency", f"latency at {plan.latency_rate:,} msg/s", w.latency, d, plan, "latency")
    published = 0
    if "publish" in todo:
        w.setup(d, "publish")
        for batch in plan.publish_batches:
            r = attempt(f"publish_b{batch}", f"publish 1 KiB, {batch}/request", w.publish_best, d, plan, "publish",
                        batch)
            published += r["published_total"] if r else 0
    if "consume" in todo and published:
        n = min(published, plan.consume_messages)
        attempt("consume", f"consume+ack {n:,} of the backlog", w.consume, d, plan, "publish", n)
    left_behind = published > 0  # a backlog the workloads below must not share the server with
    if "mixed" in todo:
        if left_behind and not fresh("fresh_start"):
            return {"results": res, "errors": errors, "skipped": skipped}
        attempt("mixed", f"publish + consume at once, {plan.mixed_s:g} s", w.mixed, d, plan, "mixed")
        left_behind = True
    if "topics" in todo:
        if left_behind and not fresh("fresh_start_topics"):
            return {"results": res, "errors": errors, "skipped": skipped}
        attempt("topics", f"publish + consume at once on {plan.topics} topics, {plan.mixed_s:g} s", w.topics, d,
                plan, "spread")
        left_behind = True
    if ("ordered" in todo or "connections" in todo) and left_behind:
        if not fresh("fresh_start_after_mixed" if "mixed" in todo else "fresh_start"):
            return {"results": res, "errors": errors, "skipped": skipped}
    if "ordered" in todo:
        attempt("ordered", f"ordered, {plan.ordered_keys:,} keys", w.ordered, d, plan, "ordered")
    if "connections" in todo:
        r = attempt("connections", f"{plan.conn_publishers:,} pubs + {plan.conn_subscribers:,} subs",
                    w.connections, d, plan, "conns")
        if r and "mixed" in d.supports and fresh("fresh_start_3"):
            # the same request size from few clients: what the many-client figures are to be compared with
            few = plan.scaled(publish_batches=(plan.conn_batch,), publish_inflight=(plan.conn_reference_inflight,),
                              mixed_s=plan.conn_s)
            attempt("connections_few", f"few clients, {plan.conn_batch}/request, {plan.conn_s:g} s", w.mixed, d, few,
                    "conns_few")
    if "idle" in todo:
        attempt("idle", f"{plan.idle_streams:,} idle streams held open", w.idle, server, plan, "idle")
    if "backlog" in todo:
        # memory is read from an idle server on an empty data directory, nothing left over from the runs above
        ok = len(todo) == 1 or attempt("fresh_start_2", "stop, start on an empty data dir", _fresh, server) is not None
        r = ok and attempt("backlog", f"backlog {plan.backlog_messages:,} × {plan.backlog_bytes} B", w.backlog,
                           server, plan, "backlog", plan.backlog_messages)
        if r and "restart" in todo:
            attempt("restart", f"kill -9, restart with {r['messages']:,} backlog", w.restart, server, plan,
                    "backlog", r["messages"])
    if failover is not None:  # last: it kills a member
        attempt("failover", "kill -9 of the owner (leader): publishes answered again", failover, server, plan,
                "failover")
    return {"results": res, "errors": errors, "skipped": skipped}


def big_backlog(root: str, plan: Plan, bars: Bars) -> dict:
    """Pigeon alone: the larger backlog reading and restart with it, on a fresh server."""
    server = PigeonServer(os.path.join(root, "big"), plan)
    out: dict = {}
    try:
        server.start()
        big = plan.scaled(backlog_messages=plan.backlog_big_messages, backlog_big_messages=0,
                          backlog_s_max=plan.backlog_big_s_max)
        r = run_target(server, big, bars, ("backlog", "restart"))
        out = {"backlog_big": r["results"].get("backlog"), "restart_big": r["results"].get("restart"),
               "errors": r["errors"]}
    finally:
        server.stop()
        server.discard()
    return out


def run(plan: Plan, targets: list[str], address: str | None = None, console: Console | None = None,
        keep_dir: str | None = None, quiet_wait_s: float = 0.0) -> dict:
    """Run `targets` one after another; before each, wait up to `quiet_wait_s` for other programs to go quiet."""
    console = console or Console()
    root = keep_dir or tempfile.mkdtemp(prefix="pigeon-bench-")
    doc: dict = {"plan": plan.name, "settings": {k: v for k, v in plan.__dict__.items()},
                 "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "machine": machine(), "targets": {}}
    bars = Bars(console)
    os.sync()  # start on a quiet disk
    t0 = time.monotonic()
    if any(name in CLUSTERS for name in targets):  # what bounds their durable publish here: one disk for three
        doc["machine"]["disk_write_mb_s"] = {str(n): disk_bandwidth(root, n) for n in (1, 3)}
    try:
        with bars.progress:
            for name in targets:
                cls = PigeonServer if name == "pigeon" else PEERS.get(name) or CLUSTERS[name]
                why = None if (name == "pigeon") else cls.missing()
                if why:
                    doc["targets"][name] = {"missing": why}
                    console.print(f"[yellow]{name}: not run — {why}")
                    continue
                server = ExternalPigeon(root, plan, address) if (name == "pigeon" and address) else cls(root, plan)
                loads = plan.workloads
                if name != "pigeon" and plan.name == "quick":
                    loads = tuple(k for k in loads if k in QUICK_PEER_WORKLOADS)
                entry: dict = {}
                quiet = wait_quiet(quiet_wait_s) if quiet_wait_s else None
                try:
                    tick, finish = bars.step(f"{name}: start")
                    started = time.monotonic()
                    server.start()
                    finish(f"{time.monotonic() - started:.1f} s")
                    entry = run_target(server, plan, bars, loads)
                except Exception as e:  # noqa: BLE001
                    entry = {"results": {}, "errors": {"start": f"{type(e).__name__}: {e}"[:2000]},
                             "trace": traceback.format_exc(limit=5)}
                finally:
                    server.stop()
                    server.discard()
                entry.update(server=server.server, durable=server.durable,
                             client=getattr(server.driver, "client", ""), quiet_before=quiet)
                doc["targets"][name] = entry
                if name == "pigeon" and plan.backlog_big_messages and not address and "backlog" in loads:
                    try:
                        big = big_backlog(root, plan, bars)
                    except Exception as e:  # noqa: BLE001
                        big = {"errors": {"backlog_big": f"{type(e).__name__}: {e}"[:2000]}}
                    entry["results"].update({k: v for k, v in big.items() if k != "errors" and v})
                    entry["errors"].update(big.get("errors") or {})
    finally:
        if not keep_dir:
            shutil.rmtree(root, ignore_errors=True)
    doc["seconds"] = round(time.monotonic() - t0, 1)
    return doc
