"""`GET /metrics`: the node's statistics in Prometheus' text format (the prometheus-client library), read from
the `statistics()` objects at each scrape — nothing on the hot paths but plain counts.

Names follow Cloud Monitoring's Pub/Sub metrics (`subscription/num_undelivered_messages` becomes
`pigeon_subscription_num_undelivered_messages{subscription="…"}`), so dashboards translate.

Label cardinality is bounded: per-subscription series are exported for the `metrics_top` subscriptions with the
largest backlog (and per-topic series for the busiest topics); every subscription and topic still counts in the
node-wide sums, and `pigeon_metrics_series_omitted` says how many were left out. Cost: up to 5,000
subscriptions are read at each scrape; above that a background pass reads them in chunks between turns of the
event loop at most every 10 s (`SubscriptionStats`), so a scrape every second costs the top-N sort and the
text."""

from __future__ import annotations

import asyncio
import heapq

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from pigeon.api.build_info import BuildInfo
from pigeon.core.histogram import Histogram, HistogramStats
from pigeon.node.journal_writer import SYNC_BUCKETS_MS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _histogram(name: str, doc: str, h: HistogramStats) -> HistogramMetricFamily:
    buckets = [(repr(b), c) for b, c in zip(h.bounds, h.cumulative)] + [("+Inf", h.count)]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.sum)


class LoopLag:
    """How late the event loop runs a timer: every `every` s it sleeps and measures the overshoot."""

    def __init__(self, every: float = 0.5):
        self.every = every
        self.last = 0.0
        self.histogram = Histogram()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pigeon-loop-lag")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.every)
            self.last = max(0.0, loop.time() - t0 - self.every)
            self.histogram.observe(self.last)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class SubscriptionStats:
    """Every subscription's statistics for the scrapes. Up to `fresh_max` subscriptions they are read at each
    scrape; above, a background pass reads them `chunk` at a time between turns of the event loop, at most
    every `every` seconds, and scrapes get its latest result (a pass over 100,000 subscriptions takes about a
    quarter of a second of the loop's time: every scrape paying it would be a quarter of the node's CPU)."""

    def __init__(self, engine, fresh_max: int = 5000, every: float = 10.0, chunk: int = 2000):
        self.engine, self.fresh_max, self.every, self.chunk = engine, fresh_max, every, chunk
        self.latest: list = []
        self.taken_at = 0.0
        self._task: asyncio.Task | None = None

    def read(self) -> tuple[list, float]:
        """(statistics, their age in seconds)."""
        if len(self.engine.state.subs_by_uid) <= self.fresh_max:
            return [s for part in self.engine.subscription_statistics(1 << 30) for s in part], 0.0
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            if loop.time() - self.taken_at >= self.every or not self.latest:
                self._task = loop.create_task(self._pass(), name="pigeon-metrics-pass")
        return self.latest, loop.time() - self.taken_at if self.latest else 0.0

    async def _pass(self) -> None:
        out = []
        for part in self.engine.subscription_statistics(self.chunk):
            out.extend(part)
            await asyncio.sleep(0)
        self.latest, self.taken_at = out, asyncio.get_running_loop().time()


class NodeCollector(Collector):
    def __init__(self, engine, cluster=None, lag: LoopLag | None = None, top: int = 500):
        self.engine, self.cluster, self.lag, self.top = engine, cluster, lag, top
        self.subs = SubscriptionStats(engine)

    def collect(self):
        st = self.engine.statistics(subscriptions=False)
        j = st.journal
        subs, age = self.subs.read()
        yield GaugeMetricFamily("pigeon_metrics_subscriptions_age_seconds", "How old the subscription figures "
                                "are (0: read at this scrape; with many subscriptions, a background pass)", value=age)

        yield GaugeMetricFamily("pigeon_topics", "Topics", value=st.topics)
        yield GaugeMetricFamily("pigeon_subscriptions", "Subscriptions", value=len(subs))
        yield GaugeMetricFamily("pigeon_undelivered_messages", "Unacked messages over every subscription",
                                value=sum(s.undelivered for s in subs))
        yield GaugeMetricFamily("pigeon_outstanding_messages", "Messages leased now over every subscription",
                                value=sum(s.outstanding for s in subs))

        # per subscription: the largest backlogs
        shown = heapq.nlargest(self.top, subs, key=lambda s: (s.undelivered, s.name))
        fams = {
            "num_undelivered_messages": GaugeMetricFamily(
                "pigeon_subscription_num_undelivered_messages", "Unacked messages (delivered or not)",
                labels=["subscription"]),
            "num_outstanding_messages": GaugeMetricFamily(
                "pigeon_subscription_num_outstanding_messages", "Messages delivered and not yet acked or expired",
                labels=["subscription"]),
            "oldest_unacked_message_age": GaugeMetricFamily(
                "pigeon_subscription_oldest_unacked_message_age_seconds", "Age of the oldest unacked message",
                labels=["subscription"]),
        }
        counters = {
            "sent": CounterMetricFamily("pigeon_subscription_sent_message_count", "Messages delivered",
                                        labels=["subscription"]),
            "acked": CounterMetricFamily("pigeon_subscription_ack_message_count", "Messages acknowledged",
                                         labels=["subscription"]),
            "expired": CounterMetricFamily("pigeon_subscription_expired_ack_deadlines_count",
                                           "Leases that ran out before an ack", labels=["subscription"]),
            "dead": CounterMetricFamily("pigeon_subscription_dead_letter_message_count",
                                        "Messages forwarded to the dead-letter topic", labels=["subscription"]),
        }
        for s in shown:
            fams["num_undelivered_messages"].add_metric([s.name], s.undelivered)
            fams["num_outstanding_messages"].add_metric([s.name], s.outstanding)
            fams["oldest_unacked_message_age"].add_metric([s.name], s.oldest_unacked_age_s)
            counters["sent"].add_metric([s.name], s.delivered)
            counters["acked"].add_metric([s.name], s.acked)
            counters["expired"].add_metric([s.name], s.expired)
            counters["dead"].add_metric([s.name], s.dead_lettered)
        yield from fams.values()
        yield from counters.values()

        # per topic: the busiest
        topics = heapq.nlargest(self.top, st.topic_stats, key=lambda t: (t[2], t[0]))
        req = CounterMetricFamily("pigeon_topic_send_request_count", "Publish requests stored", labels=["topic"])
        msg = CounterMetricFamily("pigeon_topic_send_message_count", "Messages published", labels=["topic"])
        byt = CounterMetricFamily("pigeon_topic_byte_count", "Bytes of publish requests stored", labels=["topic"])
        for name, n_req, n_msg, n_bytes in topics:
            req.add_metric([name], n_req)
            msg.add_metric([name], n_msg)
            byt.add_metric([name], n_bytes)
        yield req
        yield msg
        yield byt
        omitted = GaugeMetricFamily("pigeon_metrics_series_omitted", "Subscriptions or topics counted in the sums "
                                    "but not exported one by one (metrics_top)", labels=["kind"])
        omitted.add_metric(["subscription"], len(subs) - len(shown))
        omitted.add_metric(["topic"], len(st.topic_stats) - len(topics))
        yield omitted
        yield _histogram("pigeon_publish_latency_seconds", "From a Publish reaching the engine to its messages "
                         "being durable (and, in a cluster, replicated)", st.publish_latency)
        yield _histogram("pigeon_subscription_ack_latency_seconds", "From handing a message out to its ack "
                         "(sampled: the first message of every 16th batch delivered)", st.ack_latency)
        hot = CounterMetricFamily("pigeon_topic_ordering_key_message_count", "Messages published with each of the "
                                  "hottest ordering keys (space-saving estimate: at most over)",
                                  labels=["topic", "ordering_key"])
        for topic, key, n in st.hot_keys:
            hot.add_metric([topic, key], n)
        yield hot

        # the journal
        yield GaugeMetricFamily("pigeon_journal_bytes", "Journal bytes on disk", value=j.journal.bytes)
        yield GaugeMetricFamily("pigeon_journal_segments", "Journal segment files", value=j.journal.segments)
        yield CounterMetricFamily("pigeon_journal_synced_bytes", "Bytes made durable", value=j.journal.synced_bytes)
        sync = HistogramStats(tuple(b / 1000 for b in SYNC_BUCKETS_MS), j.sync_buckets, j.sync_seconds, j.syncs)
        yield _histogram("pigeon_fsync_seconds", "fdatasync latency of the journal", sync)
        yield CounterMetricFamily("pigeon_group_commits", "Group commits written", value=j.group_commits)
        yield CounterMetricFamily("pigeon_group_commit_entries", "Entries in them", value=j.group_commit_entries)
        yield CounterMetricFamily("pigeon_group_commit_bytes", "Bytes in them", value=j.group_commit_bytes)
        yield _histogram("pigeon_group_commit_size_entries", "Entries per group commit", j.group_commit_sizes)
        yield GaugeMetricFamily("pigeon_disk_free_bytes", "Free bytes on the data directory's disk",
                                value=j.space.free_bytes)
        yield GaugeMetricFamily("pigeon_disk_full", "1 while publishes are refused for a full disk",
                                value=int(j.space.full))

        # clients
        a = st.admission
        yield GaugeMetricFamily("pigeon_open_streams", "StreamingPull streams open", value=len(st.streams))
        yield GaugeMetricFamily("pigeon_stream_unsent_bytes", "Responses handed to gRPC, not yet taken by clients",
                                value=a.stream_unsent_bytes)
        yield GaugeMetricFamily("pigeon_publish_pending_bytes", "Publish requests waiting to be durable",
                                value=a.publish_pending_bytes)
        yield CounterMetricFamily("pigeon_refused_publishes", "Publishes refused for memory", value=a.refused_publishes)
        yield CounterMetricFamily("pigeon_refused_streams", "Streams refused for memory", value=a.refused_streams)
        yield GaugeMetricFamily("pigeon_reader_cached_bytes", "Message bytes in the read cache",
                                value=st.reader.cached_bytes)

        if self.lag is not None:
            yield GaugeMetricFamily("pigeon_event_loop_lag_seconds", "How late the event loop ran its last timer",
                                    value=self.lag.last)
            yield _histogram("pigeon_event_loop_lag_histogram_seconds", "How late the event loop runs timers",
                             self.lag.histogram.snapshot())

        if self.cluster is not None:
            logs = self.cluster.logs
            yield GaugeMetricFamily("pigeon_cluster_bundles_owned", "Bundles this node serves", value=len(logs.logs))
            yield CounterMetricFamily("pigeon_cluster_takeovers", "Bundles taken over", value=logs.taken)
            yield CounterMetricFamily("pigeon_cluster_ledger_rolls", "Ledgers closed to open the next",
                                      value=logs.rolls)
            yield CounterMetricFamily("pigeon_cluster_shard_handovers", "Shards this node handed to another "
                                      "bundle's log (finished: homed there)", value=self.cluster.handovers.done)
            yield GaugeMetricFamily("pigeon_cluster_under_replicated_ledgers", "Closed ledgers of the logs this "
                                    "node owns with fewer members up than E (at the last repair pass)",
                                    value=self.cluster.upkeep.under_replicated)
            floor = self.cluster.store.journal_floor()
            yield GaugeMetricFamily("pigeon_cluster_journal_held_bytes", "Journal bytes from the first record a "
                                    "kept ledger borrows (this node's own copy of its ledgers): the journal is not "
                                    "cut below it", value=0 if floor is None else j.journal.tail - floor)
            taken = CounterMetricFamily("pigeon_cluster_append_requests", "Append requests this node took as a "
                                        "ledger member, by the way they came (the append channel, or gRPC)",
                                        labels=["transport"])
            for transport, n in self.cluster.store.append_requests.items():
                taken.add_metric([transport], n)
            yield taken
            yield CounterMetricFamily("pigeon_cluster_ledger_cold_reads", "Reads of this node's ledgers that found "
                                      "entries outside the page cache (a thread read them in: the event loop does not "
                                      "wait for the disk)", value=self.cluster.store.cold_reads)
            yield CounterMetricFamily("pigeon_cluster_ledger_cold_read_bytes", "Bytes those reads brought into the "
                                      "page cache", value=self.cluster.store.cold_read_bytes)
            ready, _ = self.cluster.ready()
            yield GaugeMetricFamily("pigeon_cluster_ready", "1 while joined with etcd answering", value=int(ready))
            balancer = self.cluster.balancer
            if balancer is not None:  # (placement by load: node.balancer)
                load = GaugeMetricFamily("pigeon_cluster_bundle_load_cores", "Each owned bundle's share of this "
                                         "node's CPU, as the load planner reads it (smoothed)", labels=["bundle"])
                for log_id, (_, _, cores) in sorted(balancer.meter.rates.items()):
                    if log_id - 1 in self.cluster.owned:
                        load.add_metric([str(log_id - 1)], cores)
                yield load
                yield GaugeMetricFamily("pigeon_cluster_node_load_cores", "This process's CPU, as the load planner "
                                        "reads it (smoothed)", value=balancer.meter.cores)
                yield GaugeMetricFamily("pigeon_cluster_hot_bundles", "Bundles each busier than a node's share, as "
                                        "the planner found them last (only a split would help them; the planner "
                                        "only)", value=len(balancer.hot))


class SecurityCollector(Collector):
    """Refusals at the boundary (api.access) and each project's use of its quotas (ops.quotas)."""

    def __init__(self, guard):
        self.guard = guard

    def collect(self):
        g, q = self.guard, self.guard.quotas
        yield CounterMetricFamily("pigeon_auth_unauthenticated", "calls refused UNAUTHENTICATED",
                                  value=g.unauthenticated)
        yield CounterMetricFamily("pigeon_auth_permission_denied", "calls refused PERMISSION_DENIED",
                                  value=g.denied)
        yield GaugeMetricFamily("pigeon_auth_streams_watched", "open streams re-checked when policies change",
                                value=len(g.streams))
        published = CounterMetricFamily("pigeon_project_publish_bytes", "bytes published, per project",
                                        labels=["project"])
        for p, n in q.published_bytes.items():
            published.add_metric([p], n)
        yield published
        admin = CounterMetricFamily("pigeon_project_admin_operations", "admin operations, per project",
                                    labels=["project"])
        for p, n in q.admin_ops.items():
            admin.add_metric([p], n)
        yield admin
        refused = CounterMetricFamily("pigeon_project_quota_exceeded", "calls refused by a quota, per project",
                                      labels=["project", "quota"])
        for (p, quota), n in q.refused.items():
            refused.add_metric([p, quota], n)
        yield refused
        backlog = GaugeMetricFamily("pigeon_project_backlog_bytes", "unacknowledged bytes retained, per project "
                                    "(measured with a backlog quota set)", labels=["project"])
        for p, n in q.backlog.items():
            backlog.add_metric([p], n)
        yield backlog
        share = GaugeMetricFamily("pigeon_project_quota_share", "this node's part of a project's quota (a cluster "
                                  "shares each quota out among its nodes every second; 1 alone)",
                                  labels=["project", "quota"])
        for p, (pub, adm) in q.shares.items():
            share.add_metric([p, "publish-bytes-per-second"], pub)
            share.add_metric([p, "admin-operations-per-minute"], adm)
        yield share


def registry(engine, cluster=None, lag: LoopLag | None = None, top: int = 500, guard=None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BuildInfo())
    reg.register(NodeCollector(engine, cluster, lag, top))
    if guard is not None:
        reg.register(SecurityCollector(guard))
    return reg


def render(reg: CollectorRegistry) -> bytes:
    """This node's metrics, then the process-wide ones (recovery's counters, the process, the collector)."""
    return generate_latest(reg) + generate_latest(REGISTRY)
