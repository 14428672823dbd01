"""The Pub/Sub REST/JSON API, health checks, /metrics (pigeon.api.metrics): the HTTP port (aiohttp, on the node's
event loop). Its routes are pigeon.api.rest_routes', its OpenAPI document pigeon.api.rest_openapi's.

A request becomes the method's request message by the HTTP rule — path variables, then the JSON body
(`body: "*"`) or the query parameters — in proto3 JSON, and is answered by this node's own gRPC server over
loopback: validation, errors, routing to a bundle's owner are the gRPC API's, never re-implemented here. gRPC
errors come back in Google's JSON error shape, `{"error": {"code", "message", "status"}}`, with Google's HTTP
code for each status."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import time

import grpc
from aiohttp import web
from google.protobuf import json_format

from pigeon.api import sli
from pigeon.api.rest_openapi import openapi
from pigeon.api.rest_routes import EMBEDDED, Route, match
from pigeon.core import limits
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


def _embedded_json(msg, out: dict) -> dict:
    """`out` (msg as proto3 JSON) with every EMBEDDED field shown as the PubsubMessage it carries."""
    from google.pubsub_v1.types import PubsubMessage

    for fd in msg.DESCRIPTOR.fields:
        if fd.full_name in EMBEDDED and fd.json_name in out:
            out[fd.json_name] = json_format.MessageToDict(PubsubMessage.pb().FromString(getattr(msg, fd.name)))
        elif fd.message_type is not None and fd.json_name in out and not fd.message_type.GetOptions().map_entry:
            values = getattr(msg, fd.name)
            if fd.is_repeated:
                out[fd.json_name] = [_embedded_json(v, o) for v, o in zip(values, out[fd.json_name])]
            else:
                out[fd.json_name] = _embedded_json(values, out[fd.json_name])
    return out


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

    def __init__(self, grpc_target: str, ready=None, metrics=None, mtls: bool = False, metrics_gate=None,
                 requests: sli.Requests | None = None):
        self.mtls = mtls  # mutual TLS: a caller without a token is its certificate's identity
        self.metrics_gate = metrics_gate  # (authorization, client certificate) → None, or raises: /metrics' door
        self.channel = grpc.aio.insecure_channel(grpc_target, options=[
            ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        self.ready = ready  # () → (ok, why): readiness for /readyz
        self.metrics = metrics  # () → bytes in Prometheus' text format
        self._calls: dict[str, object] = {}
        self.routes = sli.RestRoutes(requests if requests is not None else sli.Requests())

    def _call(self, rpc: str):
        c = self._calls.get(rpc)
        if c is None:
            c = self._calls[rpc] = self.channel.unary_unary(rpc, request_serializer=None, response_deserializer=None)
        return c

    async def handle(self, req: web.Request) -> web.Response:
        """One REST request, recorded once (pigeon.api.sli) by its route and the status it was answered with."""
        t0 = time.perf_counter()
        found = match(req.method, req.path)
        figures = self.routes.of(found[0] if found is not None else None)
        code = grpc.StatusCode.UNKNOWN
        try:
            code, resp = await self._answer(found, req)
            return resp
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as e:  # noqa: BLE001 — answered here as the middleware would, so it is counted as sent
            code, resp = _failure(req, e)
            return resp
        finally:
            self.routes.record(figures, code, time.perf_counter() - t0)

    async def _answer(self, found, req: web.Request) -> tuple[grpc.StatusCode, web.Response]:
        if found is None:
            return grpc.StatusCode.NOT_FOUND, error_response(
                grpc.StatusCode.NOT_FOUND, f"The requested URL {req.path} was not found on this server (method "
                                           f"{req.method}).")
        route, values = found
        try:
            msg = await request_message(route, values, req)
        except RestError as e:
            return e.code, error_response(e.code, e.message)
        metadata = [(k.lower(), v) for k, v in req.headers.items() if k.lower() == "authorization"]
        if self.mtls and not metadata:
            who = _cert_identity(req)
            if who:
                metadata.append(("x-pigeon-principal", who))
        try:
            payload = msg if type(msg) is bytes else msg.SerializeToString()
            raw = await self._call(route.rpc)(payload, timeout=_CALL_S, metadata=metadata or None)
        except grpc.aio.AioRpcError as e:
            return e.code(), error_response(e.code(), e.details() or e.code().name,
                                            _status_details(e.trailing_metadata()))
        out = route.response.FromString(raw)
        if route.rpc.startswith("/pigeon.v1.Queue/"):
            return grpc.StatusCode.OK, web.json_response(_embedded_json(out, json_format.MessageToDict(out)))
        text = json_format.MessageToJson(out, indent=None)
        return grpc.StatusCode.OK, web.Response(text=text, content_type="application/json")

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

    async def jwks(self, req: web.Request) -> web.Response:
        """The public keys push OIDC tokens are signed with (pigeon.node.push_tokens): answered to anyone, with
        credentials or none, as Google's are — it holds public keys only."""
        from pigeon.node import push_tokens

        doc = await asyncio.to_thread(push_tokens.jwks)  # (the first call may read or make the key)
        return web.json_response(doc, headers={"Cache-Control": "public, max-age=300"})

    async def openid_configuration(self, req: web.Request) -> web.Response:
        """OpenID discovery for push tokens: their issuer (Google's, as Pub/Sub's tokens carry) and where their keys
        are (this port's JWKS)."""
        from pigeon.node import push_tokens

        return web.json_response({
            "issuer": push_tokens.OIDC_ISSUER, "jwks_uri": f"{req.scheme}://{req.host}/.well-known/jwks.json",
            "id_token_signing_alg_values_supported": ["RS256"], "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "claims_supported": ["aud", "azp", "email", "email_verified", "exp", "iat", "iss", "sub"],
        }, headers={"Cache-Control": "public, max-age=300"})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=limits.rest_body_bytes_max, middlewares=[_errors])
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/openapi.json", lambda req: web.json_response(openapi()))
        app.router.add_get("/.well-known/jwks.json", self.jwks)  # push tokens' keys (docs/security.md)
        app.router.add_get("/.well-known/openid-configuration", self.openid_configuration)
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
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 — the boundary: a bug answers INTERNAL and the server goes on
        return _failure(req, e)[1]


def _failure(req: web.Request, e: Exception) -> tuple[grpc.StatusCode, web.Response]:
    if isinstance(e, web.HTTPRequestEntityTooLarge):
        code, message = grpc.StatusCode.INVALID_ARGUMENT, f"Request payload size exceeds the limit: " \
                                                          f"{limits.rest_body_bytes_max} bytes."
    elif isinstance(e, web.HTTPException):
        code = {404: grpc.StatusCode.NOT_FOUND, 405: grpc.StatusCode.UNIMPLEMENTED}.get(
            e.status, grpc.StatusCode.INVALID_ARGUMENT)
        message = e.reason or str(e)
    else:
        log.error("REST %s %s failed", req.method, req.path, exc_info=e)
        code, message = grpc.StatusCode.INTERNAL, "Internal error."
    return code, error_response(code, message)


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
