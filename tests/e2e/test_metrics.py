"""/metrics against known traffic: 10 published and 4 acked leave 6 undelivered; the topic counts 10 messages in
the requests it stored; the journal's fsync histogram and the publish latency counted what happened; the page
parses as Prometheus' text format."""

from __future__ import annotations

import base64
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_rest import call

pytestmark = pytest.mark.e2e

P = "projects/metrics"


def scrape(base: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_count_known_traffic(server_factory):
    http = server_factory(http=True).http
    topic, sub = f"{P}/topics/counted", f"{P}/subscriptions/counted-reader"
    call(http, "PUT", f"/v1/{topic}", {})
    call(http, "PUT", f"/v1/{sub}", {"topic": topic})
    for batch in (4, 6):
        msgs = [{"data": base64.b64encode(b"m%d" % i).decode()} for i in range(batch)]
        assert call(http, "POST", f"/v1/{topic}:publish", {"messages": msgs})[0] == 200
    got = call(http, "POST", f"/v1/{sub}:pull", {"maxMessages": 4})[1]["receivedMessages"]
    assert len(got) == 4
    call(http, "POST", f"/v1/{sub}:acknowledge", {"ackIds": [m["ackId"] for m in got]})

    m = scrape(http)
    s = (("subscription", sub),)
    assert m[("pigeon_subscription_num_undelivered_messages", s)] == 6
    assert m[("pigeon_subscription_ack_message_count_total", s)] == 4
    assert m[("pigeon_subscription_sent_message_count_total", s)] == 4
    assert m[("pigeon_subscription_num_outstanding_messages", s)] == 0
    assert m[("pigeon_subscription_oldest_unacked_message_age_seconds", s)] >= 0
    t = (("topic", topic),)
    assert m[("pigeon_topic_send_message_count_total", t)] == 10
    assert m[("pigeon_topic_send_request_count_total", t)] == 2
    assert m[("pigeon_topics", ())] == 1 and m[("pigeon_subscriptions", ())] == 1
    assert m[("pigeon_undelivered_messages", ())] == 6
    assert m[("pigeon_publish_latency_seconds_count", ())] == 2
    assert m[("pigeon_fsync_seconds_count", ())] >= 1
    assert m[("pigeon_metrics_series_omitted", (("kind", "subscription"),))] == 0

    time.sleep(1.1)  # the event loop's lag is measured every half second
    assert ("pigeon_event_loop_lag_seconds", ()) in scrape(http)


def test_per_subscription_series_are_bounded_to_the_largest_backlogs(server_factory):
    http = server_factory(http=True, env={"PIGEON_METRICS_TOP": "1"}).http
    topic = f"{P}/topics/many"
    call(http, "PUT", f"/v1/{topic}", {})
    for name in ("small", "large"):
        call(http, "PUT", f"/v1/{P}/subscriptions/{name}", {"topic": topic})
    call(http, "POST", f"/v1/{topic}:publish", {"messages": [{"data": "eA=="}] * 3})
    got = call(http, "POST", f"/v1/{P}/subscriptions/small:pull", {"maxMessages": 3})[1]["receivedMessages"]
    call(http, "POST", f"/v1/{P}/subscriptions/small:acknowledge", {"ackIds": [m["ackId"] for m in got]})
    m = scrape(http)
    shown = {dict(k[1])["subscription"] for k in m if k[0] == "pigeon_subscription_num_undelivered_messages"}
    assert shown == {f"{P}/subscriptions/large"}
    assert m[("pigeon_metrics_series_omitted", (("kind", "subscription"),))] == 1
    assert m[("pigeon_undelivered_messages", ())] == 3, "every subscription still counts in the sums"


def test_the_grafana_dashboard_asks_for_metrics_the_node_exports(server_factory, tmp_path):
    import json
    import re
    from pathlib import Path


    dash = json.loads((Path(__file__).parents[2] / "docs" / "grafana" / "pigeon-dashboard.json").read_text())
    asked = {name for p in dash["panels"] for t in p["targets"] for name in re.findall(r"pigeon_\w+", t["expr"])}
    http = server_factory(http=True).http
    call(http, "PUT", f"/v1/{P}/topics/dash", {})
    call(http, "PUT", f"/v1/{P}/subscriptions/dash-reader", {"topic": f"{P}/topics/dash"})
    call(http, "POST", f"/v1/{P}/topics/dash:publish", {"messages": [{"data": "eA==", "orderingKey": "k"}]})
    exported = {k[0] for k in scrape(http)}  # (a family shows once it has a series: some traffic first)
    cluster_only = {n for n in asked if n.startswith("pigeon_cluster_")}
    assert asked - cluster_only <= exported, sorted(asked - cluster_only - exported)
    assert cluster_only == {"pigeon_cluster_bundles_owned", "pigeon_cluster_under_replicated_ledgers",
                            "pigeon_cluster_ledger_rolls_total", "pigeon_cluster_nodes",
                            "pigeon_cluster_ledgers_below_replicas", "pigeon_cluster_etcd_reachable"}


def test_ack_latency_hot_keys_and_group_commit_sizes(server_factory):
    http = server_factory(http=True).http
    topic, sub = f"{P}/topics/keyed", f"{P}/subscriptions/keyed-reader"
    call(http, "PUT", f"/v1/{topic}", {})
    call(http, "PUT", f"/v1/{sub}", {"topic": topic})
    for key, requests, size in (("hot", 3, 5), ("cold", 1, 1)):
        for _ in range(requests):
            msgs = [{"data": base64.b64encode(b"x").decode(), "orderingKey": key}] * size
            assert call(http, "POST", f"/v1/{topic}:publish", {"messages": msgs})[0] == 200
    for _ in range(16):  # one message a pull: the 16th batch handed out is the sampled one
        got = call(http, "POST", f"/v1/{sub}:pull", {"maxMessages": 1})[1]["receivedMessages"]
        call(http, "POST", f"/v1/{sub}:acknowledge", {"ackIds": [m["ackId"] for m in got]})

    m = scrape(http)
    assert m[("pigeon_subscription_ack_latency_seconds_count", ())] == 1
    assert m[("pigeon_subscription_ack_latency_seconds_sum", ())] >= 0
    keyed = lambda k: ("pigeon_topic_ordering_key_message_count_total", (("ordering_key", k), ("topic", topic)))  # noqa: E731
    assert (m[keyed("hot")], m[keyed("cold")]) == (15, 1)
    assert m[("pigeon_group_commit_size_entries_count", ())] == m[("pigeon_group_commits_total", ())] > 0
    assert m[("pigeon_group_commit_size_entries_sum", ())] == m[("pigeon_group_commit_entries_total", ())]
