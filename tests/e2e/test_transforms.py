"""End to end: single message transforms (JavaScript UDFs) on topics and subscriptions, through the official client
against one `pigeon serve` (node.transforms): filter, rewrite, attributes, exceptions, `disabled`, limits."""

from __future__ import annotations

import time

import pytest
from google.api_core import exceptions as gexc
from google.protobuf import field_mask_pb2

from e2e_helpers import E2E_MARKS, collect, pull_now
from pigeon.core import limits
from module_server import module_clients

pytestmark = E2E_MARKS
P = "smt-proj"

UPPER = "function upper(message, metadata) { message.data = message.data.toUpperCase(); return message; }"
DROP_SKIP = "function dropSkip(message) { return message.attributes.skip === 'yes' ? null : message; }"
TAG = ("function tag(message, metadata) { message.attributes.seen = metadata.message_id ? 'sub' : 'topic';"
       " delete message.attributes.secret; return message; }")
THROW = "function boom(message) { if (message.data === 'bad') throw new Error('no bad data'); return message; }"
SPIN = "function spin(message) { if (message.data === 'slow') { for (;;) {} } return message; }"


def udf(name, code, disabled=False):
    return {"javascript_udf": {"function_name": name, "code": code}, "disabled": disabled}


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    with module_clients(str(tmp_path_factory.mktemp("smt"))) as both:
        yield both


def topic_with(pub, sub, name, topic_transforms=(), sub_transforms=(), **sub_fields):
    t, s = pub.topic_path(P, name), sub.subscription_path(P, name)
    pub.create_topic(request={"name": t, "message_transforms": list(topic_transforms)})
    sub.create_subscription(request={"name": s, "topic": t, "message_transforms": list(sub_transforms),
                                     **sub_fields})
    return t, s


def test_topic_transforms_rewrite_filter_and_change_attributes(clients):
    pub, sub = clients
    t, s = topic_with(pub, sub, "topic-smt", [udf("dropSkip", DROP_SKIP), udf("upper", UPPER), udf("tag", TAG)])
    futures = [pub.publish(t, b"hello", skip="no", secret="x"), pub.publish(t, b"gone", skip="yes"),
               pub.publish(t, b"caf\xc3\xa9 \xff", skip="no")]
    ids = [f.result(timeout=30) for f in futures]  # the official client gets an id for every message, kept or not
    assert len(set(ids)) == 3 and ids[1].startswith("filtered-")
    got = collect(sub, s, 2)
    assert sorted(r.message.data for r in got.values()) == [b"CAF\xc3\x89 \xff", b"HELLO"]  # non-UTF-8 byte kept
    for r in got.values():
        assert dict(r.message.attributes) == {"skip": "no", "seen": "topic"}
    assert ids[0] in got and ids[2] in got
    time.sleep(0.3)
    assert pull_now(sub, s) == []  # the filtered message was never stored


def test_topic_transform_exception_fails_the_publish_and_stores_nothing(clients):
    pub, sub = clients
    t, s = topic_with(pub, sub, "topic-throw", [udf("boom", THROW)])
    with pytest.raises(gexc.InvalidArgument, match="no bad data"):
        pub.publish(t, b"bad").result(timeout=30)
    pub.publish(t, b"good").result(timeout=30)
    got = collect(sub, s, 1)
    assert [r.message.data for r in got.values()] == [b"good"]


def test_subscription_transforms_filter_acks_and_exception_is_a_failed_delivery(clients):
    pub, sub = clients
    dlq = pub.topic_path(P, "sub-throw-dlq")
    pub.create_topic(name=dlq)
    dlq_sub = sub.subscription_path(P, "sub-throw-dlq")
    sub.create_subscription(name=dlq_sub, topic=dlq)
    t, s = topic_with(pub, sub, "sub-smt", sub_transforms=[udf("dropSkip", DROP_SKIP), udf("boom", THROW),
                                                            udf("tag", TAG)],
                      dead_letter_policy={"dead_letter_topic": dlq, "max_delivery_attempts": 5},
                      retry_policy={"minimum_backoff": {"seconds": 0}, "maximum_backoff": {"seconds": 0}})
    for data, skip in ((b"keep", "no"), (b"drop", "yes"), (b"bad", "no")):
        pub.publish(t, data, skip=skip, secret="s").result(timeout=30)
    got = collect(sub, s, 1)
    (r,) = got.values()
    assert r.message.data == b"keep" and dict(r.message.attributes) == {"skip": "no", "seen": "sub"}
    # "bad" fails at every delivery (each pull is an attempt that hands out nothing): after 5 it is dead-lettered,
    # as Pub/Sub does with a message its UDF throws on
    dead, deadline = [], time.monotonic() + 20
    while not dead and time.monotonic() < deadline:
        assert pull_now(sub, s) == []  # "drop" was acked by its filter, "bad" never goes out
        dead = pull_now(sub, dlq_sub)
        time.sleep(0.05)
    assert [d.message.data for d in dead] == [b"bad"]


def test_subscription_transforms_on_a_stream_and_disabled_is_skipped(clients):
    pub, sub = clients
    t, s = topic_with(pub, sub, "sub-stream", sub_transforms=[udf("upper", UPPER), udf("dropSkip", DROP_SKIP,
                                                                                         disabled=True)])
    for i in range(20):
        pub.publish(t, b"m%d" % i, skip="yes")
    seen = []
    future = sub.subscribe(s, lambda m: (seen.append(m.data), m.ack()))
    deadline = time.monotonic() + 20
    while len(seen) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    future.cancel()
    assert sorted(seen) == sorted(b"M%d" % i for i in range(20))  # disabled filter: nothing dropped


def test_update_turns_transforms_on_and_off(clients):
    pub, sub = clients
    t, s = topic_with(pub, sub, "sub-update")
    mask = field_mask_pb2.FieldMask(paths=["message_transforms"])
    sub.update_subscription(request={"subscription": {"name": s, "message_transforms": [udf("upper", UPPER)]},
                                     "update_mask": mask})
    pub.publish(t, b"abc").result(timeout=30)
    assert [r.message.data for r in collect(sub, s, 1).values()] == [b"ABC"]
    sub.update_subscription(request={"subscription": {"name": s}, "update_mask": mask})
    pub.publish(t, b"def").result(timeout=30)
    assert [r.message.data for r in collect(sub, s, 1).values()] == [b"def"]
    pub.update_topic(request={"topic": {"name": t, "message_transforms": [udf("upper", UPPER)]},
                              "update_mask": mask})
    assert pub.get_topic(topic=t).message_transforms[0].javascript_udf.function_name == "upper"


def test_a_slow_udf_fails_alone(clients):
    pub, sub = clients
    t, s = topic_with(pub, sub, "slow", [udf("spin", SPIN)])
    t0 = time.monotonic()
    with pytest.raises(gexc.InvalidArgument, match="longer than"):
        pub.publish(t, b"slow").result(timeout=30)
    assert time.monotonic() - t0 < 5
    pub.publish(t, b"fast").result(timeout=30)  # the isolate serves on after the runaway call was stopped
    assert [r.message.data for r in collect(sub, s, 1).values()] == [b"fast"]


@pytest.mark.parametrize("transforms, error", [
    ([udf("f", "function f(m) { return m; ")], "SyntaxError"),
    ([udf("g", "function f(m) { return m; }")], "does not define a function g"),
    ([udf("f", "x" * (limits.transform_code_bytes_max + 1))], "1 to 20000 bytes"),
    ([udf(f"f{i}", f"function f{i}(m) {{ return m; }}") for i in range(limits.transforms_per_resource_max + 1)],
     "Too many message_transforms"),
    ([udf("f", "function f(m) { return m; }"), udf("f", "function f(m) { return m; }")], "its own function_name"),
    ([udf("not-a-name", "function f(m) { return m; }")], "JavaScript identifier"),
])
def test_bad_transforms_are_refused_and_change_nothing(clients, transforms, error):
    pub, sub = clients
    t = pub.topic_path(P, "bad-smt")
    with pytest.raises(gexc.InvalidArgument, match=error):
        pub.create_topic(request={"name": t, "message_transforms": transforms})
    with pytest.raises(gexc.NotFound):
        pub.get_topic(topic=t)
    pub.create_topic(name=pub.topic_path(P, "bad-smt-base"))
    s = sub.subscription_path(P, "bad-smt-sub")
    with pytest.raises(gexc.InvalidArgument, match=error):
        sub.create_subscription(request={"name": s, "topic": pub.topic_path(P, "bad-smt-base"),
                                         "message_transforms": transforms})
    with pytest.raises(gexc.NotFound):
        sub.get_subscription(subscription=s)
    pub.delete_topic(topic=pub.topic_path(P, "bad-smt-base"))
