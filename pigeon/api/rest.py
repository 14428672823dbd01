"""The Pub/Sub REST/JSON API, health checks, /metrics (pigeon.api.metrics): the HTTP port (aiohttp, on the node's
event loop).

Routes are not written by hand: they are the `google.api.http` annotations of the `pubsub.proto` and
`schema.proto` the official client library ships (compiled here, once, into descriptors with grpc_tools), plus
the IAM mixin's bindings of Pub/Sub's service configuration (as the client library's REST transport carries
them). A request becomes the method's request message by the HTTP rule — path variables, then the JSON body
(`body: "*"`) or the query parameters — in proto3 JSON, and is answered by this node's own gRPC server over
loopback: validation, errors, routing to a bundle's owner are the gRPC API's, never re-implemented here. gRPC
errors come back in Google's JSON error shape, `{"error": {"code", "message", "status"}}`, with Google's HTTP
code for each status."""

from __future__ import annotations

import asyncio
import base64
import binascii
import importlib
import importlib.util
import inspect
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache

import grpc
from aiohttp import web
from google.api import annotations_pb2, http_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from pigeon.core import limits, names
from pigeon.core.errors import PigeonError
from pigeon.core.wire import length_delimited

log = logging.getLogger("pigeon.rest")

# gRPC status → HTTP code, as Google's front ends map them (google.rpc.Code's documentation)
HTTP_CODE = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409, grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
# query parameters every Google API takes (system parameters), not fields of the request
_SYSTEM_PARAMS = {"alt", "$alt", "prettyPrint", "key", "fields", "callback", "quotaUser", "upload_protocol",
                  "uploadType", "access_token", "$.xgafv", "oauth_token"}
_IAM_METHODS = ("GetIamPolicy", "SetIamPolicy", "TestIamPermissions")
CONSOLE_DIR = os.path.join(os.path.dirname(__file__), "console")
_CALL_S = 60.0  # a call longer than this (a Pull waits at most its own time) is DEADLINE_EXCEEDED


class RestError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def error_response(code: grpc.StatusCode, message: str, details: list | None = None) -> web.Response:
    status = HTTP_CODE.get(code, 500)
    body = {"error": {"code": status, "message": message, "status": code.name}}
    if details:
        body["error"]["details"] = details
    return web.json_response(body, status=status)


def _status_details(trailers) -> list:
    """The google.rpc details (ErrorInfo, QuotaFailure, RetryInfo) of a gRPC status, as Google's JSON shows them."""
    from google.rpc import status_pb2

    for k, v in trailers or ():
        if k == "grpc-status-details-bin":
            try:
                st = status_pb2.Status.FromString(v)
                return [json_format.MessageToDict(d) for d in st.details]
            except Exception:  # noqa: BLE001 — details we cannot read are left out, the status stands
                return []
    return []


# --- routes, from the annotations ------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    verb: str  # GET, POST, …
    template: str  # as the annotation writes it
    regex: re.Pattern
    variables: tuple[str, ...]  # field paths, in the order of the regex groups
    body: str  # "" (no body: query parameters), "*" (the request) or a field's name
    rpc: str  # /package.Service/Method
    request: type
    response: type


def _template_regex(template: str) -> tuple[re.Pattern, tuple[str, ...]]:
    """`/v1/{name=projects/*/topics/*}:publish` → a regex with one group per variable, and the variables."""
    out, variables, pos = [], [], 0
    for m in re.finditer(r"\{([^}=]+)(?:=([^}]*))?\}", template):
        out.append(re.escape(template[pos:m.start()]))
        pattern = m.group(2) or "*"
        # a segment holds no '/' and no ':' (a custom verb follows the last one; resource ids have no ':')
        parts = [".+" if seg == "**" else "[^/:]+" if seg == "*" else re.escape(seg) for seg in pattern.split("/")]
        out.append("(" + "/".join(parts) + ")")
        variables.append(m.group(1))
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out) + r"\Z"), tuple(variables)


def _compiled_protos() -> descriptor_pb2.FileDescriptorSet:
    """pubsub.proto and schema.proto of the installed client library, compiled with their imports."""
    from grpc_tools import protoc

    # found, not imported: the handwritten client's package imports the whole generated client (node.pubsub_types)
    src = os.path.join(importlib.util.find_spec("google.cloud.pubsub_v1").submodule_search_locations[0], "proto")
    site = os.path.dirname(os.path.dirname(os.path.dirname(annotations_pb2.__file__)))  # where google/api lives
    std = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "google", "pubsub", "v1"))
        for name in ("pubsub.proto", "schema.proto"):  # as pubsub.proto imports it
            shutil.copy(os.path.join(src, name), os.path.join(d, "google", "pubsub", "v1", name))
        out = os.path.join(d, "set.pb")
        rc = protoc.main(["protoc", f"-I{d}", f"-I{site}", f"-I{std}", "--include_imports",
                          f"--descriptor_set_out={out}", "google/pubsub/v1/pubsub.proto",
                          "google/pubsub/v1/schema.proto"])
        if rc != 0:
            raise RuntimeError("compiling the client library's pubsub.proto failed")
        with open(out, "rb") as f:
            return descriptor_pb2.FileDescriptorSet.FromString(f.read())


def _rule_bindings(rule: http_pb2.HttpRule):
    for r in (rule, *rule.additional_bindings):
        kind = r.WhichOneof("pattern")
        if kind in ("get", "put", "post", "delete", "patch"):
            yield kind.upper(), getattr(r, kind), r.body


@lru_cache(maxsize=1)
def routes() -> tuple[Route, ...]:
    """Every binding of the annotated protos, then those of the client library's REST transports for methods
    the shipped protos predate (schema revisions) and for the IAM mixin."""
    files = _compiled_protos()
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    import google.pubsub_v1.types  # noqa: F401 — the library's messages: every field of today's API

    def cls(full: str):
        """The client library's message class (the protos it ships are older than its types: fields such as
        enable_exactly_once_delivery are missing there), else the compiled one."""
        try:
            return message_factory.GetMessageClass(descriptor_pool.Default().FindMessageTypeByName(full))
        except KeyError:
            return message_factory.GetMessageClass(pool.FindMessageTypeByName(full))

    out, done = [], set()
    for f in files.file:
        if f.package != "google.pubsub.v1":
            continue
        for svc in f.service:
            for m in svc.method:
                if not m.options.HasExtension(annotations_pb2.http):
                    continue
                done.add((svc.name, m.name))
                for verb, template, body in _rule_bindings(m.options.Extensions[annotations_pb2.http]):
                    out.append(_route(verb, template, body, f"/google.pubsub.v1.{svc.name}/{m.name}",
                                      cls(m.input_type.lstrip(".")), cls(m.output_type.lstrip("."))))
    for mod in _pigeon_protos():  # pigeon.v1's services: their own annotations
        for svc in mod.DESCRIPTOR.services_by_name.values():
            for m in svc.methods:
                if m.GetOptions().HasExtension(annotations_pb2.http):
                    for verb, template, body in _rule_bindings(m.GetOptions().Extensions[annotations_pb2.http]):
                        out.append(_route(verb, template, body, f"/{svc.full_name}/{m.name}",
                                          message_factory.GetMessageClass(m.input_type),
                                          message_factory.GetMessageClass(m.output_type)))
    seen = {(r.verb, r.template) for r in out}
    for service, transport in _transports().items():
        for name in dir(transport):
            method = name[1:]
            if not (name.startswith("_") and method[:1].isupper() and not name.startswith("_Base")) \
                    or (service, method) in done:
                continue
            sig = inspect.signature(getattr(transport, name).__call__)
            if "request" not in sig.parameters:
                continue
            request, response = sig.parameters["request"].annotation, sig.return_annotation
            request, response = _pb(request), _pb(response)
            if request is None or response is None:
                continue  # a streaming method: no REST binding
            rpc = f"/google.iam.v1.IAMPolicy/{method}" if method in _IAM_METHODS else \
                f"/google.pubsub.v1.{service}/{method}"
            for verb, template, body in _transport_bindings(transport, method):
                if (verb, template) not in seen:
                    seen.add((verb, template))
                    out.append(_route(verb, template, body, rpc, request, response))
    return tuple(out)


def _route(verb: str, template: str, body: str, rpc: str, request: type, response: type) -> Route:
    regex, variables = _template_regex(template)
    return Route(verb, template, regex, variables, body, rpc, request, response)


def _pb(t):
    """The protobuf class of an annotation of the REST transport (proto-plus types wrap one)."""
    if isinstance(t, type) and hasattr(t, "pb") and hasattr(t, "meta"):
        return t.pb()
    if isinstance(t, type) and hasattr(t, "DESCRIPTOR"):
        return t
    return None


def _pigeon_protos() -> tuple:
    from pigeon.api.proto import pigeon_monitoring_pb2, pigeon_queue_pb2, pigeon_ranges_pb2

    return pigeon_queue_pb2, pigeon_ranges_pb2, pigeon_monitoring_pb2


# bytes fields that carry a serialized google.pubsub.v1.PubsubMessage (pigeon.v1.Queue splices the stored bytes
# in): in JSON they are that message, as Pull's receivedMessages show it
_EMBEDDED = frozenset({"pigeon.v1.Taken.message", "pigeon.v1.PeekResponse.message"})


def _embedded_json(msg, out: dict) -> dict:
    """`out` (msg as proto3 JSON) with every _EMBEDDED field shown as the PubsubMessage it carries."""
    from google.pubsub_v1.types import PubsubMessage

    for fd in msg.DESCRIPTOR.fields:
        if fd.full_name in _EMBEDDED and fd.json_name in out:
            out[fd.json_name] = json_format.MessageToDict(PubsubMessage.pb().FromString(getattr(msg, fd.name)))
        elif fd.message_type is not None and fd.json_name in out and not fd.message_type.GetOptions().map_entry:
            values = getattr(msg, fd.name)
            if fd.is_repeated:
                out[fd.json_name] = [_embedded_json(v, o) for v, o in zip(values, out[fd.json_name])]
            else:
                out[fd.json_name] = _embedded_json(values, out[fd.json_name])
    return out


def _transports() -> dict:
    from google.pubsub_v1.services.publisher.transports import rest as pub
    from google.pubsub_v1.services.schema_service.transports import rest as sch
    from google.pubsub_v1.services.subscriber.transports import rest as sub

    return {"Publisher": pub.PublisherRestTransport, "Subscriber": sub.SubscriberRestTransport,
            "SchemaService": sch.SchemaServiceRestTransport}


def _transport_bindings(transport, method: str) -> list[tuple[str, str, str]]:
    """A method's bindings as the client library's REST transport carries them."""
    base = getattr(transport, f"_Base{method}", None)
    get = getattr(base, "_get_http_options", None)
    return [(o["method"].upper(), o["uri"], o.get("body", "")) for o in get()] if get else []


def match(verb: str, path: str) -> tuple[Route, tuple[str, ...]] | None:
    for r in routes():
        if r.verb == verb:
            m = r.regex.match(path)
            if m:
                return r, m.groups()
    return None


# --- requests --------------------------------------------------------------------------------------------
def _field(msg, path: str):
    """(the message holding the last field of a dotted path, that field's descriptor)."""
    *parents, last = path.split(".")
    for name in parents:
        fd = _find(msg, name)
        if fd is None or fd.message_type is None:
            raise RestError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid JSON payload received. Unknown name "
                                                              f"\"{path}\": Cannot find field.")
        msg = getattr(msg, fd.name)
    fd = _find(msg, last)
    if fd is None:
        raise RestError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"Invalid JSON payload received. Unknown name \"{path}\": Cannot bind query parameter. "
                        f"Field '{path}' could not be found in request message.")
    return msg, fd


def _find(msg, name: str):
    d = msg.DESCRIPTOR
    return d.fields_by_name.get(name) or next((f for f in d.fields if f.json_name == name), None)


def _set_scalar(msg, fd, raw: str, path: str) -> None:
    from google.protobuf.descriptor import FieldDescriptor as F

    try:
        if fd.type in (F.TYPE_STRING,):
            value = raw
        elif fd.type == F.TYPE_BOOL:
            if raw not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            value = raw in ("true", "1")
        elif fd.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            value = float(raw)
        elif fd.type == F.TYPE_ENUM:
            ev = fd.enum_type.values_by_name.get(raw)
            value = ev.number if ev is not None else int(raw)
        elif fd.type == F.TYPE_BYTES:
            value = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        elif fd.type == F.TYPE_MESSAGE:
            sub = getattr(msg, fd.name)
            json_format.Parse(json.dumps(raw), sub)  # well-known types that read from a string (FieldMask, …)
            return
        else:
            value = int(raw)
    except (ValueError, json_format.ParseError):
        raise RestError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid value at '{path}' ({fd.full_name}), "
                                                          f"\"{raw}\"") from None
    try:
        if fd.is_repeated:
            getattr(msg, fd.name).append(value)
        else:
            setattr(msg, fd.name, value)
    except (ValueError, TypeError):  # out of the field's range (an int32 page size of 2**31)
        raise RestError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid value at '{path}' ({fd.full_name}), "
                                                          f"\"{raw}\"") from None


_PUBLISH_RPC = "/google.pubsub.v1.Publisher/Publish"
_MESSAGE_KEYS = {"data", "attributes", "orderingKey"}


def _fast_publish(topic: str, raw: bytes) -> bytes | None:
    """A publish body of the usual shape — {"messages": [{"data": base64, "attributes": {str: str},
    "orderingKey": str}, …]} — encoded straight into PublishRequest bytes (json_format and message objects cost
    several times the rest of the call); anything else (other fields or types, base64 that is not strict) is
    None and goes the general way, which decides."""
    try:
        body = json.loads(raw)
        msgs = body["messages"] if type(body) is dict and len(body) == 1 else None
        if type(msgs) is not list:
            return None
        parts = [length_delimited(1, topic.encode())]
        for m in msgs:
            if type(m) is not dict or not m.keys() <= _MESSAGE_KEYS:
                return None
            data, attrs, key = m.get("data", ""), m.get("attributes", {}), m.get("orderingKey", "")
            if type(data) is not str or type(attrs) is not dict or type(key) is not str:
                return None
            inner = [length_delimited(1, binascii.a2b_base64(data, strict_mode=True))] if data else []
            for k, v in attrs.items():
                if type(k) is not str or type(v) is not str:
                    return None
                inner.append(length_delimited(2, length_delimited(1, k.encode()) + length_delimited(2, v.encode())))
            if key:
                inner.append(length_delimited(5, key.encode()))
            parts.append(length_delimited(2, b"".join(inner)))
        return b"".join(parts)
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None


async def request_message(route: Route, values: tuple[str, ...], req: web.Request):
    if route.rpc == _PUBLISH_RPC:
        fast = _fast_publish(values[0], await req.read())
        if fast is not None:
            return fast
    msg = route.request()
    if route.body:
        raw = await req.read()
        text = raw.decode("utf-8", "replace") if raw else "{}"
        target = msg if route.body == "*" else getattr(msg, route.body)
        try:
            json_format.Parse(text, target)
        except json_format.ParseError as e:
            raise RestError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid JSON payload received. {e}") from None
    if route.body != "*":  # the fields neither the path nor the body binds are query parameters
        for key, raw in req.query.items():
            if key in _SYSTEM_PARAMS:
                continue
            holder, fd = _field(msg, key)
            _set_scalar(holder, fd, raw, key)
    for path, value in zip(route.variables, values):
        holder, fd = _field(msg, path)
        _set_scalar(holder, fd, value, path)
    return msg


# --- the application ---------------------------------------------------------------------------------------
class RestApi:
    """Answers the REST API by calling the node's own gRPC server at `grpc_target`."""

    def __init__(self, grpc_target: str, ready=None, metrics=None, mtls: bool = False, metrics_gate=None):
        self.mtls = mtls  # mutual TLS: a caller without a token is its certificate's identity
        self.metrics_gate = metrics_gate  # (authorization, client certificate) → None, or raises: /metrics' door
        self.channel = grpc.aio.insecure_channel(grpc_target, options=[
            ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        self.ready = ready  # () → (ok, why): readiness for /readyz
        self.metrics = metrics  # () → bytes in Prometheus' text format
        self._calls: dict[str, object] = {}

    def _call(self, rpc: str):
        c = self._calls.get(rpc)
        if c is None:
            c = self._calls[rpc] = self.channel.unary_unary(rpc, request_serializer=None, response_deserializer=None)
        return c

    async def handle(self, req: web.Request) -> web.Response:
        found = match(req.method, req.path)
        if found is None:
            return error_response(grpc.StatusCode.NOT_FOUND, f"The requested URL {req.path} was not found on "
                                                             f"this server (method {req.method}).")
        route, values = found
        try:
            msg = await request_message(route, values, req)
        except RestError as e:
            return error_response(e.code, e.message)
        metadata = [(k.lower(), v) for k, v in req.headers.items() if k.lower() == "authorization"]
        if self.mtls and not metadata:
            who = _cert_identity(req)
            if who:
                metadata.append(("x-pigeon-principal", who))
        try:
            payload = msg if type(msg) is bytes else msg.SerializeToString()
            raw = await self._call(route.rpc)(payload, timeout=_CALL_S, metadata=metadata or None)
        except grpc.aio.AioRpcError as e:
            return error_response(e.code(), e.details() or e.code().name, _status_details(e.trailing_metadata()))
        out = route.response.FromString(raw)
        if route.rpc.startswith("/pigeon.v1.Queue/"):
            return web.json_response(_embedded_json(out, json_format.MessageToDict(out)))
        text = json_format.MessageToJson(out, indent=None)
        return web.Response(text=text, content_type="application/json")

    async def healthz(self, req: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, req: web.Request) -> web.Response:
        ok, why = self.ready() if self.ready is not None else (True, "")
        return web.json_response({"status": "ready" if ok else "not ready", **({"why": why} if why else {})},
                                 status=200 if ok else 503)

    async def metrics_page(self, req: web.Request) -> web.Response:
        if self.metrics is None:
            return error_response(grpc.StatusCode.NOT_FOUND, "No metrics here.")
        if self.metrics_gate is not None:
            try:
                self.metrics_gate(req.headers.get("Authorization"), _cert_pem(req) if self.mtls else None)
            except PigeonError as e:
                return error_response(grpc.StatusCode[e.code], e.message)
        return web.Response(body=self.metrics(), headers={"Content-Type": "text/plain; version=0.0.4; "
                                                                          "charset=utf-8"})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=limits.rest_body_bytes_max, middlewares=[_errors])
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/openapi.json", lambda req: web.json_response(openapi()))
        app.router.add_get("/", lambda req: web.FileResponse(os.path.join(CONSOLE_DIR, "index.html")))
        app.router.add_static("/console/", CONSOLE_DIR)  # the web console: static files over this API
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def close(self) -> None:
        await self.channel.close()


@web.middleware
async def _errors(req: web.Request, handler):
    """Every error in Google's shape: an oversized body, a method aiohttp refuses, a bug (logged)."""
    try:
        return await handler(req)
    except web.HTTPRequestEntityTooLarge:
        return error_response(grpc.StatusCode.INVALID_ARGUMENT, f"Request payload size exceeds the limit: "
                                                                f"{limits.rest_body_bytes_max} bytes.")
    except web.HTTPException as e:
        code = {404: grpc.StatusCode.NOT_FOUND, 405: grpc.StatusCode.UNIMPLEMENTED}.get(e.status,
                                                                                      grpc.StatusCode.INVALID_ARGUMENT)
        return error_response(code, e.reason or str(e))
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 — the boundary: a bug answers INTERNAL and the server goes on
        log.exception("REST %s %s failed", req.method, req.path)
        return error_response(grpc.StatusCode.INTERNAL, "Internal error.")


def _cert_pem(req: web.Request) -> bytes | None:
    """The client certificate of this HTTPS connection (verified by the TLS handshake), or None."""
    import ssl

    obj = req.transport.get_extra_info("ssl_object") if req.transport is not None else None
    der = obj.getpeercert(binary_form=True) if obj is not None else None
    return ssl.DER_cert_to_PEM_cert(der).encode() if der else None


def _cert_identity(req: web.Request) -> str:
    """The principal the client certificate of this HTTPS connection names."""
    from pigeon.ops import certs

    pem = _cert_pem(req)
    return certs.identity_of(pem) if pem is not None else ""


async def start(api: RestApi, host: str, port: int, ssl_context=None, reuse_port: bool = False,
                also: int = 0) -> web.AppRunner:
    """Serve the HTTP API on `port` (shared with other processes when `reuse_port`) and, when `also` is set, on
    that port of this process's own too (a worker's: a scrape there reaches this worker)."""
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port or None, ssl_context=ssl_context)
    await site.start()
    if also:
        await web.TCPSite(runner, host, also, reuse_address=True, ssl_context=ssl_context).start()
    return runner


# --- the OpenAPI document, from the same routes ------------------------------------------------------------
_INT32 = {"int32", "sint32", "sfixed32"}
_UINT32 = {"uint32", "fixed32"}
_INT64 = {"int64", "sint64", "sfixed64", "uint64", "fixed64"}
_WELL_KNOWN = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]{1,9})?s$"},
    "google.protobuf.FieldMask": {"type": "string"},
    "google.protobuf.Empty": {"type": "object", "additionalProperties": False},
    "google.protobuf.Struct": {"type": "object"},
    "google.protobuf.Value": {},
}
_SINGULAR = {"projects": "project", "topics": "topic", "subscriptions": "subscription", "snapshots": "snapshot",
             "schemas": "schema"}
# a path parameter's values as pigeon.core.names accepts them (a project's ':' is left out: in a path it would
# read as the start of a custom verb), so a client generated from the document sends names the server takes; and
# an example of each (`my-project`, `my-topic`, …), which the REST fuzz test creates before it starts
_ID_SCHEMA = {"type": "string", "minLength": limits.name_chars_min, "maxLength": limits.name_chars_max,
              "pattern": f"^[A-Za-z][{names.ID_CHARS}]*$"}
_PATH_SCHEMAS = {"project": {"type": "string", "maxLength": names.PROJECT_CHARS_MAX,
                             "pattern": f"^[A-Za-z0-9][{names.ID_CHARS}]*$", "example": "my-project"},
                 **{kind: _ID_SCHEMA | {"example": f"my-{kind}"}
                    for kind in ("topic", "subscription", "snapshot", "schema")}}


def _type_name(fd) -> str:
    from google.protobuf.descriptor import FieldDescriptor as F

    return {F.TYPE_DOUBLE: "double", F.TYPE_FLOAT: "float", F.TYPE_INT64: "int64", F.TYPE_UINT64: "uint64",
            F.TYPE_INT32: "int32", F.TYPE_FIXED64: "fixed64", F.TYPE_FIXED32: "fixed32", F.TYPE_BOOL: "bool",
            F.TYPE_STRING: "string", F.TYPE_BYTES: "bytes", F.TYPE_UINT32: "uint32", F.TYPE_ENUM: "enum",
            F.TYPE_SFIXED32: "sfixed32", F.TYPE_SFIXED64: "sfixed64", F.TYPE_SINT32: "sint32",
            F.TYPE_SINT64: "sint64", F.TYPE_MESSAGE: "message"}[fd.type]


def _field_schema(fd, comps: dict) -> dict:
    t = _type_name(fd)
    if fd.full_name in _EMBEDDED:
        from google.pubsub_v1.types import PubsubMessage

        one = _message_schema(PubsubMessage.pb().DESCRIPTOR, comps)
    elif t == "message":
        if fd.message_type.GetOptions().map_entry:
            return {"type": "object", "additionalProperties": _field_schema(fd.message_type.fields_by_name["value"],
                                                                            comps)}
        one = _message_schema(fd.message_type, comps)
    elif t in _INT32:
        one = {"type": "integer", "format": "int32"}
    elif t in _UINT32:
        one = {"type": "integer", "format": "int32", "minimum": 0}
    elif t in _INT64:
        one = {"type": "string", "pattern": "^-?[0-9]+$" if not t.startswith("u") else "^[0-9]+$"}
    elif t in ("double", "float"):
        one = {"type": "number"}
    elif t == "bool":
        one = {"type": "boolean"}
    elif t == "bytes":
        one = {"type": "string", "format": "byte"}
    elif t == "enum":
        one = {"type": "string", "enum": [v.name for v in fd.enum_type.values]}
    else:
        one = {"type": "string"}
    return {"type": "array", "items": one} if fd.is_repeated else one


def _message_schema(desc, comps: dict) -> dict:
    if desc.full_name in _WELL_KNOWN:
        return dict(_WELL_KNOWN[desc.full_name])
    if desc.full_name not in comps:
        comps[desc.full_name] = {}  # (recursive messages refer to it while it is being built)
        comps[desc.full_name] = {"type": "object", "additionalProperties": False, "properties": {
            f.json_name: _field_schema(f, comps) for f in desc.fields}}
    return {"$ref": f"#/components/schemas/{desc.full_name}"}


def _openapi_path(route: Route) -> tuple[str, list[dict]]:
    """`/v1/{name=projects/*/topics/*}:publish` → `/v1/projects/{project}/topics/{topic}:publish` and its
    path parameters (each one segment)."""
    params, out, pos = [], [], 0
    for m in re.finditer(r"\{([^}=]+)(?:=([^}]*))?\}", route.template):
        out.append(route.template[pos:m.start()])
        segs = (m.group(2) or "*").split("/")
        parts = []
        for i, seg in enumerate(segs):
            if seg == "*":
                prev = segs[i - 1] if i else m.group(1).split(".")[-1]
                name = _SINGULAR.get(prev, prev)
                params.append({"name": name, "in": "path", "required": True,
                               "schema": dict(_PATH_SCHEMAS.get(name, {"type": "string", "pattern": "^[^/:]+$"}))})
                parts.append("{" + name + "}")
            else:
                parts.append(seg)
        out.append("/".join(parts))
        pos = m.end()
    out.append(route.template[pos:])
    return "".join(out), params


@lru_cache(maxsize=1)
def openapi() -> dict:
    comps: dict = {"Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {
        "code": {"type": "integer"}, "message": {"type": "string"}, "status": {"type": "string"}}}}}}
    paths: dict = {}
    for r in routes():
        path, params = _openapi_path(r)
        bound = {v.split(".")[0] for v in r.variables}
        desc = r.request.DESCRIPTOR
        op: dict = {"operationId": f"{r.rpc.rsplit('/', 1)[-1]}.{len(paths)}", "tags": [r.rpc.split("/")[1]],
                    "parameters": list(params),
                    "responses": {"200": {"description": "OK", "content": {"application/json": {
                        "schema": _message_schema(r.response.DESCRIPTOR, comps)}}},
                        "default": {"description": "Google's error shape", "content": {"application/json": {
                            "schema": {"$ref": "#/components/schemas/Error"}}}}}}
        if r.body == "*":
            op["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": _message_schema(desc, comps)}}}
        else:
            if r.body:
                op["requestBody"] = {"required": True, "content": {"application/json": {
                    "schema": _field_schema(desc.fields_by_name[r.body], comps)}}}
            for f in desc.fields:
                if f.name in bound or f.name == r.body or _type_name(f) == "message" and \
                        f.message_type.full_name not in _WELL_KNOWN:
                    continue
                op["parameters"].append({"name": f.json_name, "in": "query", "required": False,
                                         "schema": _field_schema(f, comps)})
        paths.setdefault(path, {})[r.verb.lower()] = op
    return {"openapi": "3.0.3",
            "info": {"title": "Pigeon: the Pub/Sub v1 REST API", "version": "v1",
                     "description": "Derived from the google.api.http annotations of Pub/Sub's protos."},
            "paths": paths, "components": {"schemas": comps}}
