"""`pigeon bench --plan scale`: does a Pigeon cluster go faster with more nodes? The same cluster (etcd + N × `pigeon
serve --etcd … --replicas 3 --ack-quorum 2 --fsync always`) at each N of the plan, one N at a time, each node held
to the same share of a core by a CPU cgroup of its own (pigeon.bench.cgroups); the load generator and etcd are not
held. Owns the rule: every node is driven alike — a publisher process and a consumer process per node, each
talking to its node only, so a call about a topic another node owns takes the forwarding hop a Pub/Sub client
sent to any node takes — and efficiency is rate(N) ÷ (rate(N₀) × N/N₀), N₀ the smallest count (3).

Workloads, each on fresh topics (deleted after): `publish` (one topic, publish alone), `mixed` (one topic,
publish and consume at once), `topics_publish` and `topics` (the same over `plan.topics` topics, one in each
bundle, so their spread over the nodes is the placement's, not the hash's luck). Each node's CPU (cores, and the
share of CFS periods it was throttled in) is read over each run's window."""

from __future__ import annotations

import asyncio
import datetime
import glob
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from typing import Callable

import grpc

from pigeon.bench.cgroups import CpuCaps, Hierarchy
from pigeon.bench.cluster import BUNDLES, PigeonClusterServer
from pigeon.bench.grpc_client import GrpcDriver, publish_request
from pigeon.bench.plan import ScalePlan
from pigeon.bench.procs import CpuWatch, Daemon, cluster_status, tree_cpu, tree_pids, wait_quiet
from pigeon.bench.run import Bars, machine
from pigeon.bench.workers import Gate, run_one, run_workers
from pigeon.core.bundles import bundle_of

# (results key, field): the figures efficiency is computed for
SERIES = (("publish", "publish_msgs_per_s"), ("mixed", "publish_msgs_per_s"), ("mixed", "consume_msgs_per_s"),
          ("topics_publish", "publish_msgs_per_s"), ("topics", "publish_msgs_per_s"),
          ("topics", "consume_msgs_per_s"))


def efficiency(rates: dict[int, float | None]) -> dict[int, float | None]:
    """rate(N) ÷ (rate(N₀) × N/N₀) for each N, N₀ the smallest N: 1.0 is linear scaling, N₀/N is none at all.
    None where a rate (or the base) is missing or zero."""
    if not rates:
        return {}
    base_n = min(rates)
    base = rates[base_n]
    return {n: (round(r / (base * n / base_n), 3) if r and base else None) for n, r in sorted(rates.items())}


def efficiencies(runs: dict[str, dict]) -> dict[str, dict[str, float | None]]:
    """For each series 'key.field' measured: {N (as text, as in the JSON): efficiency}."""
    out = {}
    for key, field in SERIES:
        rates = {int(n): ((e.get("results") or {}).get(key) or {}).get(field) for n, e in runs.items()}
        rates = {n: r for n, r in rates.items() if isinstance(r, (int, float))}
        if rates:
            out[f"{key}.{field}"] = {str(n): v for n, v in efficiency(rates).items()}
    return out


def spread_names(prefix: str, count: int, bundles: int = BUNDLES) -> list[str]:
    """`count` topic names `<prefix>-<i>`, each in a bundle of its own while there are bundles to go round."""
    names, used, i = [], {}, 0
    while len(names) < count:
        name, i = f"{prefix}-{i}", i + 1
        b = bundle_of(GrpcDriver.topic(name), bundles)
        if used.get(b, 0) < -(-count // bundles) and (len(used) == bundles or b not in used):
            used[b] = used.get(b, 0) + 1
            names.append(name)
    return names


class _OneStart:
    """A gate as seen by the several tasks of one worker process: the gate counts the process ready once."""

    def __init__(self, gate: Gate):
        self.gate = gate
        self.started: asyncio.Future | None = None

    async def wait_start(self) -> None:
        if self.started is None:
            self.started = asyncio.ensure_future(self.gate.wait_start())
        await asyncio.shield(self.started)

    def __getattr__(self, name):
        return getattr(self.gate, name)


class NodeDriver(GrpcDriver):
    """Talks to one node only, about any number of topics."""

    async def setup_all(self, keys: list[str]) -> None:
        """Each key's topic and subscription. A call refused as UNAVAILABLE (a bundle still moving: a spread
        topic's subscription asks every shard's owner where it starts) is made again, as a client's retry would,
        for up to a minute; what the refused try made already is taken as made."""
        for k in keys:
            deadline = time.monotonic() + 60
            while True:
                try:
                    await self.setup(k)
                    break
                except grpc.aio.AioRpcError as e:
                    if e.code() == grpc.StatusCode.ALREADY_EXISTS:
                        await self._create_subscription(k)
                        break
                    if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise RuntimeError(f"setting up {self.topic(k)} at {self.address}: {e.code().name} "
                                           f"{e.details()}") from None
                    await asyncio.sleep(0.5)

    async def _create_subscription(self, key: str) -> None:
        from google.pubsub_v1 import types

        async with self._chan() as ch:
            create = ch.unary_unary("/google.pubsub.v1.Subscriber/CreateSubscription",
                                    request_serializer=types.Subscription.pb().SerializeToString,
                                    response_deserializer=None)
            deadline = time.monotonic() + 60
            while True:
                try:
                    await create(types.Subscription.pb()(name=self.subscription(key), topic=self.topic(key),
                                                         ack_deadline_seconds=60), timeout=30)
                    return
                except grpc.aio.AioRpcError as e:
                    if e.code() == grpc.StatusCode.ALREADY_EXISTS:
                        return
                    if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise RuntimeError(f"setting up {self.topic(k)} at {self.address}: {e.code().name} "
                                           f"{e.details()}") from None
                    await asyncio.sleep(0.5)

    async def delete_all(self, keys: list[str]) -> dict:
        """Delete the topics' subscriptions and topics (their backlog with them); returns failures by code."""
        from google.pubsub_v1 import types

        failed: dict[str, int] = {}
        async with self._chan() as ch:
            calls = [(ch.unary_unary("/google.pubsub.v1.Subscriber/DeleteSubscription",
                                     request_serializer=types.DeleteSubscriptionRequest.pb().SerializeToString,
                                     response_deserializer=None),
                      lambda k: types.DeleteSubscriptionRequest.pb()(subscription=self.subscription(k))),
                     (ch.unary_unary("/google.pubsub.v1.Publisher/DeleteTopic",
                                     request_serializer=types.DeleteTopicRequest.pb().SerializeToString,
                                     response_deserializer=None),
                      lambda k: types.DeleteTopicRequest.pb()(topic=self.topic(k)))]
            for call, request in calls:
                for k in keys:
                    try:
                        await call(request(k), timeout=60)
                    except grpc.aio.AioRpcError as e:
                        failed[e.code().name] = failed.get(e.code().name, 0) + 1
        return failed

    async def publish_topics(self, keys: list[str], size: int, batch: int, inflight: int, gate) -> dict:
        """`inflight` lanes of publish requests of `batch` messages, each lane going round the topics in turn; a
        failed request is counted by its code (and the lane goes on), not raised."""
        data = [os.urandom(size) for _ in range(batch)]
        reqs = [publish_request(self.topic(k), data) for k in keys]
        count, errors = 0, {}
        async with self._chan() as ch:
            call = ch.unary_unary("/google.pubsub.v1.Publisher/Publish", request_serializer=None,
                                  response_deserializer=None)

            async def lane(first: int):
                nonlocal count
                sent = first
                while gate.claim(batch):
                    req, sent = reqs[sent % len(reqs)], sent + 1
                    try:
                        await call(req, timeout=60)
                    except grpc.aio.AioRpcError as e:
                        errors[e.code().name] = errors.get(e.code().name, 0) + 1
                        await asyncio.sleep(0.05)
                        continue
                    count += batch
                    gate.add(batch)

            await gate.wait_start()
            await asyncio.gather(*[lane(i) for i in range(inflight)])
        return {"count": count, "t_end": time.monotonic(), "errors": errors}

    async def consume_topics(self, keys: list[str], outstanding: int, gate) -> dict:
        """A StreamingPull stream on each topic's subscription at once (`consume`: acked, reopened on error)."""
        one = _OneStart(gate)
        outs = await asyncio.gather(*[self.consume(k, outstanding, one) for k in keys])
        errors: dict[str, int] = {}
        for o in outs:
            for code, n in o["stream_errors"].items():
                errors[code] = errors.get(code, 0) + n
        return {"count": sum(o["count"] for o in outs), "t_last": max(o["t_last"] for o in outs),
                "stream_errors": errors}


class ScaleCluster(PigeonClusterServer):
    """A PigeonClusterServer of `size` nodes, each moved into a CPU cgroup of its own once it listens."""

    name = "pigeon-scale"
    settle_s_max = 180.0  # bundles move to each node as it joins, under the cap

    def __init__(self, root: str, plan: ScalePlan, size: int, caps: CpuCaps):
        super().__init__(root, plan)
        self.size, self.caps = size, caps
        self.node_args = ("--replicas", str(plan.replicas), "--ack-quorum", str(plan.ack_quorum),
                          "--topic-layout", plan.topic_layout, "--shards-per-topic", str(plan.shards_per_topic))

    def started(self, node_id: str, daemon: Daemon) -> None:
        self.caps.make(self.cgroup(node_id), self.plan.node_cpu, self.plan.cpu_period_us)
        self.caps.add(self.cgroup(node_id), tree_pids(daemon.pid))

    def cgroup(self, node_id: str) -> str:
        return f"{self.size}x-{node_id}"

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for node_id in self.nodes if hasattr(self, "nodes") else ():
                self.caps.remove(self.cgroup(node_id))


class _Window:
    """Each node's CPU (its process tree's, and its cgroup's throttling) and etcd's over a gate's window, read
    from the parent's polling (every 0.1 s) as the window opens and as it closes."""

    def __init__(self, server: ScaleCluster, gate: Gate):
        self.server, self.gate = server, gate
        self.marks: list[tuple[float, dict]] = []

    def _read(self) -> dict:
        s = self.server
        out = {n: {"cpu_s": sum(tree_cpu(d.pid).values()), **s.caps.stat(s.cgroup(n))} for n, d in s.nodes.items()}
        out["etcd"] = {"cpu_s": sum(tree_cpu(s.daemons[0].pid).values())}
        return out

    def poll(self) -> None:
        now, start = time.monotonic(), self.gate.start_at
        if start and not self.marks and now >= start:
            self.marks.append((now, self._read()))
        elif len(self.marks) == 1 and now >= self.gate.until:
            self.marks.append((now, self._read()))

    def result(self) -> dict:
        if len(self.marks) < 2:
            return {}
        (t0, a), (t1, b) = self.marks
        wall = max(t1 - t0, 1e-9)
        out = {}
        for n in b:
            r = {"cores": round((b[n]["cpu_s"] - a[n]["cpu_s"]) / wall, 3)}
            periods = b[n].get("periods", 0) - a[n].get("periods", 0)
            if periods > 0:
                r["throttled_pct"] = round(100 * (b[n]["throttled_periods"] - a[n]["throttled_periods"]) / periods, 1)
            out[n] = r
        return out


def drive(server: ScaleCluster, plan: ScalePlan, keys: list[str], consume: bool, tick: Callable) -> dict:
    """A publisher process per node (and with `consume` a consumer process per node) on `keys`, together for
    `plan.run_s`: each side rated over the window; each node's CPU over it."""
    drivers = [NodeDriver(f"127.0.0.1:{d.port}") for d in server.nodes.values()]
    run_one(drivers[0].setup_all, keys, wall_s=120)
    gate = Gate(mp.get_context("fork"), plan.run_s)
    window = _Window(server, gate)
    pubs = [(d.publish_topics, (keys, plan.message_bytes, plan.batch, plan.inflight, gate)) for d in drivers]
    subs = [(d.consume_topics, (keys, plan.outstanding, gate)) for d in drivers] if consume else []

    def poll() -> None:
        window.poll()
        if gate.start_at:
            tick(min(1.0, (time.monotonic() - gate.start_at) / plan.run_s), gate.done)

    watch = CpuWatch()
    try:
        outs = run_workers(pubs + subs, gate, plan.run_s + plan.peer_start_s_max + 60, poll)
    finally:
        failed = run_one(drivers[0].delete_all, keys, wall_s=120)
    machine_cpu = watch.read()
    published = sum(o["count"] for o in outs[:len(pubs)])
    pub_s = max(max(o["t_end"] for o in outs[:len(pubs)]) - gate.start_at, 1e-9)
    out = {"publish_msgs_per_s": round(published / pub_s), "published": published, "seconds": plan.run_s,
           "topics": len(keys), "published_via": {n: o["count"] for n, o in zip(server.nodes, outs)},
           "node_cpu": window.result(), "cpu": machine_cpu}
    errors: dict[str, int] = {}
    for o in outs[:len(pubs)]:
        for code, n in o["errors"].items():
            errors[code] = errors.get(code, 0) + n
    if errors:
        out["publish_errors"] = errors
    if consume:
        consumed = sum(o["count"] for o in outs[len(pubs):])
        sub_s = max([plan.run_s] + [o["t_last"] - gate.start_at for o in outs[len(pubs):] if o["count"]])
        out.update(consume_msgs_per_s=round(consumed / sub_s), consumed=consumed,
                   backlog_left=max(0, published - consumed))
        stream_errors: dict[str, int] = {}
        for o in outs[len(pubs):]:
            for code, n in o["stream_errors"].items():
                stream_errors[code] = stream_errors.get(code, 0) + n
        if stream_errors:
            out["stream_errors"] = stream_errors
    if failed:
        out["teardown_failed"] = failed
    return out


def _owners(server: ScaleCluster, keys: list[str]) -> dict[str, int]:
    """How many of `keys`' topics each node owns."""
    owners = cluster_status(server.etcd)["owners"]
    out = {n: 0 for n in server.nodes}
    for k in keys:
        node = owners.get(str(bundle_of(GrpcDriver.topic(k), BUNDLES)))
        out[node] = out.get(node, 0) + 1
    return out


STEPS = {  # workload: (description, how many topics, consumers too)
    "publish": ("one topic: publish", 1, False),
    "mixed": ("one topic: publish + consume", 1, True),
    "topics_publish": ("{t} topics: publish", None, False),
    "topics": ("{t} topics: publish + consume", None, True),
}


def run_count(root: str, plan: ScalePlan, size: int, caps: CpuCaps, bars: Bars) -> dict:
    """Start the cluster of `size` nodes, run the plan's workloads on it, stop it (and remove its cgroups)."""
    server = ScaleCluster(os.path.join(root, f"n{size}"), plan, size, caps)
    entry: dict = {"nodes": size, "results": {}, "errors": {}}
    try:
        tick, finish = bars.step(f"N={size}: start etcd + {size} nodes, settle")
        t0 = time.monotonic()
        server.start()
        st = cluster_status(server.etcd)
        entry["bundles_per_node"] = {n: sum(1 for o in st["owners"].values() if o == n) for n in server.nodes}
        entry["start_s"] = round(time.monotonic() - t0, 1)
        entry["server"] = server.server
        finish(f"{entry['start_s']:.1f} s")
        for key in plan.workloads:
            what, count, consume = STEPS[key]
            count = count or plan.topics
            tick, finish = bars.step(f"N={size}: " + what.format(t=count))
            time.sleep(plan.settle_s)
            keys = spread_names(f"s{size}-{key}", count)
            try:
                r = drive(server, plan, keys, consume, tick)
                r["owned_by"] = _owners(server, keys)
            except Exception as e:  # noqa: BLE001 — recorded; the next workload runs
                entry["errors"][key] = f"{type(e).__name__}: {e}"[:2000]
                finish("error")
                continue
            entry["results"][key] = r
            finish(f"{r['publish_msgs_per_s']:,}" + (f" / {r['consume_msgs_per_s']:,}" if consume else "")
                   + " msg/s")
    except Exception as e:  # noqa: BLE001
        entry["errors"]["start"] = f"{type(e).__name__}: {e}"[:2000]
    finally:
        server.stop()
        if entry["errors"] or any(r.get(k) for r in entry["results"].values()
                                  for k in ("publish_errors", "stream_errors", "teardown_failed")):
            entry["logs"] = _keep_logs(server.root, size)
        server.discard()
    return entry


def _keep_logs(root: str, size: int) -> str:
    """The logs of a count whose run had an error or a refused call (its nodes', etcd's), copied where the run's
    data is not deleted: the directory, for the report to name."""
    kept = tempfile.mkdtemp(prefix=f"pigeon-scale-n{size}-logs-")
    for path in glob.glob(os.path.join(root, "*.log")):
        shutil.copy(path, kept)
    return kept


def run_scale(plan: ScalePlan, hierarchy: Hierarchy, console=None, quiet_wait_s: float = 0.0) -> dict:
    """Every node count of the plan in turn (before each, wait up to `quiet_wait_s` for other programs to go
    quiet); returns the results document (JSON-ready)."""
    from rich.console import Console

    console = console or Console()
    caps = CpuCaps(hierarchy)
    root = tempfile.mkdtemp(prefix="pigeon-bench-scale-")
    doc: dict = {"plan": plan.name, "kind": "scale", "settings": dict(plan.__dict__),
                 "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "machine": machine(), "cgroup": {"kind": hierarchy.kind, "root": hierarchy.root}, "bundles": BUNDLES,
                 "runs": {}}
    bars = Bars(console)
    t0 = time.monotonic()
    try:
        with bars.progress:
            for n in plan.nodes:
                quiet = wait_quiet(quiet_wait_s) if quiet_wait_s else None
                doc["runs"][str(n)] = dict(run_count(root, plan, n, caps, bars), quiet_before=quiet)
    finally:
        left = caps.remove_all()
        shutil.rmtree(root, ignore_errors=True)
        if left:
            console.print(f"[red]cgroups that would not go: {left}")
    doc["efficiency"] = efficiencies(doc["runs"])
    doc["seconds"] = round(time.monotonic() - t0, 1)
    return doc
