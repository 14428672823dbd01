"""The metadata records: what the meta log holds (the `meta` rows of storage.records' table) — topics,
subscriptions, snapshots, schemas and IAM policies created, replaced or deleted. Owns their payloads' layouts."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from pigeon.storage.record import Malformed
from pigeon.storage.records.base import (KEEP_STATE, U16, U32, PayloadReader, Record, RecordType, ack_state_parts,
                                         encode_str, read_ack_state, u64s)

_TOPIC_PUT = struct.Struct("<IH")


@dataclass(slots=True)
class TopicPut(Record):
    """A topic created (a new uid) or its configuration replaced. `spread`: its shards lie in bundles of their own
    (core.bundles), fixed at creation; carried in the top bit of the shard count, which a record of an earlier
    release leaves clear (together, as every topic then was)."""

    TYPE: ClassVar = RecordType.TOPIC_PUT
    META: ClassVar = True
    uid: int
    shards: int
    config: bytes
    spread: bool = False

    def parts(self) -> list[bytes]:
        return [_TOPIC_PUT.pack(self.uid, self.shards | (_SPREAD if self.spread else 0)), self.config]

    @classmethod
    def decode(cls, payload) -> "TopicPut":
        r = PayloadReader(payload)
        uid, shards = r.take(_TOPIC_PUT)
        return cls(uid, shards & ~_SPREAD, bytes(r.rest()), bool(shards & _SPREAD))


_SPREAD = 1 << 15
_SHARD_HOME = struct.Struct("<IHIId")


@dataclass(slots=True)
class ShardHome(Record):
    """A (topic, shard) pair's records go to log `log` from now on (docs/cluster.md, "Scale-out" 4.3): written
    once the pair's `ShardIn` is durable there; routing and `BrokerState.log_of` read it. `gen` numbers the
    pair's hand-overs (1 the first): a record of an earlier one changes nothing, applied late or again."""

    TYPE: ClassVar = RecordType.SHARD_HOME
    META: ClassVar = True
    topic: int
    shard: int
    log: int
    gen: int
    now: float = 0.0  # when it was committed (a node that drops a stale copy of the pair derives dispatch anew)

    def parts(self) -> list[bytes]:
        return [_SHARD_HOME.pack(self.topic, self.shard, self.log, self.gen, self.now)]

    @classmethod
    def decode(cls, payload) -> "ShardHome":
        r = PayloadReader(payload)
        out = cls(*r.take(_SHARD_HOME))
        r.done()
        return out


def _uid_record(rtype: RecordType, doc: str):
    @dataclass(slots=True)
    class UidRecord(Record):
        TYPE: ClassVar = rtype
        META: ClassVar = True
        uid: int

        def parts(self) -> list[bytes]:
            return [U32.pack(self.uid)]

        @classmethod
        def decode(cls, payload):
            r = PayloadReader(payload)
            (uid,) = r.take(U32)
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
        return [_SUB_PUT.pack(self.uid, self.topic, len(start) if self.start is not None else KEEP_STATE),
                u64s(start), self.config]

    @classmethod
    def decode(cls, payload) -> "SubPut":
        r = PayloadReader(payload)
        uid, topic, n = r.take(_SUB_PUT)
        start = None if n == KEEP_STATE else r.array("Q", n).tolist()
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
        head = U32.pack(self.topic)
        if self.floors is None:
            return [head, U16.pack(KEEP_STATE), self.config]
        return [head, *ack_state_parts(self.floors, self.acked), self.config]

    @classmethod
    def decode(cls, payload) -> "SnapPut":
        r = PayloadReader(payload)
        (topic,) = r.take(U32)
        (n,) = U16.unpack_from(r.buf, r.pos) if r.pos + 2 <= len(r.buf) else (None,)
        if n is None:
            raise Malformed("payload too short")
        if n == KEEP_STATE:
            r.take(U16)
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
