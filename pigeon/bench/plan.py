"""The benchmark's sizes, durations and time bounds, in one place. Owns the rule: every workload is bounded in
count and in time, and a peer process never outlives `peer_wall_s_max`.

Three plans: `smoke` (a second of publish + consume, for the test suite), `quick` (≤ 2 minutes with every peer
already installed) and `full` (the committed run)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

WORKLOADS = ("publish", "consume", "mixed", "topics", "latency", "ordered", "connections", "idle", "backlog", "restart",
             "failover")


@dataclass(frozen=True)
class Plan:
    name: str
    workloads: tuple[str, ...] = WORKLOADS
    message_bytes: int = 1024  # throughput and latency workloads
    publish_batches: tuple[int, ...] = (1000, 100)  # messages per request (per pipelined window for peers)
    publish_s: float = 10.0  # per batch size
    publish_procs: int = 2  # publisher processes
    publish_inflight: tuple[int, ...] = (4, 16)  # requests in flight per publisher process: each is run, best kept
    consume_procs: int = 2
    consume_messages: int = 1_000_000  # drained from the publish backlog (all of it when it is smaller)
    consume_s_max: float = 30.0  # or stop here
    consume_outstanding_max: int = 5000  # StreamingPull flow control / prefetch / fetch size window
    mixed_s: float = 10.0  # publish and consume at once (publishers as in `publish`, the first batch size)
    topics: int = 4  # `topics`: publish + consume at once as `mixed`, spread over this many topics (one
    #                  publisher and one consumer process each): load a server can share out by topic
    latency_rate: int = 1000  # msg/s, open loop
    latency_s: float = 20.0
    latency_runs: int = 1  # repeated on fresh topics; the median run by p99 is reported
    ordered_keys: int = 1000
    ordered_batch: int = 100  # messages per request, one key per request
    ordered_messages: int = 500_000
    ordered_s_max: float = 30.0
    conn_publishers: int = 1000  # asyncio tasks, each its own publish loop
    conn_subscribers: int = 1000  # asyncio tasks, each its own StreamingPull stream
    conn_channels: int = 20  # TCP connections per side the tasks are spread over
    conn_outstanding: int = 100  # StreamingPull flow control of each subscriber stream
    conn_batch: int = 10  # messages per publish request
    conn_s: float = 10.0
    # the like-for-like reference: few clients (publish + consume at once) with requests of conn_batch messages
    conn_reference_inflight: int = 64  # requests in flight per publisher process (small requests need many)
    idle_streams: int = 10_000  # StreamingPull streams held open on a subscription with nothing to deliver
    idle_channels: int = 100  # TCP connections they are spread over
    idle_probe_s: float = 5.0  # publish + consume at once, before and while they are held
    idle_open_s_max: float = 120.0  # opening them stops here
    backlog_messages: int = 1_000_000
    backlog_bytes: int = 100
    backlog_big_messages: int = 0  # a second, larger backlog reading for Pigeon alone (0: skipped)
    backlog_s_max: float = 300.0  # a slow server's backlog stops here: the figures say how many it held
    backlog_big_s_max: float = 600.0
    restart_s_max: float = 120.0
    peer_start_s_max: float = 90.0
    peer_wall_s_max: float = 3600.0  # hard bound on any peer process (`timeout -s KILL`)
    settle_s: float = 2.0  # pause before reading RSS after a fill
    failover_s_max: float = 20.0  # replicated targets: kill -9 of the owner (leader), publishes watched this long

    def __post_init__(self):
        assert set(self.workloads) <= set(WORKLOADS), self.workloads
        assert "consume" not in self.workloads or "publish" in self.workloads, "consume drains the publish backlog"
        assert "restart" not in self.workloads or "backlog" in self.workloads, "restart reloads the backlog"
        assert all(1 <= b <= 1000 for b in self.publish_batches), "Pub/Sub allows 1,000 messages per request"
        assert self.publish_inflight and all(n >= 1 for n in self.publish_inflight)
        assert 1 <= self.ordered_batch <= 1000 and self.ordered_messages >= self.ordered_keys * self.ordered_batch
        assert self.latency_runs >= 1
        assert self.conn_channels <= min(self.conn_publishers, self.conn_subscribers)
        assert self.backlog_big_messages == 0 or self.backlog_big_messages > self.backlog_messages
        assert self.longest_s() < self.peer_wall_s_max, "a peer must outlive the workloads run against it"

    def longest_s(self) -> float:
        """The most time the workloads may take against one server (each is bounded by its own limit)."""
        bound = {"publish": len(self.publish_batches) * len(self.publish_inflight) * self.publish_s,
                 "consume": self.consume_s_max, "mixed": self.mixed_s, "topics": self.mixed_s, "latency": self.latency_runs * self.latency_s,
                 "ordered": 2 * self.ordered_s_max, "connections": 2 * self.conn_s,
                 "idle": 2 * self.idle_probe_s + 2 * self.idle_open_s_max, "backlog": self.backlog_s_max,
                 "restart": self.restart_s_max, "failover": self.failover_s_max}
        return self.peer_start_s_max + sum(bound[w] for w in self.workloads) + 30 * len(self.workloads)

    def scaled(self, **changes) -> "Plan":
        return dataclasses.replace(self, **changes)


FULL = Plan("full", latency_runs=3, backlog_big_messages=10_000_000, backlog_s_max=240.0, backlog_big_s_max=600.0)
QUICK = Plan(
    "quick", publish_batches=(1000,), publish_inflight=(4,), publish_s=1.5, consume_messages=200_000,
    consume_s_max=2.0, mixed_s=1.5, latency_s=2.0, ordered_keys=100, ordered_messages=50_000, ordered_s_max=3.0,
    conn_publishers=100, conn_subscribers=100, conn_channels=4, conn_s=1.5, idle_streams=1_000, idle_channels=10,
    idle_probe_s=1.5, idle_open_s_max=30.0, backlog_messages=100_000,
    backlog_s_max=30.0, restart_s_max=30.0, peer_start_s_max=60.0, peer_wall_s_max=600.0, settle_s=0.5,
)
SMOKE = Plan(
    "smoke", workloads=("publish", "consume", "mixed"), publish_batches=(100,), publish_inflight=(4,), publish_s=1.0,
    publish_procs=1, consume_procs=1, consume_s_max=3.0, mixed_s=1.0, peer_start_s_max=30.0, peer_wall_s_max=300.0,
)
# The replicated targets beside a single Pigeon (`pigeon bench --plan cluster --peers cluster`, part of `make bench`)
CLUSTER = Plan(
    "cluster", workloads=("publish", "consume", "mixed", "topics", "latency", "failover"), publish_batches=(1000, 100),
    publish_inflight=(4, 16), publish_s=8.0, consume_messages=500_000, consume_s_max=20.0, mixed_s=8.0,
    latency_s=15.0,
)
PLANS = {p.name: p for p in (FULL, QUICK, SMOKE, CLUSTER)}

# What a quick run includes per peer: the cheap throughput and latency workloads only.
QUICK_PEER_WORKLOADS = ("publish", "consume", "latency")


SCALE_WORKLOADS = ("publish", "mixed", "topics_publish", "topics")  # one topic alone, at once; 16 topics the same


@dataclass(frozen=True)
class ScalePlan:
    """`pigeon bench --plan scale`: the same cluster at each node count, every node held to `node_cpu` cores by a
    CPU cgroup, driven through all of its nodes (a publisher and a consumer process per node). Each count's
    bound: `longest_s()`; a full run ≈ 13 minutes, a quick one ≈ 3."""

    name: str = "scale"
    nodes: tuple[int, ...] = (3, 4, 5, 6)  # cluster sizes, in turn; efficiency is against the first
    node_cpu: float = 0.2  # cores each node may use (cgroup CPU quota); the load generator and etcd are not held
    cpu_period_us: int = 100_000  # CFS period the quota is a share of
    replicas: int = 3  # storage nodes that hold each ledger
    ack_quorum: int = 2  # of them, holding a record before it is answered
    workloads: tuple[str, ...] = SCALE_WORKLOADS
    message_bytes: int = 1024
    batch: int = 1000  # messages per publish request
    inflight: int = 4  # requests in flight per publisher process (one publisher process per node)
    outstanding: int = 5000  # StreamingPull flow control of each consumer stream (one consumer process per node)
    topics: int = 16  # the `topics_*` workloads: one topic in each of this many bundles
    topic_layout: str = "spread"  # the nodes' --topic-layout: spread, a topic's shards over every node (together:
    #                               each topic one owner's, as before spreading was built)
    shards_per_topic: int = 16  # a topic's shards: one in each bundle, so each node holds its share of the bundles
    run_s: float = 25.0  # each workload
    settle_s: float = 2.0  # pause after the cluster settles and between workloads
    peer_start_s_max: float = 90.0  # a node (or etcd) listening
    peer_wall_s_max: float = 1800.0  # hard bound on any node process (`timeout -s KILL`): one node count's run

    def __post_init__(self):
        assert self.nodes and all(n >= self.replicas for n in self.nodes), "every count must hold the replicas"
        assert list(self.nodes) == sorted(set(self.nodes)), "node counts ascending, each once"
        assert 1 <= self.ack_quorum <= self.replicas
        assert 0 < self.node_cpu, f"a node's CPU share must be positive, not {self.node_cpu}"
        assert 1 <= self.batch <= 1000 and self.inflight >= 1 and self.topics >= 1
        assert set(self.workloads) <= set(SCALE_WORKLOADS) and self.workloads, self.workloads
        assert self.topic_layout in ("together", "spread"), f"topic_layout: together or spread, not {self.topic_layout}"
        assert self.longest_s() < self.peer_wall_s_max, "a node must outlive the workloads run against it"

    def longest_s(self) -> float:
        """The most one node count's cluster may take: starting, then each workload with its setup and drain."""
        return (self.nodes[-1] + 1) * self.peer_start_s_max + len(self.workloads) * (self.run_s + 60)

    def estimate_s(self) -> float:
        """About how long the run takes (measured: a node starts in ~3 s, each run's setup and teardown ~4 s)."""
        return sum(10 + 3 * n + len(self.workloads) * (self.run_s + self.settle_s + 4) for n in self.nodes)

    def scaled(self, **changes) -> "ScalePlan":
        return dataclasses.replace(self, **changes)


SCALE = ScalePlan()
SCALE_QUICK = ScalePlan("scale-quick", nodes=(3, 4), run_s=5.0, settle_s=1.0)
SCALE_PLANS = {p.name: p for p in (SCALE, SCALE_QUICK)}
