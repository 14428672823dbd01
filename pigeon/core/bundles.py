"""Bundles: which log holds a topic's data. Owns the rule: log 0 is the metadata log; a topic (its shards and
its subscriptions' state) belongs to bundle crc32c(name) mod bundles, whose log is 1 + bundle — a stable hash, so
a topic's log is the same on every node and after every restart. A bundle is the unit a node owns and a
cluster moves (the cluster's placement assigns bundles to nodes)."""

from __future__ import annotations

import crc32c

META_LOG = 0


def bundle_of(topic_name: str, bundles: int) -> int:
    return crc32c.crc32c(topic_name.encode()) % bundles


def bundle_log(topic_name: str, bundles: int) -> int:
    return 1 + bundle_of(topic_name, bundles)


def bundle_of_log(log_id: int) -> int:
    """The bundle whose log `log_id` is (-1 for the metadata log)."""
    return log_id - 1
