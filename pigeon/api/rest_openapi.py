"""The OpenAPI 3 document of the HTTP port (`/openapi.json`), derived from the same routes the port serves
(pigeon.api.rest_routes). Owns the rule that a client generated from it sends what the server takes: a path
variable is one parameter per segment, its values as pigeon.core.names accepts them; int64s are strings and
bytes base64, as proto3 JSON writes them."""

from __future__ import annotations

import re
from functools import lru_cache

from pigeon.api.rest_routes import EMBEDDED, Route, routes
from pigeon.core import limits, names

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
    if fd.full_name in EMBEDDED:
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
