"""A log's ledger list (docs/cluster.md, "A log is a sequence of ledgers") and the changes its owner plans on it.
Owns the rules:

  * ledger ids are `log << 20 | n`, n the ledger's place in its log's list, never reused — also after the list was
    cut (the next n follows the last ledger's);
  * a cut moves where a takeover starts reading to a confirmed snapshot, and drops the ledgers that end at or before
    both that snapshot and the oldest message the bundle still needs (a message is read from its ledger when it is
    delivered: docs/cluster.md, "Scale-out"); the ledger holding the snapshot is marked with it;
  * a new ledger's ensemble is E of the nodes that are up (as many as there are machines up, when fewer, never fewer
    than Qa), one per machine at most, chosen by rendezvous hashing on the ledger's id and spread over zones; the
    members that failed a write lately are left out unless too few machines remain without them;
  * repair gives a closed ledger short of members that are up one more, chosen by rendezvous hashing among the
    nodes that are up and on a machine the ledger has no copy on yet (one copy per machine at most);
  * a roll closes the list's last ledger — only if it is the open ledger the owner writes: any other last ledger
    means another node changed the list, and the log is no longer this owner's — and the next starts where it
    ended;
  * a takeover closes an open last ledger where recovery found its entries end, reads every ledger from where
    the list was cut, and starts the next ledger where the last one ended.

Pure: the node reads and writes the list in the metadata store (node.bundle_logs) and performs what these decide."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pigeon.cluster.quorum import Replication, choose_ensemble, ensemble_size, machines

LEDGER_SEQ_BITS = 20
_SEQ_MASK = (1 << LEDGER_SEQ_BITS) - 1
_DECODED: dict[bytes, list["LedgerInfo"]] = {}  # a list's value → its ledgers as parsed (never handed out)
_DECODED_MAX = 1024  # values kept at most (then forgotten all at once): a node reads the lists of the logs it owns


@dataclass
class LedgerInfo:
    id: int
    epoch: int  # the ownership epoch of the node that wrote it
    members: dict[str, str]  # node id → where it is dialled (NodeInfo.dial), the ensemble in order
    first: int  # the log offset of its first entry
    end: int | None = None  # the log offset after its last entry, once closed
    start: int | None = None  # on one ledger once the log was cut: where a takeover starts reading (a Snapshot
    #                           record); the ledgers before it are kept only for the messages still needed

    @property
    def seq(self) -> int:
        return self.id & ((1 << LEDGER_SEQ_BITS) - 1)

    def copy(self) -> "LedgerInfo":
        return LedgerInfo(self.id, self.epoch, dict(self.members), self.first, self.end, self.start)

    def to_dict(self) -> dict:
        return {"id": self.id, "epoch": self.epoch, "members": self.members, "first": self.first, "end": self.end,
                "start": self.start}

    @staticmethod
    def decode_list(raw: bytes | None) -> list["LedgerInfo"]:
        """The list `raw` holds: new objects every call (callers change them). A list is read far more often than
        it changes — every placement pass, repair, cut and takeover reads its logs' lists — so the parse of each
        value is kept (_DECODED) and copied."""
        if not raw:
            return []
        if type(raw) is not bytes:
            return [LedgerInfo(**d) for d in json.loads(raw)]
        parsed = _DECODED.get(raw)
        if parsed is None:
            parsed = [LedgerInfo(**d) for d in json.loads(raw)]
            if len(_DECODED) >= _DECODED_MAX:
                _DECODED.clear()
            _DECODED[raw] = parsed
        return [LedgerInfo(lg.id, lg.epoch, dict(lg.members), lg.first, lg.end, lg.start) for lg in parsed]

    @staticmethod
    def encode_list(ledgers: list["LedgerInfo"]) -> bytes:
        return json.dumps([lg.to_dict() for lg in ledgers]).encode()


def next_seq(ledgers: list[LedgerInfo]) -> int:
    """The sequence number of a log's next ledger (ids are never reused, also after the list was cut)."""
    return ledgers[-1].seq + 1 if ledgers else 0


def ledger_id(log_id: int, seq: int) -> int:
    assert seq < 1 << LEDGER_SEQ_BITS and log_id < 1 << (32 - LEDGER_SEQ_BITS)
    return log_id << LEDGER_SEQ_BITS | seq


class DeletedLedgers:
    """The ledgers a storage member deleted, held as each log's highest deleted sequence number: a list is only
    ever cut by a prefix and ids are never reused, so once a ledger is deleted every earlier ledger of its log
    is gone too — dropped by that cut or an earlier one, or never listed (a roll that failed). Its size is the
    number of logs, however long the cluster runs (a set of every id grew by a ledger per roll, for good)."""

    def __init__(self, ids=()):
        self.top: dict[int, int] = {}  # log id → the highest sequence number deleted
        self.update(ids)

    def __contains__(self, lid: int) -> bool:
        top = self.top.get(lid >> LEDGER_SEQ_BITS)
        return top is not None and lid & _SEQ_MASK <= top

    def update(self, ids) -> None:
        for lid in ids:
            log, seq = lid >> LEDGER_SEQ_BITS, lid & _SEQ_MASK
            if seq > self.top.get(log, -1):
                self.top[log] = seq

    def ids(self) -> list[int]:
        """The highest deleted ledger of each log (what a store writes down: `DeletedLedgers(ids)` again)."""
        return sorted(log << LEDGER_SEQ_BITS | seq for log, seq in self.top.items())


def cut_at(ledgers: list[LedgerInfo], at: int, keep_from: int | None = None
           ) -> tuple[list[LedgerInfo], list[LedgerInfo]] | None:
    """The list with reading moved to offset `at` (a snapshot's) and the ledgers that end at or before `keep_from`
    (the oldest message still needed, at most `at`; `at` when not given) dropped; and the ledgers that leave it.
    None when it cannot be cut there (no ledger holds `at`, or one needed is gone already)."""
    keep_from = at if keep_from is None else min(keep_from, at)
    keep = [lg.copy() for lg in ledgers if lg.end is None or lg.end > keep_from]
    if not keep or keep[0].first > keep_from:
        return None
    holder = holding(keep, at)
    if holder is None:
        return None
    for lg in keep:
        lg.start = None
    keep[keep.index(holder)].start = at
    return keep, ledgers[:len(ledgers) - len(keep)]


def holding(ledgers: list[LedgerInfo], offset: int) -> LedgerInfo | None:
    """The ledger of the list that holds log offset `offset` (an open ledger holds everything from its first on)."""
    for lg in reversed(ledgers):
        if lg.first <= offset and (lg.end is None or offset < lg.end):
            return lg
        if lg.first <= offset:
            return None
    return None


def repair_target(lg: LedgerInfo, up: set[str], size: int, machine_of: dict[str, str],
                  zones: dict[str, str]) -> str | None:
    """The node a closed ledger should be copied to now (None: it has `size` members up already, or none up to
    copy from, or no node to copy to). `machine_of`: node → machine; `zones`: node → zone, of the nodes up."""
    live = [n for n in lg.members if n in up]
    held = {machine_of.get(n, n) for n in lg.members}  # a copy on a machine is the machine's one
    spare = sorted(n for n in up if n not in lg.members and machine_of[n] not in held)
    if lg.end is None or not live or len(live) >= size or not spare:
        return None
    return choose_ensemble(lg.id, {n: zones[n] for n in spare}, 1, machine_of=machine_of)[0]


class NotOurs(Exception):
    """The list's last ledger is not the open ledger this owner writes: another node closed or replaced it."""


def rolled(ledgers: list[LedgerInfo], open_id: int, close_at: int) -> list[LedgerInfo]:
    """The list with its open ledger `open_id` closed at log offset `close_at` (the next ledger starts there).
    NotOurs when the list's last ledger is not that one, open."""
    if not ledgers or ledgers[-1].id != open_id or ledgers[-1].end is not None:
        raise NotOurs(f"ledger {open_id} was closed by another node")
    out = [lg.copy() for lg in ledgers]
    out[-1].end = close_at
    return out


def recovered(ledgers: list[LedgerInfo], held: int) -> list[LedgerInfo]:
    """The list with its open last ledger closed after the `held` entries recovery found in it (a takeover)."""
    out = [lg.copy() for lg in ledgers]
    if out and out[-1].end is None:
        out[-1].end = out[-1].first + held
    return out


def reads(ledgers: list[LedgerInfo]) -> list[tuple[LedgerInfo, int, int]]:
    """What a new owner reads of a closed list, in log order: (ledger, first index, entries) — from where the list
    was cut (a snapshot) on; the ledgers before it are read only for the messages delivered from them."""
    at = read_from(ledgers)
    out = []
    for lg in ledgers:
        assert lg.end is not None, f"ledger {lg.id} is open: recover it first"
        if lg.end <= at:  # (wholly before the cut, or empty there)
            continue
        start = max(at - lg.first, 0)
        out.append((lg, start, lg.end - lg.first - start))
    return out


def next_first(ledgers: list[LedgerInfo]) -> int:
    """The log offset the next ledger of a closed list starts at."""
    return ledgers[-1].end if ledgers else 0


def read_from(ledgers: list[LedgerInfo]) -> int:
    """The log offset a takeover reads the list from (where it was cut, else its first ledger's first)."""
    cut = [lg.start for lg in ledgers if lg.start is not None]
    return cut[-1] if cut else ledgers[0].first if ledgers else 0


def to_widen(open_members: dict[int, int], nodes_up: dict[str, str], machine_of: dict[str, str],
             replication: Replication) -> tuple[int, list[int]]:
    """(the ensemble size machines up allow now, the logs whose open ledger is narrower and should move to a full
    ensemble): a ledger opened while nodes were down is widened once enough machines are up again. Machines, not
    nodes: two workers of one machine make no wider ensemble — counting them rolled such a ledger onto another of
    the same size at every pass. `open_members`: log → its open ledger's member count, for the logs not rolling;
    `nodes_up`: node → zone of the storage nodes up and not suspected."""
    size = ensemble_size(nodes_up, machine_of, replication.ensemble)
    return size, sorted(log for log, n in open_members.items() if n < size)


class TooFewNodes(Exception):
    """Fewer machines are up than the ack quorum: no ledger can be opened now."""


def new_ensemble(ledger: int, zones: dict[str, str], machine_of: dict[str, str], avoid: set[str],
                 replication: Replication, me: str) -> list[str]:
    """The members of a new ledger, in order. `zones`: node → zone of the nodes up (listening, not cut off);
    `machine_of`: node → the machine it shares ("" for its own); `avoid`: members that failed a write lately; `me`:
    the writer, a member whenever it is usable: its copy is the entry it writes to its own journal anyway (the
    store borrows it), so a ledger costs E − 1 copies over the network, and the owner reads its messages back
    from its own disk."""
    usable = {n: z for n, z in zones.items() if n not in avoid}
    if machines(usable, machine_of) < replication.ack_quorum:  # too few without them: they are tried again
        usable = dict(zones)
    size = ensemble_size(usable, machine_of, replication.ensemble)
    if size < replication.ack_quorum:
        raise TooFewNodes(f"storage nodes on {machines(usable, machine_of)} machine(s) are up; "
                          f"{replication.ack_quorum} are needed")
    return choose_ensemble(ledger, usable, size, machine_of=machine_of, first=me)

