"""Rows/s read through the `pigeon` Spark connector (DESIGN.md §7: ≥ 500,000 rows/s on 2 cores).

Starts a server on a temporary data directory, publishes N messages (1,000 per request, keyless, data
only unless --attributes), then measures
  1. the reader alone: ReadRange calls + Arrow conversion in this process, shard after shard;
  2. Spark: spark.read.format("pigeon") … .write.format("noop") (every row materialized), local[2].

    .venv/bin/python scripts/spark_read_bench.py --messages 2000000 --size 100
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from google.pubsub_v1 import types  # noqa: E402

from pigeon.spark.arrow import to_record_batch  # noqa: E402
from pigeon.spark.client import PigeonClient  # noqa: E402
from pigeon.testing.server import ServerProcess  # noqa: E402

T = "projects/bench/topics/spark-read"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100, help="data bytes per message")
    ap.add_argument("--attributes", action="store_true", help="two attributes per message (the slower path)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pigeon-spark-bench-")
    srv = ServerProcess(os.path.join(tmp, "data"), fsync="never").start()
    try:
        c = PigeonClient(srv.address)
        import grpc

        ch = grpc.insecure_channel(srv.address)
        ch.unary_unary("/google.pubsub.v1.Publisher/CreateTopic", request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=types.Topic.pb().FromString)(types.Topic.pb()(name=T))
        c.create_cursor("projects/bench/subscriptions/hold", T)
        Msg, Req = types.PubsubMessage.pb(), types.PublishRequest.pb()
        attrs = {"source": "bench", "kind": "row"} if a.attributes else {}
        req = Req(topic=T, messages=[Msg(data=os.urandom(a.size), attributes=attrs) for _ in range(1000)])
        t0 = time.perf_counter()
        for _ in range(a.messages // 1000):
            c.publish(req)
        print(f"published {a.messages:,} messages of {a.size} B in {time.perf_counter() - t0:.1f}s")
        lo = c.latest_offsets(T)

        for _ in range(a.repeat):
            t0 = time.perf_counter()
            rows = 0
            for s in lo.shards:
                pos = s.earliest
                while pos < s.latest:
                    r = c.read_range(T, s.shard, pos, s.latest, max_messages=50_000, max_bytes=8 << 20)
                    rows += to_record_batch(r, s.shard).num_rows
                    pos = r.next_offset
            dt = time.perf_counter() - t0
            print(f"reader alone (one process): {rows:,} rows in {dt:.2f}s = {rows / dt:,.0f} rows/s")

        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master(a.master).config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").config("spark.python.worker.reuse", "true")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        import pigeon.spark

        pigeon.spark.register(spark)
        df = spark.read.format("pigeon").option("endpoint", srv.address).option("topic", T).load()
        for i in range(a.repeat):
            t0 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            dt = time.perf_counter() - t0
            print(f"spark {a.master} read → noop (run {i + 1}): {a.messages:,} rows in {dt:.2f}s = "
                  f"{a.messages / dt:,.0f} rows/s")
        t0 = time.perf_counter()
        n = df.count()
        dt = time.perf_counter() - t0
        print(f"spark count(): {n:,} rows in {dt:.2f}s = {n / dt:,.0f} rows/s")
        spark.stop()
    finally:
        srv.kill()


if __name__ == "__main__":
    main()
