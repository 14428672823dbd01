"""The scale benchmark's pure parts: efficiency arithmetic, where its CPU cgroups go and what is written to them
(a temporary directory standing in for the cgroup root), topic names spread over the bundles, and the report's
cells. Nothing here starts a process or measures anything."""

from __future__ import annotations

import os

import pytest

from pigeon.bench import cgroups
from pigeon.bench.cgroups import V1, V2, CpuCaps, Hierarchy
from pigeon.bench.grpc_client import GrpcDriver
from pigeon.bench.plan import SCALE, SCALE_QUICK, ScalePlan
from pigeon.bench.scale import efficiencies, efficiency, spread_names
from pigeon.bench.scale_report import markdown, rate_rows
from pigeon.core.bundles import bundle_of


def test_efficiency_is_rate_over_the_smallest_counts_rate_scaled_by_the_node_ratio():
    assert efficiency({3: 30_000, 4: 40_000, 5: 25_000, 6: 30_000}) == {3: 1.0, 4: 1.0, 5: 0.5, 6: 0.5}
    # a topic on one owner: the same rate at every N is 3/N
    assert efficiency({3: 50_000, 6: 50_000}) == {3: 1.0, 6: 0.5}
    assert efficiency({4: 100, 5: 100}) == {4: 1.0, 5: 0.8}  # the base is the smallest count run
    assert efficiency({3: 0, 4: 10}) == {3: None, 4: None}  # no base, no ratio
    assert efficiency({3: 10, 4: None}) == {3: 1.0, 4: None}
    assert efficiency({}) == {}


def test_efficiencies_per_series_from_the_runs():
    runs = {"3": {"results": {"publish": {"publish_msgs_per_s": 300},
                              "mixed": {"publish_msgs_per_s": 30, "consume_msgs_per_s": 20}}},
            "6": {"results": {"publish": {"publish_msgs_per_s": 450}}, "errors": {"mixed": "boom"}}}
    assert efficiencies(runs) == {"publish.publish_msgs_per_s": {"3": 1.0, "6": 0.75},
                                  "mixed.publish_msgs_per_s": {"3": 1.0},
                                  "mixed.consume_msgs_per_s": {"3": 1.0}}


def test_quota_is_the_share_of_each_period():
    assert cgroups.quota_us(0.2, 100_000) == 20_000
    assert cgroups.quota_us(1.5, 100_000) == 150_000  # more than a core: several cores' periods
    assert cgroups.quota_us(0.001, 100_000) == cgroups.MIN_QUOTA_US
    for cores in (0, -1):
        with pytest.raises(ValueError):
            cgroups.quota_us(cores, 100_000)
    with pytest.raises(ValueError):
        cgroups.quota_us(0.2, 10)
    assert cgroups.limit_files(V1, 0.2, 100_000) == [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "20000")]
    assert cgroups.limit_files(V2, 0.25, 200_000) == [("cpu.max", "50000 200000")]


def _touch(path: str, text: str = "") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_find_prefers_v1s_cpu_controller_then_v2_else_says_why(tmp_path):
    v1 = tmp_path / "v1"
    _touch(str(v1 / "cpu" / "cpu.cfs_quota_us"), "-1\n")
    _touch(str(v1 / "cgroup.controllers"), "cpu io\n")
    assert cgroups.find(str(v1)) == (Hierarchy(V1, str(v1 / "cpu")), "")
    v2 = tmp_path / "v2"
    _touch(str(v2 / "cgroup.controllers"), "cpuset cpu io memory pids\n")
    assert cgroups.find(str(v2)) == (Hierarchy(V2, str(v2)), "")
    neither = tmp_path / "neither"
    _touch(str(neither / "cgroup.controllers"), "hugetlb\n")
    found, why = cgroups.find(str(neither))
    assert found is None and "does not list cpu" in why and "root" in why
    found, why = cgroups.find(str(tmp_path / "absent"))
    assert found is None and "no cgroup v2 hierarchy" in why


def test_a_v1_cgroup_is_made_filled_read_and_removed_with_only_what_was_made(tmp_path):
    root = tmp_path / "cpu"
    root.mkdir()
    foreign = root / "pigeon-bench-t-3x-n2"
    foreign.mkdir()  # someone else's, with our name: refused and left alone
    caps = CpuCaps(Hierarchy(V1, str(root)), prefix="pigeon-bench-t")
    path = caps.make("3x-n1", 0.2, 100_000)
    assert path == str(root / "pigeon-bench-t-3x-n1")
    assert (root / "pigeon-bench-t-3x-n1" / "cpu.cfs_period_us").read_text() == "100000"
    assert (root / "pigeon-bench-t-3x-n1" / "cpu.cfs_quota_us").read_text() == "20000"
    with pytest.raises(FileExistsError):
        caps.make("3x-n2", 0.2, 100_000)
    caps.add("3x-n1", [4242, 4243])
    assert (root / "pigeon-bench-t-3x-n1" / "cgroup.procs").read_text() == "42424243"  # one write per pid
    _touch(path + "/cpu.stat", "nr_periods 200\nnr_throttled 50\nthrottled_time 3000000000\n")
    assert caps.stat("3x-n1") == {"periods": 200, "throttled_periods": 50, "throttled_s": 3.0}
    _touch(path + "/cpuacct.usage", "1500000000\n")  # where cpuacct shares the mount
    assert caps.stat("3x-n1")["cpu_s"] == 1.5
    # a directory that still holds files stands for a cgroup still holding a process: not removed, and what it
    # lists is moved to the parent first
    _touch(path + "/cgroup.procs", "4242\n")
    assert caps.remove("3x-n1", tries=1) is False
    assert "4242" in (root / "cgroup.procs").read_text()
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    assert caps.remove_all() == []
    assert sorted(os.listdir(root)) == ["cgroup.procs", "pigeon-bench-t-3x-n2"]


def test_a_v2_cgroup_gets_cpu_max_and_the_controller_enabled(tmp_path):
    _touch(str(tmp_path / "cgroup.subtree_control"), "memory")
    caps = CpuCaps(Hierarchy(V2, str(tmp_path)), prefix="p")
    path = caps.make("4x-n3", 0.5, 100_000)
    assert open(os.path.join(path, "cpu.max")).read() == "50000 100000"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "memory+cpu"  # "+cpu" written once
    _touch(path + "/cpu.stat", "usage_usec 2500000\nuser_usec 2000000\nnr_periods 10\nnr_throttled 1\n"
                               "throttled_usec 500000\n")
    assert caps.stat("4x-n3") == {"periods": 10, "throttled_periods": 1, "throttled_s": 0.5, "cpu_s": 2.5}
    os.unlink(path + "/cpu.max")
    os.unlink(path + "/cpu.stat")
    assert caps.remove_all() == [] and not os.path.exists(path)


def test_the_many_topics_are_one_per_bundle():
    names = spread_names("s3-topics", 16)
    assert len(set(bundle_of(GrpcDriver.topic(n), 16) for n in names)) == 16
    names = spread_names("x", 20)  # more topics than bundles: at most two in any
    per = [sum(1 for n in names if bundle_of(GrpcDriver.topic(n), 16) == b) for b in range(16)]
    assert len(names) == 20 and max(per) == 2 and min(per) == 1


def test_plans_are_bounded_and_checked():
    assert SCALE.nodes == (3, 4, 5, 6) and SCALE.node_cpu == 0.2 and (SCALE.replicas, SCALE.ack_quorum) == (3, 2)
    assert SCALE.estimate_s() <= 15 * 60 and SCALE_QUICK.nodes == (3, 4)
    for bad in ({"nodes": (2, 3)}, {"nodes": (4, 3)}, {"node_cpu": 0}, {"workloads": ("latency",)}):
        with pytest.raises(AssertionError):
            ScalePlan(**bad)


def test_the_report_shows_each_rate_with_its_efficiency():
    doc = {"plan": "scale", "settings": dict(SCALE.__dict__), "when": "2026-11-29T12:00:00+00:00",
           "machine": {"cores": 2, "cpu": "x", "memory_bytes": 2**34, "kernel": "6", "python": "3.11"},
           "cgroup": {"kind": V1, "root": "/sys/fs/cgroup/cpu"}, "seconds": 600,
           "runs": {"3": {"results": {"publish": {"publish_msgs_per_s": 30_000, "node_cpu": {
               "n1": {"cores": 0.2, "throttled_pct": 99.0}, "etcd": {"cores": 0.01}}, "owned_by": {"n1": 1}}}},
                    "4": {"results": {"publish": {"publish_msgs_per_s": 30_000}}, "errors": {"topics": "E: x"}}}}
    doc["efficiency"] = efficiencies(doc["runs"])
    assert rate_rows(doc) == [("one topic, publish alone", ["30,000 (1.00)", "30,000 (0.75)"])]
    md = markdown(doc)
    assert "| one topic, publish alone | 30,000 (1.00) | 30,000 (0.75) |" in md
    assert "n1 0.20 (99 %)" in md and "N=4 / topics: E: x" in md
    doc["runs"]["4"]["errors"]["mixed"] = ("RuntimeError: worker 0 failed: AioRpcError: <AioRpcError of RPC that "
                                           "terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\tdetails = "
                                           "\"moving; retry.\"\n\tdebug_error_string = \"x\"\n>\nTraceback …")
    doc["runs"]["4"]["logs"] = "/tmp/pigeon-scale-n4-logs-x"
    md = markdown(doc)
    assert 'N=4 / mixed: RuntimeError: worker 0 failed: AioRpcError: <AioRpcError of RPC that terminated with: ' \
           'status = StatusCode.UNAVAILABLE details = "moving; retry."' in md, "what the error said, on its line"
    assert "N=4: the nodes' logs are kept in /tmp/pigeon-scale-n4-logs-x" in md
    assert "| other programs' CPU meanwhile, median / most (share of the machine; no efficiency) | – | – |" in md
