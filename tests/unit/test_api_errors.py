"""api.errors, the one boundary: a PigeonError becomes its gRPC status (ErrorInfo where it has one) or Google's
JSON error shape; anything else is a bug — INTERNAL, no internals leaked, and logged."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from pigeon.api import errors
from pigeon.core.errors import AckIdFailure, NotFound


class Aborted(Exception):
    pass


class Context:
    """What a handler sees of a gRPC call: enough to record how it ended."""

    def __init__(self):
        self.ended = None

    async def abort(self, code, message, trailing_metadata=()):
        self.ended = (code, message, dict(trailing_metadata))
        raise Aborted


def _call(exc) -> Context:
    class Api:
        @errors.translate
        async def method(self, request, context):
            raise exc

    ctx = Context()
    with pytest.raises(Aborted):
        asyncio.run(Api().method(None, ctx))
    return ctx


def test_an_operational_error_becomes_its_status():
    code, message, trailers = _call(NotFound("Resource not found (resource=x).")).ended
    assert (code, message, trailers) == (grpc.StatusCode.NOT_FOUND, "Resource not found (resource=x).", {})


def test_error_info_travels_as_a_status_detail():
    code, _, trailers = _call(AckIdFailure({"a1": "PERMANENT_FAILURE_INVALID_ACK_ID"})).ended
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    st = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    info = error_details_pb2.ErrorInfo()
    assert st.details[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "EXACTLY_ONCE_ACKID_FAILURE", "pubsub.googleapis.com", {"a1": "PERMANENT_FAILURE_INVALID_ACK_ID"})


def test_a_bug_is_internal_without_internals_and_logged(caplog):
    with caplog.at_level(logging.ERROR, logger="pigeon.api"):
        code, message, _ = _call(KeyError("secret-internal-name")).ended
    assert code == grpc.StatusCode.INTERNAL and "secret" not in message
    assert "KeyError" in caplog.text


def test_http_errors_have_googles_json_shape():
    assert errors.http_error(NotFound("gone")) == (
        404, {"error": {"code": 404, "message": "gone", "status": "NOT_FOUND", "details": []}})
    status, body = errors.http_error(AckIdFailure({"a": "PERMANENT_FAILURE_INVALID_ACK_ID"}))
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    assert body["error"]["details"] == [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                         "reason": "EXACTLY_ONCE_ACKID_FAILURE", "domain": "pubsub.googleapis.com",
                                         "metadata": {"a": "PERMANENT_FAILURE_INVALID_ACK_ID"}}]
    status, body = errors.http_error(ValueError("x"))
    assert status == 500 and body["error"]["status"] == "INTERNAL"
