"""The REST/JSON API on the HTTP port, driven as curl would: plain HTTP requests with JSON bodies against a real
server. Round trips of topics, subscriptions, publish (base64 data, attributes, ordering keys), pull, ack,
modifyAckDeadline, seek, snapshots, IAM and schemas; bad input (malformed JSON, unknown fields, wrong types, bad
names, oversized bodies, unknown routes) answered in Google's JSON error shape with the right HTTP code and
nothing changed; health checks."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.e2e

P = "projects/rest"


@pytest.fixture
def http(server_factory):
    return server_factory(http=True).http


def call(base: str, method: str, path: str, body=None, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def test_health_checks(http):
    assert call(http, "GET", "/healthz") == (200, {"status": "ok"})
    assert call(http, "GET", "/readyz") == (200, {"status": "ready"})


def test_topics_subscriptions_publish_pull_ack_round_trip(http):
    topic, sub = f"{P}/topics/orders", f"{P}/subscriptions/orders-reader"
    code, t = call(http, "PUT", f"/v1/{topic}", {"labels": {"team": "a"}})
    assert code == 200 and t["name"] == topic and t["labels"] == {"team": "a"}
    assert call(http, "GET", f"/v1/{topic}")[1]["name"] == topic
    code, s = call(http, "PUT", f"/v1/{sub}", {"topic": topic, "ackDeadlineSeconds": 30,
                                               "enableMessageOrdering": True, "retainAckedMessages": True})
    assert code == 200 and s["ackDeadlineSeconds"] == 30 and s["enableMessageOrdering"] is True

    code, out = call(http, "POST", f"/v1/{topic}:publish", {"messages": [
        {"data": b64("one"), "attributes": {"k": "v"}, "orderingKey": "key-1"},
        {"data": b64("two"), "orderingKey": "key-1"}]})
    assert code == 200 and len(out["messageIds"]) == 2

    code, got = call(http, "POST", f"/v1/{sub}:pull", {"maxMessages": 10})
    msgs = got["receivedMessages"]
    assert code == 200 and [base64.b64decode(m["message"]["data"]).decode() for m in msgs] == ["one", "two"]
    assert msgs[0]["message"]["attributes"] == {"k": "v"} and msgs[0]["message"]["orderingKey"] == "key-1"
    assert msgs[0]["message"]["messageId"] == out["messageIds"][0] and "publishTime" in msgs[0]["message"]
    acks = [m["ackId"] for m in msgs]
    assert call(http, "POST", f"/v1/{sub}:modifyAckDeadline", {"ackIds": acks[1:], "ackDeadlineSeconds": 0})[0] == 200
    assert call(http, "POST", f"/v1/{sub}:acknowledge", {"ackIds": acks[:1]}) == (200, {})
    code, again = call(http, "POST", f"/v1/{sub}:pull", {"maxMessages": 10})
    assert [base64.b64decode(m["message"]["data"]).decode() for m in again["receivedMessages"]] == ["two"]
    call(http, "POST", f"/v1/{sub}:acknowledge", {"ackIds": [m["ackId"] for m in again["receivedMessages"]]})

    # seek back in time (acked messages are retained): both come again
    assert call(http, "POST", f"/v1/{sub}:seek", {"time": "2000-01-01T00:00:00Z"}) == (200, {})
    code, back = call(http, "POST", f"/v1/{sub}:pull", {"maxMessages": 10})
    assert [base64.b64decode(m["message"]["data"]).decode() for m in back["receivedMessages"]] == ["one", "two"]

    code, snap = call(http, "PUT", f"/v1/{P}/snapshots/snap-1", {"subscription": sub})
    assert code == 200 and snap["topic"] == topic
    assert call(http, "POST", f"/v1/{sub}:seek", {"snapshot": f"{P}/snapshots/snap-1"})[0] == 200
    assert [x["name"] for x in call(http, "GET", f"/v1/{P}/snapshots")[1]["snapshots"]] == [f"{P}/snapshots/snap-1"]

    # lists, with paging through query parameters
    for i in range(3):
        call(http, "PUT", f"/v1/{P}/topics/more-{i}", {})
    code, page = call(http, "GET", f"/v1/{P}/topics?pageSize=2")
    assert code == 200 and len(page["topics"]) == 2 and page["nextPageToken"]
    code, rest = call(http, "GET", f"/v1/{P}/topics?pageSize=10&pageToken={page['nextPageToken']}&alt=json")
    assert len(page["topics"]) + len(rest["topics"]) == 4
    assert call(http, "GET", f"/v1/{topic}/subscriptions")[1]["subscriptions"] == [sub]

    # update by field mask
    code, upd = call(http, "PATCH", f"/v1/{sub}", {"subscription": {"ackDeadlineSeconds": 45},
                                                    "updateMask": "ackDeadlineSeconds"})
    assert code == 200 and upd["ackDeadlineSeconds"] == 45

    # IAM
    code, pol = call(http, "GET", f"/v1/{topic}:getIamPolicy")
    assert code == 200
    code, pol = call(http, "POST", f"/v1/{topic}:setIamPolicy", {"policy": {"bindings": [
        {"role": "roles/pubsub.publisher", "members": ["user:a@example.com"]}]}})
    assert code == 200 and pol["bindings"][0]["role"] == "roles/pubsub.publisher"
    code, perms = call(http, "POST", f"/v1/{topic}:testIamPermissions", {"permissions": ["pubsub.topics.publish"]})
    assert code == 200

    assert call(http, "DELETE", f"/v1/{P}/snapshots/snap-1") == (200, {})
    assert call(http, "DELETE", f"/v1/{sub}") == (200, {})
    assert call(http, "DELETE", f"/v1/{topic}") == (200, {})
    assert call(http, "GET", f"/v1/{topic}")[0] == 404


def test_schemas(http):
    definition = json.dumps({"type": "record", "name": "R", "fields": [{"name": "n", "type": "int"}]})
    code, sc = call(http, "POST", f"/v1/{P}/schemas?schemaId=rec", {"type": "AVRO", "definition": definition})
    assert code == 200 and sc["name"] == f"{P}/schemas/rec" and sc["type"] == "AVRO"
    assert call(http, "GET", f"/v1/{P}/schemas/rec")[1]["definition"] == definition
    code, ok = call(http, "POST", f"/v1/{P}/schemas:validateMessage", {
        "name": f"{P}/schemas/rec", "message": b64(json.dumps({"n": 1})), "encoding": "JSON"})
    assert code == 200
    code, bad = call(http, "POST", f"/v1/{P}/schemas:validateMessage", {
        "name": f"{P}/schemas/rec", "message": b64("{}"), "encoding": "JSON"})
    assert code == 400 and bad["error"]["status"] == "INVALID_ARGUMENT"
    assert call(http, "GET", f"/v1/{P}/schemas/rec:listRevisions")[0] == 200
    assert call(http, "DELETE", f"/v1/{P}/schemas/rec")[0] == 200


def _error(code: int, body: dict, status: str) -> None:
    assert set(body) == {"error"}, body
    err = body["error"]
    http_code = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "NOT_FOUND": 404, "ALREADY_EXISTS": 409}[status]
    assert (code, err["code"], err["status"]) == (http_code, http_code, status), body
    assert err["message"], body


def test_bad_input_gets_googles_error_shape_and_changes_nothing(http):
    topic = f"{P}/topics/kept"
    call(http, "PUT", f"/v1/{topic}", {})
    before = call(http, "GET", f"/v1/{P}/topics")[1]

    _error(*call(http, "PUT", f"/v1/{P}/topics/new-1", raw=b"{not json"), "INVALID_ARGUMENT")
    _error(*call(http, "PUT", f"/v1/{P}/topics/new-2", {"labelz": {}}), "INVALID_ARGUMENT")  # unknown field
    _error(*call(http, "PUT", f"/v1/{P}/topics/new-3", {"labels": 7}), "INVALID_ARGUMENT")  # wrong type
    _error(*call(http, "PUT", f"/v1/{P}/topics/x", {}), "INVALID_ARGUMENT")  # a name Pub/Sub refuses
    _error(*call(http, "POST", f"/v1/{topic}:publish", {"messages": [{"data": "not base64!"}]}), "INVALID_ARGUMENT")
    _error(*call(http, "POST", f"/v1/{topic}:publish", {"messages": []}), "INVALID_ARGUMENT")
    _error(*call(http, "GET", f"/v1/{P}/topics?pageSize=many"), "INVALID_ARGUMENT")
    _error(*call(http, "GET", f"/v1/{P}/topics?colour=red"), "INVALID_ARGUMENT")  # unknown query parameter
    _error(*call(http, "GET", f"/v1/{P}/topics/missing"), "NOT_FOUND")
    _error(*call(http, "PUT", f"/v1/{topic}", {}), "ALREADY_EXISTS")
    _error(*call(http, "GET", "/v1/nothing/here"), "NOT_FOUND")
    big = json.dumps({"messages": [{"data": "A" * (17 * 1024 * 1024)}]}).encode()
    _error(*call(http, "POST", f"/v1/{topic}:publish", raw=big), "INVALID_ARGUMENT")

    assert call(http, "GET", f"/v1/{P}/topics")[1] == before, "nothing changed"
    assert call(http, "GET", "/healthz")[0] == 200, "the server keeps serving"


def test_monitoring_figures_count_known_traffic(http):
    """pigeon.v1.Monitoring over REST (what the console shows): 10 published, 4 acked → 6 unacked."""
    topic, sub = f"{P}/topics/counted", f"{P}/subscriptions/counted-reader"
    call(http, "PUT", f"/v1/{topic}", {})
    call(http, "PUT", f"/v1/{sub}", {"topic": topic, "deadLetterPolicy": {"deadLetterTopic": topic}})
    call(http, "POST", f"/v1/{topic}:publish", {"messages": [{"data": b64(f"m{i}")} for i in range(10)]})
    got = call(http, "POST", f"/v1/{sub}:pull", {"maxMessages": 10})[1]["receivedMessages"]
    assert len(got) == 10
    call(http, "POST", f"/v1/{sub}:acknowledge", {"ackIds": [m["ackId"] for m in got[:4]]})

    code, stats = call(http, "GET", f"/v1/{P}/subscriptionStats")
    s = next(x for x in stats["subscriptions"] if x["name"] == sub)
    assert code == 200 and s["topic"] == topic and s["deadLetterTopic"] == topic
    assert (s["numUndeliveredMessages"], s["numOutstandingMessages"], s["sentMessages"], s["ackedMessages"]) == \
        ("6", "6", "10", "4")
    assert s["oldestUnackedMessageAgeSeconds"] >= 0
    t = next(x for x in call(http, "GET", f"/v1/{P}/topicStats")[1]["topics"] if x["name"] == topic)
    assert (t["messages"], t["publishRequests"], t["subscriptions"]) == ("10", "1", 1)
    assert P in call(http, "GET", "/v1/projects")[1]["projects"]
    assert call(http, "GET", "/v1/cluster")[1]["bundles"] >= 1
    first = call(http, "GET", f"/v1/{P}/subscriptionStats?pageSize=1")[1]
    assert len(first["subscriptions"]) == 1 and first["nextPageToken"] == first["subscriptions"][0]["name"]
    _error(*call(http, "GET", f"/v1/{P}/subscriptionStats?pageSize=100000"), "INVALID_ARGUMENT")
    _error(*call(http, "GET", "/v1/projects/bad%20name/topicStats"), "INVALID_ARGUMENT")


def test_queue_extensions_over_rest(http):
    """pigeon.v1.Queue's routes (take, peek, ack, delete, kick): messages in JSON as Pull shows them."""
    topic, sub = f"{P}/topics/jobs", f"{P}/subscriptions/jobs-queue"
    call(http, "PUT", f"/v1/{topic}", {})
    call(http, "PUT", f"/v1/{sub}", {"topic": topic})
    ids = call(http, "POST", f"/v1/{topic}:publish", {"messages": [
        {"data": b64("one"), "attributes": {"k": "v"}}, {"data": b64("two")}, {"data": b64("three")}]})[1]["messageIds"]

    code, peeked = call(http, "GET", f"/v1/{sub}/messages/{ids[0]}")
    assert code == 200 and peeked["state"] == "active"
    assert base64.b64decode(peeked["message"]["data"]) == b"one" and peeked["message"]["attributes"] == {"k": "v"}
    assert call(http, "POST", f"/v1/{sub}:deleteMessages", {"messageIds": [ids[1]]}) == (200, {"deleted": 1})
    code, taken = call(http, "POST", f"/v1/{sub}:take", {"maxMessages": 10, "lockSeconds": 60})
    got = [(base64.b64decode(t["message"]["data"]), t["message"]["messageId"]) for t in taken["messages"]]
    assert code == 200 and got == [(b"one", ids[0]), (b"three", ids[2])]
    acks = [t["ackId"] for t in taken["messages"]]
    assert call(http, "POST", f"/v1/{sub}:bury", {"ackIds": acks[1:]}) == (200, {"buried": 1})
    assert call(http, "POST", f"/v1/{sub}:ack", {"ackIds": acks[:1]}) == (200, {"acked": 1})
    assert call(http, "POST", f"/v1/{sub}:kick", {}) == (200, {"kicked": 1})
    assert call(http, "GET", f"/v1/{sub}/messages/{ids[0]}")[1]["state"] == "acked"

    _error(*call(http, "GET", f"/v1/{sub}/messages/12345"), "NOT_FOUND")
    _error(*call(http, "POST", f"/v1/{sub}:ack", {"ackIds": acks[:1]}), "FAILED_PRECONDITION")  # not the lock now
    _error(*call(http, "GET", f"/v1/{topic}/shards/first:read"), "INVALID_ARGUMENT")  # shard is a number
    code, offsets = call(http, "GET", f"/v1/{topic}:latestOffsets")
    assert code == 200 and sum(int(s.get("latest", 0)) for s in offsets["shards"]) == 3
    code, read = call(http, "GET", f"/v1/{topic}/shards/0:read")
    assert code == 200 and "nextOffset" in read
