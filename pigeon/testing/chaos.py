"""Fault scenarios against a real cluster (`make chaos`, and a few in `make test`): real etcd, real nodes on
loopback, the official Python client publishing with ordering keys and pulling + acknowledging through any
node, while one fault is injected — then a full check of the history (pigeon.testing.history):

  * **no acknowledged publish lost**: every message the publisher was told was stored reaches each subscription;
  * **no acknowledged ack undone**: once `Acknowledge` returned OK for a message, no pull *sent after that*
    delivers it again on that subscription;
  * **per-key order**: on the ordered subscription, the first deliveries of each key's messages come in the
    order they were published (a redelivery may repeat earlier ones; a later message never comes first).

A scenario is seeded: the topic names, which nodes the clients use and the fault's target follow from the
seed. Everything it starts is on loopback and is stopped (by pid) at the end."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

from pigeon.core.bundles import bundle_of
from pigeon.bench.procs import free_port
from pigeon.testing.cluster import await_status, made_for, node_process, open_ledgers, owners, wipe
from pigeon.testing.etcd import EtcdCluster, EtcdProcess
from pigeon.testing.history import BUNDLES, Checked, History, acked_while_cut, expected
from pigeon.testing.netsplit import Network

P = "projects/chaos"
KEYS = 8
SNAPSHOTS = {"PIGEON_LOG_SNAPSHOT_ENTRIES": "200"}  # owners cut their logs often: takeovers start at a snapshot
PUBLISH_WAIT_S = 5.0  # a publish not answered by then counts as failed, and the publisher tries another node


@dataclass
class Report(Checked):
    scenario: str = ""
    seed: int = 0
    recovery_s: float | None = None  # from the fault to the first of the workload's publishes acknowledged after it
    # … and to the first probe publish answered after it (Workload.probe): the workload's publisher keeps to one node
    # until a publish fails there (PUBLISH_WAIT_S), a client able to reach any node up need not
    served_s: float | None = None
    unreplicated: list[str] = field(default_factory=list)  # acknowledged while no quorum could have stored it

    @property
    def ok(self) -> bool:
        return super().ok and not self.unreplicated


class Cluster:
    """etcd and N nodes under `root`; with `split`, node-to-node and node-to-etcd connections go through a
    Network that can cut them."""

    def __init__(self, root: str, nodes: int = 3, extra: list[str] | None = None, split: bool = False,
                 etcd_members: int = 1):
        self.root, self.extra = root, extra or []
        self.etcd = EtcdProcess(os.path.join(root, "etcd")) if etcd_members == 1 else \
            EtcdCluster(os.path.join(root, "etcd"), etcd_members)
        self.nodes: dict[str, object] = {}
        self.count = nodes
        self.split = split
        self.network: Network | None = None

    def start(self) -> "Cluster":
        """Everything up and every bundle owned; what started is stopped again when that fails (etcd members
        left running by a start that failed outlived the run)."""
        try:
            self.etcd.start()
            if self.split:
                self.network = Network(self.etcd.endpoint)
            wipe(self.etcd.endpoint)
            for i in range(self.count):
                self.add(f"n{i + 1}")
            await_status(self.etcd.endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == self.count
                         and all(r["bundles"] for r in st["nodes"]), timeout=60)
        except BaseException:
            self.stop()
            raise
        return self

    def add(self, node_id: str):
        extra, appends = list(self.extra), None
        if self.network is not None:  # its append channel on a port known before it starts: the network cuts it too
            appends = f"127.0.0.1:{free_port()}"
            extra += ["--append-port", appends.rpartition(":")[2]]
        n = node_process(self.root, self.etcd.endpoint, node_id, extra=extra, env=dict(SNAPSHOTS))
        if self.network is not None:
            n.env.update(self.network.add(node_id, n.address, appends))
        self.nodes[node_id] = n.start()
        return n

    def owner_of(self, topic: str) -> str:
        return owners(self.etcd.endpoint)[bundle_of(topic, BUNDLES)]

    def owner_now(self, topic: str) -> str | None:
        """The owner of the topic's bundle, or None in the moment between one owner leaving it and the next."""
        return owners(self.etcd.endpoint).get(bundle_of(topic, BUNDLES))

    def stop(self) -> None:
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.proc.pid, signal.SIGCONT)
            n.kill()
        self.etcd.kill()
        if self.network is not None:
            self.network.close()


class Workload:
    """Publishers (one per topic, ordering keys on) and consumers (one per subscription) on threads."""

    def __init__(self, cluster: Cluster, rng: random.Random, topics: list[str], rate: float = 300.0):
        self.cluster, self.rng, self.topics, self.rate = cluster, rng, topics, rate
        self.h = History()
        self.stop_publishing = threading.Event()
        self.stop_consuming = threading.Event()
        self.subs = {t.replace("/topics/", "/subscriptions/") + suffix: i for i, t in enumerate(topics)
                     for suffix in ("-plain", "-ordered")}  # subscription → its topic's number
        self.threads: list[threading.Thread] = []
        self.clients = [self._clients() for _ in range(len(topics) + len(self.subs))]  # one set per thread
        self.each_pull_elsewhere = False  # a consumer takes the next node for every pull (not only after a failure)
        self.labels: dict[str, str] = {}  # the topics' labels
        self.pull_retry = None  # the pulls' retry (None: the client library's, which tries a dead node for a minute)
        self.probes: list[tuple[float, float]] = []  # (sent, answered) of each probe publish answered (`probe`)
        self.probers: list[threading.Thread] = []

    def _clients(self):
        """A publisher and a subscriber client of every node, in an order of the seed's (made on the main
        thread: the clients read PUBSUB_EMULATOR_HOST when made)."""
        from google.cloud import pubsub_v1

        ordered = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
        out = [(n.address, made_for(n.address, lambda: pubsub_v1.PublisherClient(publisher_options=ordered)),
                made_for(n.address, pubsub_v1.SubscriberClient)) for n in self.cluster.nodes.values()]
        self.rng.shuffle(out)
        return out

    def setup(self) -> None:
        _, pub, sub = self.clients[0][0]
        for t in self.topics:
            pub.create_topic(request={"name": t, "labels": self.labels})
            base = t.replace("/topics/", "/subscriptions/")
            sub.create_subscription(name=base + "-plain", topic=t, ack_deadline_seconds=10)
            sub.create_subscription(request={"name": base + "-ordered", "topic": t, "ack_deadline_seconds": 10,
                                             "enable_message_ordering": True})

    def start(self) -> None:
        clients = iter(self.clients)
        for i, t in enumerate(self.topics):
            self.threads.append(threading.Thread(target=self._publish, args=(i, t, next(clients)), daemon=True))
        for s in self.subs:
            self.threads.append(threading.Thread(target=self._consume, args=(s, next(clients)), daemon=True))
        for th in self.threads:
            th.start()

    def _publish(self, index: int, topic: str, clients) -> None:
        c = 0
        seq = {k: 0 for k in range(KEYS)}
        batch = max(1, int(self.rate / 10))
        while not self.stop_publishing.is_set():
            t0 = time.monotonic()
            pub = clients[c % len(clients)][1]
            futs, at = [], {}  # each publish's own answer time: the wait below ends only once all are in
            sent = time.monotonic()  # before the first leaves: sent after a fault's start is all of the batch
            for _ in range(batch):
                key = self.rng.randrange(KEYS)
                data = f"{index}:{key}:{seq[key]}"
                seq[key] += 1
                futs.append((key, data, pub.publish(topic, data.encode(), ordering_key=f"k{key}")))
                futs[-1][2].add_done_callback(lambda f, at=at: at.setdefault(id(f), time.monotonic()))
            done, _ = futures.wait([f for _, _, f in futs], timeout=PUBLISH_WAIT_S)
            answered = time.monotonic()
            failed = False
            for key, data, f in futs:
                mid = f.result() if f in done and f.exception() is None else None
                if mid is None:  # not acknowledged (yet): nothing is promised about it
                    with self.h.lock:
                        self.h.publish_failed += 1
                    with contextlib.suppress(RuntimeError):  # (not paused: it timed out rather than failed)
                        pub.resume_publish(topic, f"k{key}")  # a failed key pauses until resumed
                    failed = True
                    continue
                with self.h.lock:
                    self.h.published[mid] = data
                    self.h.answered[mid] = at.get(id(f), answered)
                    self.h.publish_times.append((index, sent, self.h.answered[mid], mid))
            if failed:
                c += 1  # try another node's client
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))

    def _consume(self, sub_name: str, clients) -> None:
        c = 0
        h = self.h
        with h.lock:
            h.deliveries[sub_name], h.first_seen[sub_name], h.acked[sub_name] = [], {}, {}
        while not self.stop_consuming.is_set():
            sub = clients[c % len(clients)][2]
            c += self.each_pull_elsewhere
            sent = time.monotonic()
            try:
                r = sub.pull(subscription=sub_name, max_messages=200, timeout=5,
                             **({"retry": self.pull_retry} if self.pull_retry is not None else {}))
            except Exception:  # noqa: BLE001 — the node is gone or the bundle moving: another node, or again
                c += not self.each_pull_elsewhere  # (another node: next turn anyway)
                time.sleep(0.2)
                continue
            got = time.monotonic()
            with h.lock:
                for m in r.received_messages:
                    mid, data = m.message.message_id, m.message.data.decode()
                    h.deliveries[sub_name].append((mid, sent))
                    h.data_of[mid] = data
                    h.first_seen[sub_name].setdefault(data, got)
            if not r.received_messages:
                continue
            try:
                sub.acknowledge(subscription=sub_name, ack_ids=[m.ack_id for m in r.received_messages])
            except Exception:  # noqa: BLE001 — not acknowledged: they come back after their deadline
                with h.lock:
                    h.ack_failed += 1
                c += not self.each_pull_elsewhere
                continue
            done = time.monotonic()
            with h.lock:
                for m in r.received_messages:
                    h.acked[sub_name].setdefault(m.message.message_id, done)

    def drained(self) -> bool:
        """Every acknowledged publish delivered on every subscription."""
        with self.h.lock:
            for s, topic in self.subs.items():
                seen = {mid for mid, _ in self.h.deliveries.get(s, [])}
                if any(mid not in seen for mid in expected(self.h, topic)):
                    return False
            return True

    def probe(self, topic: str) -> None:
        """Through each node whose process runs, a publish of one message to `topic` every 0.1 s, no client retries,
        answered or failed within 2 s ((sent, answered) of each answered: `self.probes`): how soon some node a client
        can reach serves the topic again after a fault (a node cut off, its publishes timing out, holds up only its
        own probe)."""
        from google.cloud import pubsub_v1
        from google.pubsub_v1 import PubsubMessage

        def probing(node, api) -> None:
            while not self.stop_publishing.wait(0.1):
                if _running(node):
                    sent = time.monotonic()
                    with contextlib.suppress(Exception):  # refused or timed out: tried again
                        api.publish(topic=topic, messages=[PubsubMessage(data=b"probe")], timeout=2.0, retry=None)
                        self.probes.append((sent, time.monotonic()))

        for node in list(self.cluster.nodes.values()):  # (a node added later is not probed)
            api = made_for(node.address, pubsub_v1.PublisherClient).api  # (the call without the client's batching)
            self.probers.append(threading.Thread(target=probing, args=(node, api), daemon=True))
            self.probers[-1].start()

    def finish(self, drain_s: float) -> None:
        self.stop_publishing.set()
        for th in self.threads[:len(self.topics)] + self.probers:  # the publishers end their last batch first
            th.join(timeout=2 * PUBLISH_WAIT_S + 5)
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and not self.drained():
            time.sleep(0.5)
        time.sleep(2.0)  # a last look: anything delivered again after its ack would show now
        self.stop_consuming.set()
        for th in self.threads:
            th.join(timeout=30)


def _running(node) -> bool:
    """The node's process is alive and not stopped (SIGSTOP): a client reaching it may be answered."""
    if node.proc is None or node.proc.poll() is not None:
        return False
    try:
        return open(f"/proc/{node.proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "Tt"
    except OSError:
        return False


# --- faults ------------------------------------------------------------------------------------------------
def _owner_node(cluster: Cluster, topic: str):
    return cluster.nodes[cluster.owner_of(topic)]


def kill_owner(cluster, topic, rng, say, outage_s):
    name = cluster.owner_of(topic)
    say(f"kill -9 {name}, the owner of {topic.rsplit('/', 1)[-1]}")
    cluster.nodes[name].kill()
    time.sleep(outage_s)
    say(f"start {name} again")
    cluster.nodes[name].start()


def kill_new_owner(cluster, topic, rng, say, outage_s):
    """Kill the owner, then the node that takes its bundle over the moment it claims it (its takeover under way
    or just done), then bring the first one back: the bundle moves twice, its backlog read by neither."""
    first = cluster.owner_of(topic)
    say(f"kill -9 {first}, the owner of {topic.rsplit('/', 1)[-1]}")
    cluster.nodes[first].kill()
    deadline, second = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        now = cluster.owner_now(topic)
        if now not in (None, first):
            second = now
            break
        time.sleep(0.02)
    if second is None:
        raise RuntimeError(f"nobody took {topic.rsplit('/', 1)[-1]} over from {first} in 20 s")
    say(f"kill -9 {second}, which has just claimed it; start {first} again")
    cluster.nodes[second].kill()
    cluster.nodes[first].start()
    time.sleep(outage_s)
    say(f"start {second} again")
    cluster.nodes[second].start()


def kill_replica(cluster, topic, rng, say, outage_s):
    owner = cluster.owner_of(topic)
    name = rng.choice(sorted(n for n in cluster.nodes if n != owner))
    say(f"kill -9 {name}, a storage member of {topic.rsplit('/', 1)[-1]}'s ledgers (owned by {owner})")
    cluster.nodes[name].kill()
    time.sleep(outage_s)
    say(f"start {name} again")
    cluster.nodes[name].start()


def pause_owner(cluster, topic, rng, say, outage_s):
    name = cluster.owner_of(topic)
    pid = cluster.nodes[name].proc.pid
    pause = max(outage_s, 9.0)  # past its 5 s session: another node takes its bundles over meanwhile
    say(f"SIGSTOP {name} (the owner) for {pause:.0f} s, then SIGCONT: its late writes must be refused")
    os.kill(pid, signal.SIGSTOP)
    time.sleep(pause)
    os.kill(pid, signal.SIGCONT)


def drain_owner(cluster, topic, rng, say, outage_s):
    name = cluster.owner_of(topic)
    say(f"drain {name} (the owner) under load, undrain after {outage_s:.0f} s")
    _cli("drain", name, cluster.etcd.endpoint)
    time.sleep(outage_s)
    _cli("undrain", name, cluster.etcd.endpoint)


def move_by_load(cluster, topic, rng, say, outage_s):
    """Move the topic's bundle as the load planner does (a move under `placement` in etcd, which every node lays
    over the hash), and back after a while: the bundle moves twice under load, neither time because a node went."""
    import asyncio

    from pigeon.cluster import metadata as M
    from pigeon.cluster.placement import encode_moves
    from pigeon.node.meta_etcd import EtcdMetadata

    async def put(moves):
        meta = EtcdMetadata(cluster.etcd.endpoint)
        try:
            await meta.put(M.PLACEMENT_KEY, encode_moves(moves))
        finally:
            await meta.close()

    owner, bundle = cluster.owner_of(topic), bundle_of(topic, BUNDLES)
    to = rng.choice(sorted(n for n in cluster.nodes if n != owner))
    say(f"move bundle {bundle} ({topic.rsplit('/', 1)[-1]}) from {owner} to {to} as the load planner would")
    asyncio.run(put({bundle: to}))
    time.sleep(outage_s / 2)
    say(f"and back to {owner}")
    asyncio.run(put({bundle: owner}))
    time.sleep(outage_s / 2)


def split_bundle(cluster, topic, rng, say, outage_s):
    """Split the topic's bundle as an operator splits a hot one (`pigeon cluster move-shard`): three of its four
    shards, one each, to bundles other nodes own; kill -9 the node one of them went to, start it again; then
    hand that shard back. Under load: the keys of the moved shards go on in order at their new homes."""
    by_node = owners(cluster.etcd.endpoint)
    home, first = bundle_of(topic, BUNDLES), cluster.owner_of(topic)
    others = sorted(n for n in cluster.nodes if n != first)
    moved = []
    for k in (1, 2, 3):
        node = others[(k - 1) % len(others)]
        bundle = rng.choice(sorted(b for b, n in by_node.items() if n == node))
        say(f"move shard {k} of {topic.rsplit('/', 1)[-1]} from bundle {home} ({first}) to bundle {bundle} ({node})")
        _move_shard(topic, k, bundle, cluster.etcd.endpoint)
        moved.append((k, node))
    time.sleep(outage_s / 3)
    k, node = rng.choice(moved)
    say(f"kill -9 {node}, the new owner of shard {k}")
    cluster.nodes[node].kill()
    time.sleep(outage_s / 3)
    say(f"start {node} again; move shard {k} back to bundle {home}")
    cluster.nodes[node].start()
    _move_shard(topic, k, home, cluster.etcd.endpoint)
    time.sleep(outage_s / 3)


def _move_shard(topic: str, shard: int, bundle: int, endpoint: str) -> None:
    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "move-shard", topic, "--shard", str(shard),
                          "--bundle", str(bundle), "--etcd", endpoint], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"pigeon cluster move-shard: {out.stderr.strip()}")


def add_node(cluster, topic, rng, say, outage_s):
    name = f"n{len(cluster.nodes) + 1}"
    say(f"add {name} under load")
    cluster.add(name)
    time.sleep(outage_s)


def stop_etcd(cluster, topic, rng, say, outage_s):
    say(f"stop etcd for {outage_s:.0f} s (SIGKILL, then restart on its data)")
    cluster.etcd.kill()
    time.sleep(outage_s)
    cluster.etcd.start()
    say("etcd is back")


def cut_owner(cluster, topic, rng, say, outage_s):
    name = cluster.owner_of(topic)
    cut = max(outage_s, 9.0)  # past its 5 s session: another node takes its bundles over meanwhile
    say(f"cut {name} (the owner) off from its peers and etcd for {cut:.0f} s; clients still reach it")
    cluster.network.cut(name, etcd=True)
    time.sleep(cut)
    now = cluster.owner_now(topic)
    cluster.network.heal()
    say(f"healed; {now} owned the topic at the end of the cut")
    if now == name:
        raise RuntimeError(f"the cut changed nothing: {name} still owned the topic after {cut:.0f} s")


def cut_owner_peers(cluster, topic, rng, say, outage_s):
    name = cluster.owner_of(topic)
    cut = max(outage_s, 12.0)  # past member_silence_s with writes flowing, and the step down after it
    say(f"cut {name} (the owner) off from its peers for {cut:.0f} s; it keeps its etcd session")
    cluster.network.cut(name, etcd=False)
    t_cut = time.monotonic()
    moved, held = None, {}  # each bundle it owns → the last time etcd still said so (from before that read)
    while time.monotonic() - t_cut < cut:
        t, now = time.monotonic(), owners(cluster.etcd.endpoint)
        held.update((b, t) for b, n in now.items() if n == name)
        if moved is None and now.get(bundle_of(topic, BUNDLES)) != name:  # (none: stepped down, not yet taken)
            moved = time.monotonic()
        time.sleep(0.2)
    without = sorted(log for log, members in open_ledgers(cluster.etcd.endpoint).items() if name not in members)
    cluster.network.heal()
    if moved is None:
        raise RuntimeError(f"{name} kept the topic through a {cut:.0f} s cut from its peers: it should have "
                           "stepped down")
    say(f"healed; {name} stepped down {moved - t_cut:.1f} s into the cut, {len(without)} open ledger(s) of other "
        f"logs had left it out")
    # while it owned a bundle it could reach no other member: nothing sent then to a shard there can be acknowledged
    return t_cut, held


def _cli(verb: str, node: str, endpoint: str) -> None:
    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", verb, node, "--etcd", endpoint],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"pigeon cluster {verb} {node}: {out.stderr.strip()}")


SCENARIOS = {f.__name__.replace("_", "-"): f for f in (kill_owner, kill_new_owner, kill_replica, pause_owner,
                                                        drain_owner, move_by_load, split_bundle, add_node,
                                                        stop_etcd, cut_owner, cut_owner_peers)}


def run(scenario: str, seed: int, root: str, *, warm_s: float = 4.0, outage_s: float = 10.0,
        after_s: float = 6.0, drain_s: float = 90.0, say=print, layout: str = "together") -> Report:
    """One scenario under one seed; the cluster is started under `root` and stopped at the end. `layout`: the
    nodes' --topic-layout (spread: each topic over every node; the fault strikes the owner of its first shard,
    whose bundle is the topic's)."""
    rng = random.Random(seed)
    fault = SCENARIOS[scenario]
    cluster = Cluster(root, extra=["--topic-layout", layout], split=scenario.startswith("cut-")).start()
    try:
        topics = [f"{P}/topics/s{seed}-t{i}-{rng.randrange(1 << 30)}" for i in range(2)]
        w = Workload(cluster, rng, topics)
        w.setup()
        w.start()
        w.probe(topics[0])
        time.sleep(warm_s)
        t_fault = time.monotonic()
        say(f"at {t_fault - w.h.start:.1f} s:")
        cut_off = fault(cluster, topics[0], rng, say, outage_s)  # (start, {bundle: until}): none acked in
        time.sleep(after_s)
        w.finish(drain_s)
        unreplicated = [] if cut_off is None else acked_while_cut(w.h, topics[0], cut_off, layout == "spread")
        # publishes to the faulted topic sent after the fault: how long until the first was answered
        answered = sorted(done for topic, sent, done, _ in w.h.publish_times if topic == 0 and sent >= t_fault)
        recovery = answered[0] - t_fault if answered else None
        served = min((done for sent, done in w.probes if sent >= t_fault), default=None)
        return Report(**vars(Checked.of(w)), scenario=scenario, seed=seed, recovery_s=recovery,
                      served_s=None if served is None else served - t_fault, unreplicated=unreplicated)
    finally:
        cluster.stop()

