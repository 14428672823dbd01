"""Bundles: which log holds a topic's data. Owns the rule: log 0 is the metadata log; a topic laid out *together*
(its shards and its subscriptions' state) belongs to bundle crc32c(name) mod bundles, whose log is 1 + bundle; a
topic laid out *spread* has each shard k in bundle (crc32c(name) + k) mod bundles, with that shard's part of every
subscription's state — stable hashes, so a shard's log is the same on every node and after every restart. A bundle
is the unit a node owns and a cluster moves (the cluster's placement assigns bundles to nodes)."""

from __future__ import annotations

import crc32c

META_LOG = 0


def bundle_of(topic_name: str, bundles: int) -> int:
    return crc32c.crc32c(topic_name.encode()) % bundles


def bundle_log(topic_name: str, bundles: int) -> int:
    return 1 + bundle_of(topic_name, bundles)


def shard_log(topic_name: str, shard: int, bundles: int, spread: bool) -> int:
    """The log of one shard of a topic: its topic's bundle log when the topic is together; when spread, shard k's
    is k bundles on from the topic's (so up to `bundles` shards lie in as many distinct bundles, and a node owns
    as many of a topic's shards as its share of the bundles)."""
    if not spread:
        return bundle_log(topic_name, bundles)
    return 1 + (bundle_of(topic_name, bundles) + shard) % bundles


def bundle_of_log(log_id: int) -> int:
    """The bundle whose log `log_id` is (-1 for the metadata log)."""
    return log_id - 1


# A stored message batch is named by an *address* (the broker's index keeps one per batch). On one node it is the
# position of its record in the node's journal. In a cluster, a batch a bundle's owner took over with the bundle —
# not in its own journal — is named by its place in the bundle's log instead: the same on every member and for
# every owner, since the log is its ledgers end to end (docs/cluster.md, "Scale-out"). One integer either way, so
# the indexes and caches are untouched: a log address has bit 62 set, which no journal position reaches; the log
# id takes the next 22 bits and the offset the low 40.
LOG_ADDRESS = 1 << 62
_OFFSET_BITS = 40


def log_address(log_id: int, offset: int) -> int:
    assert 0 <= offset < 1 << _OFFSET_BITS and 0 <= log_id < 1 << 21, (log_id, offset)
    return LOG_ADDRESS | log_id << _OFFSET_BITS | offset


def is_log_address(address: int) -> bool:
    return address >= LOG_ADDRESS


def split_log_address(address: int) -> tuple[int, int]:
    """(log id, offset) of a log address."""
    return (address - LOG_ADDRESS) >> _OFFSET_BITS, address & ((1 << _OFFSET_BITS) - 1)
