"""ops.quotas: each project's windows are its own; a refusal names the quota and when to retry, and charges
nothing."""

import pytest

from pigeon.core.errors import QuotaExceeded
from pigeon.ops.quotas import ProjectQuotas


def test_publish_throughput_is_metered_per_project_per_window():
    q = ProjectQuotas(publish_bytes_per_s=1000, admin_ops_per_min=0, backlog_bytes=0)
    q.publish("a", 600, now=10.0)
    with pytest.raises(QuotaExceeded) as e:
        q.publish("a", 600, now=10.5)
    assert e.value.retry_after_s() == pytest.approx(0.5)
    assert e.value.quota_violations()[0][0] == "projects/a"
    q.publish("b", 900, now=10.5)  # another project: its own window
    q.publish("a", 600, now=11.0)  # the next window
    assert q.published_bytes == {"a": 1200, "b": 900}
    assert q.refused[("a", "publish-bytes-per-second")] == 1


def test_a_request_larger_than_the_window_passes_in_a_fresh_window():
    q = ProjectQuotas(publish_bytes_per_s=100, admin_ops_per_min=0, backlog_bytes=0)
    q.publish("a", 5000, now=0.0)
    with pytest.raises(QuotaExceeded):
        q.publish("a", 1, now=0.1)


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
