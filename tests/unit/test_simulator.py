"""The deterministic simulator (pigeon.testing.simulator): a few hundred seeds in every test run (`make sim
SEEDS=N` runs many more), and proof that its checks bite — each broken on purpose, a seed finds it."""

from __future__ import annotations

import pytest

from pigeon.broker import subscription
from pigeon.node import recovery
from pigeon.storage.journal import Journal
from pigeon.testing.simulator import SimFailure, Simulator, run_seeds

SEEDS = 300


def test_seeds_run_clean(capsys):
    failed = run_seeds(0, SEEDS, 150)
    out = capsys.readouterr().out
    assert failed == 0, out


def test_a_replay_reaches_the_same_state_as_the_first_run():
    a, b = Simulator(7, 120).run(), Simulator(7, 120).run()
    assert a.log == b.log and a.sj.journal.tail == b.sj.journal.tail


def _first_failure(seeds=range(200), steps=150, about: str = "") -> str:
    """The first failure of these seeds (that mentions `about`)."""
    for seed in seeds:
        try:
            Simulator(seed, steps).run()
        except SimFailure as e:
            if about in str(e):
                return str(e)
    pytest.fail(f"no seed noticed the bug{' (' + about + ')' if about else ''}")


def test_it_notices_an_ack_that_does_not_survive_recovery(monkeypatch):
    real = recovery.BrokerTarget.apply

    def forget_acks(self, rtype, body, at):
        if rtype != 2:  # ACK
            real(self, rtype, body, at)

    monkeypatch.setattr(recovery.BrokerTarget, "apply", forget_acks)
    found = _first_failure()
    assert "differs from a replay" in found or "undone" in found, found


def test_it_notices_a_delivery_out_of_key_order(monkeypatch):
    real = subscription.SubscriptionState._key_settled

    def never_wait(self, key, ks):  # a key's next batch may go out while one is outstanding
        ks.live.clear()
        real(self, key, ks)

    monkeypatch.setattr(subscription.SubscriptionState, "_key_settled", never_wait)
    assert _first_failure(about="ordering key")


def test_it_notices_a_lease_that_never_comes_back(monkeypatch):
    monkeypatch.setattr(subscription.SubscriptionState, "expire", lambda self, now: 0)
    assert _first_failure(about="never delivered again")


def test_it_notices_an_ack_of_a_delivery_before_a_seek_acking_after_it(monkeypatch):
    from pigeon.core import ackid

    def any_generation(sub_uid, ack_id, generation=0):  # the ack path ignores the seek generation of its ids
        uid, num, version = ack_id.split(".")
        return (int(num), int(version) & 0xFFFFFFFF) if int(uid) == sub_uid else None
    monkeypatch.setattr(ackid, "parse", any_generation)
    monkeypatch.setattr(ackid, "parse_many", lambda sub_uid, ack_ids, generation=0: None)
    monkeypatch.setattr("pigeon.core.hot.ack_numbers", lambda sub_uid, ack_ids, generation=0: None)
    assert _first_failure(about="handed out before its seek")


def test_it_notices_the_leases_of_a_dropped_stream_never_coming_back(monkeypatch):
    """The first defect of the core issue, put back: closing a stream rewrote its leases in a shape expiry
    could not read."""
    def old_disown(self, owner, nums):
        for num in nums:
            lease = self.leases.get(num)
            if lease is not None and lease[2] is owner:
                self.leases[num] = (lease[0], lease[1], None)

    monkeypatch.setattr(subscription.SubscriptionState, "disown", old_disown)
    assert _first_failure(about="IndexError")


def test_it_notices_a_recovery_that_applies_past_an_unappliable_record(monkeypatch):
    """The second defect, put back: recovery treated a record it could not apply as if it were not there."""
    real = recovery.BrokerTarget.apply

    def swallow(self, rtype, body, at):
        try:
            real(self, rtype, body, at)
        except Exception:  # noqa: BLE001 — the bug under test
            pass

    monkeypatch.setattr(recovery.BrokerTarget, "apply", swallow)
    assert _first_failure(about="applied past a record that cannot be applied")


def test_it_notices_messages_stuck_for_a_dead_letter_topic_that_is_gone(monkeypatch):
    """Dead-lettering to a deleted topic as it once was: taken out for forwarding, the forward fails, the
    lease runs out, taken out again — never delivered."""
    monkeypatch.setattr(subscription.SubscriptionState, "dead_letter_open",
                        property(lambda self: True, lambda self, value: None), raising=False)
    assert _first_failure(about="never delivered again")


def test_seeds_meet_a_full_disk():
    """The full-disk fault is not vacuous: publishes are refused at the reserve and commits meet ENOSPC."""
    runs = [Simulator(seed, 150).run() for seed in range(400)]  # (a commit meets ENOSPC in about 1 seed of 70)
    assert sum(s.refused for s in runs) > 0 and sum(s.enospc for s in runs) > 0


def test_it_notices_a_full_disk_dropping_what_it_could_not_write(monkeypatch):
    """A writer that, after ENOSPC, cuts the files back but forgets the entries it had taken: they were never
    durable, yet the next commit reports them so."""
    monkeypatch.setattr(Journal, "requeue", lambda self, batches: None)
    found = _first_failure()
    # (the loss shows as a message or an ack gone, or as the journal's hole where the entries were: a bad length)
    assert any(w in found for w in ("lost", "below what was durable", "differs from a replay", "bad length")), found
