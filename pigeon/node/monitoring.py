"""What the monitoring service (pigeon.v1.Monitoring, the web console's figures) reads of a node. Owns the rules:

  * a node speaks only for the bundles it owns (in a cluster another node keeps the data state of the others;
    the API gathers the nodes' answers) — for a spread topic, and its subscriptions, only for the shards it owns:
    several nodes answer for one name, and the API adds their figures up;
  * a page is the `limit` first names after `after`, in name order — so the pages of several nodes merge into
    the cluster's page by taking the first `limit` of their union."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from pigeon.broker.subscription import SubscriptionStats
from pigeon.broker.state import BrokerState
from pigeon.core.bundles import META_LOG, bundle_log


@dataclass(frozen=True)
class TopicFigures:
    name: str
    publish_requests: int
    messages: int
    bytes: int
    subscriptions: int


@dataclass(frozen=True)
class SubscriptionFigures:
    stats: SubscriptionStats
    topic: str  # "" once the topic is deleted
    dead_letter_topic: str


def projects(engine) -> list[str]:
    """`projects/P` for every project that holds something."""
    return sorted({f"projects/{p}" for (p, _), n in engine.state.census.items() if p is not None and n > 0})


def _serves(engine, t, bundles: int) -> bool:
    """Whether this node applies some of the topic's records: it owns its bundle — of a spread topic, a bundle of
    one of its shards (each owner then speaks for its shards: the API adds the nodes' figures up)."""
    if not t.spread:
        return engine.owns(bundle_log(t.name, bundles))
    return any(engine.owns(log) for log in set(BrokerState.shard_logs(t, bundles)))


def _page(names, prefix: str, after: str, limit: int) -> list[str]:
    return heapq.nsmallest(limit, (n for n in names if n.startswith(prefix) and n > after))


def topics(engine, project: str, after: str, limit: int) -> list[TopicFigures]:
    state, bundles = engine.state, engine.config.bundles
    counts: dict[str, int] = {}
    for s in state.subs.values():
        if s.topic is not None and s.topic.name.startswith(project + "/"):
            counts[s.topic.name] = counts.get(s.topic.name, 0) + 1
    owned = (n for n, t in state.topics.items() if _serves(engine, t, bundles))
    out = []
    for name in _page(owned, f"{project}/topics/", after, limit):
        t = state.topics[name]
        out.append(TopicFigures(name, t.publish_requests, t.published, t.published_bytes, counts.get(name, 0)))
    return out


def subscriptions(engine, project: str, after: str, limit: int) -> list[SubscriptionFigures]:
    state, bundles, now = engine.state, engine.config.bundles, engine.clock.now()
    owned = (n for n, s in state.subs.items()
             if (engine.owns(META_LOG) if s.topic is None else _serves(engine, s.topic, bundles)))
    out = []
    for name in _page(owned, f"{project}/subscriptions/", after, limit):
        s = state.subs[name]
        out.append(SubscriptionFigures(s.statistics(now), s.topic.name if s.topic is not None else "",
                                       s.config.dead_letter_policy.dead_letter_topic))
    return out
