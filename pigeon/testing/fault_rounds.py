"""Rounds of random faults against a real cluster (`make chaos` runs them after the single-fault scenarios of
pigeon.testing.chaos): three nodes over an etcd cluster of three members, two publishers (the official client,
ordering keys) publishing through different nodes, StreamingPull subscribers acknowledging through a node other
than their stream's, probes publishing to four more topics through whichever nodes are up — and every `round_s`
one fault chosen at random:

  * kill-node: kill -9 of a node, started again on its data 12–15 s later;
  * pause-node: SIGSTOP of a node for 15 s (past its session: its bundles move), then SIGCONT;
  * kill-etcd-member: kill -9 of one etcd member, started again 10 s later;
  * stop-etcd: every etcd member killed for 30 s, then started again on its data;
  * add-node / kill-added: a node joins under load; a later round kills it for good (its ledgers are repaired).

At the end, the history check of pigeon.testing.chaos over every subscription (no acknowledged publish lost, no
acknowledged ack undone, per-key order on the ordered ones), and for each node killed, the time from the kill to
the first publish answered through a survivor, for every probe topic (their maximum is the round's figure).

A stream's deliveries carry the moment they reached the client less `STREAM_TRANSIT_S`: an acknowledged message
that arrives later than that after its Acknowledge returned was chosen by the server after it applied the ack —
an ack undone. (A reader thread takes every response as it comes, so a response does not wait behind acks.)"""

from __future__ import annotations

import itertools
import os
import queue
import random
import signal
import threading
import time
from dataclasses import dataclass, field

from pigeon.testing.chaos import Cluster, Workload
from pigeon.testing.history import Checked, lease_of
from pigeon.testing.cluster import made_for

P = "projects/rounds"
ROUND_S = 20.0
PROBES = 4
STREAM_TRANSIT_S = 1.0  # far more than a response takes from the server to the reader on loopback
STREAM_IDLE_S = 30.0  # a stream that brought nothing for this long is opened again on the next node (a stream to
#                       a paused node waits, as the official clients' do, as long as the node is paused)
ACK_S = 5.0


@dataclass
class Round:
    number: int
    kind: str
    target: str
    at: float  # when the fault began (monotonic)
    kill_to_publish: float | None = None  # for a kill: the slowest probe topic's first publish after it


@dataclass
class RoundsReport(Checked):
    seed: int = 0
    rounds: list[Round] = field(default_factory=list)
    probe_failed: int = 0

    @property
    def slowest_kill_to_publish(self) -> float | None:
        times = [r.kill_to_publish for r in self.rounds if r.kill_to_publish is not None]
        return max(times) if times else None


class StreamWorkload(Workload):
    """chaos.Workload's publishers; its consumers are StreamingPull streams instead of pulls: each opens a stream
    on one node and acknowledges every response with a unary Acknowledge through another."""

    def _consume(self, sub_name: str, clients) -> None:
        from google.pubsub_v1 import StreamingPullRequest

        h = self.h
        with h.lock:
            h.deliveries[sub_name], h.first_seen[sub_name], h.acked[sub_name] = [], {}, {}
        ackers = itertools.cycle(range(len(clients)))
        acker = next(ackers)
        for c in itertools.count():
            if self.stop_consuming.is_set():
                return
            sub = clients[c % len(clients)][2]
            if acker == c % len(clients) and len(clients) > 1:
                acker = next(ackers)
            ended = threading.Event()

            def requests():
                yield StreamingPullRequest(subscription=sub_name, stream_ack_deadline_seconds=10,
                                           max_outstanding_messages=200, client_id=f"rounds-{sub_name}")
                while not ended.wait(0.2) and not self.stop_consuming.is_set():
                    pass

            got: queue.Queue = queue.Queue()
            try:
                stream = sub.streaming_pull(requests=requests(), timeout=60)
            except Exception:  # noqa: BLE001 — the node is gone: the next one
                time.sleep(0.2)
                continue
            reader = threading.Thread(target=_read_stream, args=(stream, got), daemon=True)
            reader.start()
            try:
                while not self.stop_consuming.is_set():
                    try:
                        item = got.get(timeout=STREAM_IDLE_S)
                    except queue.Empty:
                        break  # nothing for a while: a paused node, or nothing to deliver — the next node
                    if item is None or isinstance(item[1], Exception):
                        break
                    arrived, resp = item
                    if not resp.received_messages:
                        continue
                    with h.lock:
                        for m in resp.received_messages:
                            mid, data = m.message.message_id, m.message.data.decode()
                            h.deliveries[sub_name].append((mid, arrived - STREAM_TRANSIT_S))
                            h.versions[(sub_name, mid, arrived - STREAM_TRANSIT_S)] = lease_of(m.ack_id)
                            h.data_of[mid] = data
                            h.first_seen[sub_name].setdefault(data, arrived)
                    ids = [m.ack_id for m in resp.received_messages]
                    try:
                        clients[acker][2].acknowledge(subscription=sub_name, ack_ids=ids, timeout=ACK_S,
                                                          retry=None)
                    except Exception:  # noqa: BLE001 — not acknowledged: they come back after their deadline
                        with h.lock:
                            h.ack_failed += 1
                        acker = next(ackers)
                        continue
                    done = time.monotonic()
                    with h.lock:
                        for m in resp.received_messages:
                            h.acked[sub_name].setdefault(m.message.message_id, done)
                            acked = h.acked_versions.setdefault(sub_name, {})
                            acked[m.message.message_id] = max(acked.get(m.message.message_id, -1),
                                                              lease_of(m.ack_id))
            finally:
                ended.set()
                stream.cancel()
                reader.join(timeout=10)
            time.sleep(0.1)


def _read_stream(stream, out: queue.Queue) -> None:
    try:
        for resp in stream:
            out.put((time.monotonic(), resp))
    except Exception as e:  # noqa: BLE001 — the stream ended (node gone, bundle moved, cancelled)
        out.put((time.monotonic(), e))
    out.put(None)


class Probes:
    """One thread per probe topic: a publish of one message every 0.1 s through a node that is up (a fresh
    choice each time), without the client's retries, answered or failed within 2 s — (sent, answered) of each
    publish that succeeded."""

    def __init__(self, cluster: Cluster, rng: random.Random, up: set[str], lock: threading.Lock):
        self.cluster, self.rng, self.up, self.lock = cluster, rng, up, lock
        self.topics = [f"{P}/topics/probe{i}-{rng.randrange(1 << 30)}" for i in range(PROBES)]
        self.ok: dict[str, list[tuple[float, float]]] = {t: [] for t in self.topics}
        self.failed = 0
        self.stop = threading.Event()
        self._clients: dict[str, object] = {}
        self._threads: list[threading.Thread] = []

    def _client(self, node: str):
        from google.cloud import pubsub_v1

        with self.lock:
            c = self._clients.get(node)
            if c is None:
                c = self._clients[node] = made_for(self.cluster.nodes[node].address, pubsub_v1.PublisherClient)
            return c

    def start(self) -> None:
        pub = self._client(sorted(self.up)[0])
        for t in self.topics:
            pub.create_topic(name=t)
        for t in self.topics:
            th = threading.Thread(target=self._probe, args=(t, random.Random(self.rng.random())), daemon=True)
            th.start()
            self._threads.append(th)

    def _probe(self, topic: str, rng: random.Random) -> None:
        from google.pubsub_v1 import PubsubMessage

        i = 0
        while not self.stop.is_set():
            with self.lock:
                nodes = sorted(self.up)
            if nodes:
                pub = self._client(rng.choice(nodes))
                sent = time.monotonic()
                try:
                    pub.api.publish(topic=topic, messages=[PubsubMessage(data=f"probe {i}".encode())], timeout=2.0,
                                    retry=None)
                    self.ok[topic].append((sent, time.monotonic()))
                except Exception:  # noqa: BLE001 — refused or timed out: counted, and tried again
                    self.failed += 1
                i += 1
            time.sleep(0.1)

    def first_after(self, t: float) -> float | None:
        """The slowest probe topic's time from `t` to its first publish sent after `t` and answered."""
        worst = 0.0
        for answered in self.ok.values():
            first = next((done for sent, done in answered if sent >= t), None)
            if first is None:
                return None
            worst = max(worst, first - t)
        return worst

    def close(self) -> None:
        self.stop.set()
        for th in self._threads:
            th.join(timeout=10)


class Faults:
    """The fault of each round; `up`: the nodes clients may use now (not killed, not paused)."""

    def __init__(self, cluster: Cluster, rng: random.Random, up: set[str], lock: threading.Lock, say):
        self.cluster, self.rng, self.up, self.lock, self.say = cluster, rng, up, lock, say
        self.added: list[str] = []  # nodes added by a round, alive
        self.next_id = len(cluster.nodes) + 1

    def choose(self) -> str:
        kinds = ["kill-node"] * 3 + ["pause-node"] * 2 + ["kill-etcd-member", "stop-etcd"]
        kinds.append("kill-added" if self.added else "add-node")
        return self.rng.choice(kinds)

    def _pick(self) -> str:
        with self.lock:
            return self.rng.choice(sorted(n for n in self.up if n not in self.added))

    def _down(self, name: str) -> None:
        with self.lock:
            self.up.discard(name)

    def _back(self, name: str) -> None:
        with self.lock:
            self.up.add(name)

    def kill_node(self) -> str:
        name = self._pick()
        outage = self.rng.uniform(12.0, 15.0)
        self.say(f"kill -9 {name}; started again in {outage:.0f} s")
        self._down(name)
        self.cluster.nodes[name].kill()
        time.sleep(outage)
        self.cluster.nodes[name].start(timeout=120)
        self._back(name)
        return name

    def pause_node(self) -> str:
        name = self._pick()
        self.say(f"SIGSTOP {name} for 15 s")
        self._down(name)
        proc = self.cluster.nodes[name].proc
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(15.0)
        os.kill(proc.pid, signal.SIGCONT)
        self._back(name)
        return name

    def kill_etcd_member(self) -> str:
        m = self.rng.choice(self.cluster.etcd.members)
        self.say(f"kill -9 etcd member {m.name}; started again in 10 s")
        m.kill()
        time.sleep(10.0)
        m.start()
        return m.name

    def stop_etcd(self) -> str:
        self.say("kill -9 every etcd member; started again in 30 s")
        self.cluster.etcd.kill()
        time.sleep(30.0)
        self.cluster.etcd.start()
        return "etcd"

    def add_node(self) -> str:
        name = f"n{self.next_id}"
        self.next_id += 1
        self.say(f"add {name}")
        self.cluster.add(name)
        self.added.append(name)
        self._back(name)
        return name

    def kill_added(self) -> str:
        name = self.added.pop()
        self.say(f"kill -9 {name} (added earlier) for good")
        self._down(name)
        self.cluster.nodes[name].kill()
        return name


def run(seed: int, root: str, rounds: int, *, round_s: float = ROUND_S, warm_s: float = 5.0,
        drain_s: float = 120.0, say=print, layout: str = "together") -> RoundsReport:
    """`rounds` random faults under one seed; the cluster lives under `root` and is stopped at the end. `layout`:
    the nodes' --topic-layout (spread: each topic over every node, each stream a merge of every owner's)."""
    rng = random.Random(seed)
    cluster = Cluster(root, etcd_members=3, extra=["--topic-layout", layout]).start()
    lock = threading.Lock()
    up = set(cluster.nodes)
    done: list[Round] = []
    probes = None
    try:
        topics = [f"{P}/topics/s{seed}-t{i}-{rng.randrange(1 << 30)}" for i in range(2)]
        w = StreamWorkload(cluster, rng, topics, rate=150.0)
        w.setup()
        w.start()
        probes = Probes(cluster, rng, up, lock)
        probes.start()
        time.sleep(warm_s)
        faults = Faults(cluster, rng, up, lock, say)
        for i in range(rounds):
            kind = faults.choose()
            t0 = time.monotonic()
            say(f"round {i + 1}/{rounds} at {t0 - w.h.start:.0f} s: {kind}")
            target = getattr(faults, kind.replace("-", "_"))()
            done.append(Round(i + 1, kind, target, t0))
            time.sleep(max(0.0, t0 + round_s - time.monotonic()))
        w.finish(drain_s)
        probes.close()
        for r in done:
            if r.kind in ("kill-node", "kill-added"):
                r.kill_to_publish = probes.first_after(r.at)
        return RoundsReport(**vars(Checked.of(w)), seed=seed, rounds=done, probe_failed=probes.failed)
    finally:
        if probes is not None:
            probes.stop.set()
        cluster.stop()
