"""Membership and ownership on the metadata store (docs/cluster.md, "Metadata" and "Placement"): a node joins
under a session lease it keeps alive — its `nodes/<id>` key and every `owners/<bundle>` key it holds go when the
session ends — and takes or gives up bundles by compare-and-swap. Owns the rules: one live node per node id (a
second with the same id is refused); one cluster per data directory; a bundle has at most one owner key, and a
new owner's epoch is above every earlier one's."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from dataclasses import dataclass

from pigeon.cluster import metadata as M
from pigeon.core import limits
from pigeon.cluster.placement import decode_homes, decode_moves, place
from pigeon.storage import formats

log = logging.getLogger("pigeon.membership")
_DECODED_MAX = 1024  # values kept decoded at most (then forgotten all at once): the cluster's node and owner keys
_NODES: dict[tuple[str, bytes], "NodeInfo"] = {}  # (node id, its key's value) → NodeInfo.decode's
_OWNERS: dict[bytes, tuple[str, int]] = {}  # an owner key's value → (node, epoch)

CLUSTER_ID_FILE = "cluster-id"  # in a node's data directory: the cluster it joined (ClusterNode)


class NodeIdTaken(Exception):
    pass


class OtherCluster(Exception):
    pass


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    zone: str = ""
    draining: bool = False
    home: str = ""  # the id of the node's data directory: the same on a restart, different on any other node
    listening: bool = True  # its server answers (storage included): ensembles are chosen among such nodes
    peer: str = ""  # its peer port's address, when it has one: node-to-node calls go there
    cut_off: bool = False  # it reaches too few peers to replicate: it owns nothing and stores nothing new until then
    append: str = ""  # its append channel's address (pigeon.node.append_channel), when it has one
    machine: str = ""  # the machine it shares with other nodes (the workers of `--workers N`): "" for its own
    format: int = 1  # the newest cluster format it speaks (storage.formats.CLUSTER; 1 from nodes before formats)
    version: str = ""  # the Pigeon release it runs, for operators ("" from nodes before versions)

    @property
    def dial(self) -> str:
        """Where another node calls it: its peer port, else the address its clients use."""
        return self.peer or self.address

    def encode(self) -> bytes:
        d = {"address": self.address, "zone": self.zone, "draining": self.draining, "home": self.home,
             "listening": self.listening}
        if self.peer:
            d["peer"] = self.peer
        if self.cut_off:
            d["cut_off"] = True
        if self.append:
            d["append"] = self.append
        if self.machine:
            d["machine"] = self.machine
        d["format"], d["version"] = self.format, self.version
        return json.dumps(d).encode()

    @staticmethod
    def decode(node_id: str, raw: bytes) -> "NodeInfo":
        """(Frozen: the one decoded from a value is handed out again — the nodes' keys are read on every placement
        pass and change seldom.)"""
        key = (node_id, raw) if type(raw) is bytes else None
        info = _NODES.get(key) if key is not None else None
        if info is None:
            d = json.loads(raw)
            info = NodeInfo(node_id, d["address"], d.get("zone", ""), d.get("draining", False), d.get("home", ""),
                            d.get("listening", True), d.get("peer", ""), d.get("cut_off", False), d.get("append", ""),
                            d.get("machine", ""), d.get("format", 1), d.get("version", ""))
            if key is not None:
                if len(_NODES) >= _DECODED_MAX:
                    _NODES.clear()
                _NODES[key] = info
        return info


async def cluster_id(meta, data_dir_id: str | None) -> str:
    """The cluster's id: created by the first node, compared by every other. `data_dir_id`: the id recorded in
    this node's data directory (None for a fresh one). Raises OtherCluster when they differ."""
    proposed = data_dir_id or uuid.uuid4().hex
    await meta.txn([M.absent(M.CLUSTER_ID_KEY)], [M.Put(M.CLUSTER_ID_KEY, proposed.encode())])
    actual = (await meta.get(M.CLUSTER_ID_KEY)).value.decode()
    if data_dir_id is not None and actual != data_dir_id:
        raise OtherCluster(f"this data directory belongs to cluster {data_dir_id}, but etcd holds cluster {actual}: "
                           "start the node with an empty data directory or point it at its own cluster's etcd")
    return actual


class MetaView:
    """The nodes, drain marks and owner keys as a watch of the metadata store keeps them (an informer): placement
    and routing read them here instead of listing them from etcd a few times a second on every node. Correctness
    never rests on it — every change of ownership is a compare-and-swap — only how soon a node notices.

    Loaded by listing each prefix once between two reads of the store's revision: the watch starts at the first
    (it misses no change), and the view is live — believed — once the watch has applied a change at or after the
    second (at once when the two are equal). Until then it may lack a change made while it listed, or hold a key
    deleted before its prefix was listed; from then on it is what the store held. (Lists demanded at one revision
    are seldom had on a busy store, where every ledger list, owner key or session written moves it.) The watch
    reports again changes the lists hold: one no newer than what the view holds for its key is skipped. Not live
    from the moment the watch breaks; while not live, readers list from the store itself, and so learn at once
    when it cannot be reached."""

    PREFIXES = (M.node_key(""), M.drain_key(""), M.owner_key(0)[:-5], M.PLACEMENT_KEY, M.HOMES_KEY)

    def __init__(self):
        self.kvs: dict[str, dict[str, M.KV]] = {p: {} for p in self.PREFIXES}
        self.live = False
        self._exact_at = 0  # the view holds the store as it is once the watch has applied this revision
        self._decoded: dict[str, object] = {}  # prefix → what `read` made of its keys, until one changes

    async def load(self, meta) -> int:
        """List the prefixes afresh; the revision read before them (a watch from there misses nothing)."""
        self.live = False
        rev = await meta.revision()
        lists = [await meta.list(p) for p in self.PREFIXES]
        self._exact_at = await meta.revision()
        self.kvs = {p: {kv.key: kv for kv in kvs} for p, kvs in zip(self.PREFIXES, lists)}
        self._decoded.clear()
        self.live = self._exact_at == rev
        return rev

    async def follow(self, meta, prefix: str):
        """Load the view, then keep it by a watch of `prefix` (which covers the view's prefixes, and the keys whose
        changes move the revision, or the view goes live only at a change under `prefix`): every change under
        `prefix` is applied and then yielded. Not live from the moment the watch breaks."""
        rev = await self.load(meta)
        try:
            async for ev in meta.watch(prefix, rev):
                self.apply(ev)
                yield ev
        finally:
            self.live = False

    def apply(self, ev: M.Event) -> None:
        """Take a change the watch reported, unless the view holds its key at that revision or a later one: the
        lists, taken after the watch's start, may show it or a later change already (a delete's event carries the
        revision of the delete)."""
        kv = ev.kv
        for p in self.PREFIXES:
            if kv.key.startswith(p):
                keys = self.kvs[p]
                held = keys.get(kv.key)
                if held is None or held.mod_revision < kv.mod_revision:
                    if ev.kind == "put":
                        keys[kv.key] = kv
                    else:
                        keys.pop(kv.key, None)
                    self._decoded.pop(p, None)
                break
        if kv.mod_revision >= self._exact_at:
            self.live = True

    def read(self, prefix: str, decode):
        """`decode(kvs)` of the keys under `prefix`, made again only once one of them changed: placement and
        routing read the nodes and owners many times between two changes."""
        got = self._decoded.get(prefix)
        if got is None:
            got = self._decoded[prefix] = decode(self.kvs[prefix].values())
        return got


class Membership:
    def __init__(self, meta, info: NodeInfo, session_ttl_s: int = 10):
        self.meta, self.info, self.ttl = meta, info, session_ttl_s
        self.lease = 0
        self.owned: dict[int, int] = {}  # bundle → the epoch this node holds it under
        self.lost = asyncio.Event()  # the session ended under us: everything owned must be given up
        self.view = MetaView()  # kept by the node's watch (ClusterNode): not live, every read lists from etcd
        self.answering = True  # the last keepalive was answered: the view is believed only while it is
        self._keeper: asyncio.Task | None = None

    async def join(self) -> None:
        """Register under a new session; NodeIdTaken when a live node has this id. A session of this node's
        earlier life (the same data directory, which one process at a time holds) is ended first: a node killed
        and restarted at once does not wait for its old session to run out, and its bundles move at once."""
        self.lease = await self.meta.grant(self.ttl)
        key = M.node_key(self.info.node_id)
        for _ in range(3):  # the key may go between the tries (a peer ended that session too): try again
            ok, _ = await self.meta.txn([M.absent(key)], [M.Put(key, self.info.encode(), self.lease)])
            if ok:
                break
            other = await self.meta.get(key)
            if other is None:
                continue
            if other.lease == self.lease:  # this session's already: `_say` wrote it meanwhile (`listening`)
                break
            if not self.info.home or NodeInfo.decode(self.info.node_id, other.value).home != self.info.home:
                await self.meta.revoke(self.lease)
                where = NodeInfo.decode(self.info.node_id, other.value).address
                raise NodeIdTaken(f"node id {self.info.node_id} is in use by a live node at {where}; if that node "
                                  f"is gone, its session ends within {self.ttl} s")
            log.info("node %s restarts: ending the session of its earlier life", self.info.node_id)
            await self.meta.revoke(other.lease)
        else:
            await self.meta.revoke(self.lease)
            raise NodeIdTaken(f"node id {self.info.node_id} could not be registered: its key changed at every try")
        if self._keeper is not None:  # (it kept the session that ended)
            self._keeper.cancel()
        self._keeper = asyncio.create_task(self._keep())

    async def listening(self) -> None:
        """Say the node's server answers now (it joins before it listens: nothing is served before joining)."""
        self.info = dataclasses.replace(self.info, listening=True)
        await self._say()

    async def say_cut_off(self, cut_off: bool) -> None:
        """Say the node reaches too few of its peers to replicate (placement then gives it no bundle and new
        ensembles leave it out), or that it reaches them again."""
        self.info = dataclasses.replace(self.info, cut_off=cut_off)
        await self._say()

    async def _say(self) -> None:
        """Write `info` to the node's key under its session. A session that ended (etcd was out of reach past its
        time to live — while the node started, say) took the key with it: that is no error of the caller's. The
        keeper finds the session ended too, and the rejoin registers `info`, which says this already."""
        try:
            await self.meta.put(M.node_key(self.info.node_id), self.info.encode(), self.lease)
        except M.LeaseGone:
            log.warning("node %s: its session ended before etcd took its record (listening %s, cut off %s); the "
                        "next session's key says it", self.info.node_id, self.info.listening, self.info.cut_off)

    async def _keep(self) -> None:
        if hasattr(self.meta, "session_keeper"):  # etcd: a thread of its own renews the session (node.meta_etcd)
            return await self._keep_on_thread()
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.meta.keepalive(self.lease)
                self._kept("ok")
            except M.LeaseGone:
                return self._kept("gone")
            except M.StoreUnavailable as e:  # owners keep serving through an outage (fencing keeps data safe)
                self._kept("unavailable", str(e))

    async def _keep_on_thread(self) -> None:
        """Renewals every quarter of the time to live from a thread, which a slow event loop does not hold up; the
        loop says it runs every limits.session_beat_s (the thread lets the session end after
        limits.session_stall_s without)."""
        loop, said = asyncio.get_running_loop(), asyncio.Queue()
        beat = time.monotonic()
        def report(what: str) -> None:  # (on the keeper's thread)
            try:
                loop.call_soon_threadsafe(said.put_nowait, what)
            except RuntimeError:  # the loop has closed: the node is gone
                keeper.stop()

        keeper = self.meta.session_keeper(self.lease, self.ttl / 4, lambda: beat, limits.session_stall_s,
                                          report).start()
        try:
            while True:
                try:
                    what = await asyncio.wait_for(said.get(), limits.session_beat_s)
                except TimeoutError:
                    what = None
                beat = time.monotonic()
                if what is not None and self._kept(what, "etcd did not answer") == "gone":
                    return
        finally:
            keeper.stop()

    def _kept(self, what: str, why: str = "") -> str:
        """A renewal's outcome: "ok", "gone" (the session ended: its bundles are given up) or "unavailable"."""
        if what == "ok":
            if not self.answering:
                log.info("the session of node %s is kept alive again", self.info.node_id)
            self.answering = True
        elif what == "gone":
            log.error("the session of node %s ended: giving up its %d bundles", self.info.node_id, len(self.owned))
            self.owned.clear()
            self.lost.set()
        else:
            if self.answering:  # (said once an outage: renewals are tried every half second through it)
                log.warning("cannot keep the session alive: %s", why)
            self.answering = False  # (a watch over a cut link may say nothing for a long time)
        return what

    async def leave(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None
        if self.lease:
            await self.meta.revoke(self.lease)
            self.lease = 0
        self.owned.clear()

    async def _read(self, prefix: str, decode):
        """What `decode` makes of the keys under `prefix`: from the view while it is live (and the store answers
        this node), else from a list of the store. A copy: the caller may change it."""
        if self.view.live and self.answering:
            return self.view.read(prefix, decode).copy()
        return decode(await self.meta.list(prefix))

    async def members(self) -> dict[str, NodeInfo]:
        return await self._read(M.node_key(""), _members)

    async def draining(self) -> set[str]:
        return await self._read(M.drain_key(""), _drained)

    async def placeable(self, members: dict[str, NodeInfo] | None = None) -> list[str]:
        """The nodes placement gives bundles to: live ones that listen (a node still starting gets none: nobody
        could reach it for them, and its peers cannot tell it died — a refused connection proves nothing before it
        listened, so its bundles would wait for its session to run out) and are neither draining nor cut off from
        their peers."""
        drained = await self.draining()
        members = await self.members() if members is None else members
        return sorted(n for n, i in members.items()
                      if i.listening and not i.draining and not i.cut_off and n not in drained)

    async def moves(self) -> dict[int, str]:
        """The placement planner's moves (cluster.placement.place), as the `placement` key holds them."""
        return await self._read(M.PLACEMENT_KEY, _moves)

    async def homes(self) -> dict[str, dict[int, int]]:
        """The bundle each (topic, shard) pair named under the `homes` key should be in (node.handover)."""
        return await self._read(M.HOMES_KEY, _homes)

    async def placement(self, bundles: int, members: dict[str, NodeInfo] | None = None) -> dict[int, str]:
        """Who should own each bundle: the hash over the placeable nodes with the planner's moves laid over it
        (every node computes the same)."""
        live = await self.placeable(members)
        return place(bundles, live, await self.moves()) if live else {}

    async def owners(self) -> dict[int, tuple[str, int]]:
        """bundle → (owner node, epoch) for every bundle that has an owner."""
        return await self._read(M.owner_key(0)[:-5], _owners)

    # --- ownership -----------------------------------------------------------------------------------------
    async def claim(self, bundle: int) -> int | None:
        """Take `bundle` if nobody holds it: its new ownership epoch, or None when another node holds it."""
        key, ekey = M.owner_key(bundle), M.epoch_key(bundle)
        if await self.meta.get(key) is not None:
            return None
        last = await self.meta.get(ekey)  # the epoch key outlives owners: epochs only go up
        epoch = (int(last.value) if last else 0) + 1
        value = json.dumps({"node": self.info.node_id, "epoch": epoch}).encode()
        ok, _ = await self.meta.txn([M.absent(key), M.unchanged_since(last) if last else M.absent(ekey)],
                                    [M.Put(key, value, self.lease), M.Put(ekey, str(epoch).encode())])
        if not ok:
            return None
        self.owned[bundle] = epoch
        return epoch

    async def release(self, bundle: int, epoch: int | None = None) -> bool:
        """Give `bundle` up (after its log was closed): delete the owner key if it is still this node's (under
        `epoch`: the one it holds the bundle under, by default)."""
        held = self.owned.pop(bundle, None)
        epoch = held if epoch is None else epoch
        if epoch is None:
            return False
        value = json.dumps({"node": self.info.node_id, "epoch": epoch}).encode()
        ok, _ = await self.meta.txn([M.holds(M.owner_key(bundle), value)], [M.Delete(M.owner_key(bundle))])
        return ok

    async def owner(self, bundle: int) -> tuple[str, int] | None:
        kv = await self.meta.get(M.owner_key(bundle))
        if kv is None:
            return None
        d = json.loads(kv.value)
        return d["node"], d["epoch"]


def _homes(kvs) -> dict[str, dict[int, int]]:
    return decode_homes(next((kv.value for kv in kvs if kv.key == M.HOMES_KEY), None))


def _moves(kvs) -> dict[int, str]:
    return decode_moves(next((kv.value for kv in kvs if kv.key == M.PLACEMENT_KEY), None))


def _members(kvs) -> dict[str, NodeInfo]:
    n = len(M.node_key(""))
    return {kv.key[n:]: NodeInfo.decode(kv.key[n:], kv.value) for kv in kvs}


def _drained(kvs) -> set[str]:
    n = len(M.drain_key(""))
    return {kv.key[n:] for kv in kvs}


def _owners(kvs) -> dict[int, tuple[str, int]]:
    n = len(M.owner_key(0)) - 5
    return {int(kv.key[n:]): _owner(kv.value) for kv in kvs}


def _owner(raw: bytes) -> tuple[str, int]:
    """(node, epoch) of an owner key's value (kept per value, as NodeInfo.decode's)."""
    got = _OWNERS.get(raw) if type(raw) is bytes else None
    if got is None:
        d = json.loads(raw)
        got = (d["node"], d["epoch"])
        if type(raw) is bytes:
            if len(_OWNERS) >= _DECODED_MAX:
                _OWNERS.clear()
            _OWNERS[raw] = got
    return got


async def status_of(meta) -> dict:
    """The cluster as `pigeon cluster status` shows it: its id, bundle count, bundles without an owner, each
    node (up, draining, or down while it still holds owner keys) with how many bundles it owns and the CPU it
    reported last (node.bundle_load), who owns each bundle, the placement planner's moves, the shards asked to
    move to other bundles (`pigeon cluster move-shard`), and the ledgers: how many, how many open, how many
    under-replicated (a member down, or fewer members
    than the widest ensemble: opened while nodes were down; repair that copies them is not built yet)."""
    members = Membership(meta, NodeInfo("-", "-"))
    nodes, drained, owners = await members.members(), await members.draining(), await members.owners()
    bundles_kv = await meta.get(M.BUNDLES_KEY)
    cid = await meta.get(M.CLUSTER_ID_KEY)
    bundles = int(bundles_kv.value) if bundles_kv else 0
    held: dict[str, list[int]] = {}
    for b, (node, _) in owners.items():
        held.setdefault(node, []).append(b)
    from pigeon.node.bundle_load import read_report

    cores = {kv.key[len(M.LOAD_PREFIX):]: read_report(kv.value)[0] for kv in await meta.list(M.LOAD_PREFIX)}
    ledgers = [lg for kv in await meta.list(M.ledgers_key(0)[:-5]) for lg in json.loads(kv.value)]
    widest = max((len(lg["members"]) for lg in ledgers), default=0)
    under = [lg for lg in ledgers if len(lg["members"]) < widest or any(m not in nodes for m in lg["members"])]
    rows = []
    for node in sorted(set(nodes) | drained | set(held)):
        info = nodes.get(node)
        state = "down" if info is None else "draining" if node in drained else "cut off" if info.cut_off else "up"
        rows.append({"node": node, "address": info.address if info else "", "zone": info.zone if info else "",
                     "machine": info.machine if info else "", "state": state, "bundles": len(held.get(node, [])),
                     "version": info.version if info else "", "format": info.format if info else None,
                     "cores": round(cores[node], 3) if node in cores else None})
    return {"cluster": cid.value.decode() if cid else "", "bundles": bundles,
            "format": formats.cluster_format([i.format for i in nodes.values()]),
            "unowned": bundles - len(owners), "nodes": rows,
            "owners": {str(b): node for b, (node, _) in sorted(owners.items())},
            "moves": {str(b): node for b, node in sorted((await members.moves()).items())},
            "homes": {t: {str(k): b for k, b in sorted(s.items())} for t, s in sorted((await members.homes()).items())},
            "ledgers": {"total": len(ledgers), "open": sum(1 for lg in ledgers if lg["end"] is None),
                        "under_replicated": len(under),
                        "under_replicated_first": [{"id": lg["id"], "members": sorted(lg["members"]),
                                                    "entries": (lg["end"] - lg["first"]) if lg["end"] is not None
                                                    else None} for lg in under[:10]]}}


async def until_answered(attempt, stop: asyncio.Event, what: str) -> tuple[bool, object]:
    """`await attempt()` again, at pauses growing to limits.etcd_retry_s_max, while it raises StoreUnavailable (each
    logged, saying `what` it was doing): (True, its result), or (False, None) once `stop` came first."""
    delay = 0.25
    while True:
        try:
            return True, await attempt()
        except M.StoreUnavailable as e:
            log.warning("%s; trying again in %.1f s (%s)", e, delay, what)
        try:
            await asyncio.wait_for(stop.wait(), delay)
            return False, None
        except asyncio.TimeoutError:
            delay = min(limits.etcd_retry_s_max, delay * 2)
