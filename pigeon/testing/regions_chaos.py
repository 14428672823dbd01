"""Faults of a deployment of regions (docs/regions.md) under load, each ending in the full history check of
pigeon.testing.chaos (no acknowledged publish lost, no acknowledged ack undone, per-key order):

  * `cut-region`: one region cut off from the others and from the global store for `outage_s` — its publishers
    go on publishing there, the other regions' messages flow on, the cut region's arrive once it is back;
  * `stop-global`: the global store stopped for `outage_s` — publishing, delivery and acks go on everywhere,
    admin calls answer UNAVAILABLE;
  * `lose-region`: the topics are copied to the east (`pigeon-copy-to`); the west is killed for good (its nodes and
    its etcd, -9) and declared lost (`pigeon cluster lose-region`): its subscriptions continue from the east's copy.
    The check holds every publish answered before the copy's lag as the east reported it just before the kill (what
    is younger may be lost: counted, not failed), and every ack but those younger than the copy's ack state then
    (they may come again: counted).

Each topic is published to from one region's node only (a key's order is kept within the region that stores it,
as Pub/Sub promises); its subscriptions are pulled and acknowledged through every node of every region in turn,
one pull each, so acks cross regions both ways (a pull through the cut region, or an ack there of the other's
messages, gets only its own region's share meanwhile). Everything is on loopback and stopped (by pid) at the end."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from pigeon.core.regions import COPY_LABEL
from pigeon.testing.chaos import Workload
from pigeon.testing.history import Checked
from pigeon.testing.regions import Deployment

P = "projects/regions-chaos"


class RegionsWorkload(Workload):
    """pigeon.testing.chaos's workload, each topic's publisher kept to the nodes of the region `homes[i]`."""

    def __init__(self, dep: Deployment, rng: random.Random, topics: list[str], homes: list[str], rate: float,
                 labels: dict[str, str] | None = None):
        super().__init__(SimpleNamespace(nodes=dep.nodes), rng, topics, rate)
        self.labels = labels or {}  # (the topics are made with them: a copy region is fixed when a topic is made)
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
    copy_lag_s: float = 0.0  # lose-region: the copy's lag as reported just before the kill …
    acks_age_s: float = 0.0  # … and the age of its ack state
    at_risk: int = 0  # publishes of the lost region answered within that lag (not held by the check) …
    at_risk_lost: int = 0  # … and how many of them were lost
    acks_again: int = 0  # acknowledged messages delivered again within the ack state's age (allowed)


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
        losing = scenario == "lose-region"
        w = RegionsWorkload(dep, rng, topics, homes, rate, {COPY_LABEL: "east"} if losing else None)
        if losing:
            from google.api_core import retry

            w.pull_retry = retry.Retry(deadline=5)  # (a pull through a region gone is given up, not retried on)
        w.setup()
        w.start()
        time.sleep(warm_s)
        t0 = time.monotonic()
        lost = None
        if losing:
            lost = _lose_west(dep, topics[1], w, say)
            refused = lost.pop("admin")
        elif scenario == "cut-region":
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
        during = {t: sum(1 for i, sent, done, _ in w.h.publish_times if i == k and t0 <= sent and done <= t1)
                  for k, t in enumerate(topics)}
        with w.h.lock:
            delivered = {t: sum(1 for s, when in w.h.first_seen.get(t.replace("/topics/", "/subscriptions/")
                                                                   + "-plain", {}).items() if t0 <= when <= t1)
                         for t in topics}
        if scenario == "cut-region":
            dep.heal()
        elif scenario == "stop-global":
            dep.etcds["global"].start()
        say(f"at {t1 - w.h.start:.1f} s: {'healed' if not losing else 'done'}; publishes acknowledged meanwhile "
            f"{during}, delivered meanwhile {delivered}; an admin call during it answered {refused}")
        risky = set() if lost is None else _set_aside(w, lost)
        w.finish(drain_s)
        checked = Checked.of(w)
        extra = {} if lost is None else _judged_loss(w, checked, lost, risky)
        return RegionsReport(**vars(checked), scenario=scenario, seed=seed, during=during,
                             delivered_during=delivered, admin_refused=refused, **extra)
    finally:
        dep.stop()


def _copy_figures(node, topic: str) -> tuple[float, float]:
    """(the copy's lag, the age of its ack state) of `topic`'s west shards, as `node` reports them."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"{node.http}/metrics", timeout=30) as r:
        text = r.read().decode()

    def one(name):
        m = re.search(rf'^{name}{{region="west",topic="{re.escape(topic)}"}} (\S+)$', text, re.M)
        return float(m.group(1)) if m else float("inf")

    return one("pigeon_region_copy_lag_seconds"), one("pigeon_region_copy_acks_age_seconds")


def _lose_west(dep: Deployment, topic: str, w: RegionsWorkload, say) -> dict:
    """Kill the west for good and declare it lost; what the east's copy reported just before."""
    import subprocess
    import sys

    lag_s, acks_s = _copy_figures(dep.node("east"), topic)
    at = time.monotonic()
    for node_id, n in dep.nodes.items():
        if dep.region_of[node_id] == "west":
            n.kill()
    dep.etcds["west"].kill()
    gone = {n.address for node_id, n in dep.nodes.items() if dep.region_of[node_id] == "west"}
    for clients in w.clients[len(w.topics):]:  # the consumers reach the east only from now on (the client
        clients[:] = [c for c in clients if c[0] not in gone]  # library retries a dead address for a minute)
    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "lose-region", "west", "--global-etcd",
                          dep.etcds["global"].endpoint], capture_output=True, text=True, timeout=60)
    say(f"at {at - w.h.start:.1f} s: the west killed for good (the east's copy {lag_s:.2f} s behind, its ack state "
        f"{acks_s:.2f} s old) and declared lost: {out.stdout.strip() or out.stderr.strip()}")
    return {"at": at, "lag_s": lag_s, "acks_s": acks_s, "admin": "OK" if out.returncode == 0 else out.stderr}


_WEST = 1  # (the west's topic: the second)


def _set_aside(w: RegionsWorkload, lost: dict) -> set[str]:
    """The publishes of the west's topic the copy's lag did not promise (answered after `at - lag_s`): out of the
    history the check holds (and the drain waits for)."""
    h, safe_until = w.h, lost["at"] - lost["lag_s"]
    with h.lock:
        risky = {m for m, d in h.published.items() if d.startswith(f"{_WEST}:") and h.answered[m] > safe_until}
        for m in risky:
            del h.published[m]
    return risky


def _judged_loss(w: RegionsWorkload, checked: Checked, lost: dict, risky: set[str]) -> dict:
    """The history check again, holding what the copy's figures promised: every publish of the west's topic answered
    before `at - lag_s` (`_set_aside`), and every ack of it returned before `at - acks_s`. What is younger is
    counted."""
    h, west = w.h, _WEST
    acks_until = lost["at"] - lost["acks_s"]
    seen = {mid for subs in (s for s, i in w.subs.items() if i == west) for mid, _ in h.deliveries.get(subs, [])}
    again = 0
    for sub, topic in w.subs.items():
        if topic != west:
            continue
        acked = h.acked.get(sub, {})
        for mid, sent in h.deliveries.get(sub, []):
            if mid in acked and sent > acked[mid] and acked[mid] > acks_until:
                again += 1
                del acked[mid]  # (the copy's ack state did not have it yet: it may come again)
    held = Checked.of(w)
    checked.lost, checked.undone, checked.disorder = held.lost, held.undone, held.disorder
    return {"copy_lag_s": lost["lag_s"], "acks_age_s": lost["acks_s"], "at_risk": len(risky),
            "at_risk_lost": len(risky - seen), "acks_again": again}


SCENARIOS = ("cut-region", "stop-global", "lose-region")
