"""Three of `make chaos`'s fault scenarios on every test run (the others, and more seeds, run as `make chaos`): a
storage member killed with SIGKILL while the owner writes; an owner paused with SIGSTOP past its session
(another node takes its bundles over and fences it; once resumed, its late writes are refused); an owner cut off
from its peers and etcd by the network while clients still reach it (it takes publishes it cannot replicate; the
others take its bundles over). Each ends in the full history check: no acknowledged publish lost, no acknowledged
ack undone, per-key order kept."""

from __future__ import annotations

import pytest

from pigeon.testing.chaos import run

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("scenario", ["kill-replica", "pause-owner", "cut-owner"])
def test_a_fault_under_load_loses_nothing_acknowledged(scenario, tmp_path):
    rep = run(scenario, 1, str(tmp_path), warm_s=3.0, outage_s=8.0, after_s=4.0, drain_s=60.0)
    print(f"{scenario}: {rep.published} publishes acknowledged, {rep.delivered} deliveries, publishes answered "
          f"again {rep.recovery_s} s after the fault")
    assert rep.published > 500 and rep.delivered >= 2 * rep.published, "the load did not run"
    assert not rep.lost, f"{len(rep.lost)} acknowledged publishes lost: {rep.lost[:5]}"
    assert not rep.undone, f"{len(rep.undone)} acknowledged acks undone: {rep.undone[:5]}"
    assert not rep.disorder, f"{len(rep.disorder)} out of order: {rep.disorder[:5]}"
    assert not rep.unreplicated, rep.unreplicated[:5]
