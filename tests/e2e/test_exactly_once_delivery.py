"""Exactly-once delivery against the real server, as the official client library sees it."""

import functools
import threading

import grpc
import pytest
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus
from google.pubsub_v1 import types
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from e2e_helpers import topic_and_subscription

pytestmark = pytest.mark.e2e


_setup = functools.partial(topic_and_subscription, project="proj", enable_exactly_once_delivery=True,
                           ack_deadline_seconds=60)


def test_stale_ack_id_fails_with_error_info(clients, server):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "eod-stale")
    pub.publish(topic, b"once").result(timeout=10)
    first = sub.pull(subscription=subscription, max_messages=1, timeout=10).received_messages[0]
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id], ack_deadline_seconds=0)
    second = sub.pull(subscription=subscription, max_messages=1, timeout=10).received_messages[0]
    assert second.message.message_id == first.message.message_id
    assert second.ack_id != first.ack_id

    channel = grpc.insecure_channel(server.address)
    ack = channel.unary_unary("/google.pubsub.v1.Subscriber/Acknowledge",
                              request_serializer=types.AcknowledgeRequest.serialize,
                              response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as err:
        ack(types.AcknowledgeRequest(subscription=subscription, ack_ids=[first.ack_id]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(err.value)
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.reason == "EXACTLY_ONCE_ACKID_FAILURE"
    assert info.domain == "pubsub.googleapis.com"
    assert dict(info.metadata) == {first.ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID"}
    # the current ack id still works, and once acked the message never comes back
    ack(types.AcknowledgeRequest(subscription=subscription, ack_ids=[second.ack_id]))
    assert sub.pull(subscription=subscription, max_messages=1, timeout=5,
                    return_immediately=True).received_messages == []
    channel.close()


def test_streaming_ack_with_response_reports_success_and_invalid(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "eod-stream")
    for i in range(5):
        pub.publish(topic, b"m%d" % i).result(timeout=10)
    statuses = []
    errors = []
    done = threading.Event()

    def callback(message):
        try:
            statuses.append(message.ack_with_response().result(timeout=20))
        except AcknowledgeError as e:  # pragma: no cover - reported below
            errors.append(e)
        if len(statuses) + len(errors) >= 5:
            done.set()

    future = sub.subscribe(subscription, callback)
    assert done.wait(30), (statuses, errors)
    future.cancel()
    assert errors == []
    assert statuses == [AcknowledgeStatus.SUCCESS] * 5

    # an ack id of an expired delivery is reported as invalid through the client's own machinery
    pub.publish(topic, b"late").result(timeout=10)
    got = sub.pull(subscription=subscription, max_messages=1, timeout=10).received_messages[0]
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[got.ack_id], ack_deadline_seconds=0)
    with pytest.raises(Exception) as err:
        sub.acknowledge(subscription=subscription, ack_ids=[got.ack_id])
    assert "invalid" in str(err.value).lower()
