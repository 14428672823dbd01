"""Rows/s read through the `pigeon` Spark connector (DESIGN.md §7: ≥ 500,000 rows/s on 2 cores; issue 43:
≥ 1,000,000 with attributes, from any node of a cluster).

Starts a server on a temporary data directory (or, with --cluster N, etcd and N cluster nodes, the topic on a
bundle of node n1), publishes N messages (1,000 per request, keyless, data only unless --attributes), then
measures
  1. the ReadRange calls alone, and the reader: those calls + Arrow conversion in this process, shard after
     shard;
  2. Spark: spark.read.format("pigeon") … .write.format("noop") (every row materialized), local[2].
On a cluster both read through --via: `other` (default), a node that does not own the topic and forwards every
call to its owner, or `owner`.

    .venv/bin/python scripts/spark_read_bench.py --messages 2000000 --size 100
    .venv/bin/python scripts/spark_read_bench.py --attributes --cluster 3 --via other
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from google.pubsub_v1 import types  # noqa: E402

from pigeon.spark.arrow import to_record_batch  # noqa: E402
from pigeon.spark.client import PigeonClient  # noqa: E402
from pigeon.testing.server import ServerProcess  # noqa: E402

T = "projects/bench/topics/spark-read"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _processes() -> dict[int, tuple[int, str, float]]:
    """pid → (parent, command name, CPU seconds so far), from /proc (Linux; empty elsewhere)."""
    out = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[int(d)] = (int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


def cpu_by_part(servers: list[int]) -> dict[str, dict[int, float]]:
    """CPU seconds used so far by each process of the Pigeon server(s), of the JVM and of the Python workers Spark
    started."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)

    def tree(pid):
        todo, seen = [pid], []
        while todo:
            p = todo.pop()
            seen.append(p)
            todo.extend(children.get(p, ()))
        return seen

    parts: dict[str, dict[int, float]] = {"pigeon": {p: procs[p][2] for p in servers if p in procs}, "JVM": {},
                                          "Python workers": {}}
    for jvm in (p for p in children.get(os.getpid(), ()) if procs[p][1] == "java"):
        parts["JVM"][jvm] = procs[jvm][2]
        parts["Python workers"].update((p, procs[p][2]) for p in tree(jvm) if p != jvm)
    return parts


def cpu_parts(before: dict, after: dict) -> dict[str, float]:
    """What each part used between two `cpu_by_part` readings (a process that ended in between is not counted)."""
    return {k: sum(v - before[k].get(p, 0.0) for p, v in after[k].items()) for k in after}


def cpu_used(before: dict, after: dict) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in cpu_parts(before, after).items())


def start_cluster(root: str, nodes: int, stack: list) -> tuple[str, dict[str, ServerProcess]]:
    """etcd and `nodes` cluster nodes (fsync never); a topic name whose bundle n1 owns."""
    from pigeon.testing.cluster import await_status, node_process, settled_owners, topic_owned_by, wipe
    from pigeon.testing.etcd import EtcdProcess

    os.makedirs(os.path.join(root, "etcd"))
    etcd = EtcdProcess(os.path.join(root, "etcd", "data")).start()
    stack.append(etcd)
    wipe(etcd.endpoint)
    ids = [f"n{i + 1}" for i in range(nodes)]
    procs = {}
    for i in ids:
        procs[i] = node_process(root, etcd.endpoint, i, extra=["--fsync", "never"]).start()
        stack.append(procs[i])
    await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == nodes
                 and all(r["bundles"] for r in st["nodes"]))
    name = topic_owned_by(settled_owners(etcd.endpoint), "n1", "spark-read")
    return f"projects/bench/topics/{name}", procs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100, help="data bytes per message")
    ap.add_argument("--attributes", action="store_true", help="two attributes per message (the slower path)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--cluster", type=int, default=0, metavar="N",
                    help="read from a cluster of N nodes (etcd + `pigeon serve --etcd`) instead of one server")
    ap.add_argument("--via", choices=("other", "owner"), default="other",
                    help="with --cluster: read through a node that does not own the topic (it forwards every call "
                         "to the owner), or through the owner")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pigeon-spark-bench-")
    stack: list = []  # processes to kill, in reverse
    try:
        topic = T
        if a.cluster:
            if a.cluster < 2 and a.via == "other":
                raise SystemExit("--via other needs --cluster 2 or more")
            topic, procs = start_cluster(tmp, a.cluster, stack)
            owner, endpoint = procs["n1"].address, procs["n1" if a.via == "owner" else "n2"].address
            print(f"cluster of {a.cluster} nodes; {topic} owned by n1 ({owner}); reading through "
                  f"{'n1, the owner' if a.via == 'owner' else 'n2, which forwards to n1'}")
        else:
            srv = ServerProcess(os.path.join(tmp, "data"), fsync="never").start()
            stack.append(srv)
            owner = endpoint = srv.address
        c = PigeonClient(owner)
        import grpc

        ch = grpc.insecure_channel(owner)
        ch.unary_unary("/google.pubsub.v1.Publisher/CreateTopic", request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=types.Topic.pb().FromString)(types.Topic.pb()(name=topic))
        c.create_cursor("projects/bench/subscriptions/hold", topic)
        Msg, Req = types.PubsubMessage.pb(), types.PublishRequest.pb()
        attrs = {"source": "bench", "kind": "row"} if a.attributes else {}
        req = Req(topic=topic, messages=[Msg(data=os.urandom(a.size), attributes=attrs) for _ in range(1000)])
        t0 = time.perf_counter()
        for _ in range(a.messages // 1000):
            c.publish(req)
        print(f"published {a.messages:,} messages of {a.size} B{' with 2 attributes' if attrs else ''} in "
              f"{time.perf_counter() - t0:.1f}s")
        c.close()

        c = PigeonClient(endpoint)
        lo = c.latest_offsets(topic)
        if sum(s.latest - s.earliest for s in lo.shards) != a.messages:
            raise SystemExit(f"{endpoint} reports {sum(s.latest - s.earliest for s in lo.shards):,} messages in "
                             f"{topic}, not {a.messages:,}")
        for i in range(a.repeat + 1):
            convert = i > 0  # the first pass: the calls alone
            t0 = time.perf_counter()
            rows = 0
            for s in lo.shards:
                pos = s.earliest
                while pos < s.latest:
                    r = c.read_range(topic, s.shard, pos, s.latest, max_messages=50_000, max_bytes=8 << 20)
                    rows += to_record_batch(r, s.shard).num_rows if convert else len(r.lengths) // 4
                    pos = r.next_offset
            dt = time.perf_counter() - t0
            what = "reader alone (one process)" if convert else "ReadRange calls alone, no conversion"
            print(f"{what}: {rows:,} rows in {dt:.2f}s = {rows / dt:,.0f} rows/s")

        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master(a.master).config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").config("spark.python.worker.reuse", "true")
                 .config("spark.ui.showConsoleProgress", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        import pigeon.spark

        pigeon.spark.register(spark)
        df = spark.read.format("pigeon").option("endpoint", endpoint).option("topic", topic).load()
        servers = [p.proc.pid for p in stack if isinstance(p, ServerProcess)]
        runs = []  # (rows/s, CPU s by part)
        for i in range(a.repeat):
            before = cpu_by_part(servers)
            t0 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            dt = time.perf_counter() - t0
            after = cpu_by_part(servers)
            runs.append((a.messages / dt, cpu_parts(before, after)))
            print(f"spark {a.master} read → noop (run {i + 1}): {a.messages:,} rows in {dt:.2f}s = "
                  f"{a.messages / dt:,.0f} rows/s; CPU s: {cpu_used(before, after)}")
        if len(runs) > 1:  # the first run warms the JVM up (several CPU seconds of JIT compilation)
            rates, parts = [r for r, _ in runs[1:]], [p for _, p in runs[1:]]
            per_m = {k: statistics.median(p[k] for p in parts) * 1e6 / a.messages for k in parts[0]}
            print(f"spark runs 2-{len(runs)}: best {max(rates):,.0f} rows/s, median {statistics.median(rates):,.0f}; "
                  f"median CPU s per 1M rows: " + ", ".join(f"{k} {v:.2f}" for k, v in per_m.items()) +
                  f", total {sum(per_m.values()):.2f}; load average {os.getloadavg()[0]:.1f}")
        t0 = time.perf_counter()
        n = df.count()
        dt = time.perf_counter() - t0
        print(f"spark count(): {n:,} rows in {dt:.2f}s = {n / dt:,.0f} rows/s")
        spark.stop()
    finally:
        for p in reversed(stack):
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
