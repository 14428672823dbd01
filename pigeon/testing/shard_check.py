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
from pigeon.core.errors import Unavailable
from pigeon.storage import records as R


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


class _World:
    """The logs of a history cut by log, each with its owner's state, while pairs are handed over between them:
    what `check_handover` drives. `router` applies the metadata log only (routing reads its homes)."""

    def __init__(self, bundles: int, rng):
        self.bundles, self.rng = bundles, rng
        self.router = _fresh()
        self.meta: list = []  # (record, position), the metadata log
        self.logs: dict[int, list] = {}  # log → its (record, position)s, Snapshots among them
        self.owners: dict[int, BrokerState] = {}
        self.counts = {"hand-overs": 0, "redone": 0, "read back": 0}

    def owner(self, log: int) -> BrokerState:
        if log not in self.owners:
            self.owners[log] = self.read_back(log)
        return self.owners[log]

    def read_back(self, log: int, behind: int = 0) -> BrokerState:
        """A new owner's state of `log`: the metadata log — but its last `behind` ShardHomes, which it applies
        only after (its view lags) — then the log read back from its latest Snapshot, as `Engine.load_log` does."""
        self.counts["read back"] += 1
        st = _fresh()
        held = self.meta[len(self.meta) - behind:] if behind else []
        for rec, at in self.meta[:len(self.meta) - len(held)]:
            st.apply(rec, at)
        entries = self.logs.get(log, [])
        cut = max((i for i, (rec, _) in enumerate(entries) if rec.TYPE == R.RecordType.SNAPSHOT), default=None)
        if cut is None:
            st.apply(R.Reset(log, self.bundles))
        else:
            st.apply(entries[cut][0])
            entries = entries[cut + 1:]
        for rec, at in entries:
            if rec.TYPE != R.RecordType.SNAPSHOT and (rec.TYPE != R.RecordType.PUBLISH or rec.topic in st.topics_by_uid):
                st.apply_in_log(rec, log, self.bundles, at)
        for rec, at in held:
            st.apply(rec, at)
        return st

    def lag(self) -> int:
        """How many ShardHomes a new owner's metadata log may lack: some of the trailing ones."""
        n = 0
        while n < len(self.meta) and self.meta[-1 - n][0].TYPE == R.RecordType.SHARD_HOME:
            n += 1
        return self.rng.randint(0, n)

    def commit_meta(self, rec: R.Record, at: int) -> None:
        self.meta.append((rec, at))
        self.router.apply(rec, at)
        for st in self.owners.values():
            st.apply(rec, at)

    def commit(self, part: R.Record, at: int) -> str | None:
        log = self.router.log_of(part, self.bundles)
        st = self.owner(log)
        try:
            mine = st.log_of(part, self.bundles)
        except Unavailable:
            return f"the owner of log {log} refuses a {part.TYPE.name} the metadata log routes to it"
        if mine != log:
            return f"a {part.TYPE.name} routed to log {log} belongs to log {mine} at its owner"
        self.logs.setdefault(log, []).append((part, at))
        st.apply(part, at)
        return None

    def hand_over(self, at: int) -> str | None:
        """Hand a random pair to a random other log, the old home's owner lost now and then between the steps
        (its next owner reads the log back and finishes from the ShardOut it finds), as node.handover does."""
        topics = [t for t in self.router.topics_by_uid.values() if not t.deleted]
        if not topics:
            return None
        t = self.rng.choice(topics)
        k = self.rng.randrange(len(t.shards))
        src = self.router.shard_logs(t, self.bundles)[k]
        dst = self.rng.choice([log for log in range(1, self.bundles + 1) if log != src])
        gen = t.gens.get(k, 0) + 1
        old = self.owner(src)
        out = R.ShardOut(t.uid, k, src, dst, gen, 0.0, images.pair_images(old, old.topics_by_uid[t.uid], k))
        self.logs.setdefault(src, []).append((out, at))
        old.apply(out)
        crash = self.rng.choice(["none", "none", "after out", "after in"])
        if crash == "after out":
            out = self._redo(src, t.uid, k, gen)
            if isinstance(out, str):
                return out
        new = self.owner(dst)
        if new.topics_by_uid[t.uid].gens.get(k, 0) < gen:  # (a ShardIn is committed only while not homed there)
            self.logs.setdefault(dst, []).append((R.ShardIn(t.uid, k, dst, src, gen, 0.0, out.images), at))
            new.apply(self.logs[dst][-1][0])
        if crash == "after in":
            if self.rng.random() < 0.5:
                self.owners[dst] = self.read_back(dst, self.lag())
            out = self._redo(src, t.uid, k, gen)
            if isinstance(out, str):
                return out
            if self.owner(dst).topics_by_uid[t.uid].gens.get(k, 0) < gen:
                return f"shard {k} of topic {t.uid}: log {dst} lost its ShardIn"
        self.commit_meta(R.ShardHome(t.uid, k, dst, gen), at)
        self.counts["hand-overs"] += 1
        return None

    def _redo(self, log: int, topic: int, shard: int, gen: int):
        """The old home's next owner: the ShardOut it finds pending, or what is wrong."""
        st = self.owners[log] = self.read_back(log, self.lag())
        self.counts["redone"] += 1
        out = st.topics_by_uid[topic].away.get(shard)
        if out is None or out.gen != gen:
            return f"shard {shard} of topic {topic}: log {log} read back holds no pending ShardOut {gen}"
        return out

    def snapshot(self) -> None:
        if self.logs:
            log = self.rng.choice(sorted(self.logs))
            self.logs[log].append((images.bundle_snapshot(self.owner(log), log, self.bundles), 0))

    def take_over(self) -> None:
        if self.logs:
            log = self.rng.choice(sorted(self.logs))
            self.owners[log] = self.read_back(log, self.lag())


def _fresh() -> BrokerState:
    st = BrokerState()
    st.dispatch_off()
    return st


def check_handover(history, bundles: int, rng, rate: float = 0.05, counts: dict | None = None) -> list[str]:
    """Invariants H1 and S2 across logs (docs/cluster.md, "Scale-out" 4.3) over a history: replay it cut by log,
    each log applied by its owner's state, while (topic, shard) pairs are handed over between logs at random
    points (`rate` a record) — the old home's owner lost now and then after its ShardOut or after the new home's
    ShardIn, its next owner finishing the hand-over from the log — and logs are cut by snapshots and read back by
    new owners whose metadata log lags. Every pair's state at its last home's owner must be what the history
    applied whole gives. The problems, in words (empty: they hold); `counts` gets how many hand-overs, redos and
    read-backs were made."""
    whole = _fresh()
    world = _World(bundles, rng)
    if counts is not None:
        world.counts = counts
        counts.update({k: counts.get(k, 0) for k in ("hand-overs", "redone", "read back")})
    problems: list[str] = []
    for rec, at in history:
        for part in whole.split(rec):
            whole.apply(part, at)
        if rec.META:
            world.commit_meta(rec, at)
            continue
        for part in world.router.split(rec):
            if world.router.log_of(part, bundles) == META_LOG:  # (a record of a subscription gone: every state's)
                world.commit_meta(part, at)
                continue
            problem = world.commit(part, at)
            if problem:
                return [problem]
        r = rng.random()
        if r < rate:
            problem = world.hand_over(at)
            if problem:
                return [problem]
        elif r < rate * 1.5:
            world.snapshot()
        elif r < rate * 2:
            world.take_over()
    for t in whole.topics_by_uid.values():
        routed = world.router.topics_by_uid.get(t.uid)
        if t.deleted or routed is None:
            continue
        for k, log in enumerate(world.router.shard_logs(routed, bundles)):
            if shard_view(world.owner(log), t.uid, k) != shard_view(whole, t.uid, k):
                problems.append(f"shard {k} of topic {t.name} at log {log} is not the state the history gives")
        want = world.router.shard_logs(routed, bundles)
        for log, st in sorted(world.owners.items()):
            mine = st.topics_by_uid.get(t.uid)
            if mine is not None and (st.shard_logs(mine, bundles) != want or mine.away):
                problems.append(f"the owner of log {log} routes topic {t.name} to {st.shard_logs(mine, bundles)} "
                                f"(away: {sorted(mine.away)}); the metadata log to {want}")
    return problems


def restarted(state: BrokerState) -> BrokerState:
    """A fresh state loaded as a node's restart loads a checkpoint of `state`: its metadata records, then its
    images (dispatch off, as recovery leaves it)."""
    st = BrokerState()
    st.dispatch_off()
    for rec in images.meta_records(state):
        st.apply(rec)
    for image in images.images(state):
        st.restore(image)
    return st
