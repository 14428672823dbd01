"""A takeover, composed from the pure parts: owner A writes a ledger through `Writer`; B takes over mid-flight and
runs `Recovery` against the same storage members, which fence the ledger when B asks (a fenced member refuses
A's later appends). Messages between the three arrive in any order. Whatever the schedule: B closes at or past
every entry A was told is durable — also those A is told about after B decided — and each such entry is on at
least Qa members with the bytes A wrote (invariants L1 and O1 of docs/cluster.md)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.cluster.ledger import Close, Confirmed, Fence, Read, Recovery, Roll, Send, Write, Writer
from pigeon.cluster.quorum import Replication


class Member:
    """A storage member's copy of one ledger: a prefix of entries, and whether it is fenced."""

    def __init__(self):
        self.entries: list[bytes] = []
        self.fenced = False

    def append(self, offset: int, entry: bytes) -> bool:
        """A's append: refused once fenced; entries arrive in order (one stream per member)."""
        if self.fenced or offset != len(self.entries):
            return False
        self.entries.append(entry)
        return True


@settings(max_examples=200, deadline=None)
@given(e=st.integers(1, 5), data=st.data())
def test_a_takeover_keeps_everything_the_old_owner_confirmed(e, data):
    qa = data.draw(st.integers(e // 2 + 1, e))
    rep = Replication(e, e, qa)
    names = [f"m{i}" for i in range(e)]
    members = {m: Member() for m in names}
    a = Writer(0, names, rep)
    b = Recovery(0, names, rep)
    inbox: list[tuple[str, tuple]] = []  # messages on their way, delivered in any order
    confirmed = 0
    outcome = None

    def from_a(actions):
        nonlocal confirmed
        for act in actions:
            if isinstance(act, Send):
                inbox.extend(("append", (m, act.offset, act.entry)) for m in act.members)
            elif isinstance(act, Confirmed):  # (may still come after B decided: any Qa acks include a member
                confirmed = act.lac              # that took the entry before its fence, so B's end covers it)
            else:
                assert isinstance(act, Roll)

    def from_b(actions):
        nonlocal outcome
        for act in actions:
            if isinstance(act, Fence):
                inbox.extend(("fence", (m,)) for m in act.members)
            elif isinstance(act, Read):
                inbox.append(("read", (act.member, act.offset)))
            elif isinstance(act, Write):
                inbox.extend(("copy", (m, act.offset, act.entry)) for m in act.members)
            else:
                outcome = act

    def deliver(kind: str, args: tuple) -> None:
        if kind == "append":
            m, offset, entry = args
            if members[m].append(offset, entry):
                from_a(a.acked(m, offset))
        elif kind == "fence":
            (m,) = args
            members[m].fenced = True
            from_b(b.fenced(m, len(members[m].entries)))
        elif kind == "read":
            m, offset = args
            from_b(b.read(m, offset, members[m].entries[offset] if offset < len(members[m].entries) else None))
        else:  # B copies an entry to a member that lacks it (fenced members take B's writes)
            m, offset, entry = args
            assert offset == len(members[m].entries), "recovery wrote a gap"
            members[m].entries.append(entry)
            from_b(b.written(m, offset))

    started = False
    for _ in range(200):
        if outcome is not None:
            break
        choices = ["a_append"] * (not a.stopped) + ["deliver"] * bool(inbox) + ["b_start"] * (not started)
        if not choices:
            break
        step = data.draw(st.sampled_from(choices))
        if step == "a_append":
            from_a(a.append(b"entry-%d" % a.next))
        elif step == "b_start":
            started = True
            from_b(b.start())
        else:
            deliver(*inbox.pop(data.draw(st.integers(0, len(inbox) - 1))))
    if not started:
        from_b(b.start())
    while outcome is None and inbox:  # the rest of the messages arrive; A sends nothing new
        deliver(*inbox.pop(0))
    assert isinstance(outcome, Close), f"with every member up, recovery must close: {outcome}"
    assert outcome.end >= confirmed, f"B closed at {outcome.end}, below A's confirmed {confirmed}"
    holders = [m for m in names if len(members[m].entries) >= outcome.end]
    assert len(holders) >= qa, f"only {holders} hold everything below {outcome.end}"
    for m in holders:
        assert members[m].entries[:outcome.end] == [b"entry-%d" % i for i in range(outcome.end)]
