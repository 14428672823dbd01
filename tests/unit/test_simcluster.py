"""The cluster simulator (pigeon.testing.simcluster): seeds of the real node code as a cluster under faults in every
test run (`make sim-cluster SEEDS=N` runs many more), and proof that its checks bite — a rule of the cluster broken
on purpose (no fencing, an append acknowledged on one copy, a delivery handed out before its lease is
replicated), a seed finds it."""

from __future__ import annotations

import logging

import pytest

from pigeon.cluster.quorum import Replication
from pigeon.node import engine, ledger_store, replication
from pigeon.testing.simcluster import SimFailure, run_seed

SEEDS = 40
STEPS = 60


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.CRITICAL)  # the nodes log every takeover and roll; a failure carries what it needs
    yield
    logging.disable(logging.NOTSET)


def _first_failure(seeds=range(1, 41), steps: int = 100) -> str:
    for seed in seeds:
        try:
            run_seed(seed, steps)
        except SimFailure as e:
            return str(e)
    pytest.fail("no seed noticed the broken rule")


def test_cluster_seeds_run_clean():
    for seed in range(1000, 1000 + SEEDS):
        run_seed(seed, STEPS)


def test_it_notices_a_ledger_member_that_does_not_fence(monkeypatch):
    """Without fencing, an owner that lost its session yet still reaches the members keeps having its appends
    acknowledged beside the new owner's."""
    async def no_fence(self, ledger):
        return self.held(ledger)

    monkeypatch.setattr(ledger_store.LedgerStore, "fence", no_fence)
    assert _first_failure()


def test_it_notices_an_append_acknowledged_on_one_copy(monkeypatch):
    real = replication.LedgerWriter.__init__

    def one_copy(self, ledger, epoch, members, rep):
        real(self, ledger, epoch, members, rep)
        minority = object.__new__(Replication)  # (Replication itself refuses a quorum that is not a majority)
        for k, v in (("ensemble", rep.ensemble), ("write_quorum", rep.write_quorum), ("ack_quorum", 1)):
            object.__setattr__(minority, k, v)
        self.machine.rep = minority

    monkeypatch.setattr(replication.LedgerWriter, "__init__", one_copy)
    assert _first_failure()


def test_it_notices_a_delivery_handed_out_before_its_lease_is_replicated(monkeypatch):
    async def at_once(self, log_id):
        return None

    monkeypatch.setattr(engine.Engine, "recorded", at_once)
    found = _first_failure()
    assert "after its ack returned OK" in found, found
