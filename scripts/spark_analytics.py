"""Analytics example, one command: per-minute counts and latency percentiles per event kind, read from a
Pigeon topic through a cursor subscription into Parquet, exactly-once (Spark's checkpoint + file sink).

    .venv/bin/python scripts/spark_analytics.py                       # demo: own server, sample events
    .venv/bin/python scripts/spark_analytics.py --endpoint localhost:8085 --topic projects/p/topics/events

Events carry attributes `kind` and `event_ms` (when the event happened); latency = publish time − event
time. Stage 1 (streaming, availableNow) lands raw rows in <out>/raw exactly once — run it again and only
new messages are added. Stage 2 aggregates <out>/raw into <out>/per_minute (Parquet) and prints the table.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def demo_server(tmp: str):
    """A server with a topic of sample events (for the one-command demo)."""
    from google.pubsub_v1 import types

    from pigeon.spark.client import PigeonClient
    from pigeon.testing.server import ServerProcess

    srv = ServerProcess(os.path.join(tmp, "data"), fsync="never").start()
    topic = "projects/demo/topics/events"
    import grpc

    ch = grpc.insecure_channel(srv.address)
    ch.unary_unary("/google.pubsub.v1.Publisher/CreateTopic", request_serializer=lambda m: m.SerializeToString(),
                   response_deserializer=types.Topic.pb().FromString)(types.Topic.pb()(name=topic))
    c = PigeonClient(srv.address)
    c.create_cursor("projects/demo/subscriptions/analytics", topic, [0, 0, 0, 0])
    rnd = random.Random(42)
    now = int(time.time() * 1000)
    Msg, Req = types.PubsubMessage.pb(), types.PublishRequest.pb()
    for batch in range(50):
        msgs = []
        for i in range(1000):
            ms = now - rnd.randrange(0, 10 * 60_000)  # events of the last 10 minutes, delivered late
            kind = rnd.choice(["click", "view", "purchase"])
            msgs.append(Msg(data=b"{}", attributes={"kind": kind, "event_ms": str(ms)}))
        c.publish(Req(topic=topic, messages=msgs))
    return srv, topic


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint")
    ap.add_argument("--topic")
    ap.add_argument("--cursor", default="analytics", help="cursor subscription (name or full path)")
    ap.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    ap.add_argument("--master", default="local[*]")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pigeon-analytics-")
    srv = None
    if not a.endpoint:
        srv, a.topic = demo_server(tmp)
        a.endpoint, a.cursor = srv.address, "projects/demo/subscriptions/analytics"
    out = a.out or os.path.join(tmp, "out")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import pigeon.spark

    spark = SparkSession.builder.master(a.master).appName("pigeon-analytics").config("spark.ui.enabled", "false") \
        .config("spark.sql.session.timeZone", "UTC").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    pigeon.spark.register(spark)
    try:
        project = a.topic.split("/")[1]
        q = (spark.readStream.format("pigeon").option("endpoint", a.endpoint).option("topic", a.topic)
             .option("project", project).option("cursor", a.cursor).load()
             .writeStream.format("parquet").option("path", os.path.join(out, "raw"))
             .option("checkpointLocation", os.path.join(out, "checkpoint")).trigger(availableNow=True).start())
        q.awaitTermination()
        raw = spark.read.parquet(os.path.join(out, "raw"))
        events = raw.select(
            F.coalesce(F.col("attributes")["kind"], F.lit("(none)")).alias("kind"),
            F.col("publish_time"),
            (F.col("attributes")["event_ms"].cast("long") / 1000).cast("timestamp").alias("event_time"),
        ).withColumn("latency_s", F.col("publish_time").cast("double") - F.col("event_time").cast("double"))
        per_minute = (
            events.groupBy(F.date_trunc("minute", "event_time").alias("minute"), "kind")
            .agg(F.count("*").alias("messages"),
                 F.transform(F.percentile_approx("latency_s", [0.5, 0.95, 0.99]), lambda x: F.round(x, 3))
                 .alias("latency_s_p50_p95_p99"))
            .orderBy("minute", "kind")
        )
        per_minute.write.mode("overwrite").parquet(os.path.join(out, "per_minute"))
        per_minute.show(60, truncate=False)
        print(f"raw rows: {raw.count():,}; results in {out}/per_minute")
    finally:
        spark.stop()
        if srv is not None:
            srv.kill()


if __name__ == "__main__":
    main()
