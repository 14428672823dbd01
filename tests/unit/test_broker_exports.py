"""broker.exports: Pub/Sub's limits on export subscriptions, names that stay inside the export root, one delivery
kind per subscription, and what is refused rather than ignored — through resources.check_subscription, as a create
and an update see it."""

from __future__ import annotations

import pytest
from google.pubsub_v1 import types

from pigeon.broker import exports, resources
from pigeon.core.errors import InvalidArgument, Unimplemented

Subscription = types.Subscription.pb()


def storage(**cfg) -> Subscription:
    s = Subscription(name="projects/p/subscriptions/sub-1", topic="projects/p/topics/topic-1")
    s.cloud_storage_config.bucket = cfg.pop("bucket", "a-bucket")
    for k, v in cfg.items():
        if k == "max_duration_s":
            s.cloud_storage_config.max_duration.seconds = v
        elif k in ("avro_config", "text_config"):
            getattr(s.cloud_storage_config, k).SetInParent()
            if v:
                s.cloud_storage_config.avro_config.use_topic_schema = True
        else:
            setattr(s.cloud_storage_config, k, v)
    return s


def check(s):
    resources.check_subscription(s, creating=True)
    return s


@pytest.mark.parametrize("cfg", [
    {}, {"bucket": "abc"}, {"bucket": "my_bucket.v2-x"}, {"max_duration_s": 60}, {"max_duration_s": 600},
    {"max_bytes": 1000}, {"max_bytes": 10 << 30}, {"max_messages": 1000}, {"filename_prefix": "raw/clicks-"},
    {"filename_datetime_format": "YYYY/MM/DD/hh-mm-ss"}, {"filename_suffix": ".txt"}, {"text_config": False},
    {"avro_config": False},
])
def test_what_pubsub_accepts_is_accepted(cfg):
    check(storage(**cfg))


@pytest.mark.parametrize("cfg, says", [
    ({"bucket": ""}, "bucket"), ({"bucket": "ab"}, "bucket"), ({"bucket": "Upper"}, "bucket"),
    ({"bucket": "gs://b"}, "bucket"), ({"bucket": "a..b"}, "bucket"), ({"bucket": "../etc"}, "bucket"),
    ({"bucket": "_checkpoints"}, "bucket"), ({"max_duration_s": 59}, "max_duration"),
    ({"max_duration_s": 601}, "max_duration"), ({"max_bytes": 999}, "max_bytes"),
    ({"max_bytes": (10 << 30) + 1}, "max_bytes"), ({"max_messages": 999}, "max_messages"),
    ({"filename_prefix": "../x"}, "filename_prefix"), ({"filename_prefix": "/abs"}, "filename_prefix"),
    ({"filename_datetime_format": "YYYY/../hh"}, "filename_datetime_format"),
    ({"filename_suffix": "a/"}, "filename_suffix"), ({"filename_suffix": "a/./b"}, "filename_suffix"),
])
def test_out_of_range_or_escaping_values_are_refused_naming_the_field(cfg, says):
    with pytest.raises(InvalidArgument) as e:
        check(storage(**cfg))
    assert f"cloud_storage_config.{says}" in e.value.message


def test_one_delivery_kind_and_unsupported_schema_columns():
    s = storage()
    s.push_config.push_endpoint = "http://127.0.0.1:9/push"
    with pytest.raises(InvalidArgument, match="one way"):
        check(s)
    s = storage()
    s.bigquery_config.table = "p.d.t"
    with pytest.raises(InvalidArgument, match="one way"):
        check(s)
    with pytest.raises(Unimplemented, match="avro_config.use_topic_schema"):
        check(storage(avro_config=True))
    for field in ("use_topic_schema", "use_table_schema"):
        b = Subscription(name="projects/p/subscriptions/sub-1", topic="projects/p/topics/topic-1")
        b.bigquery_config.table = "p.d.t"
        setattr(b.bigquery_config, field, True)
        with pytest.raises(Unimplemented, match=f"bigquery_config.{field}"):
            check(b)


@pytest.mark.parametrize("table, ok", [("p.d.t", True), ("p:d.t", True), ("my-proj.analytics.clicks_1", True),
                                       ("p.d", False), ("p.d.t.x", False), ("p/../d.t", False), ("p.d.", False)])
def test_bigquery_table_names(table, ok):
    b = Subscription(name="projects/p/subscriptions/sub-1", topic="projects/p/topics/topic-1")
    b.bigquery_config.table = table
    if ok:
        check(b)
        assert exports.kind(b) == "bigquery"
    else:
        with pytest.raises(InvalidArgument, match="bigquery_config.table"):
            check(b)


def test_kind_format_and_duration():
    assert exports.kind(Subscription()) == ""
    s = storage()
    assert exports.kind(s) == "storage"
    assert exports.output_format(s.cloud_storage_config) == "parquet"
    assert exports.output_format(storage(text_config=False).cloud_storage_config) == "text"
    assert exports.output_format(storage(avro_config=False).cloud_storage_config) == "avro"
    assert exports.max_duration_s(s.cloud_storage_config) == exports.max_duration_s_default
    assert exports.max_duration_s(storage(max_duration_s=90).cloud_storage_config) == 90


def test_the_configuration_s_state_is_output_only():
    s = storage()
    s.cloud_storage_config.state = types.CloudStorageConfig.State.PERMISSION_DENIED
    assert check(s).cloud_storage_config.state == 0
    b = Subscription(name="projects/p/subscriptions/sub-1", topic="projects/p/topics/topic-1")
    b.bigquery_config.table = "p.d.t"
    b.bigquery_config.state = types.BigQueryConfig.State.NOT_FOUND
    assert check(b).bigquery_config.state == 0
