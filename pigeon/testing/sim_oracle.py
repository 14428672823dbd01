"""What the single-node simulator's clients were told and hold (testing.simulator), as its own bookkeeping —
never read from the broker — and the durable state as plain values, for comparing a recovered state with a
replay of the surviving log."""

from __future__ import annotations

from dataclasses import dataclass, field

from pigeon.broker.state import BrokerState
from pigeon.broker.topic import SHARD_MASK
from pigeon.storage import records as R


class Stream:
    """A client's stream: the lease owner told when leases end."""

    def __init__(self):
        self.released: list[int] = []

    def release(self, num: int) -> None:
        self.released.append(num)

    def release_all(self, nums) -> None:
        self.released.extend(nums)


@dataclass
class Msg:
    topic: int
    num: int
    data: bytes
    key: str  # ordering key, "" when none (or when the message waits for an activation time)
    end: int  # journal position after its record


@dataclass
class Oracle:
    """What clients were told, as the simulator's own bookkeeping (never read from the broker)."""

    msgs: dict[tuple[int, int], Msg] = field(default_factory=dict)  # (topic uid, num) → message
    durable_msgs: set[tuple[int, int]] = field(default_factory=set)  # publishes answered OK (durable)
    pending_acks: list[tuple[int, int, list[int]]] = field(default_factory=list)  # (end, sub, nums)
    durable_acks: dict[int, set[int]] = field(default_factory=dict)  # sub uid → nums whose ack was durable
    dead: dict[int, set[int]] = field(default_factory=dict)  # sub uid → nums taken out for dead-lettering

    def durable_up_to(self, durable: int, subs_by_uid: dict) -> None:
        """The journal is durable up to `durable`: the publishes and acks answered by then were answered OK (a
        seek's entry, nums None: only what it left acked stays acked)."""
        self.durable_msgs |= {k for k, m in self.msgs.items() if m.end <= durable}
        keep = []
        for end, uid, nums in self.pending_acks:
            if end > durable:
                keep.append((end, uid, nums))
            elif uid in subs_by_uid:
                s = subs_by_uid[uid]
                if nums is None:
                    self.durable_acks[uid] = {n for n in self.durable_acks[uid] if s.is_acked(n)}
                else:
                    self.durable_acks[uid].update(nums)
        self.pending_acks = keep


    def seeks_cut(self, seeks, history, tail: int, recovered: BrokerState) -> None:
        """A crash cut the journal at `tail` through a seek of a spread topic, committed one record a shard
        (`seeks`: (start, end, sub uid); `history`: (record, position, end)): the client was not answered, and
        the parts that survived took effect — the acks they undid on their shards were undone by the seek."""
        for start, end, uid in seeks:
            if start < tail < end and uid in recovered.subs_by_uid:
                kept = {rec.shard for rec, at, e in history if start <= at and e <= tail
                        and rec.TYPE == R.RecordType.SEEK and rec.sub == uid}
                s = recovered.subs_by_uid[uid]
                self.durable_acks[uid] = {n for n in self.durable_acks[uid] if n & SHARD_MASK not in kept
                                          or s.is_acked(n)}
        seeks.clear()


def summary(st: BrokerState, now: float) -> dict:
    """The durable state, as plain values (leases that ran out by `now` count as ended on both sides)."""
    subs = {}
    for uid, s in st.subs_by_uid.items():
        leases = {n: (d, v, k) for n, (d, v, _, k) in s.leases.items() if d > now}
        counts = dict(s.versions)
        counts.update({n: v for n, (d, v, _, _) in s.leases.items() if d <= now})
        subs[uid] = (s.name, s.export_state(), leases, counts, dict(s.parked), s.detached, s.dead_letter_open)
    return {
        "topics": {u: (t.name, t.deleted, [ix.next for ix in t.shards]) for u, t in st.topics_by_uid.items()},
        "subs": subs,
        "snaps": {n: (sn.topic_uid, sn.floors, sn.acked) for n, sn in st.snapshots.items()},
        "next_uid": st.next_uid,
    }
