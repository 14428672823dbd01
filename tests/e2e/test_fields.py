"""docs/fields.md against a real server: every field of Pub/Sub's Topic and Subscription protos has a row, and each
row's status holds when the field is sent through the official client — done (it round-trips), refused (the exact
error, and nothing is created), output only (the server's value replaces the client's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1 import types

from e2e_helpers import E2E_MARKS
from module_server import module_clients

pytestmark = E2E_MARKS
P = "fields-proj"
DOC = Path(__file__).resolve().parents[2] / "docs" / "fields.md"
ROW = re.compile(r"^\| (Topic|Subscription) \| (\w+) \| ([a-z ]+) \| (.*) \|$")
UDF = [{"javascript_udf": {"function_name": "same", "code": "function same(m) { return m; }"}}]
DLQ = f"projects/{P}/topics/fields-dlq"
SCHEMA = f"projects/{P}/schemas/fields-schema"

# a value for each field, as a client would send it (name and topic are the request's own)
SAMPLES = {
    "Topic": {
        "labels": {"team": "core"},
        "message_storage_policy": {"allowed_persistence_regions": ["us-east1"]},
        "kms_key_name": "projects/p/locations/l/keyRings/r/cryptoKeys/k",
        "schema_settings": {"schema": SCHEMA, "encoding": types.Encoding.JSON},
        "satisfies_pzs": True,
        "message_retention_duration": {"seconds": 3600},
        "state": types.Topic.State.INGESTION_RESOURCE_ERROR,
        "ingestion_data_source_settings": {"aws_kinesis": {"stream_arn": "arn:aws:kinesis:x"}},
        "message_transforms": UDF,
        "tags": {"123/env": "prod"},
    },
    "Subscription": {
        "push_config": {"push_endpoint": "http://127.0.0.1:9/push"},
        "bigquery_config": {"table": "proj.dataset.table"},
        "cloud_storage_config": {"bucket": "a-bucket"},
        "bigtable_config": {"table": "projects/p/instances/i/tables/t"},
        "ack_deadline_seconds": 30,
        "retain_acked_messages": True,
        "message_retention_duration": {"seconds": 3600},
        "labels": {"team": "core"},
        "enable_message_ordering": True,
        "expiration_policy": {"ttl": {"seconds": 8 * 86400}},  # (at least the default retention, 7 days)
        "filter": 'attributes.kind = "a"',
        "dead_letter_policy": {"dead_letter_topic": DLQ, "max_delivery_attempts": 7},
        "retry_policy": {"minimum_backoff": {"seconds": 5}, "maximum_backoff": {"seconds": 50}},
        "detached": True,
        "enable_exactly_once_delivery": True,
        "topic_message_retention_duration": {"seconds": 7200},
        "state": types.Subscription.State.RESOURCE_ERROR,
        "analytics_hub_subscription_info": {"listing": "projects/p/locations/l/dataExchanges/d/listings/x"},
        "message_transforms": UDF,
        "tags": {"123/env": "prod"},
    },
}
CODES = {"UNIMPLEMENTED": gexc.MethodNotImplemented, "INVALID_ARGUMENT": gexc.InvalidArgument}


def rows() -> list[tuple[str, str, str, str]]:
    return [m.groups() for line in DOC.read_text().splitlines() if (m := ROW.match(line))]


def test_every_field_of_the_protos_has_a_row():
    have = {(kind, field) for kind, field, _, _ in rows()}
    want = {(kind, f.name) for kind, cls in (("Topic", types.Topic), ("Subscription", types.Subscription))
            for f in cls.pb().DESCRIPTOR.fields}
    assert sorted(want - have) == [], "fields without a row in docs/fields.md"
    assert sorted(have - want) == [], "rows for fields the protos do not have"
    assert {status for *_, status, _ in rows()} <= {"done", "refused", "output only"}


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    with module_clients(str(tmp_path_factory.mktemp("fields"))) as (pub, sub):
        pubsub_v1.SchemaServiceClient().create_schema(request={
            "parent": f"projects/{P}", "schema_id": "fields-schema", "schema": {
                "type_": types.Schema.Type.AVRO,
                "definition": '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}'}})
        pub.create_topic(name=DLQ)
        pub.create_topic(name=f"projects/{P}/topics/fields-topic")
        yield pub, sub


def _create(clients, kind: str, field: str, value):
    pub, sub = clients
    if kind == "Topic":
        name = f"projects/{P}/topics/t-{field.replace('_', '-')}"
        return name, lambda: pub.create_topic(request={"name": name, field: value}), lambda: pub.get_topic(topic=name)
    name = f"projects/{P}/subscriptions/s-{field.replace('_', '-')}"
    request = {"name": name, "topic": f"projects/{P}/topics/fields-topic", field: value}
    return name, lambda: sub.create_subscription(request=request), lambda: sub.get_subscription(subscription=name)


def _proto(kind: str, field: str, value):
    cls = types.Topic if kind == "Topic" else types.Subscription
    return getattr(cls.pb(cls(**{field: value})), field)


@pytest.mark.parametrize("kind, field, status, says", [r for r in rows() if r[1] not in ("name", "topic")],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
def test_each_row_holds(clients, kind, field, status, says):
    value = SAMPLES[kind][field]
    name, create, get = _create(clients, kind, field, value)
    if status == "refused":
        code, message = re.match(r"(\w+): `([^`]+)`", says).groups()
        with pytest.raises(CODES[code]) as e:
            create()
        assert message in e.value.message
        with pytest.raises(gexc.NotFound):  # nothing was created
            get()
        return
    create()
    got = getattr(get()._pb, field)
    sent = _proto(kind, field, value)
    if status == "output only":
        assert got != sent, f"{kind}.{field} is output only: the client's value must not be kept"
    else:  # done: stored as sent (what each does is tested where the feature is)
        if field in ("bigquery_config", "cloud_storage_config"):
            got.ClearField("state")  # (output only within it: the export's state, tests/unit/test_node_exports.py)
        assert got == sent


def test_names_round_trip(clients):
    pub, sub = clients
    assert pub.get_topic(topic=f"projects/{P}/topics/fields-topic").name == f"projects/{P}/topics/fields-topic"
    s = sub.create_subscription(name=f"projects/{P}/subscriptions/s-name", topic=f"projects/{P}/topics/fields-topic")
    assert (s.name, s.topic) == (f"projects/{P}/subscriptions/s-name", f"projects/{P}/topics/fields-topic")
