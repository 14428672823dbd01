"""Export subscriptions: cloud_storage_config → Parquet files, bigquery_config → a Delta table, run by the
export job (in this session's SparkSession, and once through `pigeon export --once`). Every message is
exported once, per-key order holds within a file and is recoverable by (shard, offset) across files, the
subscription's floor follows the export, and a replayed micro-batch changes nothing."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from google.pubsub_v1 import types

from pigeon.spark import export
from spark_helpers import sample_messages

pytestmark = [pytest.mark.spark, pytest.mark.e2e]
P = "proj"
T = f"projects/{P}/topics/clicks"
GCS = f"projects/{P}/subscriptions/clicks-to-files"
BQ = f"projects/{P}/subscriptions/clicks-to-table"
FILTERED = f"projects/{P}/subscriptions/clicks-with-attrs"
Sub = types.Subscription.pb()


def _setup(node):
    node.create_topic(T)
    sub = Sub(name=GCS, topic=T)
    c = sub.cloud_storage_config
    c.bucket, c.filename_prefix, c.filename_suffix, c.max_messages = "click-bucket", "raw/clicks-", ".parquet", 1000
    node.create_subscription(sub)
    sub = Sub(name=BQ, topic=T)
    sub.bigquery_config.table = "proj.analytics.clicks"
    sub.bigquery_config.write_metadata = True
    node.create_subscription(sub)
    sub = Sub(name=FILTERED, topic=T, filter='attributes.k = "v"')
    sub.cloud_storage_config.bucket = "attr-bucket"
    node.create_subscription(sub)


def _files(root, bucket):
    return sorted(glob.glob(os.path.join(root, bucket, "**", "*.parquet"), recursive=True)) + sorted(
        f for f in glob.glob(os.path.join(root, bucket, "*")) if os.path.isfile(f) and not f.endswith(".parquet"))


def _check_files(files, ids, max_rows=None):
    seen = []
    for f in files:
        rows = pq.read_table(f).to_pylist()
        assert rows
        if max_rows:
            assert len(rows) <= max_rows
        keys = [(r["shard"], r["offset"]) for r in rows]
        assert keys == sorted(keys)  # per-key order (a key lives on one shard) within the file
        seen += [r["message_id"] for r in rows]
    assert sorted(seen) == sorted(ids)  # every message once


def _delta_ids(root):
    from deltalake import DeltaTable

    t = DeltaTable(export.bigquery_path(root, "proj.analytics.clicks")).to_pyarrow_table()
    assert set(t.column_names) >= {"subscription_name", "message_id", "publish_time", "attributes", "data"}
    return t.column("message_id").to_pylist()


def test_export_subscriptions_write_each_message_once(spark, node, tmp_path):
    _setup(node)
    root = str(tmp_path / "export")
    msgs = sample_messages(2000, keys=4, seed=5)
    ids = node.publish(T, msgs)
    specs = {s.subscription: s for s in export.find_exports(node.client, [P])}
    assert set(specs) == {GCS, BQ, FILTERED}
    assert export.run(node.endpoint, [P], root, once=True, spark=spark) == 3
    files = _files(root, "click-bucket")
    assert len(files) >= 2000 // 1000
    assert all(os.path.basename(f).startswith("clicks-") and f.endswith(".parquet") for f in files)
    _check_files(files, ids, max_rows=1000)
    assert sorted(_delta_ids(root)) == sorted(ids)
    with_attr = [i for i, (_, a, _) in zip(ids, msgs) if a.get("k") == "v"]
    _check_files(_files(root, "attr-bucket"), with_attr)
    for name in (GCS, BQ, FILTERED):  # the export is the subscription's consumer: nothing left behind
        assert node.client.get_cursor(name).backlog == 0

    # more messages, then a replay of the last micro-batch of each job
    more = node.publish(T, sample_messages(700, keys=4, seed=6))
    export.run(node.endpoint, [P], root, once=True, spark=spark)
    before = {f: os.path.getmtime(f) for f in _files(root, "click-bucket")}
    # every subscription's floor is at the end, so the server lets the messages go: a replay must not need them
    deadline = time.monotonic() + 30
    while any(s.earliest < s.latest for s in node.client.latest_offsets(T).shards):
        assert time.monotonic() < deadline, "the server kept messages no subscription needs"
        time.sleep(0.2)
    for spec in specs.values():
        ck = export.checkpoint_path(root, spec)
        last = max(int(f) for f in os.listdir(os.path.join(ck, "commits")) if f.isdigit())
        for name in (str(last), f".{last}.crc"):
            if os.path.exists(os.path.join(ck, "commits", name)):
                os.remove(os.path.join(ck, "commits", name))
    export.run(node.endpoint, [P], root, once=True, spark=spark)
    # the replayed batches were found written and skipped: the same files, untouched
    assert {f: os.path.getmtime(f) for f in _files(root, "click-bucket")} == before
    assert spark.read.parquet(os.path.join(root, "click-bucket", "raw")).count() == len(ids + more)
    _check_files(_files(root, "click-bucket"), ids + more, max_rows=1000)
    assert sorted(_delta_ids(root)) == sorted(ids + more)  # the Delta commit of the batch was skipped


def test_pigeon_export_command_once(node, tmp_path):
    node.create_topic(T)
    sub = Sub(name=GCS, topic=T)
    sub.cloud_storage_config.bucket = "cli-bucket"
    sub.cloud_storage_config.filename_datetime_format = "YYYY/MM/DD/hh-mm-ss"
    node.create_subscription(sub)
    ids = node.publish(T, sample_messages(500, seed=7))
    root = str(tmp_path / "export")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    r = subprocess.run([sys.executable, "-m", "pigeon", "export", "--project", P, "--endpoint", node.endpoint,
                        "--root", root, "--once", "--master", "local[1]"], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 subscription(s) exported" in r.stdout
    files = [f for f in glob.glob(os.path.join(root, "cli-bucket", "**", "*"), recursive=True) if os.path.isfile(f)]
    assert files and all(len(os.path.relpath(f, os.path.join(root, "cli-bucket")).split("/")) == 4 for f in files)
    _check_files(files, ids)
