"""cluster.ledger.Recovery driven through random schedules: members hold prefixes of a ledger, answer in any order,
and some fail at any moment. Whatever happens, recovery closes at or past every acknowledged entry with every
entry below the end on at least Qa members (on every member left, when fewer remain), never writes a gap into a member, copies the right bytes — or fails
(and is retried later), which it may only do when members failed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.cluster.ledger import Close, Confirmed, Failed, Fence, Read, Recovery, Roll, Send, Write, Writer
from pigeon.cluster.quorum import Replication


def data(offset: int) -> bytes:
    return b"entry-%d" % offset


@st.composite
def scenarios(draw):
    e = draw(st.integers(1, 5))
    a = draw(st.integers(e // 2 + 1, e))
    first = draw(st.integers(0, 5))
    ends = draw(st.lists(st.integers(first, first + 8), min_size=e, max_size=e))
    failing = draw(st.sets(st.integers(0, e - 1), max_size=e))
    return Replication(e, e, a), first, ends, failing


@settings(max_examples=400, deadline=None)
@given(scenario=scenarios(), data_=st.data())
def test_recovery_keeps_every_acknowledged_entry(scenario, data_):
    rep, first, ends, failing = scenario
    members = [f"m{i}" for i in range(rep.ensemble)]
    held = dict(zip(members, ends))  # what each member really holds: [first, end)
    acked = max((x for x in range(first, first + 9) if sum(end >= x for end in ends) >= rep.ack_quorum),
                default=first)
    down: set[str] = set()
    r = Recovery(first, members, rep)
    pending: list = []  # answers on their way: (callable, args)
    outcome = None

    def store(member: str, offset: int):
        """The member writes the entry, then says so."""
        held[member] = max(held[member], offset + 1)
        return r.written(member, offset)

    def perform(actions):
        nonlocal outcome
        for act in actions:
            if isinstance(act, Fence):
                pending.extend((r.fenced, (m, held[m])) for m in act.members)
            elif isinstance(act, Read):
                e = data(act.offset) if act.offset < held[act.member] else None
                pending.append((r.read, (act.member, act.offset, e)))
            elif isinstance(act, Write):
                assert act.entry == data(act.offset), "recovery copied the wrong bytes"
                for m in act.members:
                    assert held[m] >= act.offset, f"a write at {act.offset} would leave a gap in {m} (holds {held[m]})"
                    pending.append((store, (m, act.offset)))
            else:
                assert outcome is None, "recovery ended twice"
                outcome = act

    perform(r.start())
    to_fail = sorted(failing)
    steps = 0
    while outcome is None:
        steps += 1
        assert steps < 500, "recovery neither closed nor failed"
        if to_fail and data_.draw(st.booleans()):
            m = members[to_fail.pop(0)]
            down.add(m)
            perform(r.unreachable(m))
            continue
        live = [p for p in pending if p[1][0] not in down]
        assert live or to_fail, "recovery waits for answers that will never come"
        if not live:
            continue
        i = data_.draw(st.integers(0, len(live) - 1))
        pending.remove(live[i])
        fn, args = live[i]
        perform(fn(*args))

    if isinstance(outcome, Failed):
        assert down, f"recovery failed with every member up: {outcome.reason}"
        return
    assert isinstance(outcome, Close)
    assert outcome.end >= acked, f"closed at {outcome.end}, below the acknowledged {acked}"
    assert outcome.end <= max(ends), "closed past anything any member held"
    holders = [m for m in members if m not in down and held[m] >= outcome.end]
    assert len(holders) >= min(rep.ack_quorum, rep.ensemble - len(down)), f"after the close only {holders} hold every entry"
    assert len(holders) >= 1


def test_late_answers_and_stale_events_are_ignored():
    r = Recovery(10, ["a", "b", "c"], Replication())
    assert r.start() == [Fence(("a", "b", "c"))]
    assert r.fenced("a", 12) == []
    assert r.fenced("a", 15) == [], "a second answer from a member changes nothing"
    assert r.fenced("b", 14) == [Read("b", 12)]  # decided at Qa = 2 answers: end 14, a lacks 12 and 13
    assert r.fenced("c", 20) == [], "a member answering after the decision is left alone"
    assert r.written("a", 12) == [], "a write nobody asked for"
    assert r.read("b", 12, b"x12") == [Write(("a",), 12, b"x12")]
    assert r.written("a", 12) == [Read("b", 13)]
    assert r.read("b", 13, b"x13") == [Write(("a",), 13, b"x13")]
    assert r.written("a", 13) == [Close(14)]


def test_it_fails_rather_than_close_below_what_may_be_acknowledged():
    r = Recovery(0, ["a", "b", "c"], Replication())
    r.start()
    r.fenced("a", 0)
    assert r.fenced("b", 3) == [Read("b", 0)]
    out = r.unreachable("b")
    assert isinstance(out[0], Failed) and "2 are needed" in out[0].reason


def test_with_members_gone_the_recovery_quorum_decides_and_the_ledger_closes_on_those_left():
    r = Recovery(0, ["a", "b", "c"], Replication())  # E = 3, Qa = 2: the recovery quorum is 2
    r.start()
    assert r.unreachable("c") == [], "two may still answer"
    assert r.fenced("a", 4) == [], "Qa = 2 answers are awaited while b may still answer"
    assert r.unreachable("b") == [Failed("only 1 of the ensemble can still answer; recovery needs 2")]
    r = Recovery(0, ["a", "b"], Replication(2, 2, 2))  # a ledger opened while two nodes were up
    r.start()
    r.unreachable("b")
    assert r.fenced("a", 3) == [Close(3)], "every acknowledged entry is on a: it alone decides"


def test_the_ensemble_must_fit_the_settings():
    with pytest.raises(ValueError, match="3 distinct members"):
        Recovery(0, ["a", "a", "b"], Replication())


# --- the writer ---------------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(e=st.integers(1, 5), data_=st.data())
def test_the_writer_confirms_only_what_qa_members_have_and_rolls_without_losing_any(e, data_):
    a = data_.draw(st.integers(e // 2 + 1, e))
    first = data_.draw(st.integers(0, 100))
    members = [f"m{i}" for i in range(e)]
    w = Writer(first, members, Replication(e, e, a))
    sent: dict[str, list[int]] = {m: [] for m in members}  # offsets on their way to each member, in order
    durable: dict[str, int] = {m: first for m in members}  # what each member has (and answered)
    entries: dict[int, bytes] = {}
    lac = first
    rolled = None
    for _ in range(data_.draw(st.integers(1, 60))):
        step = data_.draw(st.sampled_from(["append", "append", "ack", "ack", "ack", "fail"]))
        if step == "append" and not w.stopped:
            entry = b"e%d" % w.next
            (act,) = w.append(entry)
            assert act == Send(tuple(members), w.next - 1, entry)
            entries[act.offset] = entry
            for m in members:
                sent[m].append(act.offset)
        elif step == "ack":
            m = data_.draw(st.sampled_from(members))
            if not sent[m]:
                continue
            offset = sent[m].pop(0)  # a member answers in order
            durable[m] = offset + 1
            for act in w.acked(m, offset):
                assert isinstance(act, Confirmed) and act.lac > lac, "the LAC only goes forward"
                assert rolled is None, "nothing is confirmed after the writer stopped"
                lac = act.lac
                holders = sum(durable[x] >= lac for x in members)
                assert holders >= a, f"confirmed {lac} while only {holders} members have it"
        elif step == "fail" and not w.stopped:
            (rolled,) = w.failed(data_.draw(st.sampled_from(members)))
    assert w.lac == lac
    if rolled is not None:
        assert isinstance(rolled, Roll) and rolled.close_at == lac
        assert list(rolled.resend) == [entries[o] for o in range(lac, w.next)], "exactly the unconfirmed, in order"
        with pytest.raises(RuntimeError):
            w.append(b"late")


def test_an_answer_for_several_entries_confirms_them_all_once_qa_members_have_them():
    w = Writer(0, ["a", "b", "c"], Replication())
    for i in range(5):
        w.append(data(i))
    assert w.acked_through("a", 3) == [], "one member is not Qa"
    assert w.acked_through("b", 2) == [Confirmed(2)]
    assert w.acked_through("b", 2) == [] and w.acked_through("b", 1) == [], "an old answer changes nothing"
    assert w.acked_through("c", 6) == [], "an answer past what was sent is ignored"
    assert w.acked_through("c", 5) == [Confirmed(3)]  # a: 3, b: 2, c: 5 → the second highest is 3
    assert w.unconfirmed == [data(3), data(4)]
