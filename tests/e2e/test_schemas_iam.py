"""SchemaService and IAM policies through the official clients against the real server."""

import json
import time

import pytest
from google.api_core import exceptions
from google.cloud.pubsub import SchemaServiceClient
from google.iam.v1 import policy_pb2
from google.pubsub_v1 import PublisherClient as GapicPublisher
from google.pubsub_v1 import types

pytestmark = pytest.mark.e2e

AVRO = json.dumps({
    "type": "record", "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
})
PROTO = 'syntax = "proto3";\nmessage Order {\n  int64 id = 1;\n  string item = 2;\n}\n'


def _pull_one(sub, subscription):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = sub.pull(subscription=subscription, max_messages=1, timeout=10).received_messages
        if got:
            return got[0]
    raise AssertionError("nothing delivered")


def test_topic_with_avro_schema_rejects_invalid_messages(clients):
    pub, sub = clients
    schemas = SchemaServiceClient()
    schema = schemas.create_schema(parent="projects/proj", schema_id="order-avro",
                                   schema=types.Schema(type_=types.Schema.Type.AVRO, definition=AVRO))
    assert schema.revision_id and schema.definition == AVRO
    topic = pub.topic_path("proj", "orders-avro")
    pub.create_topic(request={"name": topic, "schema_settings": {"schema": schema.name,
                                                                   "encoding": types.Encoding.JSON}})
    subscription = sub.subscription_path("proj", "orders-avro-sub")
    sub.create_subscription(name=subscription, topic=topic)

    pub.publish(topic, json.dumps({"id": 7, "item": "tea"}).encode()).result(timeout=10)
    with pytest.raises(exceptions.InvalidArgument):
        GapicPublisher().publish(topic=topic, messages=[types.PubsubMessage(data=b'{"id": "seven"}')])
    m = _pull_one(sub, subscription)
    assert json.loads(m.message.data) == {"id": 7, "item": "tea"}
    assert m.message.attributes["googclient_schemaname"] == schema.name
    assert m.message.attributes["googclient_schemaencoding"] == "JSON"
    assert m.message.attributes["googclient_schemarevisionid"] == schema.revision_id


def test_schema_revisions_commit_rollback_delete(clients):
    schemas = SchemaServiceClient()
    first = schemas.create_schema(parent="projects/proj", schema_id="order-proto",
                                  schema=types.Schema(type_=types.Schema.Type.PROTOCOL_BUFFER, definition=PROTO))
    second_def = PROTO.replace("string item = 2;", "string item = 2;\n  bool paid = 3;")
    second = schemas.commit_schema(name=first.name, schema=types.Schema(
        type_=types.Schema.Type.PROTOCOL_BUFFER, definition=second_def))
    assert second.revision_id != first.revision_id
    revisions = list(schemas.list_schema_revisions(request={"name": first.name, "view": types.SchemaView.FULL}))
    assert [r.revision_id for r in revisions] == [second.revision_id, first.revision_id]  # newest first
    back = schemas.rollback_schema(name=first.name, revision_id=first.revision_id)
    assert back.definition == PROTO and back.revision_id not in (first.revision_id, second.revision_id)
    assert schemas.get_schema(name=first.name).revision_id == back.revision_id
    basic = schemas.get_schema(request={"name": first.name, "view": types.SchemaView.BASIC})
    assert basic.definition == ""
    schemas.delete_schema_revision(name=f"{first.name}@{second.revision_id}")
    assert len(list(schemas.list_schema_revisions(name=first.name))) == 2
    with pytest.raises(exceptions.InvalidArgument):
        schemas.commit_schema(name=first.name, schema=types.Schema(
            type_=types.Schema.Type.PROTOCOL_BUFFER, definition="message A {} message B {}"))
    order = bytes([0x08, 0x07, 0x12, 0x03]) + b"tea"
    schemas.validate_message(request={"parent": "projects/proj", "name": first.name, "message": order,
                                      "encoding": types.Encoding.BINARY})
    with pytest.raises(exceptions.InvalidArgument):
        schemas.validate_message(request={"parent": "projects/proj", "name": first.name, "message": b"\xff\xff",
                                          "encoding": types.Encoding.BINARY})
    schemas.delete_schema(name=first.name)
    with pytest.raises(exceptions.NotFound):
        schemas.get_schema(name=first.name)


def test_iam_policy_round_trip_and_test_permissions(clients):
    pub, sub = clients
    topic = pub.topic_path("proj", "iam-topic")
    pub.create_topic(name=topic)
    # no policy yet: the server is open
    assert list(pub.test_iam_permissions(request={"resource": topic, "permissions": [
        "pubsub.topics.publish", "pubsub.subscriptions.consume"]}).permissions) == ["pubsub.topics.publish"]
    policy = policy_pb2.Policy(bindings=[policy_pb2.Binding(role="roles/pubsub.viewer", members=["allUsers"])])
    stored = pub.set_iam_policy(request={"resource": topic, "policy": policy})
    assert stored.etag
    got = pub.get_iam_policy(request={"resource": topic})
    assert got.etag == stored.etag
    assert [(b.role, list(b.members)) for b in got.bindings] == [("roles/pubsub.viewer", ["allUsers"])]
    # Authentication is off: the caller may do everything, whatever the stored policy names (Google's samples
    # check_topic_permissions / check_subscription_permissions ask exactly this).
    granted = pub.test_iam_permissions(request={"resource": topic, "permissions": [
        "pubsub.topics.publish", "pubsub.topics.update"]}).permissions
    assert list(granted) == ["pubsub.topics.publish", "pubsub.topics.update"]
    with pytest.raises(exceptions.InvalidArgument, match="pubsub.topics.fly is not valid"):
        pub.test_iam_permissions(request={"resource": topic, "permissions": ["pubsub.topics.fly"]})
    with pytest.raises(exceptions.InvalidArgument, match="wildcards"):
        pub.test_iam_permissions(request={"resource": topic, "permissions": ["pubsub.topics.*"]})
    stale = policy_pb2.Policy(bindings=policy.bindings, etag=b"\x00\x00\x00\x01")
    with pytest.raises(exceptions.Aborted):
        pub.set_iam_policy(request={"resource": topic, "policy": stale})
    with pytest.raises(exceptions.NotFound):
        pub.get_iam_policy(request={"resource": pub.topic_path("proj", "no-such-topic")})
