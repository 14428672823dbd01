"""The data records: what a topic's bundle log holds (the `bundle` rows of storage.records' table) — messages
published, handed out, acknowledged, leased, parked, replaced, and a subscription's ack state reset or trimmed —
and the Reset and Snapshot entries that restart a bundle's state. Owns their payloads' layouts."""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import ClassVar

from pigeon.storage.record import Malformed
from pigeon.storage.records.base import (U32, PayloadReader, Record, RecordType, ack_state_parts, encode_str,
                                         read_ack_state, u64s)

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
            return [U32.pack(self.sub), u64s(self.nums)]

        @classmethod
        def decode(cls, payload):
            r = PayloadReader(payload)
            (sub,) = r.take(U32)
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
        out = [_DELIVER.pack(self.sub, self.deadline, len(self.nums), len(dead), flags), u64s(self.nums)]
        if self.versions is not None:
            out.append(array("I", self.versions).tobytes())
        if self.keys is not None:
            out.append(array("q", self.keys).tobytes())
        if dead:
            out.append(u64s(n for n, _ in dead))
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
        return [_MODACK.pack(self.sub, self.now, self.seconds, len(self.nums)), u64s(self.nums),
                array("I", self.versions).tobytes()]

    @classmethod
    def decode(cls, payload) -> "Modack":
        r = PayloadReader(payload)
        sub, now, seconds, n = r.take(_MODACK)
        nums = r.array("Q", n).tolist()
        versions = r.array("I", n).tolist()
        r.done()
        return cls(sub, now, seconds, nums, versions)


@dataclass(slots=True)
class Seek(Record):
    """A subscription's ack state replaced (seek to a time or snapshot, a cursor moved, detach): every offset
    below `floors[shard]` and those listed in `acked[shard]` are acknowledged, nothing else; leases end. With
    `shard` (a spread topic: one Seek a shard's log) only that shard's state is replaced, from `floors[0]` and
    `acked[0]`; written as a u16 after the rest, which a Seek of an earlier release has none of (every shard)."""

    TYPE: ClassVar = RecordType.SEEK
    sub: int
    floors: list[int]
    acked: list[list[int]]
    shard: int | None = None

    def parts(self) -> list[bytes]:
        parts = [U32.pack(self.sub), *ack_state_parts(self.floors, self.acked)]
        return parts if self.shard is None else parts + [_U16.pack(self.shard)]

    @classmethod
    def decode(cls, payload) -> "Seek":
        r = PayloadReader(payload)
        (sub,) = r.take(U32)
        floors, acked = read_ack_state(r)
        shard = None
        if r.pos < len(r.buf):
            (shard,) = r.take(_U16)
            if len(floors) != 1:
                raise Malformed("a seek of one shard carries one floor")
        r.done()
        return cls(sub, floors, acked, shard)


_U16 = struct.Struct("<H")
_TRIM = struct.Struct("<IHQ")


@dataclass(slots=True)
class Trim(Record):
    """Retention passed: every message of `shard` below `offset` is gone for the subscription — but, with
    `keeps_rescheduled`, the rescheduled ones (their retention counts from their latest activation: broker.
    subscription). The flag is one byte after the rest, written only when set: a Trim of an earlier release has
    none and drops them all, as it did when it was written (its journal may be cut past their batches since)."""

    TYPE: ClassVar = RecordType.TRIM
    sub: int
    shard: int
    offset: int
    keeps_rescheduled: bool = False

    def parts(self) -> list[bytes]:
        head = _TRIM.pack(self.sub, self.shard, self.offset)
        return [head + b"\x01" if self.keeps_rescheduled else head]

    @classmethod
    def decode(cls, payload) -> "Trim":
        r = PayloadReader(payload)
        out = cls(*r.take(_TRIM))
        rest = bytes(r.rest())
        if rest not in (b"", b"\x01"):
            raise Malformed("a trim's flags are one byte, 1")
        out.keeps_rescheduled = rest == b"\x01"
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
        return [_PARK.pack(self.sub, self.activate_ms), u64s(self.nums)]

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
    counts, and its message indexes, each batch named by its log address (`images`: framed checkpoint images,
    pigeon.storage.checkpoint). Applying it resets the bundle as Reset does and loads them, so the log can be read
    from here instead of from its start: no message body is in it — the batches it names stay in the ledgers
    before it, kept while needed (node.ledger_upkeep decides). Only the first entry of a log read back is applied
    (node.engine.load_log): one further in describes what the entries before it built. The owner never applies
    its own in the log; a new owner writes one into its own journal (the state it built)."""

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


_HANDOVER = struct.Struct("<IHIIId")


class _Handover(Record):
    """The layout ShardOut and ShardIn share: topic, shard, this log, the other log, the hand-over's number among
    the pair's (`gen`, 1 the first), now, then the pair's images."""

    __slots__ = ()

    def parts(self) -> list[bytes]:
        return [_HANDOVER.pack(*(getattr(self, f) for f in self.__slots__[:6])), self.images]

    @classmethod
    def decode(cls, payload):
        r = PayloadReader(payload)
        return cls(*r.take(_HANDOVER), bytes(r.rest()))


@dataclass(slots=True)
class ShardOut(_Handover):
    """A (topic, shard) pair leaves this log (`log`) for log `to` (docs/cluster.md, "Scale-out" 4.3): `images` is
    the pair's state here (framed checkpoint images, as a Snapshot's: its index with batches named by log address,
    each subscription's part), which the new home loads from a `ShardIn`. Applied, the pair's state goes from this
    log's and its records are refused here until the metadata log homes it in `to` (`ShardHome`). The image rides
    in the record so that whoever owns this log next can finish the hand-over from the log alone."""

    TYPE: ClassVar = RecordType.SHARD_OUT
    topic: int
    shard: int
    log: int
    to: int
    gen: int
    now: float
    images: bytes


@dataclass(slots=True)
class ShardIn(_Handover):
    """A (topic, shard) pair arrives in this log (`log`) from log `source`, with the state it had there (`images`,
    from its `ShardOut`): applied, the pair's state here is that state. A pair this log holds already (a hand-over
    finished twice, after a crash) changes nothing."""

    TYPE: ClassVar = RecordType.SHARD_IN
    topic: int
    shard: int
    log: int
    source: int
    gen: int
    now: float
    images: bytes


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
