"""Exactly-once end to end: a streaming query killed (-9, its whole process group) mid-stream and
restarted from its checkpoint writes every message once into Spark's Parquet sink; the pigeon sink's
replays (a batch write run again, a micro-batch replayed from the checkpoint) publish nothing twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from spark_helpers import sample_messages

pytestmark = [pytest.mark.spark, pytest.mark.e2e]
T = "projects/proj/topics/events"
CUR = "projects/proj/subscriptions/events-cursor"
HERE = os.path.dirname(os.path.abspath(__file__))


def _commits(ck: str) -> int:
    d = os.path.join(ck, "commits")
    return len([f for f in os.listdir(d) if f.isdigit()]) if os.path.isdir(d) else 0


def test_kill_mid_stream_and_restart_from_the_checkpoint_loses_and_duplicates_nothing(spark, node, tmp_path):
    node.create_topic(T)
    node.client.create_cursor(CUR, T)
    ids = node.publish(T, sample_messages(10_000, keys=8, seed=3))
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    log = open(tmp_path / "job.log", "wb")
    job = subprocess.Popen([sys.executable, os.path.join(HERE, "stream_job.py"), node.endpoint, T, CUR, out, ck, "500"],
                           cwd=HERE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while _commits(ck) < 3:
            assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the streaming job made no progress"
            time.sleep(0.05)
        time.sleep(0.3)  # land inside a later micro-batch
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        log.close()
    done = _commits(ck)
    assert done < 20, "the job finished before it was killed"  # 10,000 rows / 500 per batch
    q = (spark.readStream.format("pigeon").option("endpoint", node.endpoint).option("topic", T)
         .option("cursor", CUR).option("startingPosition", "earliest").option("maxRowsPerTrigger", "5000").load()
         .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination(240)
    assert q.exception() is None
    rows = spark.read.parquet(out).select("message_id", "shard", "offset").collect()
    assert len(rows) == len(ids)
    assert sorted(r.message_id for r in rows) == sorted(ids)
    cur = node.client.get_cursor(CUR)
    assert cur.backlog <= 5000  # trails by the last micro-batch at most


def _write(spark, node, topic, df, **opts):
    w = df.write.format("pigeon").option("endpoint", node.endpoint).option("topic", topic).mode("append")
    for k, v in opts.items():
        w = w.option(k, v)
    w.save()


def _read(spark, node, topic):
    return spark.read.format("pigeon").option("endpoint", node.endpoint).option("topic", topic).load()


def test_batch_write_run_twice_with_the_same_sink_id_publishes_once(spark, node):
    out_t = "projects/proj/topics/sink-out"
    node.create_topic(out_t)
    node.client.create_cursor("projects/proj/subscriptions/sink-hold", out_t)
    rows = [(b"row-%d" % i, {"n": str(i)}, f"k{i % 3}" if i % 2 else None) for i in range(3000)]
    df = spark.createDataFrame(rows, "data binary, attributes map<string,string>, ordering_key string").repartition(3)
    _write(spark, node, out_t, df, sinkId="nightly-2026-11-22")
    _write(spark, node, out_t, df, sinkId="nightly-2026-11-22")  # the same job again: all keys seen
    got = _read(spark, node, out_t).collect()
    assert len(got) == 3000
    assert sorted(bytes(r.data) for r in got) == sorted(r[0] for r in rows)
    keys = {r.attributes["pigeon-idempotency-key"] for r in got}
    assert len(keys) == 3000 and all(k.startswith("nightly-2026-11-22:0:") for k in keys)
    # per-key order: within a partition, rows of a key were published in order
    for r in got:
        assert dict(r.attributes)["n"] == bytes(r.data).decode().split("-")[1]
    _write(spark, node, out_t, df.limit(10), sinkId="another-run")  # a different sink id is new data
    assert _read(spark, node, out_t).count() == 3010


def test_replayed_micro_batch_publishes_nothing_twice(spark, node, tmp_path):
    src, dst = "projects/proj/topics/stream-in", "projects/proj/topics/stream-out"
    node.create_topic(src)
    node.create_topic(dst)
    node.client.create_cursor("projects/proj/subscriptions/in-hold", src)
    node.client.create_cursor("projects/proj/subscriptions/out-hold", dst)
    node.publish(src, sample_messages(3000, seed=4))
    ck = str(tmp_path / "ck")

    def run():
        q = (spark.readStream.format("pigeon").option("endpoint", node.endpoint).option("topic", src)
             .option("startingPosition", "earliest").option("maxRowsPerTrigger", "1000").load()
             .select("data", "attributes", "ordering_key")
             .writeStream.format("pigeon").option("endpoint", node.endpoint).option("topic", dst)
             .option("sinkId", "copy-job").option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination(240)
        assert q.exception() is None
        return q

    run()
    assert _read(spark, node, dst).count() == 3000
    last = max(int(f) for f in os.listdir(os.path.join(ck, "commits")) if f.isdigit())
    for name in (str(last), f".{last}.crc"):  # as if the query died before committing the batch
        if os.path.exists(os.path.join(ck, "commits", name)):
            os.remove(os.path.join(ck, "commits", name))
    q = run()
    assert sum(p["numInputRows"] for p in q.recentProgress) > 0  # the batch really ran again
    got = _read(spark, node, dst).collect()
    assert len(got) == 3000  # and its messages were stored once
    assert {r.attributes["pigeon-idempotency-key"].split(":")[1] for r in got} == {"0", "1", "2"}
