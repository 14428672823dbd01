"""The routes of the HTTP port: which REST path and verb call which gRPC method, with which request and response
messages. Owns the rule that routes are not written by hand: they are the `google.api.http` annotations of the
`pubsub.proto` and `schema.proto` the official client library ships (compiled here, once, into descriptors with
grpc_tools) and of pigeon.v1's own protos, plus the bindings the client library's REST transports carry for
methods the shipped protos predate and for the IAM mixin of Pub/Sub's service configuration."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache

from google.api import annotations_pb2, http_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_IAM_METHODS = ("GetIamPolicy", "SetIamPolicy", "TestIamPermissions")
# bytes fields that carry a serialized google.pubsub.v1.PubsubMessage (pigeon.v1.Queue splices the stored bytes
# in): in JSON they are that message, as Pull's receivedMessages show it
EMBEDDED = frozenset({"pigeon.v1.Taken.message", "pigeon.v1.PeekResponse.message"})


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


@lru_cache(maxsize=1)
def compiled_protos() -> descriptor_pb2.FileDescriptorSet:
    """pubsub.proto and schema.proto of the installed client library, compiled with their imports (once: the
    routes and server reflection both read them)."""
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
    files = compiled_protos()
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
