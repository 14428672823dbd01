"""pigeon.node.exports without Spark: the state table, the probe of a destination, which subscriptions a node runs
(its bundles' only), what Create/Get/List answer, and the child's restart backoff."""

from __future__ import annotations

import os
import types as pytypes

import pytest
from google.pubsub_v1 import types

from pigeon.core.bundles import bundle_log
from pigeon.node import exports
from pigeon.node.exports import ExportSupervisor, condition

Subscription = types.Subscription.pb()
ERR, OK = types.Subscription.State.RESOURCE_ERROR, types.Subscription.State.ACTIVE
BASE = dict(root=True, spark=True, secured=False, probe="ok", job=None, child_failures=0)


def test_every_row_of_the_table_is_reachable_and_first_match_wins():
    seen = {
        condition(**{**BASE, "root": False, "spark": False}),
        condition(**{**BASE, "spark": False}),
        condition(**{**BASE, "secured": True}),
        condition(**{**BASE, "probe": "denied"}),
        condition(**{**BASE, "probe": "missing", "job": {"state": "failed"}}),
        condition(**{**BASE, "job": {"state": "failed", "error": "[Errno 13] Permission denied: '/x'"}}),
        condition(**{**BASE, "job": {"state": "failed", "error": "boom"}}),
        condition(**{**BASE, "job": {"state": "running"}}),
    }
    assert seen == {c for c, *_ in exports.STATES}
    assert condition(**{**BASE, "child_failures": 3}) == "failed"  # a job that dies again and again
    assert condition(**{**BASE, "child_failures": 2}) == "ok"


def test_probe(tmp_path):
    assert exports.probe(str(tmp_path / "new" / "bucket"), "n1") == "ok"  # made when missing
    assert os.listdir(tmp_path / "new" / "bucket") == []  # the probe's file is gone
    (tmp_path / "file").write_text("x")
    assert exports.probe(str(tmp_path / "file"), "n1") == "missing"
    assert exports.probe("", "n1") == "missing"
    if os.geteuid() != 0:  # (root writes anywhere)
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert exports.probe(str(ro), "n1") == "denied"


def test_restart_backoff():
    assert [exports.restart_after_s(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert exports.restart_after_s(30) == exports.restart_s_max


def _sub(name: str, topic: str, **cfg):
    s = Subscription(name=name, topic=topic)
    if "bucket" in cfg:
        s.cloud_storage_config.bucket = cfg["bucket"]
    if "table" in cfg:
        s.bigquery_config.table = cfg["table"]
    return s


class FakeEngine:
    """The engine as the supervisor sees it: subscriptions by name, the logs this node owns."""

    def __init__(self, subs, owned_topics, bundles=16):
        self.bundles = bundles
        owned = {bundle_log(t, bundles) for t in owned_topics}
        self.owns = lambda log_id: log_id in owned
        self.state = pytypes.SimpleNamespace(subs={
            s.name: pytypes.SimpleNamespace(uid=i + 1, config=s, topic=pytypes.SimpleNamespace(name=s.topic))
            for i, s in enumerate(subs)}, log_of_sub=lambda n, b: bundle_log(self.state.subs[n].topic.name, b))


def _config(tmp_path, **kw):
    base = dict(export_root=str(tmp_path / "root"), export_master="local[1]", data_dir=str(tmp_path / "data"),
                node_id="n1", bundles=16, secured=False)
    return pytypes.SimpleNamespace(**{**base, **kw})


def test_a_node_runs_the_export_subscriptions_of_its_bundles_only(tmp_path):
    topics = [f"projects/p/topics/t{i}" for i in range(40)]
    mine = [t for t in topics if bundle_log(t, 16) % 2 == 0]
    subs = [_sub(f"projects/p/subscriptions/s{i}", t, bucket=f"b-{i:03d}") for i, t in enumerate(topics)]
    subs.append(_sub("projects/p/subscriptions/pull-1", mine[0]))  # not an export subscription
    sup = ExportSupervisor(_config(tmp_path), FakeEngine(subs, mine))
    assert set(sup.wanted()) == {s.name for s in subs if s.topic in mine and s.cloud_storage_config.bucket}


def test_answers_without_a_root_and_with_one(tmp_path):
    pull = _sub("projects/p/subscriptions/pull-1", "projects/p/topics/t1")
    pull.state = OK
    gcs = _sub("projects/p/subscriptions/gcs-1", "projects/p/topics/t1", bucket="b-1")
    bq = _sub("projects/p/subscriptions/bq-1", "projects/p/topics/t1", table="p.d.t")
    off = ExportSupervisor(_config(tmp_path, export_root=""), FakeEngine([], []))
    assert off.annotate(pull).state == OK  # not an export: untouched
    assert off.annotate(gcs).state == ERR and gcs.cloud_storage_config.state == exports.MISSING
    assert off.annotate(bq).state == ERR and bq.bigquery_config.state == exports.MISSING
    on = ExportSupervisor(_config(tmp_path), FakeEngine([], []))
    on.spark = True
    assert on.annotate(gcs).state == OK and gcs.cloud_storage_config.state == exports.DEST_ACTIVE
    on.probes[exports.destination(on.root, gcs)] = "denied"  # what a probe found
    assert on.annotate(gcs).state == ERR and gcs.cloud_storage_config.state == exports.DENIED
    on.conditions[gcs.name] = "ok"  # what this node decided of one it runs comes first
    assert on.annotate(gcs).state == OK
    on.others[bq.name] = "failed"  # what another node's owner shared
    assert on.annotate(bq).state == ERR


@pytest.mark.parametrize("table", ["p.d.t", "bad"])
def test_destination(tmp_path, table):
    s = _sub("projects/p/subscriptions/bq-1", "projects/p/topics/t1", table=table)
    want = os.path.join(str(tmp_path), "_bigquery", "p", "d", "t") if table == "p.d.t" else ""
    assert exports.destination(str(tmp_path), s) == want


def test_the_console_s_line(tmp_path):
    gcs = _sub("projects/p/subscriptions/gcs-1", "projects/p/topics/t1", bucket="b-1")
    off = ExportSupervisor(_config(tmp_path, export_root=""), FakeEngine([], []))
    assert off.describe(gcs) == ("cloud storage: b-1", "RESOURCE_ERROR: this node has no --export-root")
    assert off.describe(_sub("projects/p/subscriptions/pull-1", "projects/p/topics/t1")) == ("", "")
    on = ExportSupervisor(_config(tmp_path), FakeEngine([], []))
    on.spark = True
    assert on.describe(_sub("projects/p/subscriptions/bq-1", "projects/p/topics/t1", table="p.d.t")) == (
        "bigquery: p.d.t", "ACTIVE")
