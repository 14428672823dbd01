"""A node's part in its cluster (docs/cluster.md): joining, the storage role, and keeping the bundles it owns in
line with placement. Owns the rules of a node's life in the cluster:

  * nothing is served before the node has joined: an unreachable etcd is tried again (a log line each time,
    at most limits.etcd_retry_s_max apart) until it answers or the node is stopped;
  * a data directory belongs to one cluster (its id is written there on the first join and compared at every
    start), and a cluster has one bundle count (fixed by the first node);
  * a second live node with the same id is refused (membership), and a node whose session ended joins again
    under a new one, giving up what it owned;
  * ownership follows placement: a node takes the free bundles placement gives it and gives up (releases) the
    ones placement gives another node, so a join, a leave or a drain moves about one node's share; while etcd
    is unreachable a node keeps what it owns (fencing keeps data safe, not the lease's timing);
  * a node that reaches etcd but too few of its peers to replicate (every peer failed its writes lately, and
    fewer than Qa − 1 answer a call now) steps down: it says so in its node key, gives its bundles up at once
    (their callers get UNAVAILABLE, the next owners fence and recover), and owns and stores nothing new until
    enough peers answer it again — rather than hold its bundles, unable to acknowledge anything, for as long as
    the cut lasts."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid

from pigeon.cluster import metadata as M
from pigeon.core import limits
from pigeon.cluster.quorum import Replication
from pigeon.node.balancer import Balancer
from pigeon.node.bundle_logs import BundleLogs
from pigeon.node.handover import HandOvers
from pigeon.node import append_channel
from pigeon.node.ledger_store import LedgerStore
from pigeon.node.ledger_upkeep import LedgerUpkeep
from pigeon.core.bundles import bundle_of_log
from pigeon.core.regions import is_region_log, slot_of_log
from pigeon.node import regions
from pigeon.node.meta_log import Diverged, MetaLog
from pigeon.node.membership import (CLUSTER_ID_FILE, Membership, NodeIdTaken, NodeInfo, OtherCluster, cluster_id,
                                    until_answered)
from pigeon.node.meta_etcd import EtcdMetadata
from pigeon.ops import etcd_access, tls
from pigeon.ops.config import Config
from pigeon.storage import formats
from pigeon.version import __version__

log = logging.getLogger("pigeon.cluster")

__all__ = ["ClusterNode", "JoinRefused"]

HOME_FILE = "home-id"


class JoinRefused(Exception):
    """The node must not start: the sentence says why and what to do."""


class ClusterNode:
    def __init__(self, config: Config, engine, meta=None):
        self.config, self.engine = config, engine
        self.host = engine.host
        self.meta = meta or EtcdMetadata(etcd_access.read(config.etcd, config.etcd_ca, config.etcd_cert,
                                                          config.etcd_key))
        self._append_sock = append_channel.listen(config.peer_listen_host, max(config.append_port, 0)) \
            if config.append_channel else None  # bound now: its port goes into the membership record
        self._append_server = None
        appends_at = "" if self._append_sock is None else \
            f"{(config.peer_address or config.address).rpartition(':')[0]}:{self._append_sock.getsockname()[1]}"
        self.info = NodeInfo(config.node_id, config.address, config.zone, home=_home(self.host.disk, config.data_dir),
                             listening=False, peer=config.peer_address, append=appends_at, machine=config.machine,
                             format=formats.CLUSTER, version=__version__)
        self.membership = Membership(self.meta, self.info, config.session_ttl_s)
        self.store = LedgerStore(config.data_dir, config.fsync, node=engine.journal,  # it borrows the owner's copies
                                 host=self.host)
        engine.borrowed_from(self.store.journal_floor)
        self.cluster_id = ""
        # in a deployment of regions the metadata log is the global store's, which every region follows
        self.global_meta = regions.global_store(config) if config.region else None
        self.gateways = regions.Gateways(self.global_meta, engine.region, config.node_id, self.info.dial,
                                         self._peer_channel) if config.region else None
        self._peer_channels: dict[str, object] = {}
        self.meta_log = MetaLog(self.global_meta or self.meta, engine)
        self.logs = BundleLogs(self, Replication(config.replicas, config.replicas, config.ack_quorum))
        self.store.unsent_from = self.logs.unsent_from
        self.upkeep = LedgerUpkeep(self.logs)
        self.handovers = HandOvers(self)  # (topic, shard) pairs handed between bundle logs (docs/cluster.md 4.3)
        self.routes: dict[int, str] = {}  # bundle → where its owner is dialled (NodeInfo.dial), as last read
        self._routes_event = asyncio.Event()  # set (and replaced) whenever `routes` changes
        self._routes_stale = asyncio.Event()  # an owner or a node changed: read the routes again
        self.etcd_down = False  # the last placement pass could not reach etcd
        self.changed = asyncio.Event()  # something placement depends on may have changed
        self.node_changes = 0  # node keys changed (a node came, went, or changed its address) — or may have
        self._tasks: list[asyncio.Task] = []
        self._taking: set[int] = set()  # bundles claimed whose takeover runs
        self._checking: set[str] = set()  # peers being checked (check_peer)
        self.balancer: Balancer | None = None  # placement by load (node.balancer), once joined, unless turned off

    @property
    def owned(self) -> dict[int, int]:
        """bundle → ownership epoch, for the bundles this node holds now."""
        return self.membership.owned

    def routes_changed(self) -> asyncio.Event:
        """An event set the next time the routes change (wait on it, then read them again)."""
        return self._routes_event

    def _routes_moved(self, before: dict[int, str]) -> None:
        if self.routes != before:
            ev, self._routes_event = self._routes_event, asyncio.Event()
            ev.set()

    def address_of(self, log_id: int) -> str | None:
        """Where the node that owns the bundle of `log_id` is dialled (its peer port, if it has one), as last read;
        None when it has no owner. (Another region's log: where one of its gateways is.)"""
        if is_region_log(log_id):
            return self.gateways.address(slot_of_log(log_id)) if self.gateways is not None else None
        return self.routes.get(bundle_of_log(log_id))

    def _peer_channel(self, address: str):
        ch = self._peer_channels.get(address)
        if ch is None:
            ch = self._peer_channels[address] = tls.peer_channel(self.config, address, [])
        return ch

    def region_held(self, log_id: int) -> bool:
        """Whether a region holds the slot of region log `log_id` (core.regions) — else its shards are empty."""
        return self.gateways is not None and self.gateways.holds(slot_of_log(log_id))

    # --- joining -------------------------------------------------------------------------------------------
    async def join(self, stop: asyncio.Event) -> bool:
        """Join the cluster, retrying while etcd cannot be reached; False when `stop` came first. Raises
        JoinRefused when this node must not start."""
        if not (await until_answered(self._join_once, stop, "this node serves nothing until it has joined"))[0]:
            return False
        try:  # (etcd may go again right after the session was granted)
            if not (await until_answered(self._follow_metadata, stop, "reading the metadata log"))[0]:
                return False
        except Diverged as e:
            await self.membership.leave()
            raise JoinRefused(str(e)) from None
        self.engine.join_cluster(self.meta_log, self.logs.serving, self.logs)  # owns: taken over, a ledger open
        self.engine.forget_logs_not_owned()
        await self.store.open()
        if self._append_sock is not None:
            tls_context = tls.append_server_context(self.config)
            self._append_server = await append_channel.serve(self._append_sock, self.store, tls_context)
            log.info("appends from peers on %s (the append channel%s)", self.info.append,
                     ", mutual TLS" if tls_context else "")
        self._routes_stale.set()
        self._tasks = [asyncio.create_task(self._watch(), name="pigeon-cluster-watch"),
                       asyncio.create_task(self._follow_routes(), name="pigeon-cluster-routes"),
                       asyncio.create_task(self._follow_placement(), name="pigeon-cluster-placement"),
                       asyncio.create_task(self._compact_history(), name="pigeon-etcd-compaction")]
        if self.gateways is not None:
            self.gateways.start()
        if self.config.load_balance_s:
            self.balancer = Balancer(self, self.host.cpu_time, self.engine.journal.journal)
            self._tasks.append(asyncio.create_task(self.balancer.run(), name="pigeon-load-balance"))
        log.info("node %s joined cluster %s at %s (zone %s)", self.info.node_id, self.cluster_id, self.info.address,
                 self.info.zone or "-")
        return True

    async def _follow_metadata(self) -> None:
        await self.meta_log.start()
        if self.gateways is not None:  # (before it serves: which regions hold which shards)
            await self.gateways.read()

    async def _compact_history(self) -> None:
        """etcd keeps every revision of every key until told to forget (each roll, cut and owner change is one): every
        limits.etcd_compact_s compact to the revision seen one period before, as Kubernetes' API server does — a
        watch that far behind is refused and lists again. Every node does it; compacting twice is no error."""
        stores = [self.meta] + ([self.global_meta] if self.global_meta is not None else [])
        seen: list[int | None] = [None] * len(stores)
        while True:
            await asyncio.sleep(limits.etcd_compact_s)
            for i, store in enumerate(stores):
                try:
                    now = await store.revision()
                    if seen[i] is not None:
                        await store.compact(seen[i])
                    seen[i] = now
                except M.StoreUnavailable as e:
                    log.info("compacting etcd's history: %s", e)

    async def _join_once(self) -> None:
        disk = self.host.disk
        path = os.path.join(self.config.data_dir, CLUSTER_ID_FILE)
        recorded = None
        if disk.exists(path):
            recorded = disk.read_file(path).decode().strip() or None
        if recorded is None and self.meta_log.end() > 0:
            raise JoinRefused(f"the data directory {self.config.data_dir} holds a single node's data "
                              f"({self.meta_log.end()} metadata records): a cluster node starts with an empty one")
        try:
            self.cluster_id = await cluster_id(self.meta, recorded)
        except OtherCluster as e:
            raise JoinRefused(str(e)) from None
        await self._same_bundles()
        if recorded is None:
            disk.write_durably(path, (self.cluster_id + "\n").encode())
        try:
            await self.membership.join()
        except NodeIdTaken as e:
            raise JoinRefused(str(e)) from None

    async def _same_bundles(self) -> None:
        mine = str(self.config.bundles).encode()
        await self.meta.txn([M.absent(M.BUNDLES_KEY)], [M.Put(M.BUNDLES_KEY, mine)])
        theirs = (await self.meta.get(M.BUNDLES_KEY)).value
        if theirs != mine:
            raise JoinRefused(f"cluster {self.cluster_id} has {theirs.decode()} bundles and this node is set to "
                              f"{self.config.bundles}: start it with --bundles {theirs.decode()} (or none)")

    def check_peer(self, node_id: str) -> None:
        """A peer failed a write: if it refuses connections at the address its live session announces, its
        process is gone — end that session now rather than wait for it to run out, so its bundles move at once.
        (A refused connection is a clear answer; a timeout is not, and is left to the session.)"""
        if node_id != self.info.node_id and node_id not in self._checking:
            self._checking.add(node_id)
            task = asyncio.get_running_loop().create_task(self._check_peer(node_id))
            task.add_done_callback(lambda _t: self._checking.discard(node_id))

    async def _check_peer(self, node_id: str) -> None:
        try:
            kv = await self.meta.get(M.node_key(node_id))
            if kv is None:
                return
            info = NodeInfo.decode(node_id, kv.value)
            if not info.listening:
                return  # it is starting: it may not listen yet
            for _ in range(limits.peer_refusals):
                if not await self.host.refuses(info.dial, limits.peer_connect_s):
                    return  # it answers (or tells nothing)
                await asyncio.sleep(limits.peer_refusal_interval_s)
            now = await self.meta.get(M.node_key(node_id))
            if now is not None and now.lease == kv.lease:
                log.warning("node %s refuses connections at %s: its process is gone; ending its session",
                            node_id, info.dial)
                await self.meta.revoke(kv.lease)
        except (OSError, asyncio.TimeoutError, M.StoreUnavailable, ValueError) as e:
            log.debug("checking node %s: %s", node_id, e)

    async def listening(self) -> None:
        """The server answers: bundles may now be given to this node and ledgers placed on its storage. Said
        again until etcd took it (a rejoin says it too)."""
        try:
            await self.membership.listening()
        except M.StoreUnavailable as e:
            log.warning("could not say this node listens (%s); its bundles and ledgers wait until etcd answers", e)
            self._tasks.append(asyncio.get_running_loop().create_task(self._say_listening(), name="pigeon-listening"))

    async def _say_listening(self) -> None:
        while True:
            await asyncio.sleep(limits.ledger_retry_s)
            try:
                await self.membership.listening()
                return
            except M.StoreUnavailable:
                continue

    async def leave(self) -> None:
        self.engine.leave_cluster()
        await self.meta_log.stop()
        if self.gateways is not None:
            await self.gateways.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.handovers.close()
        try:
            await self.membership.leave()  # its owner keys go with its session: the others take them at once
        except M.StoreUnavailable as e:
            log.warning("could not leave cleanly (%s): the session ends by itself within %d s", e,
                        self.config.session_ttl_s)
        self.upkeep.close()
        await self.logs.close()
        if self._append_server is not None:
            self._append_server.close()
        elif self._append_sock is not None:
            self._append_sock.close()
        await self.store.close()
        await self.meta.close()
        if self.global_meta is not None:
            await self.global_meta.close()
        for ch in self._peer_channels.values():
            await ch.close()

    # --- ownership follows placement -----------------------------------------------------------------------
    async def _watch(self) -> None:
        """Wake the placement loop whenever a node, a drain mark or an owner changes, and the routes' reader when
        an owner or a node does."""
        routing = (M.owner_key(0)[:-5], M.node_key(""))
        placing = routing + (M.drain_key(""), M.PLACEMENT_KEY, M.HOMES_KEY)  # (not ledger lists, the metadata log, loads: they
        view = self.membership.view               # change often under load, and placement reads none); the view of
        while True:                               # nodes and owners that placement and routing read is kept here
            try:
                self.changed.set()
                self._routes_stale.set()
                self.node_changes += 1  # (what happened while the watch was down is not known)
                async for ev in view.follow(self.meta, M.ROOT + "/"):
                    key = ev.kv.key
                    if key.startswith(placing):
                        self.changed.set()
                        if key.startswith(routing):
                            self._routes_stale.set()
                        if key.startswith(routing[1]):
                            self.node_changes += 1
                            if ev.kind != "put":  # a session ended: its member fails in this node's open
                                self.logs.members_ended()  # ledgers now, not after a placement pass's takeovers
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise
                log.debug("watch cancelled under this node; watching again")
                await asyncio.sleep(limits.placement_check_s)
            except Exception as e:  # noqa: BLE001 — the periodic check covers the gap; watch again shortly
                log.debug("watch ended (%s); watching again", e)
                await asyncio.sleep(limits.placement_check_s)

    async def _follow_routes(self) -> None:
        """Keep `routes` to the owner keys as they change, apart from the placement loop: a pass of that loop can
        take seconds (bundles given up wait for their records in flight, takeovers read logs back), and a router
        that read its routes at the pass's start kept forwarding calls to a node that had died meanwhile — every
        publish to its bundles refused through this node until the pass ended."""
        while True:
            await self._routes_stale.wait()
            self._routes_stale.clear()
            try:
                await self.read_routes()
            except M.StoreUnavailable:
                self._routes_stale.set()  # read again once etcd answers
                await asyncio.sleep(limits.placement_check_s)
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise
                self._routes_stale.set()
            except Exception:  # noqa: BLE001 — the next change (or placement pass) reads them again
                log.exception("reading the routes failed")
                await asyncio.sleep(limits.placement_check_s)

    async def read_routes(self) -> None:
        """Read where each bundle's owner is dialled (the owner keys, the nodes' records)."""
        members = await self.membership.members()
        owners = await self.membership.owners()
        before = self.routes
        self.routes = {b: members[n].dial for b, (n, _) in owners.items() if n in members}
        self._routes_moved(before)

    def ready(self) -> tuple[bool, str]:
        """Serving as a member: joined under a live session, with etcd answering."""
        if self.membership.lost.is_set():
            return False, "this node's cluster session ended; it is joining again"
        if self.etcd_down:
            return False, "etcd cannot be reached (bundles owned are still served)"
        return True, ""

    async def _follow_placement(self) -> None:
        unavailable = False
        while True:
            tick = asyncio.get_running_loop().call_later(limits.placement_check_s, self.changed.set)
            await self.changed.wait()  # (a change, or the periodic check: cheaper than wait_for's task a pass)
            tick.cancel()
            self.changed.clear()
            try:
                if self.membership.lost.is_set():
                    await self._rejoin()
                await self.rebalance(await self._check_cut_off())
                self.logs.members_ended()
                self.handovers.follow(await self.membership.homes())
                if unavailable:
                    log.info("etcd answers again")
                unavailable = self.etcd_down = False
            except M.StoreUnavailable as e:
                if not unavailable:
                    log.warning("%s: keeping the %d bundles this node owns until it answers", e, len(self.owned))
                unavailable = self.etcd_down = True
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise
                log.exception("following placement: a call was cancelled under it; trying again")
            except Exception:
                log.exception("following placement failed; trying again")

    async def _check_cut_off(self) -> dict | None:
        """Step down when cut off from the peers; come back once enough of them answer (the module's rules). The
        members it read when it neither changed nor waited for anything (placement goes on from them: one read of
        etcd a pass), else None."""
        needed = self.logs.replication.ack_quorum - 1  # peers a quorum needs besides this node
        members = await self.membership.members()
        me = self.info.node_id
        peers = {n: i for n, i in members.items() if n != me and i.listening and not i.cut_off}
        if not self.membership.info.cut_off:
            if needed <= 0 or not self.owned or len(peers) < needed:
                return members
            # every peer failed a write lately — or none answered anything lately (an owner with nothing to write
            # hears nothing, and must ask: else it would hold its bundles through a cut, serving none of them)
            failed = set(peers) <= self.logs.failed_within(2 * limits.member_silence_s)
            if not failed and len(self.logs.heard_within(limits.member_silence_s) & set(peers)) >= needed:
                return members
            if await self.logs.answering(peers, limits.cut_off_probe_s) >= needed:
                return None  # (after a probe: what etcd says may have moved on)
            log.warning("node %s reaches etcd but fewer than %d of its peers (%s): stepping down — its %d bundles "
                        "go to nodes that can replicate them", me, needed, ",".join(sorted(peers)), len(self.owned))
            await self.membership.say_cut_off(True)
            held = dict(self.owned)
            for b in held:
                self.logs.lose(b + 1, "cut off from its peers")
            for b, epoch in held.items():
                await self.membership.release(b, epoch)
            return None
        if peers and await self.logs.answering(peers, limits.cut_off_probe_s) < needed:
            return None
        log.info("node %s reaches its peers again: it takes bundles again", me)
        await self.membership.say_cut_off(False)
        return None

    async def _rejoin(self) -> None:
        log.warning("node %s lost its session: joining again under a new one", self.info.node_id)
        for log_id in list(self.logs.logs):  # another node may own them now: fencing refuses what we would write
            self.logs.lose(log_id, "this node's session ended")
        await self.membership.join()
        self.membership.lost.clear()  # (only now: a join that failed — etcd went again — is tried next pass)

    async def rebalance(self, members: dict | None = None) -> tuple[list[int], list[int]]:
        """Take the free bundles placement gives this node, give up the ones it gives another: (taken, released).
        `members`: the nodes as just read from etcd (else read here)."""
        try:
            return await self._rebalance(members)
        finally:
            if not self.membership.view.live:  # (else the watch reports every change of an owner key)
                self._routes_stale.set()

    async def _rebalance(self, members: dict | None) -> tuple[list[int], list[int]]:
        members = await self.membership.members() if members is None else members
        want = await self.membership.placement(self.config.bundles, members)
        owners = await self.membership.owners()
        me = self.info.node_id
        released = []
        for b in sorted(self.owned):
            if want.get(b) != me:
                await self.logs.release(b)  # its ledger closed first: the next owner has nothing to recover
                if await self.membership.release(b):
                    released.append(b)
        for b in [b for b in self.owned if not self.logs.serving(b + 1) and b not in self._taking]:
            self.owned.pop(b)  # lost while being served (a roll found another owner): the key is not ours
        for b, (node, epoch) in list(owners.items()):  # (a key given up leaves `owners`)
            if node == me and b not in self.owned and not self.logs.serving(b + 1):
                # the key says this node, which does not serve the bundle: a change of its ledgers that timed out
                # yet was made (the roll then found "another" ledger) lost it here. Nobody else would take it while
                # the key stays: give the key up (the next owner, this node too, fences and recovers).
                if await self.membership.release(b, epoch):
                    del owners[b]
        claimed = []
        for b, node in sorted(want.items()):
            if node == me and b not in self.owned and b not in owners:
                epoch = await self.membership.claim(b)
                if epoch is not None:
                    claimed.append((b, epoch))
        if claimed:
            await self.read_routes()  # this node is taking them over (the router answers UNAVAILABLE meanwhile)
        taken = [b for b, ok in zip([b for b, _ in claimed], await self._take(claimed)) if ok] if claimed else []
        await self.logs.widen()
        self.upkeep.start_repair()
        await self.upkeep.compact()
        self.upkeep.collect_strays()
        for b in {b for b, _ in claimed} - set(taken):
            self.owned.pop(b, None)
        if taken or released:
            log.info("node %s took bundles %s, gave up %s; owns %d of %d", me, _ranges(taken), _ranges(released),
                     len(self.owned), self.config.bundles)
        return taken, released


    async def _take(self, claimed: list[tuple[int, int]]) -> list[bool]:
        """Take the claimed bundles over (fence, recover, rebuild, open), all at once — once this node's metadata
        log holds every change made before: a log read back with a pair's ShardHome not applied yet would take
        the pair for its own (invariant H1)."""
        self._taking.update(b for b, _ in claimed)
        try:
            await self.meta_log.catch_up()
            return await asyncio.gather(*(self.logs.take(b, e) for b, e in claimed))
        finally:
            self._taking.difference_update(b for b, _ in claimed)


def _home(disk, data_dir: str) -> str:
    """The id of this data directory (made on first use): a restart of the same node carries the same."""
    path = os.path.join(data_dir, HOME_FILE)
    if not disk.exists(path):
        disk.makedirs(data_dir)
        disk.write_durably(path, (uuid.uuid4().hex + "\n").encode())
    return disk.read_file(path).decode().strip()


def _ranges(bundles: list[int]) -> str:
    if not bundles:
        return "none"
    out, start, prev = [], bundles[0], bundles[0]
    for b in bundles[1:] + [None]:
        if b is not None and b == prev + 1:
            prev = b
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if b is not None:
            start = prev = b
    return ",".join(out)
