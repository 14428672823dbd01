"""Quorums, BookKeeper's way. Owns the rules: a ledger is written to an ensemble of E storage nodes; every entry
goes to Qw of them (here Qw = E: no striping) and its writer is answered once Qa have it in their fsync'd
journal; the last-add-confirmed position (LAC) is the end of the longest prefix every entry of which reached Qa;
recovery — after the writer died — must hear from E − Qa + 1 members of the ensemble before it may close the
ledger, because an entry acknowledged to a client sits on at least Qa of them, so any E − Qa + 1 include one
that has it. An ensemble is chosen from the live nodes deterministically (rendezvous hashing on the ledger's id),
never holds two nodes of one machine, and spans as many zones as there are. Pure: no I/O, no clock, no randomness."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class Replication:
    ensemble: int = 3  # E
    write_quorum: int = 3  # Qw
    ack_quorum: int = 2  # Qa

    def __post_init__(self):
        e, w, a = self.ensemble, self.write_quorum, self.ack_quorum
        if not 1 <= a <= w <= e:
            raise ValueError(f"replication needs 1 ≤ ack quorum ≤ write quorum ≤ ensemble (got E={e}, Qw={w}, Qa={a})")
        if w != e:
            raise ValueError("entries go to every member of the ensemble (write quorum = ensemble): striping is not "
                             "supported")
        if 2 * a <= w:
            raise ValueError(f"the ack quorum must be a majority of the write quorum (got Qw={w}, Qa={a}): two "
                             "writers fenced apart could otherwise both be acknowledged")

    @property
    def recovery_quorum(self) -> int:
        """How many members must answer a recovery (fencing) read before the ledger may be closed."""
        return self.ensemble - self.ack_quorum + 1

    def fenced_enough(self, answered: int) -> bool:
        """A fence that reached this many members stops the old writer: it can no longer reach Qa."""
        return answered >= self.recovery_quorum


def _score(ledger: int, node: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{ledger}\x1f{node}".encode(), digest_size=8).digest(), "big")


def machines(nodes: Iterable[str], machine_of: Mapping[str, str] | None = None) -> int:
    """How many machines `nodes` run on (`machine_of`: node id → machine; a node not in it, or "", is one of its
    own)."""
    return len({(machine_of or {}).get(n) or n for n in nodes})


def ensemble_size(nodes: Iterable[str], machine_of: Mapping[str, str] | None, ensemble: int) -> int:
    """How many members a new ledger gets out of `nodes` up: E, or as many machines as they run on when fewer (a
    ledger's copies on one machine's disk are one copy)."""
    return min(ensemble, machines(nodes, machine_of))


def choose_ensemble(ledger: int, nodes: Mapping[str, str], size: int, exclude: Iterable[str] = (),
                    machine_of: Mapping[str, str] | None = None, first: str | None = None) -> list[str]:
    """`size` distinct nodes for `ledger` out of `nodes` (node id → zone; "" for none), ranked by rendezvous
    hashing on the ledger's id — `first`, when it is one of them, ranked before all: at most one node of a machine
    (`machine_of`, as for `machines`: the copies on the workers of one `pigeon serve --workers N` share a disk, so
    they are one copy), spread over the zones first (one per zone in turn), then by rank. Raises ValueError when
    there are not enough machines."""
    skip = set(exclude)
    ranked = sorted((n for n in nodes if n not in skip), key=lambda n: (n != first, -_score(ledger, n), n))
    one_each, seen = [], set()  # the best-ranked node of each machine
    for n in ranked:
        m = (machine_of or {}).get(n) or n
        if m not in seen:
            seen.add(m)
            one_each.append(n)
    ranked = one_each
    if len(ranked) < size:
        raise ValueError(f"an ensemble of {size} needs {size} live storage nodes on as many machines, there are "
                         f"{len(ranked)}")
    by_zone: dict[str, list[str]] = defaultdict(list)
    for n in ranked:
        by_zone[nodes[n]].append(n)
    zones = sorted(by_zone, key=lambda z: ranked.index(by_zone[z][0]))  # the zone of the best-ranked node first
    out: list[str] = []
    while len(out) < size:
        for z in zones:
            if by_zone[z] and len(out) < size:
                out.append(by_zone[z].pop(0))
    return out


def last_add_confirmed(first: int, acks: Mapping[int, int], ack_quorum: int) -> int:
    """The end of the longest run of entries from `first` on whose every entry (offset → members that have it
    durable) reached `ack_quorum`: everything below it may be answered and read."""
    end = first
    while acks.get(end, 0) >= ack_quorum:
        end += 1
    return end


def recovered_end(first: int, answers: Iterable[int]) -> int:
    """Where a recovered ledger closes, given the end each answering member has durable: the highest end any of
    them holds (entries up to it are then copied to the others before closing). With `recovery_quorum` answers
    this is at least every end ever acknowledged."""
    return max([first, *answers])
