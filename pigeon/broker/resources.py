"""Topic, subscription and snapshot configuration. Owns the rules: documented limits and defaults on
resource configuration, which fields an update mask may touch, label syntax, the shape of message transforms, and
which fields Pigeon refuses rather than store and ignore (docs/fields.md lists every field and what it does)."""

from __future__ import annotations

import re

from google.iam.v1 import policy_pb2
from pigeon.core.pubsub_types import types

from pigeon.core import limits, names
from pigeon.core.regions import COPY_LABEL
from pigeon.core.errors import InvalidArgument, Unimplemented
from pigeon.broker import exports
from pigeon.broker.filter import compile_filter

Topic = types.Topic.pb()
Subscription = types.Subscription.pb()
Snapshot = types.Snapshot.pb()
Schema = types.Schema.pb()
Policy = policy_pb2.Policy

_LABEL_KEY = re.compile(r"[a-z][a-z0-9_\-]{0,62}\Z")
_LABEL_VALUE = re.compile(r"[a-z0-9_\-]{0,63}\Z")
_JS_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*\Z")

TOPIC_MUTABLE = frozenset(
    {
        "labels",
        "message_storage_policy",
        "kms_key_name",
        "schema_settings",
        "message_retention_duration",
        "ingestion_data_source_settings",
        "message_transforms",
    }
)
SUBSCRIPTION_MUTABLE = frozenset(
    {
        "push_config",
        "bigquery_config",
        "cloud_storage_config",
        "ack_deadline_seconds",
        "retain_acked_messages",
        "message_retention_duration",
        "labels",
        "expiration_policy",
        "dead_letter_policy",
        "retry_policy",
        "enable_exactly_once_delivery",
        "message_transforms",
    }
)
SNAPSHOT_MUTABLE = frozenset({"labels", "expire_time"})


def duration_s(d) -> float:
    return d.seconds + d.nanos / 1e9


def check_labels(labels) -> None:
    if len(labels) > limits.labels_max:
        raise InvalidArgument(f"Too many labels: at most {limits.labels_max} are allowed (got {len(labels)}).")
    for k, v in labels.items():
        if not _LABEL_KEY.match(k):
            raise InvalidArgument(
                f"Invalid label key ({k}): keys start with a lowercase letter and hold at most "
                f"{limits.label_chars_max} lowercase letters, digits, '_' or '-'."
            )
        if not _LABEL_VALUE.match(v):
            raise InvalidArgument(
                f"Invalid label value ({v}) for key {k}: at most {limits.label_chars_max} lowercase letters, "
                "digits, '_' or '-'."
            )


def _check_retention(d, what: str) -> None:
    s = duration_s(d)
    if not limits.retention_s_min <= s <= limits.retention_s_max:
        raise InvalidArgument(
            f"Invalid {what}: it must be between {limits.retention_s_min}s (10 minutes) and "
            f"{limits.retention_s_max}s (31 days), got {s:g}s."
        )


def active_transforms(transforms) -> list:
    """The JavaScript UDFs a resource applies, in order (a `disabled` one is skipped, as on the service)."""
    return [m.javascript_udf for m in transforms if not m.disabled]


def check_transforms(transforms) -> None:
    """The shape of `message_transforms` (whether the code compiles is the JavaScript engine's: node.transforms)."""
    if len(transforms) > limits.transforms_per_resource_max:
        raise InvalidArgument(f"Too many message_transforms: at most {limits.transforms_per_resource_max} are "
                              f"allowed (got {len(transforms)}).")
    seen: set[str] = set()
    for i, m in enumerate(transforms):
        kind = m.WhichOneof("transform")
        if kind != "javascript_udf":
            if kind is None:
                raise InvalidArgument(f"Invalid message_transforms[{i}]: it must set javascript_udf.")
            raise Unimplemented(f"message_transforms[{i}].{kind} is not supported: Pigeon runs javascript_udf "
                                "transforms only.")
        udf = m.javascript_udf
        if not _JS_NAME.match(udf.function_name):
            raise InvalidArgument(f"Invalid message_transforms[{i}].javascript_udf.function_name "
                                  f"({udf.function_name[:64]!r}): it must be a JavaScript identifier.")
        if udf.function_name in seen:
            raise InvalidArgument(f"Invalid message_transforms[{i}].javascript_udf.function_name "
                                  f"({udf.function_name}): each UDF of a resource must have its own function_name.")
        seen.add(udf.function_name)
        size = len(udf.code.encode())
        if not 0 < size <= limits.transform_code_bytes_max:
            raise InvalidArgument(f"Invalid message_transforms[{i}].javascript_udf.code: it must hold 1 to "
                                  f"{limits.transform_code_bytes_max} bytes (got {size}).")


def _refuse_unsupported(msg, fields: tuple[str, ...], kind: str) -> None:
    """Fields Pigeon cannot honour are refused rather than stored and ignored (docs/fields.md)."""
    for field in fields:
        value = getattr(msg, field)
        if (msg.HasField(field) and value.ByteSize()) if hasattr(value, "ByteSize") else value:
            raise Unimplemented(f"The {kind} field {field} is not supported by Pigeon: {_WHY[field]}")


_WHY = {
    "kms_key_name": "message data is not encrypted with a customer-managed key; leave it unset.",
    "ingestion_data_source_settings": "Pigeon does not ingest from external sources (Kinesis, Cloud Storage, "
                                      "Event Hubs, MSK, Confluent Cloud, Azure); publish to the topic instead.",
    "message_storage_policy": "a message is stored in the region of the node that took its publish, and a server "
                              "or a cluster that is not a region of a deployment (--region) has no regions to allow "
                              "or enforce.",
    "tags": "there are no Resource Manager tags to bind.",
    "bigtable_config": "no Bigtable export runs; use a pull or push subscription.",
}
_TOPIC_UNSUPPORTED = ("kms_key_name", "ingestion_data_source_settings", "message_storage_policy", "tags")
_TOPIC_UNSUPPORTED_IN_REGIONS = tuple(f for f in _TOPIC_UNSUPPORTED if f != "message_storage_policy")
_SUBSCRIPTION_UNSUPPORTED = ("bigtable_config", "tags")


def check_topic(t, regions: bool = False) -> None:
    """Validate a Topic in place (output-only fields are the server's: what a client sent there is dropped).
    `regions`: the node is a region of a deployment (docs/regions.md), where a message storage policy is honoured."""
    names.split(t.name, "topics")
    check_labels(t.labels)
    if t.HasField("message_retention_duration"):
        _check_retention(t.message_retention_duration, "message_retention_duration")
    if regions and t.HasField("message_storage_policy") and t.message_storage_policy.ByteSize():
        check_storage_policy(t.message_storage_policy)
    if COPY_LABEL in t.labels:
        check_copy_label(t.labels[COPY_LABEL], regions)
    _refuse_unsupported(t, _TOPIC_UNSUPPORTED_IN_REGIONS if regions else _TOPIC_UNSUPPORTED, "topic")
    check_transforms(t.message_transforms)
    t.satisfies_pzs = False
    t.state = types.Topic.State.ACTIVE


_REGION = re.compile(r"[a-z][a-z0-9-]{0,62}\Z")


def check_copy_label(region: str, regions: bool) -> None:
    """`pigeon-copy-to: <region>` asks that the topic's other regions' messages be copied to `region`
    (docs/regions.md): a region name, and only in a deployment of regions — a server or a cluster that is not a
    region has no other region to copy to, and would only be ignoring it."""
    if not regions:
        raise InvalidArgument(f"The label {COPY_LABEL} asks for copies in another region: this server is not a region "
                              "of a deployment of regions (pigeon serve --region), so it has none.")
    if not _REGION.match(region):
        raise InvalidArgument(f"Invalid label {COPY_LABEL} ({region}): a region name (1 to 63 lowercase letters, "
                              "digits or '-', starting with a letter).")


def check_copy_unchanged(before, after) -> None:
    """A topic's copy region is fixed when it is made: its shards' places follow from it."""
    if before.labels.get(COPY_LABEL, "") != after.labels.get(COPY_LABEL, ""):
        raise InvalidArgument(f"The label {COPY_LABEL} is set when a topic is made and cannot change: make a new "
                              "topic to copy to another region.")


def check_storage_policy(policy) -> None:
    """A message storage policy names the regions a topic's messages may be stored in: at least one, each a region
    name (a region not in the deployment yet stores nothing until it joins)."""
    regions = list(policy.allowed_persistence_regions)
    if not regions:
        raise InvalidArgument("Invalid message_storage_policy: allowed_persistence_regions is empty, which means that "
                              "no regions are allowed, and is not a valid configuration.")
    for r in regions:
        if not _REGION.match(r):
            raise InvalidArgument(f"Invalid message_storage_policy: {r!r} in allowed_persistence_regions is not a "
                                  "region name (1 to 63 lowercase letters, digits or '-', starting with a letter).")


def check_subscription(s, *, creating: bool) -> None:
    """Validate a Subscription and fill in the service's defaults, in place."""
    names.split(s.name, "subscriptions")
    check_labels(s.labels)
    if s.ack_deadline_seconds == 0:
        s.ack_deadline_seconds = limits.ack_deadline_s_default
    if not limits.ack_deadline_s_min <= s.ack_deadline_seconds <= limits.ack_deadline_s_max:
        raise InvalidArgument(
            f"Invalid ack_deadline_seconds: it must be between {limits.ack_deadline_s_min} and "
            f"{limits.ack_deadline_s_max} seconds (got {s.ack_deadline_seconds})."
        )
    if s.HasField("message_retention_duration"):
        _check_retention(s.message_retention_duration, "message_retention_duration")
    else:
        s.message_retention_duration.seconds = limits.subscription_retention_s_default
    if creating and not s.HasField("expiration_policy"):
        s.expiration_policy.ttl.seconds = limits.expiration_ttl_s_default
    if s.HasField("expiration_policy") and s.expiration_policy.HasField("ttl"):
        ttl = duration_s(s.expiration_policy.ttl)
        if ttl < limits.expiration_ttl_s_min:
            raise InvalidArgument(
                f"Invalid expiration_policy.ttl: it must be at least {limits.expiration_ttl_s_min}s (1 day), "
                f"got {ttl:g}s."
            )
        if ttl < duration_s(s.message_retention_duration):
            raise InvalidArgument(
                "Invalid expiration_policy.ttl: it must be at least the subscription's message_retention_duration."
            )
    if s.HasField("dead_letter_policy"):
        dlp = s.dead_letter_policy
        if dlp.max_delivery_attempts == 0:
            dlp.max_delivery_attempts = 5
        if not 5 <= dlp.max_delivery_attempts <= 100:
            raise InvalidArgument(
                f"Invalid dead_letter_policy.max_delivery_attempts: it must be between 5 and 100 "
                f"(got {dlp.max_delivery_attempts})."
            )
        if dlp.dead_letter_topic:
            names.split(dlp.dead_letter_topic, "topics")
    if s.HasField("retry_policy"):
        rp = s.retry_policy
        lo = duration_s(rp.minimum_backoff) if rp.HasField("minimum_backoff") else 10.0
        hi = duration_s(rp.maximum_backoff) if rp.HasField("maximum_backoff") else 600.0
        if not (0 <= lo <= 600 and 0 <= hi <= 600 and lo <= hi):
            raise InvalidArgument(
                "Invalid retry_policy: minimum_backoff and maximum_backoff must be between 0 and 600 seconds "
                "and minimum_backoff must not exceed maximum_backoff."
            )
    compile_filter(s.filter)  # raises InvalidArgument naming the position or the limit
    if s.push_config.push_endpoint and not re.match(r"https?://", s.push_config.push_endpoint):
        raise InvalidArgument(f"Invalid push_endpoint ({s.push_config.push_endpoint}): it must be an http(s) URL.")
    _refuse_unsupported(s, _SUBSCRIPTION_UNSUPPORTED, "subscription")
    exports.check(s)  # cloud_storage_config, bigquery_config
    check_transforms(s.message_transforms)
    s.ClearField("topic_message_retention_duration")  # output only: filled in from the topic when read
    s.ClearField("analytics_hub_subscription_info")  # output only: no Analytics Hub here
    s.state = types.Subscription.State.ACTIVE


def apply_mask(current, update, mask, mutable: frozenset[str], kind: str):
    """A copy of `current` with the fields named in `mask` taken from `update`."""
    if not mask.paths:
        raise InvalidArgument("The update_mask must be set and name at least one field.")
    merged = type(current)()
    merged.CopyFrom(current)
    for path in mask.paths:
        top = path.split(".")[0]
        if top not in mutable:
            raise InvalidArgument(f"Invalid update_mask path ({path}): the {kind} field {top} cannot be updated.")
        if top in ("labels",):
            merged.ClearField(top)
            merged.labels.update(update.labels)
            continue
        field = current.DESCRIPTOR.fields_by_name[top]
        if field.is_repeated:
            merged.ClearField(top)
            getattr(merged, top).extend(getattr(update, top))
        elif field.message_type is not None:
            merged.ClearField(top)
            if update.HasField(top):
                getattr(merged, top).CopyFrom(getattr(update, top))
        else:
            setattr(merged, top, getattr(update, top))
    return merged
