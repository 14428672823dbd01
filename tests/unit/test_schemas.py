"""Schema engine: Avro and protocol buffer definitions, message validation in JSON and BINARY encodings."""

from __future__ import annotations

import io
import json
import struct
import time

import fastavro
import pytest
from google.protobuf import descriptor_pool
from google.pubsub_v1 import types

from pigeon.core.errors import InvalidArgument
from pigeon.node import schemas
from pigeon.node.schemas import compile_schema, get_compiled, validate_any, validate_message

# --------------------------------------------------------------------------------------------- helpers


def zz(n: int) -> bytes:
    """Avro zig-zag varint, unrestricted in size (to build malformed data)."""
    n = (n << 1) ^ (n >> 127)
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def avro_binary(compiled, record) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, compiled.parsed, record)
    return buf.getvalue()


def avro_json(compiled, record) -> bytes:
    buf = io.StringIO()
    fastavro.json_writer(buf, compiled.parsed, [record])
    return buf.getvalue().strip().encode()


def invalid_data(compiled, data, encoding) -> str:
    with pytest.raises(InvalidArgument) as e:
        compiled.validate(data, encoding)
    assert e.value.message.startswith("Invalid data in message: "), e.value.message
    assert e.value.code == "INVALID_ARGUMENT"
    return e.value.message


def invalid_definition(kind, definition) -> str:
    with pytest.raises(InvalidArgument) as e:
        compile_schema(kind, definition)
    assert e.value.message.startswith("Invalid schema definition: "), e.value.message
    return e.value.message


# --------------------------------------------------------------------------------------------- Avro

AVRO_DOC = {  # the Pub/Sub documentation's example
    "type": "record",
    "name": "Avro",
    "fields": [
        {"name": "ProductName", "type": "string", "default": ""},
        {"name": "SKU", "type": "int", "default": 0},
        {"name": "InStock", "type": "boolean", "default": False},
    ],
}

AVRO_RICH = {
    "type": "record",
    "name": "Order",
    "namespace": "shop.v1",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "price", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID", "SENT"]}},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
        {"name": "blob", "type": "bytes"},
        {"name": "tags", "type": {"type": "map", "values": "int"}},
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}],
                },
            },
        },
        {"name": "first", "type": ["null", "Line", "long"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "parent", "type": ["null", "Order"], "default": None},
    ],
}

RICH_RECORDS = [
    {
        "id": 1,
        "note": None,
        "price": 9.5,
        "ratio": 0.25,
        "state": "NEW",
        "digest": b"\x00\x01\x02\xff",
        "blob": b"",
        "tags": {},
        "lines": [],
        "first": None,
        "at": 0,
        "parent": None,
    },
    {
        "id": -(1 << 63),
        "note": "héllo ✓",
        "price": -1e300,
        "ratio": 3.0,
        "state": "SENT",
        "digest": b"abcd",
        "blob": bytes(range(256)),
        "tags": {"a": 1, "b": -(1 << 31), "c": (1 << 31) - 1},
        "lines": [{"sku": "x", "qty": 2}] * 300,
        "first": {"sku": "y", "qty": 1},
        "at": 1_700_000_000_000,
        "parent": {
            "id": 2,
            "note": "",
            "price": 0.0,
            "ratio": 0.0,
            "state": "PAID",
            "digest": b"zzzz",
            "blob": b"\x00",
            "tags": {"k": 0},
            "lines": [],
            "first": 7,
            "at": 1,
            "parent": None,
        },
    },
]


@pytest.fixture(scope="module")
def rich():
    return compile_schema("AVRO", json.dumps(AVRO_RICH))


def test_avro_documentation_example_round_trips_both_encodings():
    c = compile_schema("AVRO", json.dumps(AVRO_DOC))
    assert c.type == "AVRO"
    rec = {"ProductName": "Pigeon", "SKU": 42, "InStock": True}
    c.validate(avro_binary(c, rec), "BINARY")
    c.validate(avro_json(c, rec), "JSON")
    c.validate(b'{"ProductName": "x", "SKU": 1, "InStock": false}', "JSON")


@pytest.mark.parametrize("i", range(len(RICH_RECORDS)))
def test_avro_rich_records_round_trip(rich, i):
    rich.validate(avro_binary(rich, RICH_RECORDS[i]), "BINARY")
    rich.validate(avro_json(rich, RICH_RECORDS[i]), "JSON")


def test_avro_binary_with_negative_block_counts_is_accepted():
    # Arrays/maps may be written in blocks with a negative count followed by the block's byte size.
    c = compile_schema("AVRO", '{"type": "array", "items": "int"}')
    items = zz(1) + zz(2) + zz(3)
    c.validate(zz(-3) + zz(len(items)) + items + zz(1) + zz(4) + zz(0), "BINARY")
    c.validate(zz(0), "BINARY")


def test_avro_primitive_top_level_schemas():
    c = compile_schema("AVRO", '"string"')
    c.validate(zz(2) + b"hi", "BINARY")
    c.validate(b'"hi"', "JSON")
    invalid_data(c, b"hi", "JSON")
    n = compile_schema("AVRO", '"null"')
    n.validate(b"", "BINARY")
    n.validate(b"null", "JSON")


def test_avro_binary_trailing_garbage_and_truncation_rejected(rich):
    data = avro_binary(rich, RICH_RECORDS[1])
    assert "left over" in invalid_data(rich, data + b"\x00", "BINARY")
    for cut in (1, 5, len(data) // 2, len(data) - 1):
        invalid_data(rich, data[:cut], "BINARY")
    invalid_data(rich, b"", "BINARY")


@pytest.mark.parametrize(
    "schema, data, why",
    [
        ('"int"', zz(1 << 32), "out of range"),
        ('"long"', b"\xff" * 11 + b"\x01", "malformed varint"),
        ('"boolean"', b"\x02", "not 0 or 1"),
        ('"string"', zz(-1) + b"x", "negative length"),
        ('"string"', zz(2) + b"\xff\xfe", "UTF-8"),
        ('"bytes"', zz(5) + b"abc", "ends early"),
        ('"double"', b"\x00" * 7, "ends early"),
        ('{"type": "enum", "name": "E", "symbols": ["A", "B"]}', zz(-1), "out of range"),
        ('{"type": "enum", "name": "E", "symbols": ["A", "B"]}', zz(2), "out of range"),
        ('["null", "int"]', zz(2), "out of range"),
        ('["null", "int"]', zz(-1), "out of range"),
        ('{"type": "array", "items": "int"}', zz(1 << 60) + zz(1), "longer than the data"),
        ('{"type": "map", "values": "null"}', zz(1 << 60) + zz(1) + b"k", "longer than the data"),
        ('{"type": "fixed", "name": "F", "size": 3}', b"ab", "ends early"),
    ],
)
def test_avro_malformed_binary_rejected(schema, data, why):
    assert why in invalid_data(compile_schema("AVRO", schema), data, "BINARY")


def test_avro_huge_array_of_zero_width_items_is_fast():
    c = compile_schema("AVRO", '{"type": "array", "items": "null"}')
    start = time.monotonic()
    c.validate(zz((1 << 62) - 1) + zz(0), "BINARY")  # valid: 2**62-1 nulls take no bytes
    assert time.monotonic() - start < 0.5


@pytest.mark.parametrize(
    "mutate, why",
    [
        (lambda r: r.pop("price"), "missing field 'price'"),
        (lambda r: r.update(extra=1), "unknown field 'extra'"),
        (lambda r: r.update(id="1"), "expected long"),
        (lambda r: r.update(id=True), "expected long"),
        (lambda r: r.update(id=1.5), "expected long"),
        (lambda r: r.update(price="cheap"), "expected double"),
        (lambda r: r.update(note="bare"), "union value"),  # unions are {"type": value} in Avro JSON
        (lambda r: r.update(note={"int": 3}), "not a branch"),
        (lambda r: r.update(first={"Line": {"sku": "a", "qty": 1}}), "not a branch"),  # full name needed
        (lambda r: r.update(state="LOST"), "not a symbol"),
        (lambda r: r.update(digest="abc"), "takes 4 bytes"),
        (lambda r: r.update(blob="€"), "U+00FF"),
        (lambda r: r.update(tags={"a": "1"}), 'tags["a"]: expected int'),
        (lambda r: r.update(tags=[]), "expected an object (map)"),
        (lambda r: r["lines"].append({"sku": "z"}), "lines[300]: missing field 'qty'"),
        (lambda r: r["parent"]["shop.v1.Order"].update(ratio=None), "parent<shop.v1.Order>.ratio"),
        (lambda r: r.update(tags={"a": 1 << 31}), "out of range for int"),
    ],
)
def test_avro_invalid_json_rejected(rich, mutate, why):
    record = json.loads(avro_json(rich, RICH_RECORDS[1]))
    mutate(record)
    assert why in invalid_data(rich, json.dumps(record).encode(), "JSON")


def test_avro_json_accepts_integral_floats_and_special_doubles(rich):
    record = json.loads(avro_json(rich, RICH_RECORDS[0]))
    record.update(id=5.0, price="NaN", ratio="-Infinity")
    rich.validate(json.dumps(record).encode(), "JSON")
    record["note"] = {"string": "x"}
    rich.validate(json.dumps(record).encode(), "JSON")


def test_avro_json_not_json_or_not_utf8(rich):
    assert "not JSON" in invalid_data(rich, b"{", "JSON")
    assert "not JSON" in invalid_data(rich, b'{"id": 1} {"id": 2}', "JSON")
    assert "not UTF-8" in invalid_data(rich, b'"\xff"', "JSON")


def test_avro_deep_nesting_is_an_error_not_a_crash():
    c = compile_schema("AVRO", '{"type": "record", "name": "N", "fields": [{"name": "n", "type": ["null", "N"]}]}')
    deep = b'{"n": ' * 5000 + b"null" + b"}" * 5000
    invalid_data(c, deep, "JSON")
    invalid_data(c, zz(1) * 100_000 + zz(0), "BINARY")
    c.validate(zz(1) * 50 + zz(0), "BINARY")


@pytest.mark.parametrize(
    "definition, why",
    [
        ("{not json", "not JSON"),
        ("", "empty"),
        ('"strin"', "unknown type 'strin'"),
        ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "Nope"}]}', "unknown type 'Nope'"),
        ('{"type": "record", "name": "1R", "fields": []}', "not a valid Avro name"),
        ('{"type": "record", "name": "R"}', "'fields'"),
        (
            '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "a", "type": "int"}]}',
            "twice",
        ),
        ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", "default": "x"}]}', "Default"),
        ('{"type": "record", "name": "R", "fields": [{"name": "a"}]}', "no 'type'"),
        ('["int", "int"]', "twice"),
        ('["int", ["string"]]', "union"),
        ('{"type": "enum", "name": "E", "symbols": ["A", "A"]}', "duplicate"),
        ('{"type": "enum", "name": "E", "symbols": ["1A"]}', "not a valid Avro name"),
        ('{"type": "fixed", "name": "F"}', "'size'"),
        ('{"type": "fixed", "name": "F", "size": -1}', "'size'"),
        ('{"type": "array"}', "'items'"),
        ('{"type": "map"}', "'values'"),
        (
            '{"type": "record", "name": "R", "fields": [{"name": "r", "type": {"type": "fixed", "name": "R", "size": 1}}]}',
            "twice",
        ),
        ('{"type": "record", "name": "int", "fields": []}', "primitive"),
        ("5", "a schema is"),
        ('{"name": "x"}', "missing 'type'"),
    ],
)
def test_avro_invalid_definitions(definition, why):
    assert why in invalid_definition("AVRO", definition)


def test_avro_namespaces_resolve_like_the_spec():
    d = {
        "type": "record",
        "name": "a.b.Outer",
        "fields": [
            {"name": "x", "type": {"type": "fixed", "name": "X", "size": 1}},  # a.b.X
            {"name": "y", "type": "X"},  # resolves in the enclosing namespace
            {"name": "z", "type": "a.b.X"},
            {"name": "w", "type": {"type": "enum", "name": "W", "namespace": "other", "symbols": ["Q"]}},
            {"name": "v", "type": ["null", "other.W", "a.b.X"]},
        ],
    }
    c = compile_schema("AVRO", json.dumps(d))
    c.validate(b'{"x": "1", "y": "2", "z": "3", "w": "Q", "v": {"a.b.X": "4"}}', "JSON")
    c.validate(b'{"x": "1", "y": "2", "z": "3", "w": "Q", "v": {"other.W": "Q"}}', "JSON")
    c.validate(avro_binary(c, {"x": b"1", "y": b"2", "z": b"3", "w": "Q", "v": "Q"}), "BINARY")


def test_definition_size_limit():
    big = json.dumps({"type": "enum", "name": "E", "symbols": [f"S{i}" for i in range(60_000)]})
    assert len(big) > schemas.DEFINITION_BYTES_MAX
    assert "limit" in invalid_definition("AVRO", big)


def test_unknown_type_and_encoding():
    with pytest.raises(InvalidArgument):
        compile_schema("TYPE_UNSPECIFIED", '"int"')
    c = compile_schema("AVRO", '"int"')
    with pytest.raises(InvalidArgument, match="encoding"):
        c.validate(b"\x00", "ENCODING_UNSPECIFIED")


def test_enum_values_from_the_pubsub_types_are_accepted():
    c = compile_schema(types.Schema.Type.AVRO, '"int"')
    c.validate(b"\x02", types.Encoding.BINARY)
    c.validate(b"1", types.Encoding.JSON)
    c.validate(b"\x02", 2)  # a raw protobuf enum value
    compile_schema(2, '"int"')


# --------------------------------------------------------------------------------------------- protocol buffers

PROTO_DOC = """syntax = "proto3";
message ProtocolBuffer {
  string product_name = 1;
  int32 SKU = 2;
  bool in_stock = 3;
}
"""

PROTO_RICH = """syntax = "proto3";
package shop.v1;
message Order {
  enum State { NEW = 0; PAID = 1; }
  message Line { string sku = 1; int32 qty = 2; }
  int64 id = 1;
  State state = 2;
  repeated Line lines = 3;
  map<string, double> tags = 4;
  bytes blob = 5;
  oneof who { string user = 6; int64 account = 7; }
  optional string note = 8;
}
"""


@pytest.fixture(scope="module")
def order():
    return compile_schema("PROTOCOL_BUFFER", PROTO_RICH)


def test_proto_documentation_example():
    c = compile_schema("PROTOCOL_BUFFER", PROTO_DOC)
    assert c.type == "PROTOCOL_BUFFER" and c.root_message == "ProtocolBuffer"
    msg = c.message_class(product_name="Pigeon", SKU=42, in_stock=True)
    c.validate(msg.SerializeToString(), "BINARY")
    c.validate(b'{"productName": "Pigeon", "SKU": 42, "inStock": true}', "JSON")
    c.validate(b'{"product_name": "Pigeon"}', "JSON")
    c.validate(b"", "BINARY")  # the empty message
    c.validate(b"{}", "JSON")


def test_proto_rich_binary_and_json(order):
    assert order.root_message == "shop.v1.Order"
    m = order.message_class(id=-5, state=1, blob=b"\x00\xff", user="u", note="")
    m.lines.add(sku="a", qty=2)
    m.tags["x"] = 1.5
    order.validate(m.SerializeToString(), "BINARY")
    order.validate(
        b'{"id": "-5", "state": "PAID", "lines": [{"sku": "a", "qty": 2}], "tags": {"x": 1.5},'
        b' "blob": "AP8=", "account": 3}',
        "JSON",
    )


@pytest.mark.parametrize(
    "data",
    [
        b"\x08",  # field 1 varint, value missing
        b"\x1a\x05\x0a",  # field 3 length 5, only 1 byte follows
        b"\x0f",  # wire type 7 does not exist
        b"\x32\x02\xff\xfe",  # field 6 (a proto3 string) with invalid UTF-8
    ],
)
def test_proto_malformed_binary_rejected(order, data):
    assert "not a valid BINARY shop.v1.Order" in invalid_data(order, data, "BINARY")


@pytest.mark.parametrize(
    "text",
    [
        b'{"id": "x"}',
        b'{"unknown": 1}',
        b'{"state": "LOST"}',
        b'{"lines": {"sku": "a"}}',
        b'{"user": "a", "account": 1}',  # two members of one oneof
        b"not json",
        b"\xff",
    ],
)
def test_proto_invalid_json_rejected(order, text):
    invalid_data(order, text, "JSON")


def test_proto2_required_fields():
    proto2 = 'syntax = "proto2"; message A { required int32 x = 1; optional string y = 2; }'
    c = compile_schema("PROTOCOL_BUFFER", proto2)
    c.validate(b"\x08\x01", "BINARY")
    c.validate(b'{"x": 1}', "JSON")
    assert "missing required" in invalid_data(c, b"\x12\x01a", "BINARY")
    assert "x" in invalid_data(c, b'{"y": "a"}', "JSON")


@pytest.mark.parametrize(
    "definition, why",
    [
        ('syntax = "proto3"; message A { int32 x = 1; } message B { int32 y = 1; }', "found A, B"),
        ('syntax = "proto3";', "found none"),
        ('syntax = "proto3"; enum E { X = 0; } message A { E e = 1; }', "enum E"),
        (
            'syntax = "proto3"; import "google/protobuf/timestamp.proto"; message A { google.protobuf.Timestamp t = 1; }',
            "import",
        ),
        ('syntax = "proto3"; import "other.proto"; message A {}', "other.proto"),
        ('edition = "2023"; message A { int32 x = 1; }', "proto2 and proto3"),
        ("", "empty"),
    ],
)
def test_proto_invalid_definitions(definition, why):
    assert why in invalid_definition("PROTOCOL_BUFFER", definition)


def test_proto_syntax_error_carries_protoc_text():
    msg = invalid_definition("PROTOCOL_BUFFER", 'syntax = "proto3";\nmessage A {\n  int32 x = 1\n}\n')
    assert 'schema.proto:4:1: Expected ";".' in msg
    assert "/tmp" not in msg and "absl" not in msg
    msg = invalid_definition("PROTOCOL_BUFFER", 'syntax = "proto3"; message A { Missing m = 1; }')
    assert '"Missing" is not defined' in msg


def test_proto_schema_reusing_pubsub_names_stays_private():
    fake = 'syntax = "proto3"; package google.pubsub.v1; message Topic { int32 only_field = 1; }'
    a = compile_schema("PROTOCOL_BUFFER", fake)
    b = compile_schema("PROTOCOL_BUFFER", fake)  # twice: each schema has its own pool
    assert a.root_message == "google.pubsub.v1.Topic"
    a.validate(b.message_class(only_field=3).SerializeToString(), "BINARY")
    invalid_data(a, b'{"name": "projects/p/topics/t"}', "JSON")
    # the real google.pubsub.v1.Topic is untouched
    real = descriptor_pool.Default().FindMessageTypeByName("google.pubsub.v1.Topic")
    assert "message_storage_policy" in real.fields_by_name and "only_field" not in real.fields_by_name
    t = types.Topic(name="projects/p/topics/t", labels={"a": "b"})
    assert types.Topic.deserialize(types.Topic.serialize(t)).labels["a"] == "b"
    assert types.PubsubMessage(data=b"x").data == b"x"


# --------------------------------------------------------------------------------------------- cache and helpers


def test_get_compiled_caches_results_and_failures():
    d = json.dumps(AVRO_DOC)
    assert get_compiled("AVRO", d) is get_compiled(types.Schema.Type.AVRO, d)
    bad = 'syntax = "proto3"; message A { int32 x = 1 }'
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="Expected"):
            get_compiled("PROTOCOL_BUFFER", bad)
    start = time.monotonic()
    with pytest.raises(InvalidArgument):
        get_compiled("PROTOCOL_BUFFER", bad)
    assert time.monotonic() - start < 0.05  # no protoc run: the failure came from the cache


def test_validate_message_and_validate_any():
    d = json.dumps(AVRO_DOC)
    validate_message("AVRO", d, b'{"ProductName": "a", "SKU": 1, "InStock": true}', "JSON")
    with pytest.raises(InvalidArgument, match="Invalid data in message"):
        validate_message("AVRO", d, b'{"ProductName": "a"}', "JSON")
    v2 = compile_schema("AVRO", json.dumps({**AVRO_DOC, "fields": AVRO_DOC["fields"][:1]}))
    v1 = get_compiled("AVRO", d)
    validate_any([v1, v2], b'{"ProductName": "a"}', "JSON")
    with pytest.raises(InvalidArgument):
        validate_any([v1, v2], b"{}", "JSON")
    with pytest.raises(InvalidArgument):
        validate_any([], b"{}", "JSON")


def test_float_field_binary_width():
    c = compile_schema("AVRO", '{"type": "record", "name": "P", "fields": [{"name": "f", "type": "float"}]}')
    c.validate(struct.pack("<f", 1.5), "BINARY")
    invalid_data(c, struct.pack("<d", 1.5), "BINARY")
