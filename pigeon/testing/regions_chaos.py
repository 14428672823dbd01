"""Faults of a deployment of regions (docs/regions.md) under load, each ending in the full history check of
pigeon.testing.chaos (no acknowledged publish lost, no acknowledged ack undone, per-key order):

  * `cut-region`: one region cut off from the others and from the global store for `outage_s` — its publishers
    go on publishing there, the other regions' messages flow on, the cut region's arrive once it is back;
  * `stop-global`: the global store stopped for `outage_s` — publishing, delivery and acks go on everywhere,
    admin calls answer UNAVAILABLE.

Each topic is published to from one region's node only (a key's order is kept within the region that stores it,
as Pub/Sub promises); its subscriptions are pulled and acknowledged through every node of every region in turn,
one pull each, so acks cross regions both ways (a pull through the cut region, or an ack there of the other's
messages, gets only its own region's share meanwhile). Everything is on loopback and stopped (by pid) at the end."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from pigeon.testing.chaos import Checked, Workload
from pigeon.testing.regions import Deployment

P = "projects/regions-chaos"


class RegionsWorkload(Workload):
    """pigeon.testing.chaos's workload, each topic's publisher kept to the nodes of the region `homes[i]`."""

    def __init__(self, dep: Deployment, rng: random.Random, topics: list[str], homes: list[str], rate: float):
        super().__init__(SimpleNamespace(nodes=dep.nodes), rng, topics, rate)
        self.each_pull_elsewhere = True  # (each subscription read through every region in turn)
        for i, home in enumerate(homes):
            at = {n.address for node_id, n in dep.nodes.items() if dep.region_of[node_id] == home}
            self.clients[i] = [c for c in self.clients[i] if c[0] in at]


@dataclass
class RegionsReport(Checked):
    scenario: str = ""
    seed: int = 0
    during: dict[str, int] = field(default_factory=dict)  # topic → publishes acknowledged during the fault
    delivered_during: dict[str, int] = field(default_factory=dict)  # topic → its first deliveries during the fault
    admin_refused: str = ""  # what an admin call answered during the fault


def _admin_call(dep: Deployment, region: str) -> str:
    """What creating a topic through `region`'s node answers now (its code's name, or OK)."""
    from google.api_core import exceptions
    from pigeon.testing.cluster import clients_of

    pub, _ = clients_of(dep.node(region))
    try:
        pub.create_topic(request={"name": f"{P}/topics/admin-{time.monotonic_ns()}"}, timeout=15, retry=None)
        return "OK"
    except exceptions.GoogleAPICallError as e:
        return e.grpc_status_code.name if e.grpc_status_code else type(e).__name__


def run(scenario: str, seed: int, root: str, *, outage_s: float = 60.0, warm_s: float = 4.0,
        drain_s: float = 120.0, rate: float = 100.0, say=print) -> RegionsReport:
    rng = random.Random(seed)
    regions = ("east", "west")
    dep = Deployment(root, regions=regions).start()
    try:
        homes = list(regions)
        topics = [f"{P}/topics/s{seed}-{home}-{rng.randrange(1 << 30)}" for home in homes]
        w = RegionsWorkload(dep, rng, topics, homes, rate)
        w.setup()
        w.start()
        time.sleep(warm_s)
        t0 = time.monotonic()
        if scenario == "cut-region":
            dep.cut_off("west")
            say(f"at {t0 - w.h.start:.1f} s: the west cut off from the east and the global store for {outage_s:g} s")
            refused = _admin_call(dep, "west")
        elif scenario == "stop-global":
            dep.etcds["global"].kill()
            say(f"at {t0 - w.h.start:.1f} s: the global store stopped for {outage_s:g} s")
            refused = _admin_call(dep, "east")
        else:
            raise ValueError(f"unknown scenario {scenario!r}")
        time.sleep(max(0.0, outage_s - (time.monotonic() - t0)))
        t1 = time.monotonic()
        during = {t: sum(1 for i, sent, done in w.h.publish_times if i == k and t0 <= sent and done <= t1)
                  for k, t in enumerate(topics)}
        with w.h.lock:
            delivered = {t: sum(1 for s, when in w.h.first_seen.get(t.replace("/topics/", "/subscriptions/")
                                                                   + "-plain", {}).items() if t0 <= when <= t1)
                         for t in topics}
        if scenario == "cut-region":
            dep.heal()
        else:
            dep.etcds["global"].start()
        say(f"at {t1 - w.h.start:.1f} s: healed; publishes acknowledged meanwhile {during}, delivered meanwhile "
            f"{delivered}; an admin call during it answered {refused}")
        w.finish(drain_s)
        return RegionsReport(**vars(Checked.of(w)), scenario=scenario, seed=seed, during=during,
                             delivered_during=delivered, admin_refused=refused)
    finally:
        dep.stop()


SCENARIOS = ("cut-region", "stop-global")
