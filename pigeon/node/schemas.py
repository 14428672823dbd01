"""Schema engine of the SchemaService: compiles AVRO and PROTOCOL_BUFFER definitions and validates message
data against them in the JSON or BINARY encoding.

Owns the rules:
- a definition is valid when it parses (Avro 1.11 JSON schema; proto2/proto3 source that protoc accepts),
  imports nothing and, for protocol buffers, defines exactly one top-level type, a message
  (cloud.google.com/pubsub/docs/schemas: "define only one top-level type; import statements that reference
  other types aren't supported"); failures are InvalidArgument("Invalid schema definition: ...");
- message data is valid when it decodes completely under the schema; failures are
  InvalidArgument("Invalid data in message: ...").

Avro is checked by broker.avro (pure, strict decoders of its own). Protocol buffers compile with protoc from grpcio-tools in a child process (protoc prints its errors on the C
stderr, and a crash or a runaway schema must not take the server down); the FileDescriptorSet is loaded into a
pool private to the schema, never the default pool, so a schema may reuse any name (google.pubsub.v1.Topic...).

Compiling a proto schema costs a process start (~0.15 s) and blocks: call it from a worker thread in the
server. `get_compiled` / `validate_message` keep an LRU of compiled schemas (failures included).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from pigeon.core import limits
from pigeon.broker.avro import AvroSchema
from pigeon.broker.schema_kinds import (  # noqa: F401  (re-exported: the schema service and tests use these names)
    AVRO, BINARY, DATA_PREFIX, DEF_PREFIX, DEFINITION_BYTES_MAX, JSON, PROTOCOL_BUFFER, CompiledSchema, encoding_name,
    type_name)
from pigeon.core.errors import InvalidArgument


def compile_schema(schema_type, definition: str) -> CompiledSchema:
    """Compile `definition` of `schema_type` ("AVRO" / "PROTOCOL_BUFFER", or the enum); uncached."""
    kind = type_name(schema_type)
    if not isinstance(definition, str):
        raise InvalidArgument(DEF_PREFIX + "the definition must be text")
    if not definition.strip():
        raise InvalidArgument(DEF_PREFIX + "the definition is empty")
    size = len(definition.encode("utf-8", "surrogatepass"))
    if size > DEFINITION_BYTES_MAX:
        raise InvalidArgument(DEF_PREFIX + f"{size} bytes; the limit is {DEFINITION_BYTES_MAX} bytes")
    if kind == AVRO:
        return AvroSchema(definition)
    return ProtoSchema(definition)


@functools.lru_cache(maxsize=limits.compiled_schemas_max)
def _cached(kind: str, definition: str) -> CompiledSchema | str:
    try:
        return compile_schema(kind, definition)
    except InvalidArgument as e:  # keep the message, not the exception (its traceback would grow)
        return e.message


def get_compiled(schema_type, definition: str) -> CompiledSchema:
    """compile_schema through an LRU keyed by (type, definition); failures are cached too."""
    got = _cached(type_name(schema_type), definition)
    if isinstance(got, str):
        raise InvalidArgument(got)
    return got


def validate_message(schema_type, definition: str, data: bytes, encoding) -> None:
    """Raise InvalidArgument unless `data` is valid under the (cached) compiled schema."""
    get_compiled(schema_type, definition).validate(data, encoding)


def validate_any(schemas: Iterable[CompiledSchema], data: bytes, encoding) -> None:
    """Valid when valid under one of `schemas` (a topic's revision range); else the last schema's error."""
    error = None
    for s in schemas:
        try:
            s.validate(data, encoding)
            return
        except InvalidArgument as e:
            error = e
    if error is None:
        raise InvalidArgument(DATA_PREFIX + "no schema revision to validate against")
    raise error


# ============================================================================================== protobuf

_PROTO_FILE = "schema.proto"
_PROTOC_NOISE = re.compile(r"^(WARNING: All log messages before absl|[IW]\d{4} )")


def _protoc(definition: str) -> bytes:
    """FileDescriptorSet (without imports) of `definition`, or InvalidArgument carrying protoc's errors."""
    with tempfile.TemporaryDirectory(prefix="pigeon-schema-") as tmp:
        with open(os.path.join(tmp, _PROTO_FILE), "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(definition)
        cmd = [sys.executable, "-m", "grpc_tools.protoc", "--proto_path=.", "--descriptor_set_out=out.pb", _PROTO_FILE]
        try:
            done = subprocess.run(cmd, cwd=tmp, capture_output=True, timeout=limits.protoc_s_max,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise InvalidArgument(DEF_PREFIX + f"protoc took longer than {limits.protoc_s_max:g} s") from None
        if done.returncode != 0:
            lines = done.stderr.decode("utf-8", "replace").replace(tmp + os.sep, "").splitlines()
            text = "\n".join(ln for ln in lines if ln.strip() and not _PROTOC_NOISE.match(ln))
            raise InvalidArgument(DEF_PREFIX + (text or f"protoc failed (exit status {done.returncode})"))
        with open(os.path.join(tmp, "out.pb"), "rb") as f:
            return f.read()


class ProtoSchema(CompiledSchema):
    """A protocol buffer schema: one top-level message, `message_class`, in a private descriptor pool."""

    type = PROTOCOL_BUFFER

    def __init__(self, definition: str):
        self.definition = definition
        self.file_descriptor_set = _protoc(definition)
        fds = descriptor_pb2.FileDescriptorSet.FromString(self.file_descriptor_set)
        (fdp,) = fds.file
        if fdp.dependency:
            raise InvalidArgument(
                DEF_PREFIX + f"import statements are not supported (imports {', '.join(fdp.dependency)})"
            )
        if fdp.syntax not in ("", "proto2", "proto3"):
            raise InvalidArgument(DEF_PREFIX + f"only proto2 and proto3 are supported, not {fdp.syntax}")
        if fdp.enum_type:
            raise InvalidArgument(
                DEF_PREFIX + f"the only top-level type must be a message; found enum {fdp.enum_type[0].name}"
            )
        if len(fdp.message_type) != 1:
            found = ", ".join(m.name for m in fdp.message_type) or "none"
            raise InvalidArgument(DEF_PREFIX + f"exactly one top-level message type is required; found {found}")
        package = f"{fdp.package}." if fdp.package else ""
        self.root_message = package + fdp.message_type[0].name
        self._pool = descriptor_pool.DescriptorPool()  # never the default pool: names may collide
        try:
            self._pool.Add(fdp)
            self.descriptor = self._pool.FindMessageTypeByName(self.root_message)
            self.message_class = message_factory.GetMessageClass(self.descriptor)
        except Exception as e:
            raise InvalidArgument(DEF_PREFIX + f"{type(e).__name__}: {e}") from None

    def validate(self, data: bytes, encoding: str) -> None:
        enc = encoding_name(encoding)
        if not isinstance(data, bytes):
            data = bytes(data)
        msg = self.message_class()
        try:
            if enc == BINARY:
                msg.ParseFromString(data)
            else:
                json_format.Parse(data.decode("utf-8"), msg, descriptor_pool=self._pool)
        except Exception as e:  # DecodeError, ParseError, UnicodeDecodeError, RecursionError...
            detail = str(e) or type(e).__name__
            raise InvalidArgument(DATA_PREFIX + f"not a valid {enc} {self.root_message}: {detail}") from None
        if not msg.IsInitialized():
            missing = ", ".join(msg.FindInitializationErrors())
            raise InvalidArgument(DATA_PREFIX + f"missing required fields of {self.root_message}: {missing}")


__all__ = [
    "AVRO",
    "BINARY",
    "JSON",
    "PROTOCOL_BUFFER",
    "AvroSchema",
    "CompiledSchema",
    "ProtoSchema",
    "compile_schema",
    "get_compiled",
    "validate_any",
    "validate_message",
]
