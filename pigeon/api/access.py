"""Access control at the gRPC boundary. Owns the rules: every call is authenticated and authorized here, once,
before its handler runs (so before any state changes), by the permission map (api.permissions); a call the map
does not name is refused; a caller who may not do something gets PERMISSION_DENIED with one message whatever
the reason, so it learns nothing about the resource (not even whether it exists); a missing or bad credential
gets UNAUTHENTICATED; list answers hold only what the caller may see; an open StreamingPull is checked at open
and again whenever policies change (within `limits.security_watch_s`), and ended with PERMISSION_DENIED once
its caller lost the right; quotas are charged here (a refusal is answered when its retry hint comes due, at
most `limits.quota_refusal_hold_s_max` later); every admin change and every refusal is audited.

A forwarded call (api.router) carries its caller's verified principal in `x-pigeon-principal`, which is
believed only from a peer that proved it is a node (its client certificate, under mutual TLS) on a listener
that takes peers, or from the node's own REST front (the unix socket in its data directory). A node serves
one of two arrangements (api.server): one port for clients and peers alike (SHARED), or a client port (CLIENTS:
no caller vouches for another there, whatever certificate it shows) beside a peer port (PEERS: every caller
must be a node). With security off nothing here is wired in: the embedded default's calls never pass through
it."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time

import grpc

from pigeon.api import errors
from pigeon.api.permissions import RULES, Listing, Need, Rule
from pigeon.broker import iam
from pigeon.core import limits
from pigeon.core.errors import PermissionDenied, PigeonError, QuotaExceeded, Unauthenticated

log = logging.getLogger("pigeon.access")

PRINCIPAL = "x-pigeon-principal"
SHARED, CLIENTS, PEERS = "shared", "clients", "peers"  # the listener a call came on (see the module's docstring)
FORWARDED = "x-pigeon-forwarded"  # (api.router's marker)
REGION = "x-pigeon-region"  # (api.router's marker of a call from another region's node)
COPY = "x-pigeon-copy"  # (api.region_copies' marker of a copy's read: everything below its start is copied)
CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("pigeon_caller", default=None)


def _field(request, path: str) -> str:
    value = request
    for name in path.split("."):
        value = getattr(value, name, "")
    return value if isinstance(value, str) else ""


def _publish_topic(raw: bytes) -> str:
    """The topic of a PublishRequest's bytes (field 1 comes first from every client; else parse it whole)."""
    if raw[:1] == b"\x0a" and len(raw) > 2 and raw[1] < 0x80:
        return raw[2:2 + raw[1]].decode("utf-8", "replace")
    from pigeon.core import rawproto

    try:
        return rawproto.PublishRequestRaw.FromString(raw).topic
    except Exception:  # noqa: BLE001 — the handler refuses it as the client's mistake
        return ""


class _Watched:
    __slots__ = ("principal", "needs", "task", "revoked")

    def __init__(self, principal, needs, task):
        self.principal, self.needs, self.task, self.revoked = principal, needs, task, False


class _Chain:
    """An async iterator that yields `first`, then what `rest` yields (the stream's first request, read here)."""

    def __init__(self, first, rest):
        self.first, self.rest = first, rest

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.first is not None:
            first, self.first = self.first, None
            return first
        return await self.rest.__anext__()


class Guard:
    def __init__(self, engine, authn, config, audit, quotas, clock=time.monotonic):
        from pigeon.ops import certs  # (cryptography: loaded by secured servers only)

        self.engine, self.authn, self.audit, self.quotas, self.clock = engine, authn, audit, quotas, clock
        self._identity = certs.identity_of
        self.admins = config.admin_principals
        self.mtls = bool(config.tls_client_ca)
        self.streams: set[_Watched] = set()
        self._decisions: dict[tuple[str, str, str], bool] = {}
        self._policies, self._version = None, -1
        self._seen_version = -1
        self.denied = 0
        self.unauthenticated = 0

    # --- who and what ----------------------------------------------------------------------------------------
    def principal(self, context, listener: str = SHARED) -> tuple[str, bool]:
        """(who calls, whether a node already authorized the call: it forwarded it after checking it with this
        same map, so the owner does not check again — its copy of the policies may be a moment behind).
        On the peer port only a node is answered: the principal it vouches for, else its own."""
        authorization = forwarded = None
        routed = False
        for k, v in context.invocation_metadata() or ():
            if k == "authorization":
                authorization = v
            elif k == PRINCIPAL:
                forwarded = v
            elif k == FORWARDED:
                routed = True
        cert = None
        if self.mtls or listener == PEERS:
            pem = (context.auth_context() or {}).get("x509_pem_cert")
            cert = pem[0] if pem else None
        if listener == PEERS:
            node = self._identity(cert) if cert is not None else ""
            if not node.startswith("node:"):
                raise PermissionDenied()  # a certificate of the cluster's CA that names no node
            return (forwarded, routed) if forwarded else (node, False)
        if forwarded:
            if (context.peer() or "").startswith("unix:"):  # this node's REST front: checked here
                return forwarded, False
            if listener == SHARED and cert is not None and self._identity(cert).startswith("node:"):
                return forwarded, routed
        return self.authn.principal(authorization, cert), False

    def allowed(self, principal: str, permission: str, resource: str) -> bool:
        """Decisions are remembered until the policies change (their change counter): a repeated call costs a
        dict lookup, however long the policies."""
        policies = self.engine.state.policies
        if policies is not self._policies or policies.version != self._version:
            self._policies, self._version = policies, policies.version
            self._decisions.clear()
        key = (principal, permission, resource)
        hit = self._decisions.get(key)
        if hit is None:
            if len(self._decisions) >= limits.decision_cache_max:
                self._decisions.clear()
            hit = self._decisions[key] = permission in iam.effective(policies, self.admins, principal, resource)
        return hit

    def resources(self, need: Need, request) -> list[tuple[str, str]]:
        """(permission, resource) pairs a need asks for with this request; [] when an optional field is empty.
        Raises PermissionDenied when a required field is empty."""
        if need.on in ("node", "admin"):
            return [(need.on, "")]
        name = _publish_topic(request) if type(request) is bytes else _field(request, need.field)
        if not name:
            if need.required:
                raise PermissionDenied()
            return []
        if need.on == "project":
            name = iam.project_of(name)
        elif need.on == "topic_of":
            sub = self.engine.state.subs.get(name)
            name = sub.topic.name if sub is not None and sub.topic is not None else iam.project_of(name)
        name = name.split("@", 1)[0]  # a schema revision is its schema's
        if not name:
            raise PermissionDenied()
        permission = need.permission
        if need.on == "iam":
            kind = name.split("/")[2] if name.count("/") == 3 else ""
            permission = (f"resourcemanager.projects.{permission}" if name.count("/") == 1 else
                          f"pubsub.{kind}.{permission}" if kind else "")
        return [(permission, name)]

    def check(self, principal: str, rule: Rule, request) -> list[tuple[str, str]]:
        """Every (permission, resource) the call needs, each held — or PermissionDenied."""
        pairs = [p for need in rule.needs for p in self.resources(need, request)]
        for permission, resource in pairs:
            if permission == "node":
                ok = principal.startswith("node:")
            elif permission == "admin":
                ok = principal in self.admins
            else:
                ok = bool(permission) and self.allowed(principal, permission, resource)
            if not ok:
                raise PermissionDenied()
        return pairs

    def _charge(self, rule: Rule, request, pairs) -> None:
        if not self.quotas.active or not (rule.publish or rule.admin):
            return
        resource = next((r for _, r in pairs if r), "")
        project = iam.project_of(resource).removeprefix("projects/")
        if not project:
            return
        if rule.publish:
            self.quotas.publish(project, len(request), self.clock())
        else:
            self.quotas.admin(project, self.clock())

    def _refused(self, e: PigeonError, principal: str, method: str, request, rule: Rule | None) -> None:
        if isinstance(e, Unauthenticated):
            self.unauthenticated += 1
        elif isinstance(e, PermissionDenied):
            self.denied += 1
        resource = ""
        if rule is not None and rule.needs and type(request) is not errors.Unparsable:
            need = rule.needs[0]
            resource = _publish_topic(request) if type(request) is bytes else _field(request, need.field)
        self.audit.record(principal, method, resource, e.code)

    # --- wiring ----------------------------------------------------------------------------------------------
    def wrap(self, handlers: list[grpc.GenericRpcHandler], listener: str = SHARED) -> list[grpc.GenericRpcHandler]:
        """The handlers of one listener (SHARED, CLIENTS or PEERS), each call checked here first."""
        assert listener in (SHARED, CLIENTS, PEERS), listener
        return [PerMethod(h, lambda name, handler: self.method(name, handler, listener)) for h in handlers]

    def method(self, name: str, handler, listener: str = SHARED):
        rule = RULES.get(name)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(name, rule, handler.unary_unary, listener))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=self._stream(name, rule, handler.stream_stream, listener))
        raise AssertionError(f"{name}: only unary and bidirectional methods are served")

    def _unary(self, method: str, rule: Rule | None, inner, listener: str):
        async def guarded(request, context):
            who = "-"
            try:
                who, checked = self.principal(context, listener)
                if rule is None:
                    raise PermissionDenied()
                if checked:  # forwarded by the node that checked it: served as asked
                    CALLER.set(who)
                    return await inner(request, context)
                if type(request) is not errors.Unparsable:
                    pairs = self.check(who, rule, request)
                    self._charge(rule, request, pairs)
            except PigeonError as e:
                self._refused(e, who, method, request, rule)
                if isinstance(e, QuotaExceeded):
                    # answered when its retry hint comes due: a client ignoring the hint cannot turn refusals
                    # into load that slows the other tenants (each of its lanes waits out the window)
                    await asyncio.sleep(min(e.retry_after_s() or 0.0, limits.quota_refusal_hold_s_max))
                await errors.abort(context, e)
            CALLER.set(who)
            if rule.admin:
                return await self._audited(who, method, rule, request, inner, context)
            if rule.listing is not None and type(request) is not errors.Unparsable:
                return await self._listed(who, rule.listing, request, inner, context)
            return await inner(request, context)

        return guarded

    async def _audited(self, who, method, rule, request, inner, context):
        resource = "" if type(request) is errors.Unparsable else next(
            (r for n in rule.needs for _, r in self.resources(n, request)), "")
        outcome = "UNKNOWN"
        try:
            out = await inner(request, context)
            outcome = "OK"
            return out
        except BaseException:
            code = context.code() if hasattr(context, "code") else None
            outcome = getattr(code, "name", None) or "ERROR"
            raise
        finally:
            self.audit.record(who, method, resource, outcome)
            if outcome == "OK" and method.endswith("/SetIamPolicy"):
                self.recheck()  # a revocation reaches this node's open streams at once

    async def _listed(self, who, listing: Listing, request, inner, context):
        """The handler's pages, filtered to what the caller may see, until a page is full or none is left."""
        first = await inner(request, context)
        if self._sees_all(who, listing, request):
            return first
        cls = _response_class(listing.response)
        if "page_size" not in request.DESCRIPTOR.fields_by_name:
            size = 1 << 62  # (a list without pages)
        else:
            size = request.page_size or (limits.stats_page_size_default if listing.response.startswith("pigeon.v1.")
                                         else limits.list_page_size_default)
        out, raw = [], first
        again = type(request)()
        again.CopyFrom(request)
        while True:
            resp = cls.FromString(raw)
            for item in getattr(resp, listing.field):
                name = item if listing.names else item.name
                if self.allowed(who, listing.permission, name):
                    out.append(item)
            token = getattr(resp, "next_page_token", "")
            if not token or len(out) > size:
                break
            again.page_token = token
            raw = await inner(again, context)
        more = bool(token) or len(out) > size
        out = out[:size]
        answer = cls()
        getattr(answer, listing.field).extend(out)
        if more and out and hasattr(answer, "next_page_token"):
            answer.next_page_token = out[-1] if listing.names else out[-1].name
        return answer.SerializeToString()

    def _sees_all(self, who: str, listing: Listing, request) -> bool:
        parent = getattr(request, "project", "") or getattr(request, "parent", "")
        return bool(parent) and self.allowed(who, listing.permission, iam.project_of(parent))

    def _stream(self, method: str, rule: Rule | None, inner, listener: str):
        async def guarded(request_iterator, context):
            who = "-"
            first = None
            checked = False
            try:
                who, checked = self.principal(context, listener)
                if rule is None:
                    raise PermissionDenied()
                try:
                    first = await request_iterator.__anext__()
                except StopAsyncIteration:
                    return
                if type(first) is not errors.Unparsable and not checked:
                    self.check(who, rule, first)
            except PigeonError as e:
                self._refused(e, who, method, first, rule)
                await errors.abort(context, e)
            CALLER.set(who)
            needs = [] if type(first) is errors.Unparsable or checked else [
                p for n in rule.needs for p in self.resources(n, first) if p[0] not in ("node", "admin")]
            watched = _Watched(who, needs, asyncio.current_task())
            if needs:
                self.streams.add(watched)
            try:
                async for resp in inner(_Chain(first, request_iterator), context):
                    yield resp
            except asyncio.CancelledError:
                if not watched.revoked:
                    raise
                watched.task.uncancel()
                self.audit.record(who, method, needs[0][1], "PERMISSION_DENIED", stream="revoked")
                await errors.abort(context, PermissionDenied())
            finally:
                self.streams.discard(watched)

        return guarded

    # --- open streams ----------------------------------------------------------------------------------------
    def recheck(self) -> int:
        """End every open stream whose caller no longer holds what it needs; returns how many were ended."""
        self._seen_version = self.engine.state.policies.version
        ended = 0
        for w in list(self.streams):
            if not w.revoked and not all(self.allowed(w.principal, p, r) for p, r in w.needs):
                w.revoked = True
                w.task.cancel()
                ended += 1
        if ended:
            log.info("ended %d open stream(s) whose caller lost the permission", ended)
        return ended

    def recheck_if_changed(self) -> int:
        if self.engine.state.policies.version != self._seen_version:
            return self.recheck()
        return 0


def _response_class(full_name: str):
    from google.protobuf import descriptor_pool, message_factory

    import google.pubsub_v1.types  # noqa: F401 — registers Pub/Sub's messages
    from pigeon.api.proto import pigeon_monitoring_pb2  # noqa: F401

    return message_factory.GetMessageClass(descriptor_pool.Default().FindMessageTypeByName(full_name))


class PerMethod(grpc.GenericRpcHandler):
    """A service's handlers, each wrapped once by `wrap(method name, handler)` — the guard's checks, the SLIs'
    figures (pigeon.api.sli) — since grpc asks for the handler on every call."""

    def __init__(self, inner: grpc.GenericRpcHandler, wrap):
        self.inner, self.wrap = inner, wrap
        self._wrapped: dict[str, object] = {}

    def service(self, handler_call_details):
        name = handler_call_details.method
        h = self._wrapped.get(name)
        if h is None:
            h = self.inner.service(handler_call_details)
            if h is None:
                return None
            h = self._wrapped[name] = self.wrap(name, h)
        return h
