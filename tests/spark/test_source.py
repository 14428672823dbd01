"""The `pigeon` data source against the real server: batch reads equal what was published, streaming
reads with availableNow into Parquet are exactly-once across runs and move the cursor, admission
control bounds micro-batches, data loss fails the query unless allowed."""

from __future__ import annotations

import glob
import json
import os

import pytest

from spark_helpers import sample_messages

pytestmark = [pytest.mark.spark, pytest.mark.e2e]
T = "projects/proj/topics/orders"
CUR = "projects/proj/subscriptions/orders-cursor"


def read(spark, node, **opts):
    r = spark.read.format("pigeon").option("endpoint", node.endpoint).option("topic", T)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_equals_what_was_published(spark, node):
    node.create_topic(T)
    node.client.create_cursor(CUR, T)  # holds retention from offset 0
    msgs = sample_messages(3000)
    ids = node.publish(T, msgs)
    df = read(spark, node)
    lo = node.client.latest_offsets(T)
    assert df.rdd.getNumPartitions() == sum(s.latest > s.earliest for s in lo.shards)  # one per shard with messages
    rows = df.collect()
    assert len(rows) == len(msgs)
    got = {r.message_id: (bytes(r.data), dict(r.attributes), r.ordering_key) for r in rows}
    assert got == {i: (d, a, k) for i, (d, a, k) in zip(ids, msgs)}
    # offsets are dense per shard; a key lives on one shard in publish order
    by_shard: dict[int, list[int]] = {}
    for r in rows:
        by_shard.setdefault(r.shard, []).append(r.offset)
    assert all(sorted(v) == list(range(len(v))) for v in by_shard.values())
    order = {i: n for n, i in enumerate(ids)}
    for key in {k for _, _, k in msgs if k}:
        keyed = [r for r in rows if r.ordering_key == key]
        assert len({r.shard for r in keyed}) == 1
        by_offset = sorted(keyed, key=lambda r: r.offset)
        assert [order[r.message_id] for r in by_offset] == sorted(order[r.message_id] for r in keyed)
    assert all(r.publish_time is not None for r in rows)
    # deterministic: the same ranges again, split differently, give the same rows
    again = read(spark, node, maxRowsPerPartition="333", readMessagesPerCall="100").collect()
    assert sorted(map(tuple, again)) == sorted(map(tuple, rows))
    assert read(spark, node, startingPosition="latest").count() == 0


def test_batch_read_from_a_time_and_from_offsets(spark, node):
    node.create_topic(T)
    node.client.create_cursor(CUR, T)
    node.publish(T, [(b"old-%d" % i, {}, "") for i in range(40)])
    lo = node.client.latest_offsets(T)
    ms = int(max(r.publish_time.timestamp() for r in read(spark, node).collect()) * 1000) + 5
    import time

    while time.time() * 1000 <= ms:
        time.sleep(0.005)
    node.publish(T, [(b"new-%d" % i, {}, "") for i in range(40)])
    new = read(spark, node, startingPosition="time", startingTime=str(ms)).collect()
    assert sorted(bytes(r.data) for r in new) == sorted(b"new-%d" % i for i in range(40))
    start = [s.latest for s in lo.shards]
    same = read(spark, node, startingOffsets=json.dumps(start)).collect()
    assert sorted(bytes(r.data) for r in same) == sorted(b"new-%d" % i for i in range(40))


def stream(spark, node, out, ck, **opts):
    r = (spark.readStream.format("pigeon").option("endpoint", node.endpoint).option("topic", T)
         .option("cursor", CUR).option("startingPosition", "earliest"))
    for k, v in opts.items():
        r = r.option(k, v)
    q = (r.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination(240)
    assert not q.isActive
    if q.exception():
        raise q.exception()
    return q


def test_streaming_available_now_into_parquet_is_exactly_once_and_moves_the_cursor(spark, node, tmp_path):
    node.create_topic(T)
    node.client.create_cursor(CUR, T)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    first = sample_messages(2000, seed=1)
    ids = node.publish(T, first)
    q = stream(spark, node, out, ck, maxRowsPerTrigger="600")
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 4 and all(p["numInputRows"] <= 600 for p in batches)  # admission control
    assert spark.read.parquet(out).count() == 2000
    after_first = [s.latest for s in node.client.latest_offsets(T).shards]
    second = sample_messages(500, seed=2)
    ids += node.publish(T, second)
    stream(spark, node, out, ck, maxRowsPerTrigger="600")
    rows = spark.read.parquet(out).collect()
    assert sorted(r.message_id for r in rows) == sorted(ids)  # every message once
    # Spark tells a source that a batch is done when it plans the next one: the cursor trails the query by
    # the last micro-batch, never more (what retention holds for a stopped query is at most that much)
    cur = node.client.get_cursor(CUR)
    assert list(cur.offsets) == after_first and cur.backlog == 500
    stream(spark, node, out, ck)
    assert spark.read.parquet(out).count() == 2500


def test_missing_data_fails_the_query_unless_allowed(spark, node, tmp_path):
    node.create_topic(T)
    node.publish(T, [(b"gone-%d" % i, {}, "") for i in range(10)])  # no subscription: not retained
    lo = node.client.latest_offsets(T)
    import time

    deadline = time.monotonic() + 30
    while node.client.latest_offsets(T).shards[0].earliest == 0 and time.monotonic() < deadline:
        time.sleep(0.2)  # the server's retention pass runs every few seconds
    node.client.create_cursor(CUR, T)
    node.publish(T, [(b"kept-%d" % i, {}, "") for i in range(10)])
    with pytest.raises(Exception, match="no longer retained"):
        read(spark, node, startingOffsets=json.dumps([0] * lo.shard_count)).collect()
    rows = read(spark, node, startingOffsets=json.dumps([0] * lo.shard_count), failOnDataLoss="false").collect()
    assert sorted(bytes(r.data) for r in rows) == sorted(b"kept-%d" % i for i in range(10))


def test_parquet_output_files_have_per_key_order(spark, node, tmp_path):
    """Rows of one key are in one partition (one shard) in offset order within each output file."""
    node.create_topic(T)
    node.client.create_cursor(CUR, T)
    node.publish(T, [(b"%d" % i, {}, f"k{i % 5}") for i in range(1000)])
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    stream(spark, node, out, ck)
    import pyarrow.parquet as pq

    files = [f for f in glob.glob(os.path.join(out, "*.parquet"))]
    assert files
    for f in files:
        t = pq.read_table(f).to_pylist()
        for k in {r["ordering_key"] for r in t}:
            offs = [r["offset"] for r in t if r["ordering_key"] == k]
            assert offs == sorted(offs)
