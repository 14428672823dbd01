"""broker.resources (validation, defaults, update masks) and core.names (resource name rules)."""

from __future__ import annotations

import pytest
from google.protobuf import field_mask_pb2
from google.pubsub_v1 import types
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.core import limits, names
from pigeon.core.errors import InvalidArgument
from pigeon.broker import resources
from pigeon.broker.resources import (
    SNAPSHOT_MUTABLE, SUBSCRIPTION_MUTABLE, TOPIC_MUTABLE, Snapshot, Subscription, Topic, apply_mask,
)

SETTINGS = settings(max_examples=150, deadline=None)
SUB = "projects/p/subscriptions/sub-1"
TOPIC = "projects/p/topics/topic-1"
DAY = 86_400


def sub(**kw):
    return Subscription(name=SUB, topic=TOPIC, **kw)


def checked(creating=True, **kw):
    s = sub(**kw)
    resources.check_subscription(s, creating=creating)
    return s


def rejected(creating=True, **kw):
    with pytest.raises(InvalidArgument) as e:
        resources.check_subscription(sub(**kw), creating=creating)
    return e.value


def mask(*paths):
    return field_mask_pb2.FieldMask(paths=list(paths))


# --- check_subscription ------------------------------------------------------------------------
def test_subscription_defaults():
    s = checked()
    assert s.ack_deadline_seconds == 10
    assert s.message_retention_duration.seconds == 7 * DAY
    assert s.expiration_policy.ttl.seconds == 31 * DAY
    assert s.state == types.Subscription.State.ACTIVE


def test_update_does_not_add_an_expiration_policy():
    s = checked(creating=False)
    assert not s.HasField("expiration_policy")


@pytest.mark.parametrize("ack", [10, 11, 599, 600])
def test_ack_deadline_in_range_is_kept(ack):
    assert checked(ack_deadline_seconds=ack).ack_deadline_seconds == ack


@pytest.mark.parametrize("ack", [1, 9, 601, 10_000, -1])
def test_ack_deadline_out_of_range_is_rejected(ack):
    e = rejected(ack_deadline_seconds=ack)
    assert e.code == "INVALID_ARGUMENT" and "ack_deadline_seconds" in e.message


@pytest.mark.parametrize("secs", [600, 3600, 7 * DAY, 31 * DAY])
def test_retention_in_range(secs):
    s = checked(message_retention_duration={"seconds": secs})
    assert s.message_retention_duration.seconds == secs


@pytest.mark.parametrize("secs,nanos", [(599, 0), (599, 999_999_999), (31 * DAY, 1), (31 * DAY + 1, 0), (0, 0)])
def test_retention_out_of_range(secs, nanos):
    rejected(message_retention_duration={"seconds": secs, "nanos": nanos})


def test_expiration_ttl_rules():
    s = checked(expiration_policy={"ttl": {"seconds": DAY}}, message_retention_duration={"seconds": 600})
    assert s.expiration_policy.ttl.seconds == DAY
    rejected(expiration_policy={"ttl": {"seconds": DAY - 1}}, message_retention_duration={"seconds": 600})
    # with the default retention (7 days) a 1-day ttl is too short
    rejected(expiration_policy={"ttl": {"seconds": DAY}})
    # ttl must cover the retention
    rejected(expiration_policy={"ttl": {"seconds": DAY}}, message_retention_duration={"seconds": 2 * DAY})
    checked(expiration_policy={"ttl": {"seconds": 2 * DAY}}, message_retention_duration={"seconds": 2 * DAY})
    # an expiration policy without ttl means "never expire"
    s = checked(expiration_policy={})
    assert s.HasField("expiration_policy") and not s.expiration_policy.HasField("ttl")


@pytest.mark.parametrize("attempts,want", [(0, 5), (5, 5), (50, 50), (100, 100)])
def test_dead_letter_attempts_in_range(attempts, want):
    s = checked(dead_letter_policy={"dead_letter_topic": TOPIC, "max_delivery_attempts": attempts})
    assert s.dead_letter_policy.max_delivery_attempts == want


@pytest.mark.parametrize("attempts", [1, 4, 101, 1000])
def test_dead_letter_attempts_out_of_range(attempts):
    e = rejected(dead_letter_policy={"dead_letter_topic": TOPIC, "max_delivery_attempts": attempts})
    assert "max_delivery_attempts" in e.message


def test_dead_letter_topic_name_is_checked():
    rejected(dead_letter_policy={"dead_letter_topic": "projects/p/subscriptions/abc"})
    rejected(dead_letter_policy={"dead_letter_topic": "nonsense"})


@pytest.mark.parametrize("lo,hi,ok", [
    (None, None, True), (0, 0, True), (10, 600, True), (600, 600, True),
    (601, None, False), (None, 601, False), (20, 10, False), (-1, 10, False),
])
def test_retry_policy_bounds(lo, hi, ok):
    rp = {}
    if lo is not None:
        rp["minimum_backoff"] = {"seconds": lo}
    if hi is not None:
        rp["maximum_backoff"] = {"seconds": hi}
    if ok:
        checked(retry_policy=rp)
    else:
        rejected(retry_policy=rp)


def test_filter_and_push_endpoint():
    padded = 'attributes:"' + "a" * 243 + '"'  # 256 bytes, a valid filter
    assert len(padded.encode()) == 256
    checked(filter=padded)
    rejected(filter=padded[:-1] + 'a"')  # 257 bytes
    rejected(filter='attributes:"' + "é" * 122 + "a" + '"')  # 257 bytes of multibyte characters
    rejected(filter="a" * 10)  # not the filter language
    checked(push_config={"push_endpoint": "https://example.com/push"})
    rejected(push_config={"push_endpoint": "ftp://example.com"})


def test_subscription_name_is_checked():
    with pytest.raises(InvalidArgument):
        resources.check_subscription(Subscription(name="projects/p/subscriptions/goog-x", topic=TOPIC), creating=True)
    with pytest.raises(InvalidArgument):
        resources.check_subscription(Subscription(name=TOPIC, topic=TOPIC), creating=True)


# --- labels and topics -------------------------------------------------------------------------
label_keys = st.from_regex(r"[a-z][a-z0-9_\-]{0,62}", fullmatch=True)
label_values = st.from_regex(r"[a-z0-9_\-]{0,63}", fullmatch=True)


@SETTINGS
@given(st.dictionaries(label_keys, label_values, max_size=limits.labels_max))
def test_valid_labels_pass(labels):
    resources.check_labels(labels)
    t = Topic(name=TOPIC)
    t.labels.update(labels)
    resources.check_topic(t)


@pytest.mark.parametrize("labels", [
    {"A": "x"}, {"1a": "x"}, {"": "x"}, {"a" * 64: "x"}, {"a": "X"}, {"a": "v" * 64}, {"a": "x y"},
    {f"k{i}": "" for i in range(limits.labels_max + 1)},
])
def test_invalid_labels_fail(labels):
    with pytest.raises(InvalidArgument):
        resources.check_labels(labels)


def test_topic_retention_bounds():
    resources.check_topic(Topic(name=TOPIC))
    resources.check_topic(Topic(name=TOPIC, message_retention_duration={"seconds": 600}))
    resources.check_topic(Topic(name=TOPIC, message_retention_duration={"seconds": 31 * DAY}))
    for secs in (599, 31 * DAY + 1):
        with pytest.raises(InvalidArgument):
            resources.check_topic(Topic(name=TOPIC, message_retention_duration={"seconds": secs}))
    with pytest.raises(InvalidArgument):
        resources.check_topic(Topic(name="projects/p/topics/ab"))


# --- apply_mask --------------------------------------------------------------------------------
def test_empty_mask_is_rejected():
    with pytest.raises(InvalidArgument):
        apply_mask(sub(), sub(), mask(), SUBSCRIPTION_MUTABLE, "subscription")


@pytest.mark.parametrize("path", ["name", "topic", "filter", "enable_message_ordering", "state", "nope",
                                  "push_config_x", "detached"])
def test_immutable_subscription_paths_are_rejected(path):
    with pytest.raises(InvalidArgument) as e:
        apply_mask(sub(), sub(), mask("labels", path), SUBSCRIPTION_MUTABLE, "subscription")
    assert path.split(".")[0] in e.value.message


@pytest.mark.parametrize("path", ["name", "satisfies_pzs", "state"])
def test_immutable_topic_paths_are_rejected(path):
    with pytest.raises(InvalidArgument):
        apply_mask(Topic(name=TOPIC), Topic(name=TOPIC), mask(path), TOPIC_MUTABLE, "topic")


MUTABLE_PATHS = [(cls, mutable, path) for cls, mutable in [(Topic, TOPIC_MUTABLE), (Subscription, SUBSCRIPTION_MUTABLE),
                                                           (Snapshot, SNAPSHOT_MUTABLE)] for path in sorted(mutable)]


@pytest.mark.parametrize("cls,mutable,path", MUTABLE_PATHS,
                         ids=[f"{c.DESCRIPTOR.name}.{p}" for c, _, p in MUTABLE_PATHS])
def test_every_mutable_path_can_be_updated(cls, mutable, path):
    assert path in cls.DESCRIPTOR.fields_by_name, f"{cls.DESCRIPTOR.name}.{path} does not exist"
    merged = apply_mask(cls(name="x"), cls(name="y"), mask(path), mutable, "thing")
    assert merged.name == "x"  # only the masked field comes from the update


@pytest.mark.parametrize("cls,mutable", [(Topic, TOPIC_MUTABLE), (Subscription, SUBSCRIPTION_MUTABLE)])
def test_apply_mask_replaces_repeated_message_transforms(cls, mutable):
    cur = cls(name="x")
    cur.message_transforms.add().javascript_udf.function_name = "old"
    upd = cls(name="y")
    upd.message_transforms.add().javascript_udf.function_name = "new1"
    upd.message_transforms.add().javascript_udf.function_name = "new2"
    merged = apply_mask(cur, upd, mask("message_transforms"), mutable, "thing")
    assert [m.javascript_udf.function_name for m in merged.message_transforms] == ["new1", "new2"]
    assert merged.name == "x"


def test_apply_mask_scalar_labels_and_messages():
    cur = sub(ack_deadline_seconds=10, retain_acked_messages=True, labels={"a": "1", "b": "2"},
              push_config={"push_endpoint": "https://a/", "attributes": {"x": "y"}},
              dead_letter_policy={"dead_letter_topic": TOPIC, "max_delivery_attempts": 7})
    before = Subscription()
    before.CopyFrom(cur)
    upd = Subscription(name=SUB, topic="projects/p/topics/other", ack_deadline_seconds=30, labels={"c": "3"},
                       push_config={"push_endpoint": "https://b/"})
    merged = apply_mask(cur, upd, mask("ack_deadline_seconds", "labels", "push_config.push_endpoint",
                                       "dead_letter_policy"), SUBSCRIPTION_MUTABLE, "subscription")
    assert merged.ack_deadline_seconds == 30
    assert dict(merged.labels) == {"c": "3"}  # replaced, not merged
    assert merged.push_config.push_endpoint == "https://b/"
    assert dict(merged.push_config.attributes) == {}  # the whole message comes from the update
    assert not merged.HasField("dead_letter_policy")  # unset in the update: cleared
    # untouched fields stay
    assert merged.topic == TOPIC and merged.retain_acked_messages
    assert cur == before, "apply_mask modified its input"


@SETTINGS
@given(st.integers(10, 600), st.integers(10, 600), st.booleans(), st.booleans())
def test_apply_mask_takes_exactly_the_masked_fields(a1, a2, r1, r2):
    cur = sub(ack_deadline_seconds=a1, retain_acked_messages=r1)
    upd = sub(ack_deadline_seconds=a2, retain_acked_messages=r2)
    m1 = apply_mask(cur, upd, mask("ack_deadline_seconds"), SUBSCRIPTION_MUTABLE, "subscription")
    assert (m1.ack_deadline_seconds, m1.retain_acked_messages) == (a2, r1)
    m2 = apply_mask(cur, upd, mask("retain_acked_messages"), SUBSCRIPTION_MUTABLE, "subscription")
    assert (m2.ack_deadline_seconds, m2.retain_acked_messages) == (a1, r2)


def test_snapshot_mask():
    cur = Snapshot(name="projects/p/snapshots/snap", topic=TOPIC, labels={"a": "1"})
    upd = Snapshot(name="projects/p/snapshots/snap", labels={"b": "2"}, expire_time={"seconds": 1000})
    merged = apply_mask(cur, upd, mask("labels", "expire_time"), SNAPSHOT_MUTABLE, "snapshot")
    assert dict(merged.labels) == {"b": "2"} and merged.expire_time.seconds == 1000 and merged.topic == TOPIC
    with pytest.raises(InvalidArgument):
        apply_mask(cur, upd, mask("topic"), SNAPSHOT_MUTABLE, "snapshot")


# --- core.names --------------------------------------------------------------------------------
ID_REST = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~+%"
valid_ids = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("abcdefhijklmnopqrstuvwxyzABCDEFHIJKLMNOPQRSTUVWXYZ"),  # no g/G: "goog" is tested apart
    st.text(ID_REST, min_size=2, max_size=254),
)


@SETTINGS
@given(valid_ids, st.sampled_from(names.KINDS))
def test_valid_ids_pass_and_round_trip(rid, kind):
    names.check_id(rid, kind)
    assert names.split(names.join("my-project", kind, rid), kind) == ("my-project", rid)


@SETTINGS
@given(valid_ids, st.sampled_from(["0", "-", "_", ".", "~", "+", "%", "é", " "]))
def test_ids_must_start_with_a_letter(rid, first):
    with pytest.raises(InvalidArgument):
        names.check_id(first + rid[1:], "topics")


@SETTINGS
@given(valid_ids, st.sampled_from(list("/ :*?#@!é\n\t$&")), st.data())
def test_ids_with_other_characters_fail(rid, bad, data):
    i = data.draw(st.integers(1, len(rid)))
    with pytest.raises(InvalidArgument):
        names.check_id(rid[:i] + bad + rid[i:], "subscriptions")


def test_id_length_bounds():
    names.check_id("abc", "topics")
    names.check_id("a" * 255, "topics")
    for bad in ("", "a", "ab", "a" * 256):
        with pytest.raises(InvalidArgument):
            names.check_id(bad, "topics")


@pytest.mark.parametrize("rid", ["goog", "google-topic", "googx"])
def test_goog_prefix_is_reserved(rid):
    with pytest.raises(InvalidArgument) as e:
        names.check_id(rid, "topics")
    assert "goog" in e.value.message


def test_goo_without_g_is_allowed():
    names.check_id("goo-topic", "topics")
    names.check_id("agoog", "topics")


@pytest.mark.parametrize("name,kind", [
    ("projects/p/topics", "topics"),
    ("projects/p/topics/abc/x", "topics"),
    ("project/p/topics/abc", "topics"),
    ("projects//topics/abc", "topics"),
    ("projects/p/subscriptions/abc", "topics"),
    ("projects/p p/topics/abc", "topics"),
    ("", "topics"),
])
def test_split_rejects_malformed_names(name, kind):
    with pytest.raises(InvalidArgument):
        names.split(name, kind)


def test_project_of():
    assert names.project_of("projects/my-proj") == "my-proj"
    for bad in ("projects/", "projects/a/b", "project/a", "projects/a b", "projects/" + "a" * 101):
        with pytest.raises(InvalidArgument):
            names.project_of(bad)
