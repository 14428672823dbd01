"""What a cluster node's /metrics says of the whole cluster, for the alerts of docs/alerts.yml: nodes by state,
ledgers with fewer copies than `--replicas`, and whether etcd answers. Owns the rules:

  * a node is down when the cluster still needs it — it holds a bundle's owner key, or is a member of a ledger
    some log still lists — and has no live session: a node that left and whose data moved elsewhere is not
    down, it is gone (a killed node stays down until repair or cuts replace its copies);
  * a ledger is under-replicated when fewer of its members are live than `--replicas` (E): a log that opened its
    ledgers on the two nodes left of three is, though nothing could be repaired there (the node-owned
    `pigeon_cluster_under_replicated_ledgers` counts against what repair could reach, so it stays 0 then);
  * the figures come from etcd, read in the background at most every `every` seconds and only when scraped: a
    scrape gets the latest read (`pigeon_cluster_view_age_seconds` says how old), never waits for etcd, and a
    node nobody scrapes reads nothing. Every node reports the same cluster-wide figures: alerts take the max."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pigeon.cluster import metadata as M
from pigeon.cluster.ledgers import LedgerInfo

log = logging.getLogger("pigeon.metrics")

STATES = ("up", "draining", "cut_off", "down")


@dataclass(frozen=True)
class ClusterView:
    nodes: dict[str, int]  # state → how many nodes
    under_replicated: int  # ledgers with fewer live members than E
    ledgers: int


async def read_view(meta, membership, replicas: int) -> ClusterView:
    members, drained, owners = await membership.members(), await membership.draining(), await membership.owners()
    ledgers = [lg for kv in await meta.list(M.ledgers_key(0)[:-5]) for lg in LedgerInfo.decode_list(kv.value)]
    needed = {node for node, _ in owners.values()} | {n for lg in ledgers for n in lg.members}
    nodes = dict.fromkeys(STATES, 0)
    for n, info in members.items():
        nodes["draining" if n in drained or info.draining else "cut_off" if info.cut_off else "up"] += 1
    nodes["down"] = len(needed - set(members))
    short = sum(1 for lg in ledgers if sum(1 for n in lg.members if n in members) < replicas)
    return ClusterView(nodes, short, len(ledgers))


class ClusterHealth(Collector):
    def __init__(self, cluster, every: float = 5.0):
        self.cluster, self.every = cluster, every
        self.view: ClusterView | None = None
        self.taken_at = 0.0
        self._task: asyncio.Task | None = None

    def _refresh(self) -> None:
        loop = asyncio.get_running_loop()
        if (self._task is None or self._task.done()) and (self.view is None or
                                                          loop.time() - self.taken_at >= self.every):
            self._task = loop.create_task(self._read(), name="pigeon-cluster-view")

    async def _read(self) -> None:
        c = self.cluster
        try:
            self.view = await read_view(c.meta, c.membership, c.config.replicas)
            self.taken_at = asyncio.get_running_loop().time()
        except M.StoreUnavailable as e:  # the last view stands, growing older; etcd's own gauge says why
            log.debug("reading the cluster's view for /metrics: %s", e)
        except Exception:  # noqa: BLE001 — a failed read must not cost the node: the next scrape reads again
            log.exception("reading the cluster's view for /metrics failed")

    def collect(self):
        self._refresh()
        yield GaugeMetricFamily("pigeon_cluster_etcd_reachable", "1 while this node's last placement pass reached "
                                "etcd", value=int(not self.cluster.etcd_down))
        v = self.view
        if v is None:  # (the first scrape starts the first read)
            return
        nodes = GaugeMetricFamily("pigeon_cluster_nodes", "Nodes by state; down: still an owner or a ledger "
                                  "member of the cluster, without a live session", labels=["state"])
        for state in STATES:
            nodes.add_metric([state], v.nodes[state])
        yield nodes
        yield GaugeMetricFamily("pigeon_cluster_ledgers", "Ledgers every log of the cluster lists", value=v.ledgers)
        yield GaugeMetricFamily("pigeon_cluster_ledgers_below_replicas", "Ledgers of the cluster with fewer live "
                                "members than --replicas", value=v.under_replicated)
        yield GaugeMetricFamily("pigeon_cluster_view_age_seconds", "How old the cluster-wide figures are (read "
                                "from etcd in the background)",
                                value=asyncio.get_running_loop().time() - self.taken_at)
