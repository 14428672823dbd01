"""Placement by measured load (docs/cluster.md, "Scale-out" 4.1–4.2): every node reports what its bundles cost it
under `load/<node>`; the planner — the placeable node with the lowest id — turns the reports into moves
(cluster.placement.replan, pure) and writes them under `placement` by compare-and-swap; every node's placement
pass lays them over the hash (node.membership). Owns the rules of *when*: a report every third of the period; a
plan at most once a period, and a whole period after the last change (the loads it reads were measured under the
placement it changed); nothing planned while the store does not answer. And the split of a hot bundle — one
busier alone than a node's share, which moving cannot help: the planner names it in the key, and its owner, which
alone knows what its topics publish, asks (under `homes`) for half the shards its busiest topic has there in other
nodes' bundles (cluster.placement.split) — a bundle at most once in two periods, so the loads it reads next were
measured after the split."""

from __future__ import annotations

import asyncio
import logging

from pigeon.cluster import metadata as M
from pigeon.cluster import placement
from pigeon.core import limits
from pigeon.node.bundle_load import LoadMeter, read_report
from pigeon.storage import formats

log = logging.getLogger("pigeon.cluster")


class Balancer:
    def __init__(self, cluster, cpu, journal):
        """`cpu()`: the process's CPU seconds (node.host); `journal`: the node's storage.journal.Journal (its
        per-log counts are the meter's input)."""
        self.cluster = cluster
        self.period = cluster.config.load_balance_s
        self.meter = LoadMeter(self._counts, self.period / 3, cpu=cpu, clock=asyncio.get_running_loop().time)
        self.journal = journal
        self.hot: list[int] = []  # bundles too busy for any node, as last planned (a split would help them)
        self._changed_at = asyncio.get_running_loop().time()
        self._split_at: dict[int, float] = {}  # hot bundle of this node's → when it last asked for a split
        self._published: dict[int, int] = {}  # topic uid → its bytes published here, at the last look
        self.splits = 0  # splits asked for

    def _counts(self) -> dict[int, tuple[int, int]]:
        logs = self.journal.logs
        out = {}
        for b in self.cluster.owned:
            st = logs.get(b + 1)
            if st is not None:
                out[b + 1] = (st.entries, st.bytes)
        return out

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.period / 3)
            self.meter.sample()
            try:
                await self.report()
                if loop.time() - self._changed_at >= self.period and await self.plan():
                    self._changed_at = loop.time()
                await self.split_hot()
            except (M.StoreUnavailable, M.LeaseGone):
                continue  # (the placement loop says etcd is away; the next period tries again)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 — a period lost is no harm: placement stands as it is
                log.exception("balancing bundles by load failed; trying again next period")

    async def report(self) -> None:
        membership = self.cluster.membership
        if membership.lease:
            await self.cluster.meta.put(M.load_key(self.cluster.info.node_id),
                                        self.meter.report(b + 1 for b in self.cluster.owned), membership.lease)

    async def plan(self) -> bool:
        """As the planner, move bundles when the loads say so: whether the moves changed."""
        membership, me = self.cluster.membership, self.cluster.info.node_id
        live = await membership.placeable()
        if not live or live[0] != me:
            return False
        owners = await membership.owners()
        load: dict[int, float] = {}
        for kv in await self.cluster.meta.list(M.LOAD_PREFIX):
            node = kv.key[len(M.LOAD_PREFIX):]
            for b, (_, _, cores) in read_report(kv.value)[1].items():
                if owners.get(b, ("",))[0] == node:  # (a bundle that moved since is its new owner's to report)
                    load[b] = cores
        held = await self.cluster.meta.get(M.PLACEMENT_KEY)
        moved = placement.decode_moves(held.value if held else None)
        new, hot = placement.replan(self.cluster.config.bundles, live, moved, load, balance=limits.load_balance,
                                    floor=limits.load_floor_cores, most=limits.load_moves_max)
        if hot != self.hot:
            self.hot = hot
            if hot:
                log.info("bundles %s are each busier than a node's share (%s): moving them cannot balance the "
                         "load; a topic of theirs would need more shards", hot,
                         ", ".join(f"{b}: {load[b]:.2f} cores" for b in hot))
        if new == moved and hot == placement.decode_hot(held.value if held else None):
            return False
        ok, _ = await self.cluster.meta.txn([M.unchanged_since(held) if held else M.absent(M.PLACEMENT_KEY)],
                                            [M.Put(M.PLACEMENT_KEY, placement.encode_moves(new, hot))])
        if ok and new != moved:
            carried = placement.node_loads(placement.place(self.cluster.config.bundles, live, moved), load, live)
            went = {b: n for b, n in new.items() if moved.get(b) != n}
            log.info("placement by load: moving %s (nodes' load before: %s)",
                     ", ".join(f"bundle {b} to {n}" for b, n in sorted(went.items())) or "bundles back to the hash",
                     ", ".join(f"{n} {c:.2f}" for n, c in sorted(carried.items())))
        return ok and new != moved

    async def split_hot(self) -> None:
        """As the owner of a bundle the planner named hot: ask for half the shards its busiest topic (by bytes
        published here since the last look) has there in other nodes' bundles, under `homes` by compare-and-swap;
        every node's placement pass then starts the hand-overs that are its own (node.handover)."""
        engine, membership = self.cluster.engine, self.cluster.membership
        now, bundles = asyncio.get_running_loop().time(), self.cluster.config.bundles
        published = {t.uid: t.published_bytes for t in engine.state.topics_by_uid.values()}
        grew = {uid: n - self._published.get(uid, n) for uid, n in published.items()}
        self._published = published
        held = await self.cluster.meta.get(M.PLACEMENT_KEY)
        hot = [b for b in placement.decode_hot(held.value if held else None)
               if b in self.cluster.owned and now - self._split_at.get(b, -1e18) >= 2 * self.period]
        if not hot or await self.cluster.logs.speaks() < formats.CLUSTER_HANDOVER:
            return
        owners = {b: n for b, (n, _) in (await membership.owners()).items()}
        carried = {kv.key[len(M.LOAD_PREFIX):]: read_report(kv.value)[0]
                   for kv in await self.cluster.meta.list(M.LOAD_PREFIX)}
        for b in hot:
            here = [(grew.get(t.uid, 0), t.name, shards) for t in engine.state.topics_by_uid.values()
                    if not t.deleted and not t.away
                    for shards in [[k for k, log in enumerate(engine.state.shard_logs(t, bundles)) if log == b + 1]]
                    if len(shards) > 1]
            if not here:
                continue
            _, name, shards = max(here)
            plan = placement.split(shards, carried, owners, b)
            if plan and await self._ask_homes(name, plan):
                self._split_at[b] = now
                self.splits += 1
                log.info("bundle %d is hot: splitting %s, its busiest topic there — %s", b, name,
                         ", ".join(f"shard {k} to bundle {to}" for k, to in sorted(plan.items())))

    async def _ask_homes(self, topic: str, plan: dict[int, int]) -> bool:
        held = await self.cluster.meta.get(M.HOMES_KEY)
        homes = placement.decode_homes(held.value if held else None)
        homes.setdefault(topic, {}).update(plan)
        ok, _ = await self.cluster.meta.txn([M.unchanged_since(held) if held else M.absent(M.HOMES_KEY)],
                                            [M.Put(M.HOMES_KEY, placement.encode_homes(homes))])
        return ok
