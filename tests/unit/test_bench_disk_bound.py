"""The cluster benchmark measures the durable bandwidth of the one disk its members share and says what bound
that puts on a replicated publish (three copies of every message on one disk), beside the figures it bounds."""

from __future__ import annotations

from pigeon.bench import procs, report
from pigeon.bench.plan import PLANS


def test_the_probe_writes_and_syncs_for_every_writer(tmp_path):
    one = procs.disk_bandwidth(str(tmp_path), 1, seconds=0.3, block=64 * 1024)
    three = procs.disk_bandwidth(str(tmp_path), 3, seconds=0.3, block=64 * 1024)
    assert one > 0 and three > 0
    assert list(tmp_path.iterdir()) == []  # its files are removed


def test_the_report_states_the_bound_and_what_each_target_wrote():
    targets = {"pigeon": {"results": {"publish_b1000": {"msgs_per_s": 400_000}}},
               "pigeon-cluster": {"results": {"publish_b1000": {"msgs_per_s": 200_000}}}}
    doc = {"plan": "cluster", "when": "2026-11-27T00:00:00+00:00",
           "settings": dict(PLANS["cluster"].__dict__, message_bytes=1000),
           "machine": {"cores": 2, "cpu": "x", "memory_bytes": 2**34, "kernel": "6", "python": "3.11",
                       "disk_write_mb_s": {"1": 500.0, "3": 750.0}},
           "targets": targets}
    text = report.markdown(doc)
    assert "one writer 500 MB/s, three at once 750 MB/s" in text
    assert "at most 250 MB/s of messages, where one node may take 500 (0.50×)" in text  # 750 / 3 / 500
    assert "pigeon's publish × 1,000 wrote 400 MB/s" in text
    assert "pigeon-cluster's publish × 1,000 wrote 600 MB/s" in text  # three copies of 200k × 1,000 B
    del doc["machine"]["disk_write_mb_s"]  # a run without cluster targets measures nothing and says nothing
    assert "disk the members share" not in report.markdown(doc)
