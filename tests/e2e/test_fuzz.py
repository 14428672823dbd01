"""Hostile input against the real server: every gRPC method of every service it serves, with random bytes,
protobuf-shaped garbage (any field number, any wire type, names valid and not, huge and empty values, forged ack
ids and page tokens), deadlines of ~0 and ~forever, and StreamingPull streams that send garbage mid-way or never
read. Every answer is OK or one of Google's codes for a client's mistake, with a message — never UNKNOWN or
INTERNAL — the server keeps serving, and after kill -9 nothing acknowledged is lost.

`make test` runs a few examples per method (derandomized: the same every run); `make fuzz` runs FUZZ_EXAMPLES per
method and prints the calls made and the codes seen."""

from __future__ import annotations

import collections
import glob
import os
import re

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2e_helpers import E2E_MARKS, collect, raw_publish, topic_and_subscription

pytestmark = E2E_MARKS

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))
CLIENT_MISTAKES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                   grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE,
                   grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.PERMISSION_DENIED,
                   grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED,
                   grpc.StatusCode.UNIMPLEMENTED}
SEEN: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)  # method → codes (make fuzz)


def _methods() -> list[tuple[str, bool]]:
    """(path, is a stream) of every method the official clients and Pigeon's own protos define."""
    import google.pubsub_v1
    from pigeon.api.proto import pigeon_queue_pb2, pigeon_ranges_pb2

    paths = set()
    for f in glob.glob(os.path.join(os.path.dirname(google.pubsub_v1.__file__), "services/*/transports/grpc.py")):
        paths |= set(re.findall(r'"(/google\.(?:pubsub\.v1|iam\.v1)\.[A-Za-z]+/[A-Za-z]+)"', open(f).read()))
    for m in (pigeon_queue_pb2, pigeon_ranges_pb2):
        for svc in m.DESCRIPTOR.services_by_name.values():
            paths |= {f"/{svc.full_name}/{x.name}" for x in svc.methods}
    return sorted((p, p.endswith("/StreamingPull")) for p in paths)


METHODS = _methods()
UNARY = [p for p, stream in METHODS if not stream]

# --- protobuf-shaped garbage ---------------------------------------------------------------------------------
NAMES = ["projects/fz/topics/fz-topic", "projects/fz/subscriptions/fz-sub", "projects/fz/snapshots/fz-snap",
         "projects/fz/schemas/fz-schema", "projects/fz", "projects/fz/topics/x", "projects//topics/",
         "projects/fz/topics/" + "t" * 300, "", "../../etc/passwd", "projects/fz/topics/fz-topic\x00",
         "\udcff".encode("utf-8", "surrogatepass").decode("latin-1"), "1-2-3", "999999999-1-1", "-1--1",
         "projects/fz/subscriptions/fz-sub@0", "token-" + "A" * 40]


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


_field_value = st.one_of(
    st.tuples(st.just(2), st.one_of(st.sampled_from(NAMES).map(lambda s: s.encode("utf-8", "replace")),
                                    st.binary(max_size=64), st.just(b"x" * 70_000))),
    st.tuples(st.just(0), st.sampled_from([0, 1, -1, 2 ** 31, 2 ** 63 - 1, 2 ** 64 - 1, 10 ** 12]).map(_varint)),
    st.tuples(st.just(1), st.binary(min_size=8, max_size=8)),
    st.tuples(st.just(5), st.binary(min_size=4, max_size=4)),
)
_shaped = st.lists(st.tuples(st.integers(1, 20), _field_value), max_size=8).map(
    lambda fields: b"".join(_varint(num << 3 | wt) + (_varint(len(v)) + v if wt == 2 else v)
                            for num, (wt, v) in fields))
REQUESTS = st.one_of(st.binary(max_size=256), _shaped,
                     _shaped.flatmap(lambda b: st.integers(0, max(0, len(b) - 1)).map(
                         lambda i: b[:i] + bytes([(b[i] ^ 0x5A) if b else 0]) + b[i + 1:])))
DEADLINES = st.sampled_from([0.001, 0.05, 5.0, 3600.0 * 24 * 365])


def _check(path: str, code: grpc.StatusCode, details: str | None) -> None:
    SEEN[path][code.name] += 1
    assert code in CLIENT_MISTAKES, f"{path}: {code.name} {details!r}"
    if code is not grpc.StatusCode.OK and code is not grpc.StatusCode.DEADLINE_EXCEEDED \
            and code is not grpc.StatusCode.CANCELLED:
        assert details, f"{path}: {code.name} without a message"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """One server for the module, with a topic, a subscription and acknowledged publishes in it."""
    from google.cloud import pubsub_v1
    from pigeon.testing.server import ServerProcess

    srv = ServerProcess(str(tmp_path_factory.mktemp("fuzz") / "data")).start()
    old = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = srv.address
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic, subscription = topic_and_subscription(pub, sub, "fz", project="fz")
    kept = raw_publish(pub, topic, [{"data": f"kept-{i}".encode()} for i in range(20)])
    acked = raw_publish(pub, topic, [{"data": b"acked"}])
    got = collect(sub, subscription, len(kept) + 1, do_ack=False)
    sub.acknowledge(subscription=subscription, ack_ids=[got[acked[0]].ack_id])
    channel = grpc.insecure_channel(srv.address)
    yield srv, channel, (pub, sub, topic, subscription, set(kept), acked[0])
    channel.close()
    srv.kill()
    if old is None:
        os.environ.pop("PUBSUB_EMULATOR_HOST", None)
    else:
        os.environ["PUBSUB_EMULATOR_HOST"] = old


def test_every_method_the_clients_know_is_served():
    from pigeon.api import admin_api, pigeon_api, queue_api
    from pigeon.api.grpc_api import PubSubApi

    class Details(grpc.HandlerCallDetails):
        def __init__(self, method):
            self.method, self.invocation_metadata = method, ()

    class Unused:  # the handler tables only hold on to the engine
        def __getattr__(self, name):
            return self

    e = Unused()
    handlers = PubSubApi(e).handlers() + admin_api.handlers(e) + queue_api.handlers(e) + pigeon_api.handlers(e)
    missing = [p for p, _ in METHODS if not any(h.service(Details(p)) for h in handlers)]
    assert len(METHODS) >= 45 and not missing, missing


@pytest.mark.parametrize("path", UNARY)
def test_unary_methods_answer_garbage_with_a_clients_mistake(target, path):
    _, channel, _ = target
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request=REQUESTS, timeout=DEADLINES)
    def run(request, timeout):
        try:
            call(request, timeout=min(timeout, 30.0) if timeout < 3600 else timeout)
            _check(path, grpc.StatusCode.OK, None)
        except grpc.RpcError as e:
            _check(path, e.code(), e.details())

    run()


def test_streams_with_garbage_mid_way_or_never_read(target):
    srv, channel, (_, _, _, subscription, _, _) = target
    path = "/google.pubsub.v1.Subscriber/StreamingPull"
    call = channel.stream_stream(path, request_serializer=None, response_deserializer=None)
    first = (b"\x0a" + _varint(len(subscription)) + subscription.encode() + b"\x28\x0a")  # name, deadline 10 s

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(garbage=st.lists(REQUESTS, min_size=1, max_size=3), lead=st.booleans())
    def run(garbage, lead):
        reqs = ([first] if lead else []) + garbage
        responses = call(iter(reqs), timeout=3.0)
        try:
            for _ in responses:
                pass
            _check(path, grpc.StatusCode.OK, None)
        except grpc.RpcError as e:
            _check(path, e.code(), e.details())

    run()
    # streams that never read: opened, first request sent, then left alone until the test ends
    idle = [call(iter([first]), timeout=60.0) for _ in range(20)]
    ping = channel.unary_unary("/google.pubsub.v1.Publisher/ListTopics", request_serializer=None,
                               response_deserializer=None)
    ping(b"\x0a\x0bprojects/fz", timeout=10)  # the server keeps serving meanwhile
    for r in idle:
        r.cancel()


def print_report() -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("method", "calls", "codes seen")
    for path in sorted(SEEN):
        c = SEEN[path]
        table.add_row(path, str(sum(c.values())), ", ".join(f"{k} {v}" for k, v in c.most_common()))
    Console(width=160).print(table)
    print(f"{sum(sum(c.values()) for c in SEEN.values())} calls over {len(SEEN)} methods, none answered UNKNOWN "
          "or INTERNAL")



@pytest.mark.parametrize("path,body", [
    ("/google.pubsub.v1.Publisher/Publish", b"\x00"),  # found by the fuzzer: the raw publish parser's DecodeError
    ("/google.pubsub.v1.Publisher/GetTopic", b"\xff\xff"),  # grpc answered a parser's exception INTERNAL
    ("/pigeon.v1.Queue/Take", b"\x0a\x05ab"),
])
def test_requests_that_do_not_parse_are_invalid_argument(target, path, body):
    _, channel, _ = target
    with pytest.raises(grpc.RpcError) as e:
        channel.unary_unary(path, request_serializer=None, response_deserializer=None)(body, timeout=10)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "not a valid" in e.value.details()


def test_a_stream_whose_first_request_does_not_parse_is_invalid_argument(target):
    _, channel, _ = target
    call = channel.stream_stream("/google.pubsub.v1.Subscriber/StreamingPull", request_serializer=None,
                                 response_deserializer=None)
    with pytest.raises(grpc.RpcError) as e:
        for _ in call(iter([b"\xff\xff\xff"]), timeout=10):
            pass
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "StreamingPullRequest" in e.value.details()


def test_after_the_fuzzing_nothing_acknowledged_is_lost(target, server_factory):
    """Runs last in this module: kill -9, restart on the same data, every kept message is still there and the
    acknowledged one does not come back."""
    srv, _, (_, sub, _, subscription, kept, acked) = target
    srv.kill()
    again = server_factory(data_dir=srv.data_dir, port=srv.port)
    from google.cloud import pubsub_v1

    fresh = pubsub_v1.SubscriberClient()
    got = collect(fresh, subscription, len(kept), timeout=60)
    assert set(got) == kept and acked not in got
    fresh.close()
    again.kill()
    if os.environ.get("FUZZ_REPORT"):
        print_report()
