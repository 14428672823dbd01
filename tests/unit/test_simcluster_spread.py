"""The cluster simulator with spread topics (each shard a bundle, and an owner, of its own: docs/cluster.md,
"Scale-out", step 3): seeds of the real node code clean, and a rule of it broken on purpose caught."""

from __future__ import annotations


import pytest

from pigeon.node.engine import Engine
from pigeon.node.executor import append_step
from pigeon.storage import records as R
from pigeon.testing.simcluster import SimFailure, run_seed

SEEDS = 10
STEPS = 60


pytestmark = pytest.mark.usefixtures("quiet_logs")


def test_spread_seeds_run_clean():
    for seed in range(3000, 3000 + SEEDS):
        sim = run_seed(seed, STEPS, spread=True)
        assert all(t.spread for t in sim.nodes["n1"].engine.state.topics.values())


def test_it_notices_a_node_that_stops_serving_a_topic_when_it_gives_up_one_of_its_shards(monkeypatch):
    """A node that gives up one shard's log of a spread topic must go on dispatching the shards it still owns
    (a together topic has no such case: its one log is all of it). Without that, what it owns waits for ever."""
    def forget_log(self, log_id: int) -> None:  # the state cleared, its subscriptions left not dispatching
        rec = R.Reset(log_id, self.config.bundles)
        append_step(self.state, self.logs, self.epoch, self._fenced, self.config.bundles, rec)
        self.state.apply(rec)

    monkeypatch.setattr(Engine, "forget_log", forget_log)
    for seed in range(5000, 5030):
        try:
            run_seed(seed, 100, spread=True)
        except SimFailure as e:
            assert "never delivered" in str(e) or "delivered after a later message" in str(e), str(e)
            return
    pytest.fail("no seed noticed the broken rule")
