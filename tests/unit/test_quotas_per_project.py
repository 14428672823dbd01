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
