"""The record catalogue. Owns the rule: every change of broker state is one of these typed records, each with
one encoder (`parts`) and one decoder (`decode`), here and nowhere else; records are batch-granular — one
Publish RPC is one record of N messages, one delivery or one ack batch is one record — so the log costs a few
bytes per message, never an object per message.

Payloads are little endian. Arrays of message numbers are raw u64 arrays (one C-level copy each way); protos
(configurations, policies) are stored as their serialized bytes; strings as u16 length · UTF-8. The framing
around a payload (length · crc · type) is storage.record's.

| type            | log    | payload |
|-----------------|--------|---------|
| PUBLISH 1       | bundle | topic u32 · shard u16 · base u64 · publish ms i64 · count u32 · key i64 · activations u32 · keys u32 · activation ms i64[] · idempotency keys str[] · the PublishRequest bytes |
| ACK 2           | bundle | sub u32 · message numbers u64[] |
| DELIVER 3       | bundle | sub u32 · deadline f64 · n u32 · dead u32 · flags u8 · nums u64[n] · versions u32[n]? · keys i64[n]? · dead nums u64[] · dead attempts u32[] |
| MODACK 4        | bundle | sub u32 · now f64 · seconds u32 · n u32 · nums u64[n] · versions u32[n] (0 = any); seconds 0 is a nack |
| SEEK 5          | bundle | sub u32 · shards u16 · floors u64[] · per shard: count u32 · acked offsets u64[] |
| TRIM 6          | bundle | sub u32 · shard u16 · offset u64 (retention: everything below is gone for the subscription) |
| PARK 7          | bundle | sub u32 · activate ms i64 (-1: bury) · nums u64[] |
| KICK 8          | bundle | sub u32 · nums u64[] |
| UPDATE 9        | bundle | sub u32 · num u64 · the new PubsubMessage bytes |
| TOPIC_PUT 16    | meta   | uid u32 · shards u16 · Topic bytes |
| TOPIC_DEL 17    | meta   | uid u32 |
| SUB_PUT 18      | meta   | uid u32 · topic uid u32 (0: none) · start count u16 · start offsets u64[] · Subscription bytes |
| SUB_DEL 19      | meta   | uid u32 |
| SNAP_PUT 20     | meta   | topic uid u32 · shards u16 (0xffff: keep the state) · floors u64[] · per shard acked · Snapshot bytes |
| SNAP_DEL 21     | meta   | name str |
| SCHEMA_PUT 22   | meta   | Schema bytes (one revision; the first creates the schema) |
| SCHEMA_DEL 23   | meta   | name str |
| SCHEMA_REVDEL 24| meta   | name str · revision id str |
| POLICY_PUT 25   | meta   | resource str · Policy bytes |
"""

from __future__ import annotations

import enum
import struct
from array import array
from dataclasses import dataclass
from typing import ClassVar

from pigeon.storage.record import Malformed  # a payload that does not decode as its type says


class RecordType(enum.IntEnum):
    PUBLISH = 1
    ACK = 2
    DELIVER = 3
    MODACK = 4
    SEEK = 5
    TRIM = 6
    PARK = 7
    KICK = 8
    UPDATE = 9
    RESET = 10
    SNAPSHOT = 11
    TOPIC_PUT = 16
    TOPIC_DEL = 17
    SUB_PUT = 18
    SUB_DEL = 19
    SNAP_PUT = 20
    SNAP_DEL = 21
    SCHEMA_PUT = 22
    SCHEMA_DEL = 23
    SCHEMA_REVDEL = 24
    POLICY_PUT = 25




# --- small codec helpers ------------------------------------------------------------------------------
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_KEEP_STATE = 0xFFFF


def _u64s(values) -> bytes:
    return array("Q", values).tobytes()


def encode_str(s: str) -> bytes:
    b = s.encode()
    return _U16.pack(len(b)) + b


class PayloadReader:
    """Reads a payload front to back; any overrun or leftover is Malformed."""

    __slots__ = ("buf", "pos")

    def __init__(self, payload):
        self.buf = memoryview(payload)
        self.pos = 0

    def take(self, s: struct.Struct) -> tuple:
        if self.pos + s.size > len(self.buf):
            raise Malformed("payload too short")
        out = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return out

    def raw(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise Malformed("payload too short")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def array(self, code: str, n: int) -> array:
        a = array(code)
        a.frombytes(self.raw(n * a.itemsize))
        return a

    def string(self) -> str:
        (n,) = self.take(_U16)
        try:
            return str(self.raw(n), "utf-8")
        except UnicodeDecodeError as e:
            raise Malformed(f"bad string: {e}") from None

    def u64_rest(self) -> array:
        """The rest of the payload as message numbers."""
        rest = self.rest()
        if len(rest) % 8:
            raise Malformed("message numbers are not a whole number of u64")
        nums = array("Q")
        nums.frombytes(rest)
        return nums

    def rest(self) -> memoryview:
        out = self.buf[self.pos:]
        self.pos = len(self.buf)
        return out

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise Malformed(f"{len(self.buf) - self.pos} bytes left over")


class Record:
    """A typed record: `parts()` are the payload's pieces (joined once, by the framing), `decode` reads one."""

    TYPE: ClassVar[RecordType]
    META: ClassVar[bool] = False  # metadata (the meta log) or data of a topic's bundle

    def parts(self) -> list[bytes]:
        raise NotImplementedError

    @classmethod
    def decode(cls, payload) -> "Record":
        raise NotImplementedError


# --- data records ---------------------------------------------------------------------------------------
_PUBLISH = struct.Struct("<IHQqIqII")


@dataclass(slots=True)
class Publish(Record):
    """One Publish RPC's messages appended to one topic shard. `request` is the PublishRequest as stored
    (message ids and publish time are derived, never stored); `key` the ordering-key hash (0: none, -1: the
    batch waits in the activation index); `activations` each message's activation ms (scheduled batches);
    `idempotency_keys` each message's key ("" for none) when some message has one."""

    TYPE: ClassVar = RecordType.PUBLISH
    topic: int
    shard: int
    base: int
    publish_ms: int
    count: int
    key: int
    request: bytes | memoryview
    activations: list[int] | None = None
    idempotency_keys: list[str] | None = None

    def parts(self) -> list[bytes]:
        acts, keys = self.activations or (), self.idempotency_keys or ()
        head = _PUBLISH.pack(self.topic, self.shard, self.base, self.publish_ms, self.count, self.key, len(acts),
                             len(keys))
        if not acts and not keys:
            return [head, self.request]
        return [head, array("q", acts).tobytes(), b"".join(map(encode_str, keys)), self.request]

    @classmethod
    def decode(cls, payload) -> "Publish":
        r = PayloadReader(payload)
        topic, shard, base, ms, count, key, n_act, n_keys = r.take(_PUBLISH)
        acts = list(r.array("q", n_act)) if n_act else None
        keys = [r.string() for _ in range(n_keys)] if n_keys else None
        return cls(topic, shard, base, ms, count, key, r.rest(), acts, keys)

    @staticmethod
    def head(payload) -> tuple[int, int, int, int, int, int]:
        """(topic, shard, base, publish ms, count, key) without decoding the rest (the reader's path)."""
        return _PUBLISH.unpack_from(payload, 0)[:6]

    @staticmethod
    def request_of(payload) -> memoryview:
        """The stored PublishRequest bytes of a PUBLISH payload, without a copy."""
        r = PayloadReader(payload)
        _, _, _, _, _, _, n_act, n_keys = r.take(_PUBLISH)
        r.raw(8 * n_act)
        for _ in range(n_keys):
            r.string()
        return r.rest()


def _nums_record(rtype: RecordType, doc: str):
    @dataclass(slots=True)
    class NumsRecord(Record):
        TYPE: ClassVar = rtype
        sub: int
        nums: list[int] | array

        def parts(self) -> list[bytes]:
            return [_U32.pack(self.sub), _u64s(self.nums)]

        @classmethod
        def decode(cls, payload):
            r = PayloadReader(payload)
            (sub,) = r.take(_U32)
            return cls(sub, r.u64_rest())

    NumsRecord.__doc__ = doc
    return NumsRecord


Ack = _nums_record(RecordType.ACK, "Message numbers acknowledged on one subscription.")
Ack.__name__ = Ack.__qualname__ = "Ack"
Kick = _nums_record(RecordType.KICK, "Buried messages of one subscription sent back to the queue.")
Kick.__name__ = Kick.__qualname__ = "Kick"

_DELIVER = struct.Struct("<IdIIB")
_HAS_VERSIONS, _HAS_KEYS = 1, 2


@dataclass(slots=True)
class Deliver(Record):
    """Messages handed out on one subscription, locked until `deadline` (seconds): `nums` with their delivery
    `versions` (None: all first deliveries) and ordering-key hashes (`keys`, ordered subscriptions only);
    `dead` are (num, deliveries so far) taken out for the dead-letter topic instead, held until `deadline`."""

    TYPE: ClassVar = RecordType.DELIVER
    sub: int
    deadline: float
    nums: list[int]
    versions: list[int] | None = None
    keys: list[int] | None = None
    dead: list[tuple[int, int]] | None = None

    def parts(self) -> list[bytes]:
        dead = self.dead or ()
        flags = (_HAS_VERSIONS if self.versions is not None else 0) | (_HAS_KEYS if self.keys is not None else 0)
        out = [_DELIVER.pack(self.sub, self.deadline, len(self.nums), len(dead), flags), _u64s(self.nums)]
        if self.versions is not None:
            out.append(array("I", self.versions).tobytes())
        if self.keys is not None:
            out.append(array("q", self.keys).tobytes())
        if dead:
            out.append(_u64s(n for n, _ in dead))
            out.append(array("I", (a for _, a in dead)).tobytes())
        return out

    @classmethod
    def decode(cls, payload) -> "Deliver":
        r = PayloadReader(payload)
        sub, deadline, n, n_dead, flags = r.take(_DELIVER)
        nums = r.array("Q", n).tolist()
        versions = r.array("I", n).tolist() if flags & _HAS_VERSIONS else None
        keys = r.array("q", n).tolist() if flags & _HAS_KEYS else None
        dead = None
        if n_dead:
            dn = r.array("Q", n_dead)
            da = r.array("I", n_dead)
            dead = list(zip(dn.tolist(), da.tolist()))
        r.done()
        return cls(sub, deadline, nums, versions, keys, dead)


_MODACK = struct.Struct("<IdII")


@dataclass(slots=True)
class Modack(Record):
    """Lease deadlines of one subscription changed at `now`: each (num, version) (version 0: any delivery)
    is locked for `seconds` more; 0 seconds ends the lease as a failure (a nack)."""

    TYPE: ClassVar = RecordType.MODACK
    sub: int
    now: float
    seconds: int
    nums: list[int]
    versions: list[int]

    def parts(self) -> list[bytes]:
        assert len(self.nums) == len(self.versions)
        return [_MODACK.pack(self.sub, self.now, self.seconds, len(self.nums)), _u64s(self.nums),
                array("I", self.versions).tobytes()]

    @classmethod
    def decode(cls, payload) -> "Modack":
        r = PayloadReader(payload)
        sub, now, seconds, n = r.take(_MODACK)
        nums = r.array("Q", n).tolist()
        versions = r.array("I", n).tolist()
        r.done()
        return cls(sub, now, seconds, nums, versions)


def ack_state_parts(floors: list[int], acked: list[list[int]]) -> list[bytes]:
    assert len(floors) == len(acked)
    out = [_U16.pack(len(floors)), _u64s(floors)]
    for a in acked:
        out.append(_U32.pack(len(a)))
        out.append(_u64s(a))
    return out


def read_ack_state(r: PayloadReader) -> tuple[list[int], list[list[int]]]:
    (n,) = r.take(_U16)
    floors = r.array("Q", n).tolist()
    acked = []
    for _ in range(n):
        (k,) = r.take(_U32)
        acked.append(r.array("Q", k).tolist())
    return floors, acked


@dataclass(slots=True)
class Seek(Record):
    """A subscription's ack state replaced (seek to a time or snapshot, a cursor moved, detach): every offset
    below `floors[shard]` and those listed in `acked[shard]` are acknowledged, nothing else; leases end."""

    TYPE: ClassVar = RecordType.SEEK
    sub: int
    floors: list[int]
    acked: list[list[int]]

    def parts(self) -> list[bytes]:
        return [_U32.pack(self.sub), *ack_state_parts(self.floors, self.acked)]

    @classmethod
    def decode(cls, payload) -> "Seek":
        r = PayloadReader(payload)
        (sub,) = r.take(_U32)
        floors, acked = read_ack_state(r)
        r.done()
        return cls(sub, floors, acked)


_TRIM = struct.Struct("<IHQ")


@dataclass(slots=True)
class Trim(Record):
    """Retention passed: every message of `shard` below `offset` is gone for the subscription."""

    TYPE: ClassVar = RecordType.TRIM
    sub: int
    shard: int
    offset: int

    def parts(self) -> list[bytes]:
        return [_TRIM.pack(self.sub, self.shard, self.offset)]

    @classmethod
    def decode(cls, payload) -> "Trim":
        r = PayloadReader(payload)
        out = cls(*r.take(_TRIM))
        r.done()
        return out


_PARK = struct.Struct("<Iq")


@dataclass(slots=True)
class Park(Record):
    """Locked messages of one subscription set aside without an ack: until `activate_ms` (reschedule), or
    until kicked when it is -1 (bury)."""

    TYPE: ClassVar = RecordType.PARK
    sub: int
    activate_ms: int
    nums: list[int]

    def parts(self) -> list[bytes]:
        return [_PARK.pack(self.sub, self.activate_ms), _u64s(self.nums)]

    @classmethod
    def decode(cls, payload) -> "Park":
        r = PayloadReader(payload)
        sub, at = r.take(_PARK)
        return cls(sub, at, r.u64_rest().tolist())


_RESET = struct.Struct("<II")


@dataclass(slots=True)
class Reset(Record):
    """A node's own copy of a bundle log starts over here: the bundle's topics and their subscriptions go back
    to their state as created, and the entries that follow (the log, read back from the ledgers that hold it,
    when the node takes the bundle over) rebuild them. Local to a node's journal: never replicated."""

    TYPE: ClassVar = RecordType.RESET
    log: int
    bundles: int  # how many bundles the cluster has (which topics are the log's)

    def parts(self) -> list[bytes]:
        return [_RESET.pack(self.log, self.bundles)]

    @classmethod
    def decode(cls, payload) -> "Reset":
        r = PayloadReader(payload)
        out = cls(*r.take(_RESET))
        r.done()
        return out


@dataclass(slots=True)
class Snapshot(Record):
    """A bundle log's data state at this point of the log, written by its owner into the log itself: the bundle's
    topics' shard offsets, activation and idempotency indexes, and its subscriptions' ack state, leases and
    counts (`images`: framed checkpoint images, pigeon.storage.checkpoint). Applying it resets the bundle as
    Reset does and loads them, so the log can be read from here instead of from its start: no message body is
    in it — the entries that follow hold every message still needed when the log is cut here (node.bundle_logs
    decides where). Only the first entry of a log read back is applied (node.engine.rebuild_log): one further in
    describes what the entries before it built. The owner never applies its own."""

    TYPE: ClassVar = RecordType.SNAPSHOT
    log: int
    bundles: int
    images: bytes

    def parts(self) -> list[bytes]:
        return [_RESET.pack(self.log, self.bundles), self.images]

    @classmethod
    def decode(cls, payload) -> "Snapshot":
        r = PayloadReader(payload)
        log, bundles = r.take(_RESET)
        return cls(log, bundles, bytes(r.rest()))


_UPDATE = struct.Struct("<IQ")


@dataclass(slots=True)
class Update(Record):
    """One message's data and attributes replaced, for one subscription (queue extension)."""

    TYPE: ClassVar = RecordType.UPDATE
    sub: int
    num: int
    message: bytes

    def parts(self) -> list[bytes]:
        return [_UPDATE.pack(self.sub, self.num), self.message]

    @classmethod
    def decode(cls, payload) -> "Update":
        r = PayloadReader(payload)
        sub, num = r.take(_UPDATE)
        return cls(sub, num, bytes(r.rest()))


# --- metadata records ---------------------------------------------------------------------------------
_TOPIC_PUT = struct.Struct("<IH")


@dataclass(slots=True)
class TopicPut(Record):
    """A topic created (a new uid) or its configuration replaced."""

    TYPE: ClassVar = RecordType.TOPIC_PUT
    META: ClassVar = True
    uid: int
    shards: int
    config: bytes

    def parts(self) -> list[bytes]:
        return [_TOPIC_PUT.pack(self.uid, self.shards), self.config]

    @classmethod
    def decode(cls, payload) -> "TopicPut":
        r = PayloadReader(payload)
        uid, shards = r.take(_TOPIC_PUT)
        return cls(uid, shards, bytes(r.rest()))


def _uid_record(rtype: RecordType, doc: str):
    @dataclass(slots=True)
    class UidRecord(Record):
        TYPE: ClassVar = rtype
        META: ClassVar = True
        uid: int

        def parts(self) -> list[bytes]:
            return [_U32.pack(self.uid)]

        @classmethod
        def decode(cls, payload):
            r = PayloadReader(payload)
            (uid,) = r.take(_U32)
            r.done()
            return cls(uid)

    UidRecord.__doc__ = doc
    return UidRecord


TopicDel = _uid_record(RecordType.TOPIC_DEL, "A topic deleted (its subscriptions keep their backlog).")
TopicDel.__name__ = TopicDel.__qualname__ = "TopicDel"
SubDel = _uid_record(RecordType.SUB_DEL, "A subscription deleted.")
SubDel.__name__ = SubDel.__qualname__ = "SubDel"

_SUB_PUT = struct.Struct("<IIH")


@dataclass(slots=True)
class SubPut(Record):
    """A subscription created (a new uid, starting at `start`: each shard's end at creation) or its
    configuration replaced (`start` None). `topic` 0: no topic (created on a deleted one)."""

    TYPE: ClassVar = RecordType.SUB_PUT
    META: ClassVar = True
    uid: int
    topic: int
    config: bytes
    start: list[int] | None = None

    def parts(self) -> list[bytes]:
        start = self.start or []
        return [_SUB_PUT.pack(self.uid, self.topic, len(start) if self.start is not None else _KEEP_STATE),
                _u64s(start), self.config]

    @classmethod
    def decode(cls, payload) -> "SubPut":
        r = PayloadReader(payload)
        uid, topic, n = r.take(_SUB_PUT)
        start = None if n == _KEEP_STATE else r.array("Q", n).tolist()
        return cls(uid, topic, bytes(r.rest()), start)


@dataclass(slots=True)
class SnapPut(Record):
    """A snapshot created with the ack state it captured (`floors`, `acked`), or its configuration replaced
    (state None: kept)."""

    TYPE: ClassVar = RecordType.SNAP_PUT
    META: ClassVar = True
    topic: int
    config: bytes
    floors: list[int] | None = None
    acked: list[list[int]] | None = None

    def parts(self) -> list[bytes]:
        head = _U32.pack(self.topic)
        if self.floors is None:
            return [head, _U16.pack(_KEEP_STATE), self.config]
        return [head, *ack_state_parts(self.floors, self.acked), self.config]

    @classmethod
    def decode(cls, payload) -> "SnapPut":
        r = PayloadReader(payload)
        (topic,) = r.take(_U32)
        (n,) = _U16.unpack_from(r.buf, r.pos) if r.pos + 2 <= len(r.buf) else (None,)
        if n is None:
            raise Malformed("payload too short")
        if n == _KEEP_STATE:
            r.take(_U16)
            return cls(topic, bytes(r.rest()))
        floors, acked = read_ack_state(r)
        return cls(topic, bytes(r.rest()), floors, acked)


def _name_record(rtype: RecordType, doc: str):
    @dataclass(slots=True)
    class NameRecord(Record):
        TYPE: ClassVar = rtype
        META: ClassVar = True
        name: str

        def parts(self) -> list[bytes]:
            return [encode_str(self.name)]

        @classmethod
        def decode(cls, payload):
            r = PayloadReader(payload)
            name = r.string()
            r.done()
            return cls(name)

    NameRecord.__doc__ = doc
    return NameRecord


SnapDel = _name_record(RecordType.SNAP_DEL, "A snapshot deleted (or expired).")
SnapDel.__name__ = SnapDel.__qualname__ = "SnapDel"
SchemaDel = _name_record(RecordType.SCHEMA_DEL, "A schema deleted with all its revisions.")
SchemaDel.__name__ = SchemaDel.__qualname__ = "SchemaDel"


@dataclass(slots=True)
class SchemaPut(Record):
    """A schema revision added (the first one creates the schema)."""

    TYPE: ClassVar = RecordType.SCHEMA_PUT
    META: ClassVar = True
    config: bytes

    def parts(self) -> list[bytes]:
        return [self.config]

    @classmethod
    def decode(cls, payload) -> "SchemaPut":
        return cls(bytes(payload))


@dataclass(slots=True)
class SchemaRevDel(Record):
    """One revision of a schema deleted."""

    TYPE: ClassVar = RecordType.SCHEMA_REVDEL
    META: ClassVar = True
    name: str
    revision_id: str

    def parts(self) -> list[bytes]:
        return [encode_str(self.name), encode_str(self.revision_id)]

    @classmethod
    def decode(cls, payload) -> "SchemaRevDel":
        r = PayloadReader(payload)
        out = cls(r.string(), r.string())
        r.done()
        return out


@dataclass(slots=True)
class PolicyPut(Record):
    """An IAM policy set on a resource."""

    TYPE: ClassVar = RecordType.POLICY_PUT
    META: ClassVar = True
    resource: str
    policy: bytes

    def parts(self) -> list[bytes]:
        return [encode_str(self.resource), self.policy]

    @classmethod
    def decode(cls, payload) -> "PolicyPut":
        r = PayloadReader(payload)
        return cls(r.string(), bytes(r.rest()))


CATALOGUE: dict[int, type[Record]] = {cls.TYPE: cls for cls in (
    Publish, Ack, Deliver, Modack, Seek, Trim, Park, Kick, Update, Reset, Snapshot, TopicPut, TopicDel, SubPut, SubDel, SnapPut,
    SnapDel, SchemaPut, SchemaDel, SchemaRevDel, PolicyPut)}
assert len(CATALOGUE) == len(RecordType)


def decode(rtype: int, payload) -> Record:
    """The typed record of a payload. Raises Malformed (an unknown type included)."""
    cls = CATALOGUE.get(rtype)
    if cls is None:
        raise Malformed(f"unknown record type {rtype}")
    try:
        return cls.decode(payload)
    except (struct.error, ValueError) as e:
        if isinstance(e, Malformed):
            raise
        raise Malformed(str(e)) from None
