"""A ledger's writer and the recovery of a ledger whose writer is gone, as state machines: events in (answers of
the ensemble's members), actions out (what to send, what became durable, where to close the ledger).

The writer (docs/cluster.md, "A log is a sequence of ledgers") owns the rules:

  * every entry goes to every member of the ensemble, in offset order; a member answers once it has the entry
    durable, and answers in order, so what it has answered is a prefix;
  * the last-add-confirmed position (LAC) is the end of the prefix that at least Qa members have answered; only
    entries below it are reported durable (then their publishes and acks are answered), and it never goes back;
  * when a member fails, the writer stops: the ledger is to be closed at the LAC, and the entries at and above
    it — sent, not yet confirmed — are to be appended again, in order, to the next ledger. Nothing confirmed is
    lost, nothing unconfirmed is reported durable, no member is waited for.

Recovery owns the rules of docs/cluster.md's steps 1–3:

  * fence every member; decide once Qa have answered with the end they hold — at least the recovery quorum
    `E − Qa + 1` (Qa is a majority), so the old writer can no longer reach Qa and every entry it had acknowledged
    is below the highest end heard; members answering after that are left alone. When members are known to be
    gone and Qa can no longer answer, the recovery quorum alone decides (it still sees every acknowledged
    entry); the ledger then closes under-replicated, on the members that remain, for repair to complete;
  * copy each entry between the lowest and the highest end from a member that has it to the answering members
    that do not, in offset order (members hold prefixes), one entry at a time — so on close every entry below
    the end is on at least Qa members;
  * close at the highest end — never lower: if no reachable member holds an entry below it, or fewer than the
    recovery quorum can answer, recovery fails (and is tried again later) rather than drop what may have been
    acknowledged.

Pure: the node sends what the actions say and feeds back what comes; the simulator and the tests drive it with
members that answer late, in any order, or never."""

from __future__ import annotations

from dataclasses import dataclass

from pigeon.cluster.quorum import Replication


@dataclass(frozen=True, slots=True)
class Fence:
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Read:
    member: str
    offset: int


@dataclass(frozen=True, slots=True)
class Write:
    members: tuple[str, ...]
    offset: int
    entry: bytes


@dataclass(frozen=True, slots=True)
class Close:
    end: int


@dataclass(frozen=True, slots=True)
class Failed:
    reason: str


@dataclass(frozen=True, slots=True)
class Send:
    members: tuple[str, ...]
    offset: int
    entry: bytes


@dataclass(frozen=True, slots=True)
class Confirmed:
    lac: int  # every entry below is durable on at least Qa members


@dataclass(frozen=True, slots=True)
class Roll:
    close_at: int  # close the ledger here (its LAC) …
    resend: tuple[bytes, ...]  # … and append these again, in order, to the next ledger (offsets close_at, …)
    why: str


Action = Fence | Read | Write | Close | Failed | Send | Confirmed | Roll


class Writer:
    def __init__(self, first: int, ensemble: list[str], replication: Replication):
        if len(set(ensemble)) != len(ensemble) or len(ensemble) != replication.ensemble:
            raise ValueError(f"an ensemble of {replication.ensemble} distinct members is needed, got {ensemble}")
        self.first, self.ensemble, self.rep = first, tuple(ensemble), replication
        self.next = first  # the offset the next entry gets
        self.lac = first
        self.answered = {m: first for m in ensemble}  # the end of what each member has answered
        self.unconfirmed: list[bytes] = []  # entries [lac, next)
        self.stopped = False

    def append(self, entry: bytes) -> list[Action]:
        if self.stopped:
            raise RuntimeError("this ledger is being closed: append to the next one")
        offset = self.next
        self.next += 1
        self.unconfirmed.append(entry)
        return [Send(self.ensemble, offset, entry)]

    def acked(self, member: str, offset: int) -> list[Action]:
        """`member` has the entry at `offset` durable (and, answering in order, every entry before it)."""
        if member not in self.answered or offset != self.answered[member]:
            return []
        return self.acked_through(member, offset + 1)

    def acked_through(self, member: str, end: int) -> list[Action]:
        """`member` has every entry below `end` durable (its answer to a request of several entries)."""
        if self.stopped or member not in self.answered or end <= self.answered[member] or end > self.next:
            return []
        self.answered[member] = end
        lac = sorted(self.answered.values(), reverse=True)[self.rep.ack_quorum - 1]
        if lac <= self.lac:
            return []
        del self.unconfirmed[:lac - self.lac]
        self.lac = lac
        return [Confirmed(lac)]

    def failed(self, member: str, why: str = "") -> list[Action]:
        if self.stopped or member not in self.answered:
            return []
        self.stopped = True
        return [Roll(self.lac, tuple(self.unconfirmed), f"{member} failed{': ' + why if why else ''}")]

    def stop(self, why: str) -> list[Action]:
        """Close the ledger of the writer's own accord (to move to a better ensemble), as a failure would."""
        if self.stopped:
            return []
        self.stopped = True
        return [Roll(self.lac, tuple(self.unconfirmed), why)]


class Recovery:
    def __init__(self, first: int, ensemble: list[str], replication: Replication):
        if len(set(ensemble)) != len(ensemble) or len(ensemble) != replication.ensemble:
            raise ValueError(f"an ensemble of {replication.ensemble} distinct members is needed, got {ensemble}")
        self.first, self.ensemble, self.rep = first, list(ensemble), replication
        self.ends: dict[str, int] = {}  # answered members → the end they hold (moves up as entries are copied)
        self.gone: set[str] = set()  # members that failed
        self.end: int | None = None  # the recovered end, once decided
        self.offset = first  # the entry being copied
        self.reading: str | None = None
        self.writing: set[str] = set()
        self.done = False

    def start(self) -> list[Action]:
        return [Fence(tuple(self.ensemble))]

    # --- events --------------------------------------------------------------------------------------------
    def fenced(self, member: str, end: int) -> list[Action]:
        """`member` fenced the ledger; it holds the entries [first, end)."""
        if self.done or self.end is not None or member in self.gone or member in self.ends \
                or member not in self.ensemble:
            return []
        if end < self.first:
            return self._fail(f"{member} answered an end ({end}) below the ledger's first entry ({self.first})")
        self.ends[member] = end
        return self._decide()

    def _decide(self) -> list[Action]:
        """Decide the end once Qa answered — or the recovery quorum, when every other member is gone."""
        answered, silent = len(self.ends), len(self.ensemble) - len(self.gone) - len(self.ends)
        if answered >= self.rep.ack_quorum or (answered >= self.rep.recovery_quorum and silent == 0):
            self.end = max(self.ends.values())
            self.offset = min(self.ends.values())
            return self._next()
        return []

    def unreachable(self, member: str) -> list[Action]:
        if self.done or member in self.gone or member not in self.ensemble:
            return []
        self.gone.add(member)
        self.ends.pop(member, None)
        if self.end is None:
            if len(self.ensemble) - len(self.gone) < self.rep.recovery_quorum:
                return self._fail(f"only {len(self.ensemble) - len(self.gone)} of the ensemble can still answer; "
                                  f"recovery needs {self.rep.recovery_quorum}")
            return self._decide()
        remain = min(self.rep.ack_quorum, len(self.ensemble) - len(self.gone))
        if len(self.ends) < max(1, remain):  # a fresh attempt hears from the members still up and copies to them
            return self._fail(f"only {len(self.ends)} members remain to hold the recovered entries; "
                              f"{max(1, remain)} are needed")
        if member == self.reading:
            self.reading = None
            return self._next()
        if member in self.writing:
            self.writing.discard(member)
            if not self.writing:
                return self._advance()
        return []

    def read(self, member: str, offset: int, entry: bytes | None) -> list[Action]:
        """The answer to Read(member, offset): the entry, or None when the member does not have it after all."""
        if self.done or member != self.reading or offset != self.offset:
            return []
        self.reading = None
        if entry is None:
            self.ends[member] = min(self.ends[member], offset)
            return self._next()
        targets = tuple(m for m in self.ensemble if m in self.ends and self.ends[m] <= offset)
        if not targets:  # the members that lacked it are gone
            return self._advance()
        self.writing = set(targets)
        return [Write(targets, offset, entry)]

    def written(self, member: str, offset: int) -> list[Action]:
        if self.done or offset != self.offset or member not in self.writing:
            return []
        self.writing.discard(member)
        self.ends[member] = max(self.ends[member], offset + 1)
        return self._advance() if not self.writing else []

    # --- steps ---------------------------------------------------------------------------------------------
    def _advance(self) -> list[Action]:
        self.offset += 1
        return self._next()

    def _next(self) -> list[Action]:
        """Copy the next entry some answering member lacks, or close."""
        while self.offset < self.end and all(e > self.offset for e in self.ends.values()):
            self.offset += 1
        if self.offset >= self.end:
            self.done = True
            return [Close(self.end)]
        sources = [m for m in self.ensemble if self.ends.get(m, -1) > self.offset]
        if not sources:
            return self._fail(f"no reachable member holds entry {self.offset} (below the recovered end "
                              f"{self.end}): it may have been acknowledged, so recovery must wait for its holders")
        self.reading = sources[0]
        return [Read(self.reading, self.offset)]

    def _fail(self, why: str) -> list[Action]:
        self.done = True
        return [Failed(why)]
