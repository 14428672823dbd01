"""The record catalogue. Owns the rule: every change of broker state is one of these typed records, each with
one encoder (`parts`) and one decoder (`decode`), here and nowhere else; records are batch-granular — one
Publish RPC is one record of N messages, one delivery or one ack batch is one record — so the log costs a few
bytes per message, never an object per message.

Payloads are little endian. Arrays of message numbers are raw u64 arrays (one C-level copy each way); protos
(configurations, policies) are stored as their serialized bytes; strings as u16 length · UTF-8. The framing
around a payload (length · crc · type) is storage.record's.

The catalogue is kept in three modules: records.base (the types, the Record base class, the payload codec),
records.data (the bundle logs' records) and records.meta (the meta log's); this package is their one entry point,
with CATALOGUE and `decode`.

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
| SHARD_OUT 12    | bundle | topic u32 · shard u16 · log u32 · to log u32 · gen u32 · now f64 · the pair's images (checkpoint framing) |
| SHARD_IN 13     | bundle | topic u32 · shard u16 · log u32 · from log u32 · gen u32 · now f64 · the pair's images |
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
| SHARD_HOME 26   | meta   | topic u32 · shard u16 · log u32 · gen u32 · now f64 (the pair's home from its gen-th hand-over on) |
"""

from __future__ import annotations

import struct

from pigeon.storage.record import Malformed  # a payload that does not decode as its type says
from pigeon.storage.records.base import (PayloadReader, Record, RecordType, ack_state_parts, encode_str,
                                         read_ack_state)
from pigeon.storage.records.data import (Ack, Deliver, Kick, Modack, Park, Publish, Reset, Seek, ShardIn, ShardOut,
                                         Snapshot, Trim, Update)
from pigeon.storage.records.meta import (PolicyPut, SchemaDel, SchemaPut, SchemaRevDel, ShardHome, SnapDel, SnapPut,
                                         SubDel, SubPut, TopicDel, TopicPut)

__all__ = ["Malformed", "PayloadReader", "Record", "RecordType", "ack_state_parts", "encode_str", "read_ack_state",
           "Ack", "Deliver", "Kick", "Modack", "Park", "Publish", "Reset", "Seek", "ShardIn", "ShardOut", "Snapshot",
           "Trim", "Update", "PolicyPut", "SchemaDel", "SchemaPut", "SchemaRevDel", "ShardHome", "SnapDel", "SnapPut",
           "SubDel", "SubPut", "TopicDel", "TopicPut", "CATALOGUE", "decode"]

CATALOGUE: dict[int, type[Record]] = {cls.TYPE: cls for cls in (
    Publish, Ack, Deliver, Modack, Seek, Trim, Park, Kick, Update, Reset, Snapshot, ShardOut, ShardIn, TopicPut, TopicDel,
    SubPut, SubDel, SnapPut, SnapDel, SchemaPut, SchemaDel, SchemaRevDel, PolicyPut, ShardHome)}
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
