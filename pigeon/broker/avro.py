"""Avro (spec 1.11) definitions and data, checked strictly. Owns the rules: a definition is valid when it parses
(fastavro checks default values) and imports nothing; data is valid when it decodes completely under it, in the
JSON or BINARY encoding; failures are InvalidArgument("Invalid schema definition: ...") or
InvalidArgument("Invalid data in message: ...").

The decoders are this module's own, compiled once per schema into closures: fastavro's JSON decoder does no type
checks and its binary reader accepts out-of-range enum indexes (-1 reads the last symbol) and loops once per item
of an array of nulls whatever its length (a 10-byte message can ask for 2**62). Pure: no I/O."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from pigeon.broker.schema_kinds import AVRO, BINARY, DATA_PREFIX, DEF_PREFIX, CompiledSchema, encoding_name
from pigeon.core.errors import InvalidArgument


_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_SPECIAL_FLOATS = ("NaN", "Infinity", "-Infinity")


class _Bad(Exception):
    """Invalid data; `path` is filled in on the way up (fields, items, map keys)."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.msg = msg
        self.path: list[str] = []

    def text(self) -> str:
        where = "".join(self.path).lstrip(".")
        return f"{where}: {self.msg}" if where else self.msg


def _jtype(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _eof(pos: int) -> _Bad:
    return _Bad(f"data ends early (byte {pos})")


def _read_varint(buf: bytes, pos: int, max_bytes: int) -> tuple[int, int]:
    """Zig-zag varint at `pos` -> (value, next pos)."""
    n = len(buf)
    if pos >= n:
        raise _eof(pos)
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    start = pos
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= n:
            raise _eof(pos)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if pos - start >= max_bytes:
            raise _Bad(f"malformed varint at byte {start}")


def _read_long(buf: bytes, pos: int) -> tuple[int, int]:
    start = pos
    v, pos = _read_varint(buf, pos, 10)
    if not _LONG_MIN <= v <= _LONG_MAX:
        raise _Bad(f"long out of range at byte {start}")
    return v, pos


def _read_int(buf: bytes, pos: int) -> tuple[int, int]:
    start = pos
    v, pos = _read_varint(buf, pos, 5)
    if not _INT_MIN <= v <= _INT_MAX:
        raise _Bad(f"int out of range at byte {start}")
    return v, pos


def _read_length(buf: bytes, pos: int) -> tuple[int, int]:
    """Length of bytes/string: a long >= 0 that fits in the data."""
    start = pos
    size, pos = _read_long(buf, pos)
    if size < 0:
        raise _Bad(f"negative length at byte {start}")
    if pos + size > len(buf):
        raise _eof(len(buf))
    return size, pos


class _Node:
    """One Avro type: a union label, a JSON checker, a binary checker and the least bytes it can take."""

    __slots__ = ("label", "json", "binary", "width", "done")

    def __init__(self, label: str, json_fn=None, binary_fn=None, width: int = 1):
        self.label = label
        self.json: Callable[[object], None] = json_fn
        self.binary: Callable[[bytes, int], int] = binary_fn
        self.width = width
        self.done = json_fn is not None

    def json_ref(self):
        """The JSON checker, or a late-bound call while the (recursive) type is still being built."""
        return self.json if self.done else (lambda v, node=self: node.json(v))

    def binary_ref(self):
        return self.binary if self.done else (lambda buf, pos, node=self: node.binary(buf, pos))


def _primitive(name: str) -> _Node:
    if name == "null":

        def j(v):
            if v is not None:
                raise _Bad(f"expected null, got {_jtype(v)}")

        def b(buf, pos):
            return pos

        return _Node("null", j, b, 0)
    if name == "boolean":

        def j(v):
            if not isinstance(v, bool):
                raise _Bad(f"expected boolean, got {_jtype(v)}")

        def b(buf, pos):
            if pos >= len(buf):
                raise _eof(pos)
            if buf[pos] > 1:
                raise _Bad(f"boolean byte is {buf[pos]}, not 0 or 1 (byte {pos})")
            return pos + 1

        return _Node("boolean", j, b, 1)
    if name in ("int", "long"):
        lo, hi = (_INT_MIN, _INT_MAX) if name == "int" else (_LONG_MIN, _LONG_MAX)

        def j(v, name=name, lo=lo, hi=hi):
            if type(v) is int:
                if lo <= v <= hi:
                    return
                raise _Bad(f"{v} is out of range for {name}")
            if type(v) is float and v.is_integer():
                if lo <= v <= hi:
                    return
                raise _Bad(f"{v} is out of range for {name}")
            raise _Bad(f"expected {name}, got {_jtype(v) if type(v) is not float else v}")

        b = _read_int if name == "int" else _read_long
        return _Node(name, j, lambda buf, pos, b=b: b(buf, pos)[1], 1)
    if name in ("float", "double"):
        size = 4 if name == "float" else 8

        def j(v, name=name):
            if type(v) in (int, float) or v in _SPECIAL_FLOATS:
                return
            raise _Bad(f"expected {name}, got {_jtype(v)}")

        def b(buf, pos, size=size):
            if pos + size > len(buf):
                raise _eof(len(buf))
            return pos + size

        return _Node(name, j, b, size)
    if name == "bytes":

        def j(v):
            if not isinstance(v, str):
                raise _Bad(f"expected bytes (a string), got {_jtype(v)}")
            try:
                v.encode("latin-1")
            except UnicodeEncodeError:
                raise _Bad("bytes must be a string of code points U+0000..U+00FF") from None

        def b(buf, pos):
            size, pos = _read_length(buf, pos)
            return pos + size

        return _Node("bytes", j, b, 1)
    # string

    def j(v):
        if not isinstance(v, str):
            raise _Bad(f"expected string, got {_jtype(v)}")

    def b(buf, pos):
        size, pos = _read_length(buf, pos)
        try:
            buf[pos : pos + size].decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad(f"string is not valid UTF-8 (byte {pos})") from None
        return pos + size

    return _Node("string", j, b, 1)


class _AvroBuilder:
    """Walks a JSON Avro schema (spec 1.11) into _Nodes, checking what fastavro lets through."""

    def __init__(self):
        self.named: dict[str, _Node] = {}

    def fail(self, msg: str):
        raise InvalidArgument(DEF_PREFIX + msg)

    def check_name(self, name, what: str, dotted: bool) -> None:
        if not isinstance(name, str) or not name:
            self.fail(f"{what} must be a non-empty string, got {json.dumps(name)}")
        parts = name.split(".") if dotted else [name]
        if not all(_NAME_RE.match(p) for p in parts):
            self.fail(f"{what} {name!r} is not a valid Avro name ([A-Za-z_][A-Za-z0-9_]*)")

    def fullname(self, s: dict, ns: str) -> tuple[str, str]:
        """(fullname, namespace) of a named type declared inside namespace `ns`."""
        name = s.get("name")
        self.check_name(name, f"name of a {s.get('type')}", dotted=True)
        if "." in name:
            return name, name.rpartition(".")[0]
        space = s.get("namespace", ns)
        if space is None:
            space = ""
        if space:
            self.check_name(space, "namespace", dotted=True)
        elif not isinstance(space, str):
            self.fail(f"namespace must be a string, got {json.dumps(space)}")
        if name in _PRIMITIVES:
            self.fail(f"{name!r} is a primitive type name and cannot name a {s.get('type')}")
        return (f"{space}.{name}" if space else name), space

    def declare(self, fullname: str) -> _Node:
        if fullname in self.named:
            self.fail(f"type {fullname!r} is defined twice")
        node = _Node(fullname)
        self.named[fullname] = node
        return node

    def node(self, s, ns: str) -> _Node:
        if isinstance(s, str):
            if s in _PRIMITIVES:
                return _primitive(s)
            for candidate in ((s,) if "." in s or not ns else (f"{ns}.{s}", s)):
                if candidate in self.named:
                    return self.named[candidate]
            self.fail(f"unknown type {s!r}")
        if isinstance(s, list):
            return self.union(s, ns)
        if not isinstance(s, dict):
            self.fail(f"a schema is a string, an array or an object, not {json.dumps(s)[:60]}")
        t = s.get("type")
        if t is None:
            self.fail(f"missing 'type' in {json.dumps(s)[:80]}")
        if isinstance(t, str):
            if t in _PRIMITIVES:
                return _primitive(t)  # logical types are validated as their underlying type
            maker = {
                "record": self.record,
                "error": self.record,
                "enum": self.enum,
                "fixed": self.fixed,
                "array": self.array,
                "map": self.map,
            }.get(t)
            if maker is not None:
                return maker(s, ns)
            return self.node(t, ns)  # {"type": "SomeNamedType"}
        self.fail(f"'type' must be a string, got {json.dumps(t)[:60]}")

    def record(self, s: dict, ns: str) -> _Node:
        fullname, space = self.fullname(s, ns)
        node = self.declare(fullname)
        fields = s.get("fields")
        if not isinstance(fields, list):
            self.fail(f"record {fullname!r} needs a 'fields' array")
        names: list[str] = []
        jfns, bfns = [], []
        width = 0
        for f in fields:
            if not isinstance(f, dict):
                self.fail(f"a field of record {fullname!r} is not an object: {json.dumps(f)[:60]}")
            self.check_name(f.get("name"), f"field name in record {fullname!r}", dotted=False)
            if f["name"] in names:
                self.fail(f"field {f['name']!r} appears twice in record {fullname!r}")
            if "type" not in f:
                self.fail(f"field {f['name']!r} of record {fullname!r} has no 'type'")
            child = self.node(f["type"], space)
            names.append(f["name"])
            jfns.append(child.json_ref())
            bfns.append(child.binary_ref())
            width += child.width if child.done else 1
        field_set = frozenset(names)
        jpairs = tuple(zip(names, jfns))
        bpairs = tuple(zip(names, bfns))

        def j(v):
            if not isinstance(v, dict):
                raise _Bad(f"expected an object for record {fullname}, got {_jtype(v)}")
            if len(v) != len(field_set) or not field_set.issuperset(v):
                extra = sorted(k for k in v if k not in field_set)
                if extra:
                    raise _Bad(f"unknown field {extra[0]!r} in record {fullname}")
            for name, fn in jpairs:
                try:
                    value = v[name]
                except KeyError:
                    raise _Bad(f"missing field {name!r} of record {fullname}") from None
                try:
                    fn(value)
                except _Bad as e:
                    e.path.insert(0, "." + name)
                    raise

        def b(buf, pos):
            for name, fn in bpairs:
                try:
                    pos = fn(buf, pos)
                except _Bad as e:
                    e.path.insert(0, "." + name)
                    raise
            return pos

        node.json, node.binary, node.width, node.done = j, b, width, True
        return node

    def enum(self, s: dict, ns: str) -> _Node:
        fullname, _ = self.fullname(s, ns)
        node = self.declare(fullname)
        symbols = s.get("symbols")
        if not isinstance(symbols, list):
            self.fail(f"enum {fullname!r} needs a 'symbols' array")
        for sym in symbols:
            self.check_name(sym, f"symbol of enum {fullname!r}", dotted=False)
        if len(set(symbols)) != len(symbols):
            self.fail(f"enum {fullname!r} has a duplicate symbol")
        if "default" in s and s["default"] not in symbols:
            self.fail(f"default {json.dumps(s['default'])} of enum {fullname!r} is not one of its symbols")
        symbol_set = frozenset(symbols)
        count = len(symbols)

        def j(v):
            if not isinstance(v, str):
                raise _Bad(f"expected a symbol of enum {fullname}, got {_jtype(v)}")
            if v not in symbol_set:
                raise _Bad(f"{v!r} is not a symbol of enum {fullname}")

        def b(buf, pos):
            start = pos
            i, pos = _read_int(buf, pos)
            if not 0 <= i < count:
                raise _Bad(f"enum index {i} out of range for {fullname} (byte {start})")
            return pos

        node.json, node.binary, node.width, node.done = j, b, 1, True
        return node

    def fixed(self, s: dict, ns: str) -> _Node:
        fullname, _ = self.fullname(s, ns)
        node = self.declare(fullname)
        size = s.get("size")
        if type(size) is not int or size < 0:
            self.fail(f"fixed {fullname!r} needs a 'size' >= 0, got {json.dumps(size)}")

        def j(v):
            if not isinstance(v, str):
                raise _Bad(f"expected fixed {fullname} (a string), got {_jtype(v)}")
            try:
                v.encode("latin-1")
            except UnicodeEncodeError:
                raise _Bad("fixed must be a string of code points U+0000..U+00FF") from None
            if len(v) != size:
                raise _Bad(f"fixed {fullname} takes {size} bytes, got {len(v)}")

        def b(buf, pos):
            if pos + size > len(buf):
                raise _eof(len(buf))
            return pos + size

        node.json, node.binary, node.width, node.done = j, b, size, True
        return node

    def array(self, s: dict, ns: str) -> _Node:
        if "items" not in s:
            self.fail("array needs 'items'")
        item = self.node(s["items"], ns)
        ij, ib = item.json_ref(), item.binary_ref()
        iw = item.width if item.done else 1

        def j(v):
            if not isinstance(v, list):
                raise _Bad(f"expected an array, got {_jtype(v)}")
            for i, x in enumerate(v):
                try:
                    ij(x)
                except _Bad as e:
                    e.path.insert(0, f"[{i}]")
                    raise

        def b(buf, pos):
            index = 0
            while True:
                start = pos
                count, pos = _read_long(buf, pos)
                if count == 0:
                    return pos
                if count < 0:
                    count = -count
                    _, pos = _read_long(buf, pos)  # block size in bytes
                if iw == 0:  # items take no bytes and are always valid (null, fixed(0), ...)
                    index += count
                    continue
                if count * iw > len(buf) - pos:
                    raise _Bad(f"array block of {count} items at byte {start} is longer than the data")
                for _ in range(count):
                    try:
                        pos = ib(buf, pos)
                    except _Bad as e:
                        e.path.insert(0, f"[{index}]")
                        raise
                    index += 1

        return _Node("array", j, b, 1)

    def map(self, s: dict, ns: str) -> _Node:
        if "values" not in s:
            self.fail("map needs 'values'")
        value = self.node(s["values"], ns)
        vj, vb = value.json_ref(), value.binary_ref()
        read_key = _primitive("string").binary

        def j(v):
            if not isinstance(v, dict):
                raise _Bad(f"expected an object (map), got {_jtype(v)}")
            for k, x in v.items():
                try:
                    vj(x)
                except _Bad as e:
                    e.path.insert(0, f"[{json.dumps(k)}]")
                    raise

        def b(buf, pos):
            while True:
                start = pos
                count, pos = _read_long(buf, pos)
                if count == 0:
                    return pos
                if count < 0:
                    count = -count
                    _, pos = _read_long(buf, pos)
                if count > len(buf) - pos:  # every entry has a key: >= 1 byte
                    raise _Bad(f"map block of {count} entries at byte {start} is longer than the data")
                for _ in range(count):
                    key_at = pos
                    pos = read_key(buf, pos)
                    try:
                        pos = vb(buf, pos)
                    except _Bad as e:
                        size, at = _read_length(buf, key_at)
                        e.path.insert(0, f"[{json.dumps(buf[at : at + size].decode('utf-8'))}]")
                        raise

        return _Node("map", j, b, 1)

    def union(self, s: list, ns: str) -> _Node:
        branches: list[_Node] = []
        for branch in s:
            if isinstance(branch, list):
                self.fail("a union may not immediately contain another union")
            node = self.node(branch, ns)
            if any(node.label == other.label for other in branches):
                self.fail(f"union contains {node.label!r} twice")
            branches.append(node)
        by_label = {n.label: n.json_ref() for n in branches}
        binaries = tuple(n.binary_ref() for n in branches)
        has_null = "null" in by_label
        labels = ", ".join(by_label) or "nothing"

        def j(v):
            if v is None:
                if has_null:
                    return
                raise _Bad(f"null is not allowed in union [{labels}]")
            if not isinstance(v, dict) or len(v) != 1:
                raise _Bad(f'a union value is null or {{"<type>": value}} with <type> one of [{labels}]')
            ((label, x),) = v.items()
            fn = by_label.get(label)
            if fn is None:
                raise _Bad(f"{label!r} is not a branch of union [{labels}]")
            try:
                fn(x)
            except _Bad as e:
                e.path.insert(0, f"<{label}>")
                raise

        def b(buf, pos):
            start = pos
            i, pos = _read_int(buf, pos)
            if not 0 <= i < len(binaries):
                raise _Bad(f"union branch {i} out of range [{labels}] (byte {start})")
            return binaries[i](buf, pos)

        return _Node("union", j, b, 1)


class AvroSchema(CompiledSchema):
    """An Avro schema. `parsed` is fastavro's parsed schema (for encoders/decoders elsewhere)."""

    type = AVRO

    def __init__(self, definition: str):
        self.definition = definition
        try:
            raw = json.loads(definition)
        except (ValueError, RecursionError) as e:
            raise InvalidArgument(DEF_PREFIX + f"not JSON: {e}") from None
        try:
            root = _AvroBuilder().node(raw, "")
        except RecursionError:
            raise InvalidArgument(DEF_PREFIX + "nested too deeply") from None
        import fastavro  # (here, not at the top: a server with no Avro schema starts without it, ~10 ms)

        try:
            self.parsed = fastavro.parse_schema(raw, named_schemas={})
        except KeyError as e:
            raise InvalidArgument(DEF_PREFIX + f"missing attribute {e}") from None
        except Exception as e:  # SchemaParseException, UnknownType, ValueError, TypeError...
            raise InvalidArgument(DEF_PREFIX + f"{type(e).__name__}: {e}") from None
        self._json = root.json
        self._binary = root.binary

    def validate(self, data: bytes, encoding: str) -> None:
        enc = encoding_name(encoding)
        if not isinstance(data, bytes):
            data = bytes(data)
        try:
            if enc == BINARY:
                end = self._binary(data, 0)
                if end != len(data):
                    raise _Bad(f"{len(data) - end} bytes left over after the value (from byte {end})")
            else:
                try:
                    value = json.loads(data.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise _Bad(f"not UTF-8: {e}") from None
                except ValueError as e:
                    raise _Bad(f"not JSON: {e}") from None
                self._json(value)
        except _Bad as e:
            raise InvalidArgument(DATA_PREFIX + e.text()) from None
        except RecursionError:
            raise InvalidArgument(DATA_PREFIX + "nested too deeply") from None


