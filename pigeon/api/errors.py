"""The one error boundary. Owns the rule: an operational error (PigeonError) becomes a gRPC status — with
google.rpc details where it carries them (ErrorInfo) — or Google's JSON error shape over HTTP here and nowhere
else; any other exception is a bug: logged with its traceback, answered INTERNAL without internals, and the
server keeps serving."""

from __future__ import annotations

import functools
import logging
import time

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from pigeon.core import limits
from pigeon.core.errors import InvalidArgument, PigeonError

log = logging.getLogger("pigeon.api")

INTERNAL_MESSAGE = "Internal error in the server (it is logged there); the request may be retried."


def _details(e: PigeonError) -> list:
    """The google.rpc detail messages an operational error carries: ErrorInfo, QuotaFailure, RetryInfo."""
    out = []
    info = e.error_info()
    if info is not None:
        reason, domain, metadata = info
        out.append(error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata=metadata))
    violations = e.quota_violations()
    if violations:
        out.append(error_details_pb2.QuotaFailure(violations=[
            error_details_pb2.QuotaFailure.Violation(subject=s, description=d) for s, d in violations]))
    retry = e.retry_after_s()
    if retry is not None:
        r = error_details_pb2.RetryInfo()
        r.retry_delay.FromNanoseconds(int(retry * 1e9))
        out.append(r)
    return out


def grpc_status(e: PigeonError) -> tuple[grpc.StatusCode, str, tuple]:
    """(code, message, trailing metadata) of an operational error."""
    trailers = ()
    details = _details(e)
    if details:
        packed = []
        for d in details:
            a = any_pb2.Any()
            a.Pack(d)
            packed.append(a)
        st = status_pb2.Status(code=code_pb2.Code.Value(e.code), message=e.message, details=packed)
        trailers = (("grpc-status-details-bin", st.SerializeToString()),)
    return grpc.StatusCode[e.code], e.message, trailers


class Relayed(Exception):
    """The status another node ended a forwarded call with, passed on to the client as it came."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers=()):
        super().__init__(details)
        self.code, self.details, self.trailers = code, details, tuple(trailers or ())


async def abort(context, e: BaseException):
    """End a call with the status of `e` (INTERNAL, logged, for anything but a PigeonError or a Relayed one)."""
    if isinstance(e, Relayed):
        await context.abort(e.code, e.details, trailing_metadata=e.trailers)
    if not isinstance(e, PigeonError):
        log.error("unexpected error in %s", _method(context), exc_info=e)
        await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    code, message, trailers = grpc_status(e)
    await context.abort(code, message, trailing_metadata=trailers)


def _method(context) -> str:
    try:
        return context.method() if hasattr(context, "method") else "a call"
    except Exception:  # noqa: BLE001 — only for the log line
        return "a call"


class Unparsable:
    """Stands in for a request whose bytes are not the message its method takes: grpc would answer a parser's
    exception INTERNAL, but the mistake is the client's (INVALID_ARGUMENT, through `refused`)."""

    __slots__ = ("kind", "why")

    def __init__(self, kind: str, why: str):
        self.kind, self.why = kind, why

    def refused(self) -> InvalidArgument:
        return InvalidArgument(f"The request is not a valid {self.kind}: {self.why}.")


def parser(request_cls):
    """A request deserializer that never raises: the message, or an Unparsable."""
    kind = request_cls.DESCRIPTOR.full_name

    def parse(data: bytes):
        try:
            return request_cls.FromString(data)
        except Exception as e:  # noqa: BLE001 — DecodeError, or what the runtime raises for nonsense
            return Unparsable(kind, str(e) or type(e).__name__)

    return parse


def unary(fn, request_cls):
    """A unary method handler whose request is parsed by `parser` (None: the handler takes the raw bytes);
    `fn` goes through `translate`, which refuses an Unparsable."""
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=parser(request_cls) if request_cls is not None else None, response_serializer=None)


_WAITS = {"pull", "take"}  # handlers that wait for messages by design: not slow when they take their time


def translate(fn):
    """Wrap a unary gRPC handler: errors leave through `abort`; a call slower than limits.slow_request_s (but
    one that waits by design) gets a log line with its duration."""
    watch = fn.__name__ not in _WAITS

    @functools.wraps(fn)
    async def handler(self, request, context):
        t0 = time.perf_counter()
        try:
            if type(request) is Unparsable:
                raise request.refused()
            return await fn(self, request, context)
        except PigeonError as e:
            await abort(context, e)
        except Exception as e:  # noqa: BLE001 — the boundary: a bug becomes INTERNAL, the server goes on
            await abort(context, e)
        finally:
            took = time.perf_counter() - t0
            if watch and took > limits.slow_request_s:
                log.warning("slow request: %s took %.2f s", fn.__name__, took)

    return handler


def http_error(e: BaseException) -> tuple[int, dict]:
    """(HTTP status, body) in Google's JSON error shape: {"error": {"code", "message", "status", "details"}}."""
    if not isinstance(e, PigeonError):
        log.error("unexpected error", exc_info=e)
        return 500, {"error": {"code": 500, "message": INTERNAL_MESSAGE, "status": "INTERNAL", "details": []}}
    from google.protobuf import json_format

    details = []
    for d in _details(e):
        a = any_pb2.Any()
        a.Pack(d)
        details.append(json_format.MessageToDict(a))
    return e.http, {"error": {"code": e.http, "message": e.message, "status": e.code, "details": details}}
