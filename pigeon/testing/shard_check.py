"""Invariant T3 of docs/cluster.md, checked over a history of records: shards are independent. Applying the logs of
any set of a topic's shards gives exactly the state of those shards that applying all of them gives — so a topic's
shards can live on different owners, each applying only its own shards' logs.

`check_history` replays a history (the records a node committed, in order) three ways: whole, into one state; cut
by log (`BrokerState.split` and `log_of`, as the executor commits them) into one state per log, each also given the
metadata log; and, for each log, the snapshot of its shards (`bundle_snapshot`, what a new owner loads) applied to
another log's state. The shards of every log must read the same in all three. Pure; the simulator runs it after
every seed, and tests/unit/test_shards_independent.py on histories of their own."""

from __future__ import annotations

from pigeon.broker import images
from pigeon.broker.state import BrokerState
from pigeon.broker.topic import SHARD_MASK
from pigeon.core.bundles import META_LOG


def shard_view(st: BrokerState, topic_uid: int, shard: int) -> dict:
    """Everything `st` holds about one shard of a topic, as plain values: its index, activation and idempotency
    entries, and each subscription's part (ack state, leases without their owners, counts, parked and updated
    messages, seek generation)."""
    t = st.topics_by_uid[topic_uid]
    ix = t.shards[shard]
    ours = lambda n: n & SHARD_MASK == shard  # noqa: E731
    view = {
        "index": (ix.next, list(ix.base), list(ix.pos), list(ix.ms), list(ix.keys)),
        "schedule": sorted(e for sec, raw in t.schedule.export(ours) for e in _entries(sec, raw)),
        "idempotency": sorted((k, mid, ms) for k, mid, ms in t.idempotency.export() if ours(int(mid))),
    }
    for uid in sorted(t.subscriptions):
        s = st.subs_by_uid[uid]
        sh = s.shards[shard]
        view[uid] = (sh.floor, sorted(sh.acked),
                     sorted((n, d, v, k) for n, (d, v, _, k) in s.leases.items() if ours(n)),
                     sorted((n, v) for n, v in s.versions.items() if ours(n)),
                     sorted((n, at) for n, at in s.parked.items() if ours(n)),
                     sorted((n, m) for n, m in s.overrides.items() if ours(n)),
                     s.generations[shard])
    return view


def _entries(sec: int, raw: bytes) -> list[tuple[int, bytes]]:
    return [(sec, raw[i:i + 8]) for i in range(0, len(raw), 8)]


def check_history(history, bundles: int) -> list[str]:
    """Replay `history` — (record, journal position) pairs in commit order — whole and cut by log; the shards on
    which they disagree, in words (empty: invariant T3 holds)."""
    whole = BrokerState()
    whole.dispatch_off()
    by_log: dict[int, BrokerState] = {}
    meta: list = []
    for rec, at in history:
        for part in whole.split(rec):
            log = whole.log_of(part, bundles)
            whole.apply(part, at)
            if log == META_LOG:
                meta.append((part, at))
                for st in by_log.values():
                    st.apply(part, at)
                continue
            st = by_log.get(log)
            if st is None:
                st = by_log[log] = BrokerState()
                st.dispatch_off()
                for m, m_at in meta:
                    st.apply(m, m_at)
            st.apply(part, at)
    problems = []
    logs = sorted(by_log)
    for log in logs:
        other = by_log[logs[(logs.index(log) + 1) % len(logs)]]
        loaded = {}
        if other is not by_log[log]:  # a new owner of `log` beside the shards of another log it owns
            other.apply(images.bundle_snapshot(whole, log, bundles))
            loaded = other
        for t, shards in whole.log_shards(log, bundles):
            for k in sorted(shards):
                want = shard_view(whole, t.uid, k)
                if shard_view(by_log[log], t.uid, k) != want:
                    problems.append(f"shard {k} of topic {t.name}: its log {log} alone applies to another state")
                if loaded and shard_view(loaded, t.uid, k) != want:
                    problems.append(f"shard {k} of topic {t.name}: the snapshot of log {log} loads another state")
    return problems
