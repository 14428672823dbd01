"""The fault runs' history and its check (pigeon.testing.chaos, .fault_rounds, .regions_chaos): what the workload
was told and saw — publishes acknowledged, deliveries, acks returned, the leases behind them — and what of it breaks
a rule: an acknowledged publish lost, an acknowledged ack undone, a key's messages out of order, a publish
acknowledged where no quorum could have stored it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from pigeon.api.spread import shard_of_message
from pigeon.core.bundles import shard_log

BUNDLES = 16  # the test clusters' bundle count (pigeon.testing.chaos)


@dataclass
class History:
    published: dict[str, str] = field(default_factory=dict)  # message id → data, publishes acknowledged
    publish_failed: int = 0
    publish_times: list[tuple[int, float, float, str]] = field(default_factory=list)  # (topic, sent, answered, id)
    answered: dict[str, float] = field(default_factory=dict)  # message id → when its publish was answered
    deliveries: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # sub → [(message id, sent)]
    first_seen: dict[str, dict[str, float]] = field(default_factory=dict)  # sub → data → first delivery's time
    data_of: dict[str, str] = field(default_factory=dict)  # message id → data, of every delivery
    acked: dict[str, dict[str, float]] = field(default_factory=dict)  # sub → message id → when the ack returned
    # the leases behind deliveries and acks, where the workload notes them: (sub, message id, sent) → the version
    # its ack id carries; sub → message id → the highest version acknowledged
    versions: dict[tuple[str, str, float], int] = field(default_factory=dict)
    acked_versions: dict[str, dict[str, int]] = field(default_factory=dict)
    ack_failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    start: float = field(default_factory=time.monotonic)


@dataclass
class Checked:
    """What the history check found, and the load it looked at."""
    published: int
    delivered: int
    lost: list[str]
    undone: list[str]
    disorder: list[str]
    publish_failed: int
    ack_failed: int
    late: list[str]  # deliveries that came after their message's ack under the lease acked or an earlier one

    @property
    def ok(self) -> bool:
        return not (self.lost or self.undone or self.disorder)

    @staticmethod
    def of(w: "Workload") -> "Checked":
        lost, undone, disorder, late = check(w.h, w.subs)
        return Checked(len(w.h.published), sum(len(v) for v in w.h.deliveries.values()), lost, undone, disorder,
                       w.h.publish_failed, w.h.ack_failed, late)


def lease_of(ack_id: str) -> int:
    """The lease an ack id of Pigeon's names (its version; a seek's generation above it): a message's later
    deliveries carry higher ones."""
    return int(ack_id.rsplit(".", 1)[1])


def expected(h: History, topic: int) -> dict[str, str]:
    """The acknowledged publishes of topic number `topic` (its data starts with the number)."""
    prefix = f"{topic}:"
    return {m: d for m, d in h.published.items() if d.startswith(prefix)}


def check(h: History, subs: dict[str, int]) -> tuple[list[str], list[str], list[str], list[str]]:
    """(lost, undone, out of order, late) — each a list of short descriptions. `subs`: subscription → topic number.
    A delivery after its message's ack is an ack undone when it is of a later lease than the one acknowledged (or
    the workload notes no leases); of that lease or an earlier one, it is a copy that was on its way before the
    ack (a stream's response that a node paused, SIGSTOP, held in its buffers) — `late`, not a broken rule."""
    lost, undone, disorder, late = [], [], [], []
    for sub, topic in subs.items():
        seen = {mid for mid, _ in h.deliveries.get(sub, [])}
        lost += [f"{sub.rsplit('/', 1)[-1]}: {d} (id {m}, answered at {h.answered.get(m, 0) - h.start:.1f} s)"
                 for m, d in expected(h, topic).items() if m not in seen]
        acked, acked_versions = h.acked.get(sub, {}), h.acked_versions.get(sub, {})
        for mid, sent in h.deliveries.get(sub, []):
            if mid in acked and sent > acked[mid]:
                said = (f"{sub.rsplit('/', 1)[-1]}: {h.data_of.get(mid, mid)} delivered by a pull sent "
                        f"{sent - acked[mid]:.2f} s after its ack returned (at {acked[mid] - h.start:.1f} s)")
                version = h.versions.get((sub, mid, sent))
                if version is not None and version <= acked_versions.get(mid, -1):
                    late.append(said + f", under lease {version} (acked: {acked_versions[mid]})")
                else:
                    undone.append(said)
    published = set(h.published.values())
    for ordered in (s for s in subs if s.endswith("-ordered")):
        by_key: dict[str, list[tuple[int, float]]] = {}
        for data, t in h.first_seen.get(ordered, {}).items():
            if data not in published:
                continue  # not acknowledged to the publisher: its place in the order is not promised
            _, key, seq = data.split(":")
            by_key.setdefault(key, []).append((int(seq), t))
        for key, items in by_key.items():
            items.sort()
            for (s1, t1), (s2, t2) in zip(items, items[1:]):
                if t2 < t1:
                    disorder.append(f"{ordered.rsplit('/', 1)[-1]} key {key}: {s2} came before {s1}")
    return lost, undone, disorder, late


def acked_while_cut(h: History, topic: str, cut_off: tuple[float, dict[int, float]], spread: bool) -> list[str]:
    """Publishes to topic number 0 (named `topic`) sent into a cut of a node from its peers and acknowledged while
    the bundle of their shard was the cut node's — `cut_off`: the cut's start, and each bundle the node owned → the
    last time etcd still said so. It could reach no member then: no quorum could have stored them."""
    start, held = cut_off
    return [f"a publish sent {sent - start:.1f} s into the cut was acknowledged {done - sent:.1f} s later"
            for i, sent, done, mid in h.publish_times if i == 0 and start <= sent
            and done < held.get(shard_log(topic, shard_of_message(mid) or 0, BUNDLES, spread) - 1, 0.0)]
