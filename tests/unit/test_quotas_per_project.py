"""ops.quotas: each project's buckets and windows are its own; a refusal names the quota and when to retry, and charges
nothing."""

import pytest

from pigeon.core.errors import QuotaExceeded
from pigeon.ops.quotas import ProjectQuotas


def test_publish_throughput_is_a_bucket_per_project_refilled_at_its_rate():
    q = ProjectQuotas(publish_bytes_per_s=10_000, admin_ops_per_min=0, backlog_bytes=0)  # a bucket of 1,000 B
    q.publish("a", 600, now=10.0)
    with pytest.raises(QuotaExceeded) as e:
        q.publish("a", 600, now=10.0)  # 400 left
    assert e.value.retry_after_s() == pytest.approx(0.1)  # 20 ms would do; the floor keeps refusals few
    assert e.value.quota_violations()[0][0] == "projects/a"
    q.publish("b", 900, now=10.0)  # another project: its own bucket
    q.publish("a", 600, now=10.03)  # 300 B refilled in 30 ms: 600 fit
    assert q.published_bytes == {"a": 1200, "b": 900}
    assert q.refused[("a", "publish-bytes-per-second")] == 1
    # flat out for 10 s at 100 B a call: what passes is the rate (and one bucket), not a burst per window
    passed, t = 0, 20.0
    while t < 30.0:
        try:
            q.publish("c", 100, now=t)
            passed += 100
        except QuotaExceeded:
            pass
        t += 0.001
    assert 100_000 <= passed <= 100_000 + 1_000 + 100


def test_a_request_larger_than_the_bucket_passes_when_it_is_full_and_is_paid_back():
    q = ProjectQuotas(publish_bytes_per_s=1000, admin_ops_per_min=0, backlog_bytes=0)  # a bucket of 100 B
    q.publish("a", 5000, now=0.0)
    with pytest.raises(QuotaExceeded) as e:
        q.publish("a", 1, now=1.0)  # 4,000 B still owed
    assert e.value.retry_after_s() == pytest.approx(3.901)  # (100 B of a full bucket + 3,900 owed) ÷ 1,000 B/s
    q.publish("a", 1, now=5.0)


def test_admin_operations_and_backlog():
    q = ProjectQuotas(publish_bytes_per_s=0, admin_ops_per_min=2, backlog_bytes=1000)
    q.admin("a", 0.0)
    q.admin("a", 1.0)
    with pytest.raises(QuotaExceeded, match="admin-operations-per-minute"):
        q.admin("a", 2.0)
    q.admin("a", 60.0)
    q.measured({"a": 2000, "b": 10})
    with pytest.raises(QuotaExceeded, match="backlog-bytes"):
        q.publish("a", 1, 61.0)
    q.publish("b", 1, 61.0)


def test_the_boundary_carries_quota_failure_and_retry_info():
    from google.rpc import error_details_pb2, status_pb2

    from pigeon.api.errors import grpc_status, http_error
    from pigeon.core.errors import LimitExceeded

    code, _, trailers = grpc_status(QuotaExceeded("p", "publish-bytes-per-second", 10, "bytes per second", 0.25))
    st = status_pb2.Status.FromString(dict(trailers)["grpc-status-details-bin"])
    assert code.name == "RESOURCE_EXHAUSTED" and [d.type_url.rsplit(".", 1)[1] for d in st.details] == [
        "QuotaFailure", "RetryInfo"]
    retry = error_details_pb2.RetryInfo()
    st.details[1].Unpack(retry)
    assert retry.retry_delay.ToMilliseconds() == 250
    status, body = http_error(LimitExceeded("Your project has exceeded a limit", "projects/p"))
    assert status == 429 and body["error"]["details"] == [{
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{"subject": "projects/p", "description": "Your project has exceeded a limit"}]}]


def _flat_out(q: ProjectQuotas, project: str, start: float, seconds: float, call: int = 100) -> int:
    """Bytes that pass while a node's callers publish `call` bytes every millisecond."""
    passed, t = 0, start
    while t < start + seconds:
        try:
            q.publish(project, call, now=t)
            passed += call
        except QuotaExceeded:
            pass
        t += 0.001
    return passed


def test_a_cluster_shares_each_projects_quota_out_by_what_each_node_was_asked():
    """Three nodes, one project's 10,000 B/s: the two whose callers publish flat out share it; the third, asked
    nothing, keeps a floor for its callers' first calls; a project nobody asked about gets equal shares."""
    nodes = [ProjectQuotas(publish_bytes_per_s=10_000, admin_ops_per_min=60, backlog_bytes=0) for _ in range(3)]
    passed = [0, 0, 0]
    t = 100.0
    empty = [q.report() for q in nodes]  # the first exchange, as the nodes start: nobody asked anything yet
    for i, q in enumerate(nodes):
        q.share_out(empty[i], empty[:i] + empty[i + 1:])
    for _ in range(10):  # ten exchanges, a second apart, the two busy nodes asked the same
        for i in (0, 1):
            passed[i] += _flat_out(nodes[i], "p", t, 1.0)
        reports = [q.report() for q in nodes]
        for i, q in enumerate(nodes):
            q.share_out(reports[i], reports[:i] + reports[i + 1:])
        t += 1.0
    assert nodes[0].shares["p"][0] == pytest.approx(0.5) and nodes[1].shares["p"][0] == pytest.approx(0.5)
    assert nodes[2].shares["p"][0] == pytest.approx(1 / 12), "the floor: a quarter of an equal share"
    # the cluster passed the project's quota (and a bucket each), not a node's each: 2 × 100,000 without sharing
    assert sum(passed) <= 10 * 10_000 + 2 * 1_000
    assert min(passed[:2]) >= 0.4 * sum(passed[:2]), "equal callers, equal shares"
    assert nodes[2].default_share == pytest.approx(1 / 3)  # a project nobody reported
    assert nodes[0]._share("other", 0) == pytest.approx(1 / 3)


def test_a_node_refused_asks_for_more_and_a_lone_node_holds_the_whole_quota():
    a, b = (ProjectQuotas(publish_bytes_per_s=10_000, admin_ops_per_min=0, backlog_bytes=0) for _ in range(2))
    a.publish("p", 5_000, now=1.0)
    ra, rb = a.report(), b.report()
    a.share_out(ra, [rb])
    b.share_out(rb, [ra])
    # a asked for half the quota and gets it, b nothing; the other half is split between them
    assert (a.shares["p"][0], b.shares["p"][0]) == (0.75, 0.25)
    _flat_out(b, "p", 2.0, 1.0)  # b's callers now ask, and are mostly refused: what they asked still counts
    ra, rb = a.report(), b.report()
    assert rb["p"][0] >= 100 * 999  # every call asked, passed or not
    b.share_out(rb, [ra])
    assert b.shares["p"][0] == 1.0, "a asked nothing this second: b holds it all"
    a.publish("p", 20_000, now=3.0)  # a asks for twice the quota, b for ten times: an equal part each
    _flat_out(b, "p", 3.0, 1.0)
    ra, rb = a.report(), b.report()
    a.share_out(ra, [rb])
    b.share_out(rb, [ra])
    assert (a.shares["p"][0], b.shares["p"][0]) == (0.5, 0.5)
    alone = ProjectQuotas(publish_bytes_per_s=10_000, admin_ops_per_min=0, backlog_bytes=0)
    alone.share_out(alone.report(), [])
    assert alone.default_share == 1.0


def test_admin_operations_and_backlog_are_the_clusters_too():
    a, b = (ProjectQuotas(publish_bytes_per_s=0, admin_ops_per_min=10, backlog_bytes=1_000) for _ in range(2))
    for _ in range(3):
        a.admin("p", now=0.0)
    b.admin("p", now=0.0)
    ra, rb = a.report(), b.report()
    a.share_out(ra, [rb])
    assert a.shares["p"][1] == pytest.approx(0.5)  # both asked for more than a second's part: halves
    for _ in range(2):  # 5 of the minute's 10 are a's
        a.admin("p", now=1.0)
    with pytest.raises(QuotaExceeded) as e:
        a.admin("p", now=1.0)
    assert "limit 10 operations per minute" in str(e.value)  # the client is told the project's quota
    b.measured({"p": 800})
    a.measured({"p": 300})
    a.share_out(a.report(), [b.report()])
    with pytest.raises(QuotaExceeded):  # 300 here + 800 there > 1,000
        a.publish("p", 1, now=2.0)


def test_a_report_names_the_busiest_projects_only():
    from pigeon.core import limits

    q = ProjectQuotas(publish_bytes_per_s=10**9, admin_ops_per_min=0, backlog_bytes=0)
    for i in range(limits.quota_report_projects_max + 1):
        q.publish(f"p{i}", 10 + i, now=1.0)
    report = q.report()
    assert len(report) == limits.quota_report_projects_max and "p0" not in report and report["p1"][0] == 11
    assert q.report() == {}, "counted anew after each report"


def test_a_report_that_cannot_be_read_changes_nothing():
    q = ProjectQuotas(publish_bytes_per_s=10_000, admin_ops_per_min=0, backlog_bytes=0)
    q.publish("p", 5_000, now=1.0)
    own = q.report()
    q.share_out(own, [{"p": [0, 0, 0]}])
    before = (dict(q.shares), q.default_share, dict(q.elsewhere_backlog))
    with pytest.raises((IndexError, TypeError, ValueError)):
        q.share_out(own, [{"p": [1]}])  # (another version's shape)
    assert (q.shares, q.default_share, q.elsewhere_backlog) == before
