"""Placement by measured load (docs/cluster.md, "Scale-out" 4.1–4.2): every node reports what its bundles cost it
under `load/<node>`; the planner — the placeable node with the lowest id — turns the reports into moves
(cluster.placement.replan, pure) and writes them under `placement` by compare-and-swap; every node's placement
pass lays them over the hash (node.membership). Owns the rules of *when*: a report every third of the period; a
plan at most once a period, and a whole period after the last change (the loads it reads were measured under the
placement it changed); nothing planned while the store does not answer."""

from __future__ import annotations

import asyncio
import logging

from pigeon.cluster import metadata as M
from pigeon.cluster import placement
from pigeon.core import limits
from pigeon.node.bundle_load import LoadMeter, read_report

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
        if new == moved:
            return False
        ok, _ = await self.cluster.meta.txn([M.unchanged_since(held) if held else M.absent(M.PLACEMENT_KEY)],
                                            [M.Put(M.PLACEMENT_KEY, placement.encode_moves(new))])
        if ok:
            carried = placement.node_loads(placement.place(self.cluster.config.bundles, live, moved), load, live)
            went = {b: n for b, n in new.items() if moved.get(b) != n}
            log.info("placement by load: moving %s (nodes' load before: %s)",
                     ", ".join(f"bundle {b} to {n}" for b, n in sorted(went.items())) or "bundles back to the hash",
                     ", ".join(f"{n} {c:.2f}" for n, c in sorted(carried.items())))
        return ok
