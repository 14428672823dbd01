"""Schema kinds and encodings, and what a compiled schema offers (the Pub/Sub SchemaService's model). Pure: the
Avro checks are broker.avro's; protocol buffers compile in pigeon.node.schemas (protoc runs in a child process)."""

from __future__ import annotations

from pigeon.core import limits
from pigeon.core.errors import InvalidArgument

AVRO = "AVRO"
PROTOCOL_BUFFER = "PROTOCOL_BUFFER"
JSON = "JSON"
BINARY = "BINARY"
# google.pubsub.v1.Schema.Type and google.pubsub.v1.Encoding numbers, for callers holding raw protobuf enums.
_TYPE_NUMBERS = {1: PROTOCOL_BUFFER, 2: AVRO}
_ENCODING_NUMBERS = {1: JSON, 2: BINARY}

DEFINITION_BYTES_MAX = limits.schema_definition_bytes_max  # documented by Pub/Sub: 300 KB

DEF_PREFIX = "Invalid schema definition: "
DATA_PREFIX = "Invalid data in message: "


def type_name(schema_type) -> str:
    if isinstance(schema_type, int):  # raw protobuf enum value (IntEnum members are ints too)
        name = getattr(schema_type, "name", None) or _TYPE_NUMBERS.get(int(schema_type), str(int(schema_type)))
    else:
        name = str(getattr(schema_type, "name", schema_type))
    if name not in (AVRO, PROTOCOL_BUFFER):
        raise InvalidArgument(f"Invalid schema type {name!r}: expected AVRO or PROTOCOL_BUFFER")
    return name


def encoding_name(encoding) -> str:
    if isinstance(encoding, int):
        name = getattr(encoding, "name", None) or _ENCODING_NUMBERS.get(int(encoding), str(int(encoding)))
    else:
        name = str(getattr(encoding, "name", encoding))
    if name not in (JSON, BINARY):
        raise InvalidArgument(f"Invalid encoding {name!r}: expected JSON or BINARY")
    return name


class CompiledSchema:
    """A definition that compiled. `validate` raises InvalidArgument("Invalid data in message: ...")."""

    type: str
    definition: str

    def validate(self, data: bytes, encoding: str) -> None:
        raise NotImplementedError


