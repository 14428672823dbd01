"""Regions (docs/regions.md): clusters, each with its own etcd, that share one global metadata store. Owns the
rules of where a topic's shards live:

  * a deployment has a fixed number of region *slots* (the global store's `region-slots`, set by its first node);
    a region holds one slot for good;
  * a topic of S × slots shards has, in slot r, the shards r·S … r·S + S − 1 — so a message's number (its
    shard) names the region that stores it, and an ack id names it too;
  * a node stores and serves only its own region's shards: another region's shards lie in that region's
    *region log* here, a log id no bundle has, which no node of this region ever owns (calls about them go to a
    gateway of that region)."""

from __future__ import annotations

from typing import NamedTuple

REGION_LOG_BASE = 1 << 20  # above every bundle's log (core.limits.bundles_max), below a log address's 21 bits


class Region(NamedTuple):
    """A node's region: its name, its slot, and how many slots the deployment has."""
    name: str
    slot: int
    slots: int

    def shards(self, count: int) -> range:
        """The shards of a topic of `count` shards that this region stores (all of them when `count` does not
        split evenly over the slots: a topic made before regions)."""
        if count % self.slots:
            return range(count)
        per = count // self.slots
        return range(self.slot * per, (self.slot + 1) * per)


def region_log(slot: int) -> int:
    """The log that stands, in another region, for the shards region `slot` stores."""
    return REGION_LOG_BASE + slot


def is_region_log(log_id: int) -> bool:
    return log_id >= REGION_LOG_BASE


def slot_of_log(log_id: int) -> int:
    return log_id - REGION_LOG_BASE


def slot_of_shard(shard: int, count: int, slots: int) -> int:
    """The slot of the region that stores shard `shard` of a topic of `count` shards."""
    return shard // (count // slots)


# A topic labelled `pigeon-copy-to: <region>` when it is made has every other region's shards copied, as they are
# stored, into that region (docs/regions.md, "Cross-region copies"): there they are *copy shards* — the same shard
# numbers and offsets, so a message's id and an ack id name the same message in both — held back from delivery
# until their region is declared lost, then served by the copy region in its place.
COPY_LABEL = "pigeon-copy-to"


def copy_region(labels) -> str | None:
    """The region a topic's shards are copied to (its `pigeon-copy-to` label), if any."""
    return labels.get(COPY_LABEL) or None


def copy_shards(region: Region | None, count: int, labels) -> frozenset[int]:
    """The shards of a topic of `count` shards that region `region` stores as copies of other regions' (none
    unless the topic is copied to it)."""
    if region is None or copy_region(labels) != region.name or count % region.slots:
        return frozenset()
    own = region.shards(count)
    return frozenset(k for k in range(count) if k not in own)


def copied_away(region: Region | None, labels) -> bool:
    """Whether region `region`'s shards of a topic are copied to another region (its messages are kept until the
    copy has them)."""
    return region is not None and copy_region(labels) not in (None, region.name)
