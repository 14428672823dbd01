"""`pigeon backup` / `pigeon restore` (docs/operations.md, "Backup and restore"): a node loaded with every kind of
resource and some unacknowledged messages is backed up with the real command, restored into a fresh node, and
compared through the API's own answers; with --data every message a subscription had not acknowledged is
delivered by the restored node, and none it had acknowledged."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from google.cloud import pubsub_v1
from google.iam.v1 import policy_pb2
from google.protobuf import json_format
from google.pubsub_v1 import types

from e2e_helpers import E2E_MARKS, close_clients, collect, pull_now

pytestmark = E2E_MARKS

P = "projects/backup"
AVRO = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]})
AVRO2 = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"},
                                                                  {"name": "n", "type": "int", "default": 0}]})
CAN_DIFFER = {"revisionId", "revisionCreateTime", "etag", "expireTime"}  # numbered or stamped by the server


def _pigeon(*args: str, address: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pigeon", *args, "--address", address], capture_output=True,
                          text=True, timeout=120)


def _clients(monkeypatch, node):
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", node.address)
    return pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient(), pubsub_v1.SchemaServiceClient()


def _load(pub, sub, schemas) -> dict[str, set[bytes]]:
    """Every kind of resource, and messages: returns each subscription's unacknowledged data."""
    schema = f"{P}/schemas/order"
    first = schemas.create_schema(parent=P, schema_id="order", schema={"type_": "AVRO", "definition": AVRO})
    second = schemas.commit_schema(name=schema, schema={"name": schema, "type_": "AVRO", "definition": AVRO2})
    pub.create_topic(request={"name": f"{P}/topics/orders", "labels": {"team": "shop"},
                              "message_retention_duration": {"seconds": 3600}})
    pub.create_topic(request={"name": f"{P}/topics/typed", "schema_settings": {
        "schema": schema, "encoding": "JSON", "first_revision_id": first.revision_id,
        "last_revision_id": second.revision_id}})
    pub.create_topic(name=f"{P}/topics/dead")
    sub.create_subscription(request={"name": f"{P}/subscriptions/all", "topic": f"{P}/topics/orders",
                                     "ack_deadline_seconds": 30, "enable_message_ordering": True})
    sub.create_subscription(request={"name": f"{P}/subscriptions/europe", "topic": f"{P}/topics/orders",
                                     "filter": 'attributes.region = "eu"', "dead_letter_policy": {
                                         "dead_letter_topic": f"{P}/topics/dead", "max_delivery_attempts": 5},
                                     "retry_policy": {"minimum_backoff": {"seconds": 1}}})
    sub.create_subscription(name=f"{P}/subscriptions/dead-sub", topic=f"{P}/topics/dead")
    sub.create_subscription(name=f"{P}/subscriptions/typed-sub", topic=f"{P}/topics/typed")
    for i in range(12):
        pub.publish(f"{P}/topics/orders", f"o{i}".encode(), region="eu" if i % 2 else "us",
                    ordering_key="").result(timeout=30)
    pub.publish(f"{P}/topics/typed", b'{"id": "t1"}').result(timeout=30)
    # "all" acknowledges its first 5 messages, "europe" (the odd ones) 2; the rest stays unacknowledged
    collect(sub, f"{P}/subscriptions/all", 5, max_messages=5)
    collect(sub, f"{P}/subscriptions/europe", 2, max_messages=2)
    sub.create_snapshot(request={"name": f"{P}/snapshots/before", "subscription": f"{P}/subscriptions/all",
                                 "labels": {"why": "test"}})
    policy = policy_pb2.Policy(bindings=[policy_pb2.Binding(role="roles/pubsub.subscriber",
                                                            members=["user:ann@example.com"])])
    sub.set_iam_policy(request={"resource": f"{P}/subscriptions/all", "policy": policy})
    pub.set_iam_policy(request={"resource": f"{P}/topics/orders", "policy": policy})
    return _unacked(sub)


def _unacked(sub) -> dict[str, set[bytes]]:
    """Each subscription's messages now (pulled, then handed back at once: nothing is acknowledged)."""
    out = {}
    for name in ("all", "europe", "dead-sub", "typed-sub"):
        got: dict = {}
        received = pull_now(sub, f"{P}/subscriptions/{name}")
        while received:
            got.update({r.message.message_id: r for r in received})
            received = pull_now(sub, f"{P}/subscriptions/{name}")
        if got:
            sub.modify_ack_deadline(subscription=f"{P}/subscriptions/{name}", ack_ids=[r.ack_id for r in got.values()],
                                    ack_deadline_seconds=0)
        out[name] = {r.message.data for r in got.values()}
    return out


def _described(pub, sub, schemas) -> dict:
    """What the API says of every resource, with what cannot be equal after a restore left out."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in CAN_DIFFER}
        return [clean(v) for v in x] if isinstance(x, list) else x

    def js(m):
        return clean(json_format.MessageToDict(type(m).pb(m) if hasattr(type(m), "pb") else m))

    revisions = [list(schemas.list_schema_revisions(request={"name": s.name, "view": "FULL"}))
                 for s in schemas.list_schemas(request={"parent": P})]
    # a restore numbers revisions anew: a topic's revision ids are compared by which revision they name
    which = {r.revision_id: f"{r.name} revision {len(revs) - i}" for revs in revisions for i, r in enumerate(revs)}
    topics = [js(t) for t in pub.list_topics(project=P)]
    for t in topics:
        t.get("schemaSettings", {}).update({k: which[v] for k, v in t.get("schemaSettings", {}).items()
                                            if k.endswith("RevisionId")})
    out = {"topics": topics,
           "subscriptions": [js(sub.get_subscription(subscription=s.name)) for s in sub.list_subscriptions(project=P)],
           "schemas": [[js(r) for r in revs] for revs in revisions],
           "snapshots": [js(s) for s in sub.list_snapshots(project=P)]}
    out["iam"] = {name: js(client.get_iam_policy(request={"resource": name}))
                  for name, client in [(t["name"], pub) for t in out["topics"]] +
                  [(s["name"], sub) for s in out["subscriptions"] + out["snapshots"]]}
    return out


def test_a_backup_restored_into_a_fresh_node_answers_alike_with_every_unacked_message(server_factory, tmp_path,
                                                                                      monkeypatch):
    old = server_factory()
    pub, sub, schemas = _clients(monkeypatch, old)
    try:
        unacked = _load(pub, sub, schemas)
        before = _described(pub, sub, schemas)
    finally:
        close_clients(pub, sub)
    assert unacked["all"] and unacked["europe"] and unacked["typed-sub"], unacked
    assert len(before["iam"]["projects/backup/topics/orders"]["bindings"]) == 1 and before["snapshots"]
    assert len(before["schemas"][0]) == 2 and len(before["subscriptions"]) == 4, before
    out = _pigeon("backup", "--to", str(tmp_path / "b"), "--data", address=old.address)
    assert out.returncode == 0, out.stderr

    new = server_factory()
    out = _pigeon("restore", "--from", str(tmp_path / "b"), address=new.address)
    assert out.returncode == 0, out.stderr
    pub, sub, schemas = _clients(monkeypatch, new)
    try:
        after = _described(pub, sub, schemas)
        for kind in before:  # field by field, kind by kind: a difference names its resource
            assert after[kind] == before[kind], kind
        assert _unacked(sub) == unacked
        # (the snapshot holds the restored backlog of "all": seeking to it brings the same messages back)
        sub.seek(request={"subscription": f"{P}/subscriptions/all", "snapshot": f"{P}/snapshots/before"})
        assert {r.message.data for r in pull_now(sub, f"{P}/subscriptions/all")} == unacked["all"]
    finally:
        close_clients(pub, sub)

    again = _pigeon("restore", "--from", str(tmp_path / "b"), address=new.address)
    assert again.returncode == 2 and "not empty" in again.stderr, again.stderr
    missing = _pigeon("restore", "--from", str(tmp_path / "nothing"), address=new.address)
    assert missing.returncode == 2 and "holds no backup" in missing.stderr, missing.stderr
