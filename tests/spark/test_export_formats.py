"""The export's files without Spark (pigeon.spark.export.write_files on Arrow tables, as a micro-batch hands them
over): Parquet, Avro (with and without metadata, as Pub/Sub writes it) and text; a file ends at max_messages or about
max_bytes; the same rows give the same files, byte for byte, under the same names — which is what makes a replayed
micro-batch write nothing twice. And the source's hold (minRowsPerTrigger, maxTriggerDelay) as a pure rule."""

from __future__ import annotations

import glob
import os
from datetime import datetime, timezone

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.pubsub_v1 import types

from pigeon.spark import export
from pigeon.spark.arrow import SCHEMA
from pigeon.spark.source import trigger_due

SUB = "projects/proj/subscriptions/to-files"


def _table(n: int, size: int = 10) -> pa.Table:
    t0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)
    rows = {
        "message_id": [str(1000 + i) for i in range(n)],
        "shard": [i % 2 for i in range(n)],
        "offset": [i // 2 for i in range(n)],
        "ordering_key": ["k" if i % 3 == 0 else "" for i in range(n)],
        "publish_time": [t0.replace(second=i % 60) for i in range(n)],
        "attributes": [[("n", str(i))] if i % 2 else [] for i in range(n)],
        "data": [b"%0*d" % (size, i) for i in range(n)],
    }
    return export._prepare(pa.table(rows, schema=SCHEMA), None)


def _spec(**cfg) -> export.ExportSpec:
    s = types.Subscription.pb()(name=SUB, topic="projects/proj/topics/clicks")
    c = s.cloud_storage_config
    c.bucket = "a-bucket"
    for k, v in cfg.items():
        if k == "avro_metadata":
            c.avro_config.write_metadata = v
        elif k == "text":
            c.text_config.SetInParent()
        else:
            setattr(c, k, v)
    return export.spec_of(s)


def _files(root: str) -> list[str]:
    return sorted(f for f in glob.glob(os.path.join(root, "a-bucket", "**"), recursive=True) if os.path.isfile(f))


def test_text_files_hold_each_message_s_data_and_a_newline(tmp_path):
    t = _table(2500)
    paths = export.write_files(_spec(text=True, max_messages=1000, filename_suffix=".txt"), str(tmp_path), t, 0,
                               [1250, 1250])
    assert [len(open(p, "rb").read().splitlines()) for p in paths] == [1000, 1000, 500]
    lines = [line for p in paths for line in open(p, "rb").read().splitlines()]
    assert lines == t["data"].to_pylist()  # in (shard, offset) order
    assert all(p.endswith(".txt") for p in paths)


@pytest.mark.parametrize("metadata", [False, True])
def test_avro_files_are_pubsub_s_records(tmp_path, metadata):
    t = _table(50)
    paths = export.write_files(_spec(avro_metadata=metadata), str(tmp_path), t, 0, [25, 25])
    with open(paths[0], "rb") as f:
        reader = fastavro.reader(f)
        records = list(reader)
        schema = reader.writer_schema
    assert [r["data"] for r in records] == t["data"].to_pylist()
    if not metadata:
        assert [f["name"] for f in schema["fields"]] == ["data"]
        return
    assert [f["name"] for f in schema["fields"]] == ["subscription_name", "message_id", "publish_time", "attributes",
                                                     "data"]
    want = t.to_pylist()
    for r, w in zip(records, want):
        assert (r["subscription_name"], r["message_id"], r["publish_time"]) == (SUB, w["message_id"],
                                                                                w["publish_time"])
        attrs = dict(w["attributes"] or ())
        if w["ordering_key"]:
            attrs["ordering_key"] = w["ordering_key"]  # (Pub/Sub puts the ordering key among the attributes)
        assert r["attributes"] == attrs


@pytest.mark.parametrize("fmt", ["parquet", "avro", "text"])
def test_the_same_rows_give_the_same_files_byte_for_byte(tmp_path, fmt):
    spec = _spec(**({"text": True} if fmt == "text" else {"avro_metadata": True} if fmt == "avro" else {}),
                 max_messages=1000)
    t = _table(2200)
    first = export.write_files(spec, str(tmp_path / "a"), t, 7, [1100, 1100])
    again = export.write_files(spec, str(tmp_path / "b"), t, 7, [1100, 1100])
    assert [os.path.relpath(p, tmp_path / "a") for p in first] == [os.path.relpath(p, tmp_path / "b") for p in again]
    assert [open(p, "rb").read() for p in first] == [open(p, "rb").read() for p in again]
    assert export.files_done(spec, str(tmp_path / "a"), 7) == [1100, 1100]
    assert export.files_done(spec, str(tmp_path / "a"), 8) is None
    if fmt == "parquet":
        assert sum(pq.read_table(p).num_rows for p in first) == 2200


def test_max_bytes_ends_a_file_and_names_follow_the_first_row(tmp_path):
    t = _table(300, size=100)  # ~100 B of data a row, plus the format's overhead
    paths = export.write_files(_spec(text=True, max_bytes=2020, filename_prefix="raw/",
                                     filename_datetime_format="YYYY/MM/DD/hh"), str(tmp_path), t, 0, [150, 150])
    counts = [len(open(p, "rb").read().splitlines()) for p in paths]
    assert sum(counts) == 300 and max(counts) == 20  # 20 × (100 + 1) bytes
    assert all(os.path.getsize(p) <= 2020 for p in paths)
    rel = os.path.relpath(paths[0], tmp_path / "a-bucket")
    assert rel == "raw/2026/11/29/12_0-000000000000"


def test_the_hold_waits_for_a_file_s_worth_or_max_duration():
    assert not trigger_due(0, 1000, 999.0, 60.0)  # nothing waits: no micro-batch
    assert not trigger_due(999, 1000, 59.9, 60.0)
    assert trigger_due(1000, 1000, 0.0, 60.0)  # a whole file's worth
    assert trigger_due(1, 1000, 60.0, 60.0)  # max_duration since the first waiting row


def test_a_checkpoint_belongs_to_one_subscription(tmp_path):
    from pigeon.spark import export_jobs

    root, spec = str(tmp_path), _spec()
    ck = export.checkpoint_path(root, spec)
    os.makedirs(os.path.join(ck, "offsets"))  # the manual `pigeon export`'s checkpoint, without a marker
    export_jobs.own_checkpoint(root, spec, 7)
    assert os.path.isdir(os.path.join(ck, "offsets"))  # taken as it is
    export_jobs.own_checkpoint(root, spec, 7)
    assert os.path.isdir(os.path.join(ck, "offsets"))
    export_jobs.own_checkpoint(root, spec, 9)  # deleted and created again under the same name
    assert os.listdir(ck) == [export_jobs.MARKER]
    jobs = tmp_path / "jobs.json"
    assert export_jobs.read_jobs(str(jobs)) == {}
    export_jobs.write_json(str(jobs), {"subscriptions": {SUB: 9}})
    assert export_jobs.read_jobs(str(jobs)) == {SUB: 9}
    assert [export_jobs.retry_after_s(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
