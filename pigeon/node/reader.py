"""Reading stored messages back. Owns the rule: message bytes are read from the record that stored
them (or the cache of recent records) and never re-encoded."""

from __future__ import annotations

import struct
from collections import OrderedDict

from pigeon.broker.topic import TopicState, split_msgnum
from pigeon.node.wal import Wal
from pigeon.storage import payloads, record

_LEN = struct.Struct("<I")


class MessageReader:
    def __init__(self, wal: Wal, cache_bytes_max: int):
        self.wal = wal
        self.cache_bytes_max = cache_bytes_max
        self._cache: OrderedDict[int, list[bytes]] = OrderedDict()  # record pos → stored messages
        self._cache_bytes = 0
        self.disk_reads = 0

    def remember(self, pos: int, messages: list[bytes], nbytes: int) -> None:
        self._cache[pos] = messages
        self._cache_bytes += nbytes
        while self._cache_bytes > self.cache_bytes_max and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= sum(map(len, old))

    def batch(self, pos: int) -> list[bytes]:
        msgs = self._cache.get(pos)
        if msgs is not None:
            return msgs
        self.disk_reads += 1
        head = self.wal.read(pos, 8)
        (length,) = _LEN.unpack_from(head, 0)
        buf = self.wal.read(pos, 8 + length)
        rtype, payload, _ = record.decode_at(buf, 0, len(buf))
        assert rtype == record.RecordType.PUBLISH
        msgs = payloads.publish_messages(payload)
        self.remember(pos, msgs, length)
        return msgs

    def messages(self, topic: TopicState, nums: list[int]) -> list[bytes]:
        """Stored PubsubMessage bytes for message numbers (offset << shard_bits | shard)."""
        out = []
        memo_shard = memo_lo = memo_hi = -1
        memo_msgs: list[bytes] = []
        shards = topic.shards
        for num in nums:
            offset, shard = split_msgnum(num)
            if shard != memo_shard or not memo_lo <= offset < memo_hi:
                ix = shards[shard]
                i = ix.batch_of(offset)
                memo_shard, memo_lo, memo_hi = shard, ix.base[i], ix.batch_end(i)
                memo_msgs = self.batch(ix.pos[i])
            out.append(memo_msgs[offset - memo_lo])
        return out
