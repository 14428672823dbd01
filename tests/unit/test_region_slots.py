"""Regions' pure rules (pigeon.core.regions) and a region's slot in the global store (pigeon.node.regions): which
shards a region stores, which log each shard of a topic lies in as a node of a region sees it, where a publish
goes, and how slots are taken."""

from __future__ import annotations

import asyncio

import pytest

from pigeon.broker import commands
from pigeon.broker.state import BrokerState
from pigeon.core.bundles import shard_log
from pigeon.broker.resources import Topic
from pigeon.core.regions import Region, is_region_log, region_log, slot_of_log
from pigeon.node.meta_local import LocalMetadata
from pigeon.node.regions import RegionRefused, take_slot

BUNDLES = 16


def _topic(region: Region | None, shards: int, spread: bool = False, name: str = "projects/p/topics/orders"):
    state = BrokerState()
    state.region = region
    state.apply(commands.create_topic(state, Topic(name=name), shards, spread))
    return state, state.topics[name]


def test_a_region_stores_its_slots_shards():
    assert Region("east", 0, 4).shards(8) == range(0, 2)
    assert Region("west", 3, 4).shards(8) == range(6, 8)
    assert Region("west", 1, 4).shards(6) == range(0, 6)  # (not split evenly: a topic made before regions)


@pytest.mark.parametrize("spread", [False, True])
def test_other_regions_shards_lie_in_their_region_logs(spread):
    state, t = _topic(Region("west", 1, 4), 8, spread)
    logs = state.shard_logs(t, BUNDLES)
    assert t.spread and t.local == range(2, 4)
    assert [slot_of_log(log) for k, log in enumerate(logs) if k not in t.local] == [0, 0, 2, 2, 3, 3]
    assert [is_region_log(log) for log in logs] == [True, True, False, False, True, True, True, True]
    # its own shards lie in its bundles as a topic of its own shard count would: together in one, or one a shard
    assert logs[2:4] == [shard_log(t.name, k, BUNDLES, spread) for k in range(2)]
    assert state.shards_in(t, logs[2], BUNDLES) == ({2, 3} if not spread else {2})


def test_a_publish_stays_in_the_region_that_took_it():
    _, t = _topic(Region("west", 1, 4), 8)
    assert {t.shard_for("") for _ in range(10)} == {2, 3}  # keyless: the region's shards in turn
    keyed = {t.shard_for(f"key-{i}") for i in range(50)}
    assert keyed == {2, 3}
    assert all(t.shard_for("k") == t.shard_for("k") for _ in range(3))  # a key keeps its shard


def test_without_regions_nothing_changes():
    state, t = _topic(None, 4)
    assert not t.spread and t.local == range(4)
    assert state.shard_logs(t, BUNDLES) == [shard_log(t.name, k, BUNDLES, False) for k in range(4)]
    assert not any(is_region_log(log) for log in state.shard_logs(t, BUNDLES))
    assert region_log(0) > BUNDLES


def test_slots_are_taken_once_each():
    async def go():
        meta = LocalMetadata()
        east = await take_slot(meta, "east", 2)
        west = await take_slot(meta, "west", 4)  # (the first node fixed the number of slots)
        again = await take_slot(meta, "east", 2)
        with pytest.raises(RegionRefused):
            await take_slot(meta, "north", 2)
        return east, west, again

    east, west, again = asyncio.run(go())
    assert (east, west, again) == (Region("east", 0, 2), Region("west", 1, 2), Region("east", 0, 2))


def test_a_data_directory_keeps_its_region(tmp_path):
    from types import SimpleNamespace

    from pigeon.node.disk import OsDisk
    from pigeon.node.regions import resolve

    def config(region: str, name: str):
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        return SimpleNamespace(data_dir=str(d), region=region, region_slots=4, global_etcd="unused")

    (tmp_path / "west").mkdir()
    (tmp_path / "west" / "region").write_text("west 1 4\n")
    assert asyncio.run(resolve(config("west", "west"), OsDisk(), asyncio.Event())) == Region("west", 1, 4)
    with pytest.raises(RegionRefused, match="holds region west's data"):
        asyncio.run(resolve(config("north", "west"), OsDisk(), asyncio.Event()))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "cluster-id").write_text("c0ffee\n")  # a cluster node's from before regions
    with pytest.raises(RegionRefused, match="from before regions"):
        asyncio.run(resolve(config("west", "old"), OsDisk(), asyncio.Event()))
