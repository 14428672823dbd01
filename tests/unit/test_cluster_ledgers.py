"""cluster.ledgers: a log's ledger list and the changes planned on it — ids never reused, where a cut may fall, a new
ledger's ensemble, a repair's target — as pure functions, with hypothesis drawing the lists and the nodes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.cluster.ledgers import (DeletedLedgers, LedgerInfo, NotOurs, TooFewNodes, cut_at, ledger_id,
                                    new_ensemble, next_first, next_seq, read_from, reads, recovered, repair_target,
                                    rolled)
from pigeon.cluster.quorum import Replication

REP = Replication(3, 3, 2)


def _list(lengths: list[int], open_last: bool) -> list[LedgerInfo]:
    out, first = [], 0
    for i, n in enumerate(lengths):
        end = None if open_last and i == len(lengths) - 1 else first + n
        out.append(LedgerInfo(ledger_id(1, i), 1, {"a": "a:1", "b": "b:1", "c": "c:1"}, first, end))
        first += n
    return out


@given(st.lists(st.integers(0, 5), min_size=1, max_size=8), st.booleans(), st.integers(0, 45))
def test_a_cut_keeps_the_ledger_that_holds_it_and_everything_after(lengths, open_last, at):
    ledgers = _list(lengths, open_last)
    plan = cut_at(ledgers, at)
    holds = [lg for lg in ledgers if lg.first <= at and (lg.end is None or at < lg.end)]
    if not holds:
        assert plan is None
        return
    keep, dropped = plan
    assert keep[0].id == holds[0].id and keep[0].start == at
    assert [lg.id for lg in dropped + keep] == [lg.id for lg in ledgers]
    assert all(lg.end is not None and lg.end <= at for lg in dropped)
    assert ledgers[len(dropped)].start is None  # the list it was given is not changed
    assert next_seq(keep) == next_seq(ledgers)  # ids go on after a cut, never reused


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from("abcdefg"), st.sampled_from(["", "z1", "z2"]), min_size=0, max_size=7),
       st.sets(st.sampled_from("abcdefg")), st.integers(0, 100))
def test_a_new_ensemble_takes_up_nodes_only_and_leaves_the_failed_out_while_it_can(zones, avoid, seq):
    machine_of = {n: "" for n in zones}
    try:
        chosen = new_ensemble(ledger_id(2, seq), zones, machine_of, avoid, REP, "a")
    except TooFewNodes:
        assert len(zones) < REP.ack_quorum
        return
    usable = set(zones) - avoid if len(set(zones) - avoid) >= REP.ack_quorum else set(zones)
    assert len(chosen) == min(3, len(usable)) and len(set(chosen)) == len(chosen) and set(chosen) <= usable
    assert chosen == new_ensemble(ledger_id(2, seq), zones, machine_of, avoid, REP, "a")  # every node computes it
    assert ("a" in chosen) == ("a" in usable), "the writer holds a copy of its ledger whenever it may"
    if len({zones[n] for n in usable}) >= 2:
        assert len({zones[n] for n in chosen}) >= 2, "the copies stay spread over zones"


def test_one_machine_s_workers_give_a_ledger_one_copy_its_writer_s():
    zones = {"m.w0": "", "m.w1": ""}
    machine_of = {"m.w0": "m", "m.w1": "m"}
    assert new_ensemble(ledger_id(3, 0), zones, machine_of, set(), Replication(1, 1, 1), "m.w1") == ["m.w1"]
    with pytest.raises(TooFewNodes):
        new_ensemble(ledger_id(3, 0), zones, machine_of, set(), REP, "m.w1")


def test_repair_copies_a_closed_ledger_short_of_members_to_a_node_up_on_another_machine():
    lg = LedgerInfo(ledger_id(4, 0), 1, {"a": "a:1", "b": "b:1", "dead": "d:1"}, 0, 10)
    up = {"a", "b", "c"}
    machine_of = {n: n for n in up}
    assert repair_target(lg, up, 3, machine_of, {n: "" for n in up}) == "c"
    assert repair_target(LedgerInfo(lg.id, 1, lg.members, 0, None), up, 3, machine_of, {n: "" for n in up}) is None
    assert repair_target(lg, {"a", "b"}, 2, {"a": "a", "b": "b"}, {"a": "", "b": ""}) is None  # no spare node
    full = LedgerInfo(lg.id, 1, {"a": "a:1", "b": "b:1", "c": "c:1"}, 0, 10)
    assert repair_target(full, up, 3, machine_of, {n: "" for n in up}) is None


def _list(lengths: list[int], open_last: bool) -> list[LedgerInfo]:
    out, first = [], 0
    for i, n in enumerate(lengths):
        out.append(LedgerInfo(ledger_id(1, i), 1, {"n1": "a", "n2": "b"}, first, first + n))
        first += n
    if open_last and out:
        out[-1].end = None
    return out


@given(st.lists(st.integers(0, 9), min_size=1, max_size=6), st.integers(0, 20))
def test_a_roll_closes_only_the_open_ledger_this_owner_writes(lengths, extra):
    ledgers = _list(lengths, open_last=True)
    last = ledgers[-1]
    out = rolled(ledgers, last.id, last.first + extra)
    assert out[-1].end == last.first + extra and ledgers[-1].end is None  # (the list read is not changed)
    assert next_first(out) == last.first + extra
    with pytest.raises(NotOurs):
        rolled(out, last.id, last.first + extra)  # closed already (by another node, after a takeover)
    with pytest.raises(NotOurs):
        rolled(ledgers, last.id + 1, 0)  # another ledger is the last: the list is another owner's


@given(st.lists(st.integers(0, 5), min_size=1, max_size=8), st.booleans(), st.integers(0, 45), st.integers(0, 45))
def test_a_cut_moves_reading_to_the_snapshot_and_keeps_every_ledger_of_a_message_still_needed(lengths, open_last, at,
                                                                                           need):
    ledgers = _list(lengths, open_last)
    plan = cut_at(ledgers, at, need)
    if plan is None:
        assert all(not (lg.first <= at and (lg.end is None or at < lg.end)) for lg in ledgers) or \
            ledgers[0].first > min(at, need)
        return
    keep, dropped = plan
    low = min(at, need)
    assert read_from(keep) == at and sum(lg.start is not None for lg in keep) == 1
    assert keep[0].first <= low  # every message from the oldest one needed on is in a ledger kept
    assert all(lg.end is not None and lg.end <= low for lg in dropped)
    assert [lg.id for lg in dropped + keep] == [lg.id for lg in ledgers]
    if not open_last:
        offsets = [lg.first + i for lg, first, n in reads(keep) for i in range(first, first + n)]
        assert offsets == list(range(at, keep[-1].end))  # a takeover reads from the snapshot on, not before


@given(st.lists(st.integers(0, 9), min_size=1, max_size=6), st.integers(0, 9), st.integers(0, 30))
def test_a_takeover_reads_every_entry_from_the_cut_and_starts_where_recovery_ended(lengths, held, at):
    ledgers = recovered(_list(lengths, open_last=True), held)
    assert ledgers[-1].end == ledgers[-1].first + held
    total = ledgers[-1].end
    plan = cut_at(ledgers, min(at, total))
    if plan is not None:
        ledgers = plan[0]
    start = read_from(ledgers)
    offsets = [lg.first + i for lg, first, n in reads(ledgers) for i in range(first, first + n)]
    assert offsets == list(range(start, total))  # every entry once, in order, none before the cut
    assert next_first(ledgers) == total


@settings(max_examples=200)
@given(st.dictionaries(st.integers(1, 9), st.integers(1, 3), max_size=6),
       st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["", "z1"]), max_size=6),
       st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["", "m1", "m2"])))
def test_widening_moves_exactly_the_ledgers_narrower_than_the_machines_up_allow(open_members, up, machine_of):
    from pigeon.cluster.ledgers import to_widen
    from pigeon.cluster.quorum import machines

    size, narrow = to_widen(open_members, up, machine_of, REP)
    assert size == min(REP.ensemble, machines(up, machine_of))  # workers of one machine count once
    assert narrow == sorted(log for log, n in open_members.items() if n < size)
    # once widened to that size, nothing is widened again while the same machines are up
    assert to_widen({log: max(n, size) for log, n in open_members.items()}, up, machine_of, REP)[1] == []


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), max_size=30))
def test_deleted_ledgers_hold_each_logs_highest_and_everything_before_it(deletes):
    """A ledger deleted means every earlier one of its log is gone (lists are cut by prefixes, ids never reused);
    what a store writes down reads back the same, and so does the list of every id an earlier release wrote."""
    d = DeletedLedgers()
    gone: set[int] = set()
    for log, seq in deletes:
        d.update([ledger_id(log, seq)])
        gone |= {ledger_id(log, s) for s in range(seq + 1)}
    every = [ledger_id(log, seq) for log in range(4) for seq in range(52)]
    assert [lid for lid in every if lid in d] == sorted(gone)
    assert len(d.ids()) == len({log for log, _ in deletes})
    for again in (DeletedLedgers(d.ids()), DeletedLedgers(sorted(gone))):
        assert [lid for lid in every if lid in again] == sorted(gone)
