"""Structured logs: with --log-format json every line the server writes is one JSON object (time, level, logger,
message), and each administrative change gets exactly one line once it is durable — never one per message."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_rest import call

pytestmark = pytest.mark.e2e

P = "projects/logs"


def test_json_lines_and_one_line_per_change(server_factory):
    srv = server_factory(http=True, extra=["--log-format", "json"])
    topic, sub = f"{P}/topics/logged", f"{P}/subscriptions/logged-reader"
    call(srv.http, "PUT", f"/v1/{topic}", {})
    call(srv.http, "PUT", f"/v1/{sub}", {"topic": topic})
    call(srv.http, "POST", f"/v1/{topic}:publish", {"messages": [{"data": "eA=="}] * 50})
    call(srv.http, "PATCH", f"/v1/{sub}", {"subscription": {"ackDeadlineSeconds": 30},
                                           "updateMask": "ackDeadlineSeconds"})
    call(srv.http, "DELETE", f"/v1/{sub}")
    call(srv.http, "DELETE", f"/v1/{topic}")
    srv.stop()
    lines = [ln for ln in open(srv.log_path).read().splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines if ln.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert len(records) == len([ln for ln in lines if not ln.startswith("pigeon: listening")]), \
        "every log line is JSON"
    changes = [r["message"] for r in records if r["message"].startswith("change: ")]
    assert changes == [f"change: topic {topic} created", f"change: subscription {sub} created",
                       f"change: subscription {sub} updated", f"change: subscription {sub} deleted",
                       f"change: topic {topic} deleted"]
