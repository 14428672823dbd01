"""A deployment of regions on loopback (docs/regions.md; tests, `make regions`, the regions' latency and fault
runs): a global etcd, and per region an etcd and real `pigeon serve --region …` nodes. Every node reaches every
other node and every etcd through a CONNECT proxy of the test network (pigeon.testing.netsplit), so the links
between regions can be delayed (each way) and a region cut off from the others; a client reaches a node
directly. The global store is placed in the first region: the other regions reach it across their link."""

from __future__ import annotations

import os
import time

from pigeon.bench.procs import free_port
from pigeon.core import limits
from pigeon.testing.cluster import await_status
from pigeon.testing.etcd import EtcdProcess
from pigeon.testing.netsplit import Network
from pigeon.testing.server import ServerProcess


class Deployment:
    def __init__(self, root: str, regions=("east", "west"), nodes: int = 1, delay_s: float = 0.0,
                 shards_per_topic: int = 2, region_slots: int = 4, extra: list[str] | None = None):
        self.root, self.regions, self.delay_s = root, tuple(regions), delay_s
        self.shards_per_topic, self.region_slots = shards_per_topic, region_slots
        replicas = min(nodes, 3)
        self.flags = ["--replicas", str(replicas), "--ack-quorum", str(replicas // 2 + 1),
                      "--shards-per-topic", str(shards_per_topic), "--region-slots", str(region_slots),
                      *(extra or [])]
        self.etcds = {name: EtcdProcess(os.path.join(root, f"etcd-{name}"), name=name)
                      for name in ("global", *self.regions)}
        self.net = Network(self.etcds["global"].endpoint)
        self.nodes: dict[str, ServerProcess] = {}  # node id ("<region>-<i>") → its process
        self.region_of: dict[str, str] = {}
        for region in self.regions:
            for i in range(1, nodes + 1):
                node_id, append = f"{region}-{i}", free_port()
                port = free_port()
                env = self.net.add(node_id, f"127.0.0.1:{port}", f"127.0.0.1:{append}")
                self.region_of[node_id] = region
                self.nodes[node_id] = ServerProcess(
                    os.path.join(root, node_id), port=port, env=env, log_path=os.path.join(root, f"{node_id}.log"),
                    http=True,
                    extra=["--etcd", self.etcds[region].endpoint, "--node-id", node_id, "--region", region,
                           "--global-etcd", self.etcds["global"].endpoint, "--append-port", str(append),
                           *self.flags])

    def places(self, region: str) -> set[str]:
        """What lies in `region`: its nodes, its etcd (and, for the first region, the global store)."""
        out = {n for n, r in self.region_of.items() if r == region} | {self.etcds[region].endpoint}
        return out | ({self.etcds["global"].endpoint} if region == self.regions[0] else set())

    def start(self) -> "Deployment":
        for e in self.etcds.values():
            e.start()
        if self.delay_s:
            for i, a in enumerate(self.regions):
                for b in self.regions[i + 1:]:
                    self.net.delay(self.places(a), self.places(b), self.delay_s)
        for node_id in self.nodes:  # (in order: the first region takes slot 0, and so on)
            self.nodes[node_id].start()
        for region in self.regions:  # each region's bundles owned (a takeover reads the global metadata log first)
            count = sum(1 for r in self.region_of.values() if r == region)
            await_status(self.etcds[region].endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == count
                         and all(r["bundles"] for r in st["nodes"]), what=f"region {region}'s bundles to be owned")
        time.sleep(limits.region_gateways_s + 0.5)  # (the first nodes have read the later regions' gateways too)
        return self

    def node(self, region: str, i: int = 1) -> ServerProcess:
        return self.nodes[f"{region}-{i}"]

    def cut_off(self, region: str) -> None:
        """Region `region` from every other place (the global store too, unless it lies there); its clients still
        reach it."""
        others = set().union(*(self.places(r) for r in self.regions if r != region))
        self.net.partition(self.places(region), others)

    def heal(self) -> None:
        self.net.heal()

    def stop(self) -> None:
        for n in self.nodes.values():
            n.kill()
        for e in self.etcds.values():
            e.kill()
        self.net.close()
