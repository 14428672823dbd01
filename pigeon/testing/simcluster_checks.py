"""What the cluster simulator's clients saw (`History`) and the rules a run is checked against at its end and
between its steps (testing.simcluster runs them): every acknowledged publish delivered, per-key order on the
ordered subscriptions, no roll storm, every idle log's ledger list cut short. Each check names what broke, or
says nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from pigeon.broker import images
from pigeon.cluster.ledgers import LedgerInfo
from pigeon.core import limits
from pigeon.testing.simnode import BUNDLES

ROLLS_MAX = 20  # more new ledgers of one log than this within one step of the workload is a roll storm


@dataclass
class History:
    published: dict[str, tuple[int, str]] = field(default_factory=dict)  # message id → (topic, data), acked
    keys: dict[str, str] = field(default_factory=dict)  # data → ordering key
    seq: dict[str, int] = field(default_factory=dict)  # data → its place in its key
    delivered: dict[str, set[str]] = field(default_factory=dict)  # sub → message ids delivered
    first: dict[str, list[str]] = field(default_factory=dict)  # sub → data in order of first delivery
    firsts: dict[str, set[str]] = field(default_factory=dict)  # sub → the data in `first`
    received: int = 0  # messages that pulls returned, on every subscription
    acked: dict[str, dict[str, float]] = field(default_factory=dict)  # sub → message id → when its ack returned
    dead: set[str] = field(default_factory=set)  # data delivered on the dead-letter topic's subscription
    publish_failed: int = 0
    calls: int = 0

    def missing(self, subs: dict[str, int], poison: dict[str, int]) -> list[tuple[str, str]]:
        """(subscription, message id) of every acknowledged publish not delivered on it yet (on a poison
        subscription: not yet delivered on the dead-letter topic's)."""
        by_topic: dict[int, list[tuple[str, str]]] = {}
        for mid, (topic, d) in self.published.items():
            by_topic.setdefault(topic, []).append((mid, d))
        out = []
        for sub, t in subs.items():
            seen = self.delivered.get(sub, set())
            out += [(sub, mid) for mid, _ in by_topic.get(t, ()) if mid not in seen]
        for sub, t in poison.items():  # each of its messages is dead-lettered in the end
            out += [(sub, mid) for mid, d in by_topic.get(t, ()) if d not in self.dead]
        return out

    def out_of_order(self) -> str | None:
        """The first message an ordered subscription first delivered after a later one of its key."""
        published = {d for _, d in self.published.values()}
        for sub, order in self.first.items():
            last: dict[str, int] = {}
            for d in order:
                if d not in published:
                    continue
                key, seq = self.keys[d], self.seq[d]
                if seq < last.get(key, 0):
                    return f"{sub}: {d} first delivered after a later message of key {key}"
                last[key] = seq
        return None


class RollWatch:
    """A log's ledgers are numbered in order: many new ones since the last look (a step: at most a few seconds)
    is a roll storm — ledgers opened and closed at once, each a change of the list in etcd."""

    def __init__(self):
        self._seqs: dict[str, int] = {}  # ledger list key → its last ledger's number, at the last look
        self._seen: dict[str, int] = {}  # ledger list key → the revision of its value at the last look

    def look(self, kvs) -> str | None:
        for key, kv in kvs.items():
            if "/ledgers/" not in key or self._seen.get(key) == kv.mod_revision:
                continue  # (unchanged since the last look: its last ledger is the same)
            self._seen[key] = kv.mod_revision
            if lgs := LedgerInfo.decode_list(kv.value):
                last, seq = self._seqs.get(key), lgs[-1].seq
                self._seqs[key] = seq
                if last is not None and seq - last > ROLLS_MAX:
                    return (f"log {key.rsplit('/', 1)[-1]} opened {seq - last} ledgers in one step (a roll storm: "
                            f"ledgers opened and closed with nothing written); the last {lgs[-1]}")
        return None


def lists_short(nodes) -> bool:
    """Every log that keeps no message lists at most a few ledgers more than a snapshot is written at: an idle
    log moved again and again gets a snapshot and is cut too, its list does not grow with every takeover. (A log
    with messages not yet acknowledged keeps their ledgers, and so does one whose messages a shard handed to
    another log still holds unacknowledged.)"""
    lent = {source for n in nodes for log_id in n.cluster.logs.logs
            for source in images.lent_map(n.engine.state, log_id, BUNDLES)}
    for n in nodes:
        for log_id, ol in n.cluster.logs.logs.items():
            if log_id in lent or images.bundle_need(n.engine.state, log_id, BUNDLES) < 1 << 63:
                continue
            if len(ol.ledgers) > limits.log_ledgers_snapshot + 2:
                return False
    return True
