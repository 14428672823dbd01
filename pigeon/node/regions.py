"""A cluster node's part in a deployment of regions (docs/regions.md): its region's slot, and the gateways of the
other regions. Owns the rules:

  * a region takes a slot once, the first free one, by compare-and-swap in the global store (`regions/<name>`
    and `region-slot/<n>` together); the deployment's number of slots is fixed by its first node;
  * a node keeps its region's (name, slot, slots) in its data directory (the `region` file) and refuses to start
    under another region's name — its data is that slot's shards;
  * every node of a region is a gateway of it: `gateways/<slot>/<node id>` holds where it is dialled, under a
    lease of the global store; a node reads the others' every limits.region_gateways_s and keeps the last it read
    while the global store cannot be reached (a call about another region's shards goes to one of them);
  * the nearest of several regions is the one whose gateway answered a call soonest lately (a call no server
    serves: its answer, UNIMPLEMENTED, is one round trip on the same path the forwarded calls take, proxies and
    all), measured every limits.region_gateways_s and smoothed; one that did not answer is farthest."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import grpc

from pigeon.cluster import metadata as M
from pigeon.core import limits
from pigeon.core.regions import Region
from pigeon.node.membership import CLUSTER_ID_FILE, until_answered
from pigeon.ops import etcd_access

log = logging.getLogger("pigeon.regions")

_PING = "/pigeon.v1.Regions/Ping"  # served by nobody: the answer is UNIMPLEMENTED, after one round trip
_ANSWERED = {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
_same = lambda b: b  # noqa: E731

REGION_FILE = "region"


class RegionRefused(Exception):
    """The node must not start in this region: the sentence says why."""


def global_store(config):
    from pigeon.node.meta_etcd import EtcdMetadata

    return EtcdMetadata(etcd_access.read(config.global_etcd, config.etcd_ca, config.etcd_cert, config.etcd_key))


async def take_slot(meta, name: str, slots_wanted: int) -> Region:
    """Region `name`'s slot: the one it holds, or the first free one, taken now."""
    await meta.txn([M.absent(M.REGION_SLOTS_KEY)], [M.Put(M.REGION_SLOTS_KEY, str(slots_wanted).encode())])
    slots = int((await meta.get(M.REGION_SLOTS_KEY)).value)
    key = M.region_key(name)
    for slot in range(slots):
        if (held := await meta.get(key)) is not None:
            return Region(name, int(held.value), slots)
        await meta.txn([M.absent(key), M.absent(M.region_slot_key(slot))],
                       [M.Put(key, str(slot).encode()), M.Put(M.region_slot_key(slot), name.encode())])
    if (held := await meta.get(key)) is not None:
        return Region(name, int(held.value), slots)
    raise RegionRefused(f"the deployment's {slots} region slots are all taken (--region-slots is fixed by its first "
                        "node)")


async def resolve(config, disk, stop: asyncio.Event) -> Region | None:
    """The node's region with its slot (None when `stop` came first): from the data directory when it was
    recorded there, else from the global store (retried while it cannot be reached), then recorded."""
    path = os.path.join(config.data_dir, REGION_FILE)
    if disk.exists(path):
        name, slot, slots = disk.read_file(path).decode().split()
        if name != config.region:
            raise RegionRefused(f"the data directory {config.data_dir} holds region {name}'s data, not "
                                f"{config.region}'s")
        return Region(name, int(slot), int(slots))
    if disk.exists(os.path.join(config.data_dir, CLUSTER_ID_FILE)):
        raise RegionRefused(f"the data directory {config.data_dir} holds a cluster's data from before regions (its "
                            "topics' shards are not laid out by region slots): a region's node starts with an empty "
                            "one")
    meta = global_store(config)
    try:
        got, region = await until_answered(lambda: take_slot(meta, config.region, config.region_slots), stop,
                                           "taking the region's slot in the global store")
    finally:
        await meta.close()
    if not got:
        return None
    disk.makedirs(config.data_dir)
    disk.write_durably(path, f"{region.name} {region.slot} {region.slots}\n".encode())
    log.info("region %s holds slot %d of %d", region.name, region.slot, region.slots)
    return region


class Gateways:
    """This node as a gateway of its region, and where the other regions' gateways are."""

    def __init__(self, meta, region: Region, node_id: str, dial: str, channel):
        self.meta, self.region, self.node_id, self.dial = meta, region, node_id, dial
        self.channel = channel  # address → a gRPC channel to that node (the router's kind)
        self.known: dict[int, list[str]] = {}  # slot → its gateways' addresses, as last read
        self.held: set[int] = set()  # the slots regions hold, as last read (the others' shards hold nothing)
        self.names: dict[int, str] = {}  # slot → the name of the region that holds it
        self.round_trips: dict[int, float] = {}  # slot → seconds to reach its gateway, smoothed
        self.lost: set[int] = set()  # the slots of regions declared lost for good (their copies serve instead)
        self.changed = asyncio.Event()  # set (and replaced) whenever `known` changes
        self._task: asyncio.Task | None = None

    def holds(self, slot: int) -> bool:
        """Whether a region holds slot `slot` (a topic's shards in a slot none holds are empty everywhere)."""
        return slot in self.held

    def nearest(self, names) -> int | None:
        """The slot of the nearest of the regions `names` that has a gateway (None: none has)."""
        slots = [s for s, name in self.names.items() if name in names and self.address(s)]
        return min(slots, key=lambda s: (self.round_trips.get(s, float("inf")), s), default=None)

    def address(self, slot: int) -> str | None:
        """Where a call about region `slot`'s shards goes (None: no gateway known)."""
        got = self.known.get(slot)
        return got[0] if got else None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pigeon-region-gateways")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        lease = 0
        while True:
            try:
                if lease == 0:
                    lease = await self.meta.grant(limits.region_gateway_ttl_s)
                    await self.meta.put(M.gateway_key(self.region.slot, self.node_id), self.dial.encode(), lease)
                else:
                    await self.meta.keepalive(lease)
                await self.read()
                await self._measure()
            except M.LeaseGone:
                lease = 0
                continue
            except M.StoreUnavailable as e:
                log.info("region gateways: %s (the last read stay)", e)
            await asyncio.sleep(limits.region_gateways_s)

    async def read(self) -> None:
        """Read the regions' slots and gateways now (StoreUnavailable when the global store does not answer)."""
        slots = await self.meta.list(M.REGION_SLOT_PREFIX)
        self.names = {int(kv.key.rpartition("/")[2]): kv.value.decode() for kv in slots}
        held = set(self.names)
        known: dict[int, list[str]] = {}
        for kv in await self.meta.list(M.GATEWAYS_PREFIX):
            slot, _, _ = kv.key[len(M.GATEWAYS_PREFIX):].partition("/")
            known.setdefault(int(slot), []).append(kv.value.decode())
        lost = {int(kv.key.rpartition("/")[2]) for kv in await self.meta.list(M.REGION_LOST_PREFIX)}
        if known != self.known or held != self.held or lost != self.lost:
            self.known, self.held, self.lost = known, held, self.lost | lost  # (lost for good: never back)
            ev, self.changed = self.changed, asyncio.Event()
            ev.set()

    async def _measure(self) -> None:
        """Time a call to each other region's gateway (smoothed: 0.7 of the last figure, 0.3 of this one)."""
        for slot in sorted(self.known):
            address = self.address(slot)
            if slot == self.region.slot or not address:
                continue
            ping = self.channel(address).unary_unary(_PING, request_serializer=_same, response_deserializer=_same)
            t0 = time.monotonic()
            try:
                await ping(b"", timeout=limits.region_gateways_s)
            except grpc.aio.AioRpcError as e:
                if e.code() not in _ANSWERED:
                    self.round_trips.pop(slot, None)  # (no answer: farthest until it answers again)
                    continue
            took = time.monotonic() - t0
            last = self.round_trips.get(slot)
            self.round_trips[slot] = took if last is None else 0.7 * last + 0.3 * took


async def lose_region(meta, name: str) -> int:
    """Declare region `name` lost for good: every topic copied elsewhere is served from its copies from now on, and
    the region's own nodes must never serve again (docs/regions.md). Returns its slot."""
    got = await meta.get(M.region_key(name))
    if got is None:
        raise KeyError(name)
    slot = int(got.value)
    await meta.put(M.region_lost_key(slot), name.encode())
    return slot


async def regions_of(meta) -> dict:
    """The deployment as `pigeon cluster regions` shows it, from its global store: how many slots, and each region
    holding one with the gateways (nodes) it has now."""
    slots = await meta.get(M.REGION_SLOTS_KEY)
    gateways: dict[int, list[dict]] = {}
    for kv in await meta.list(M.GATEWAYS_PREFIX):
        slot, _, node = kv.key[len(M.GATEWAYS_PREFIX):].partition("/")
        gateways.setdefault(int(slot), []).append({"node": node, "address": kv.value.decode()})
    lost = {int(kv.key.rpartition("/")[2]) for kv in await meta.list(M.REGION_LOST_PREFIX)}
    regions = [{"region": kv.value.decode(), "slot": int(kv.key.rpartition("/")[2]),
                "gateways": gateways.get(int(kv.key.rpartition("/")[2]), []),
                "lost": int(kv.key.rpartition("/")[2]) in lost}
               for kv in await meta.list(M.REGION_SLOT_PREFIX)]
    return {"slots": int(slots.value) if slots else 0, "regions": regions}
