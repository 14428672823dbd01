"""The REST layer's pure parts: routes derived from the annotations (every Publisher, Subscriber and SchemaService
method but the streaming one, IAM on each resource kind), path templates, the OpenAPI paths, and the publish fast
path giving exactly the request the general JSON mapping gives — or leaving the body to it."""

from __future__ import annotations

import json
import re

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.api import rest, rest_openapi, rest_routes
from pigeon.core import names
from pigeon.core.errors import InvalidArgument


def test_every_unary_method_has_a_route():
    rpcs = {r.rpc for r in rest_routes.routes()}
    for method in ("CreateTopic", "UpdateTopic", "Publish", "GetTopic", "ListTopics", "ListTopicSubscriptions",
                   "ListTopicSnapshots", "DeleteTopic", "DetachSubscription"):
        assert f"/google.pubsub.v1.Publisher/{method}" in rpcs
    for method in ("CreateSubscription", "GetSubscription", "UpdateSubscription", "ListSubscriptions",
                   "DeleteSubscription", "ModifyAckDeadline", "Acknowledge", "Pull", "ModifyPushConfig", "GetSnapshot",
                   "ListSnapshots", "CreateSnapshot", "UpdateSnapshot", "DeleteSnapshot", "Seek"):
        assert f"/google.pubsub.v1.Subscriber/{method}" in rpcs
    assert "/google.pubsub.v1.Subscriber/StreamingPull" not in rpcs
    for method in ("CreateSchema", "GetSchema", "ListSchemas", "ListSchemaRevisions", "CommitSchema", "RollbackSchema",
                   "DeleteSchemaRevision", "DeleteSchema", "ValidateSchema", "ValidateMessage"):
        assert f"/google.pubsub.v1.SchemaService/{method}" in rpcs
    iam = [r.template for r in rest_routes.routes() if r.rpc.startswith("/google.iam.v1.")]
    assert len(iam) == 12 and all(any(k in t for t in iam) for k in ("topics", "subscriptions", "snapshots", "schemas"))


@pytest.mark.parametrize("verb,path,rpc,values", [
    ("PUT", "/v1/projects/p/topics/t-1", "/google.pubsub.v1.Publisher/CreateTopic", ("projects/p/topics/t-1",)),
    ("POST", "/v1/projects/p/topics/t-1:publish", "/google.pubsub.v1.Publisher/Publish", ("projects/p/topics/t-1",)),
    ("GET", "/v1/projects/p/schemas/s-1:listRevisions", "/google.pubsub.v1.SchemaService/ListSchemaRevisions",
     ("projects/p/schemas/s-1",)),
    ("GET", "/v1/projects/p/schemas/s-1", "/google.pubsub.v1.SchemaService/GetSchema", ("projects/p/schemas/s-1",)),
    ("PATCH", "/v1/projects/p/subscriptions/s-1", "/google.pubsub.v1.Subscriber/UpdateSubscription",
     ("projects/p/subscriptions/s-1",)),
])
def test_paths_match_their_routes(verb, path, rpc, values):
    route, got = rest_routes.match(verb, path)
    assert (route.rpc, got) == (rpc, values)


def test_no_route_for_other_paths():
    assert rest_routes.match("GET", "/v1/projects/p/topics/t/extra") is None
    assert rest_routes.match("DELETE", "/v1/projects/p/topics/t:publish") is None


def test_openapi_paths_split_variables_into_segments():
    paths = rest_openapi.openapi()["paths"]
    op = paths["/v1/projects/{project}/topics/{topic}:publish"]["post"]
    assert [p["name"] for p in op["parameters"] if p["in"] == "path"] == ["project", "topic"]
    assert "requestBody" in op
    listing = paths["/v1/projects/{project}/topics"]["get"]
    assert {p["name"] for p in listing["parameters"] if p["in"] == "query"} == {"pageSize", "pageToken"}


PUBLISH = next(r for r in rest_routes.routes() if r.rpc == "/google.pubsub.v1.Publisher/Publish")


@pytest.mark.parametrize("body", [
    {"messages": [{"data": "aGVsbG8=", "attributes": {"a": "1", "é": ""}, "orderingKey": "k"}, {}]},
    {"messages": [{"attributes": {"only": "attrs"}}]},
    {"messages": []},
])
def test_the_publish_fast_path_gives_what_the_json_mapping_gives(body):
    fast = rest._fast_publish("projects/p/topics/t", json.dumps(body).encode())
    general = json_format.Parse(json.dumps(body), PUBLISH.request())
    general.topic = "projects/p/topics/t"
    assert PUBLISH.request.FromString(fast) == general


@pytest.mark.parametrize("body", [
    b'{"messages": [{"data": "aGVsbG8"}]}',  # unpadded base64: the JSON mapping decides
    b'{"messages": [{"data": "a-_b"}]}',  # URL-safe alphabet
    b'{"messages": [{"dat": "aGVsbG8="}]}',  # an unknown field
    b'{"messages": [{"data": 5}]}',
    b'{"messages": [{"attributes": {"a": 1}}]}',
    b'{"messages": {}}', b'{"messages": [], "topic": "x"}', b'[]', b'not json',
])
def test_unusual_publish_bodies_go_the_general_way(body):
    assert rest._fast_publish("projects/p/topics/t", body) is None


def _path_schema(name: str) -> dict:
    op = rest_openapi.openapi()["paths"]["/v1/projects/{project}/subscriptions/{subscription}:pull"]["post"]
    if name == "topic":
        op = rest_openapi.openapi()["paths"]["/v1/projects/{project}/topics/{topic}"]["put"]
    return next(p["schema"] for p in op["parameters"] if p["name"] == name)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), name=st.sampled_from(["project", "topic", "subscription"]))
def test_a_path_parameter_the_document_allows_is_a_name_the_server_takes(data, name):
    """The OpenAPI document's path parameters say what pigeon.core.names accepts, so that a client generated
    from it (or a fuzzer) sends names that reach the operation rather than a 400 for the name alone."""
    schema = _path_schema(name)
    value = data.draw(st.from_regex(schema["pattern"], fullmatch=True).filter(
        lambda v: schema.get("minLength", 1) <= len(v) <= schema["maxLength"]))
    if name == "project":
        names.check_project(value)
    elif not value.lower().startswith("goog"):  # (the one rule a pattern does not say)
        names.split(f"projects/p/{name}s/{value}", f"{name}s")


@pytest.mark.parametrize("name, value", [("topic", "ab"), ("topic", "1abc"), ("topic", "a" * 256),
                                         ("topic", "ab/c"), ("subscription", "a b c"), ("project", "-p"),
                                         ("project", "p" * 101), ("project", "p q")])
def test_a_name_the_server_refuses_the_document_refuses(name, value):
    with pytest.raises(InvalidArgument):
        if name == "project":
            names.check_project(value)
        else:
            names.split(f"projects/p/{name}s/{value}", f"{name}s")
    schema = _path_schema(name)
    assert not (re.fullmatch(schema["pattern"].strip("^$"), value)
                and schema.get("minLength", 1) <= len(value) <= schema["maxLength"])
