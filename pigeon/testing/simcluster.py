"""The cluster simulator: a whole cluster of the real node code — each node the real executor (node.engine), the
real cluster node (node.cluster_node: membership, placement, routing, the metadata log, the bundle logs with their
ledger writers, recovery, rolls, repair and cuts) and the real ledger store — on one event loop of virtual time
(testing.simloop), over simulated disks (testing.simdisk: a crash loses what was not synced), journals without
threads (testing.simjournal), a simulated network and metadata store (testing.simnet). One seed drives the
workload and the faults; the same seed gives the same run (with the same PYTHONHASHSEED).

The workload: clients publish with ordering keys through any node, and pull and acknowledge through any node (a
call reaching a node that does not own the bundle is forwarded to the owner its routes name, as the router does);
one topic also has a subscription whose consumer nacks every message, so that each goes, past its delivery
attempts, to a dead-letter topic — published there by the source's owner at the dead-letter topic's owner.
The faults, chosen by the seed between steps: a node crashes (its unsynced writes are lost; it starts again on its
disk later), a shard of a topic is asked into another bundle (its owner hands it over), a node is cut off from its peers and the metadata store (clients still reach it), the metadata store
goes down, links heal; nodes run with skewed clocks. At the end every fault is healed, every node started, and the
clients drain the subscriptions. Checked:

  * no acknowledged publish lost (delivered on every subscription by the end, and on the dead-letter topic's);
  * no acknowledged ack undone (a pull sent after an ack returned OK never returns that message again);
  * per-key order on the ordered subscriptions (first deliveries come in publish order);
  * every bundle has an owner again, and no closed ledger stays short of members that are up;
  * no log rolls in a storm (many ledgers opened within one step);
  * at the end, every idle log's ledger list cut short and every journal rid of what no log keeps, once a
    diligent subscriber took what was left (the checks: testing.simcluster_checks).

A failure raises SimFailure naming the seed; `python -m pigeon.testing.simcluster_main --seed N` replays it (with the
PYTHONHASHSEED it prints), `--seeds N` runs many (`make sim-cluster SEEDS=N`)."""

from __future__ import annotations

import asyncio
import gc
import random
import traceback

import crc32c
from google.pubsub_v1 import types

from pigeon.cluster import metadata as M
from pigeon.cluster.placement import decode_homes, encode_homes
from pigeon.core import limits
from pigeon.core.bundles import shard_log
from pigeon.core.errors import PigeonError, Unavailable
from pigeon.node.meta_local import LocalMetadata
from pigeon.testing import simloop
from pigeon.testing.simcluster_checks import History, RollWatch, lists_short
from pigeon.testing.simnet import SimNet
from pigeon.testing.simnode import BUNDLES, LOG_SNAPSHOT_S, NODE, SHARDS, SimNode, _Refused

P = "projects/simc"
KEYS = ["k1", "k2", "k3"]
CALL_S = 5.0  # a client's deadline for one call
FAULT_RATE = 0.2  # the share of steps that begin with a fault
MOVE_RATE = 0.15  # the share of faults that are a shard asked into another bundle
DRAIN_PULL, DRAIN_PAUSE_S = 100, 0.2  # a drain's pulls ask for this many; it pauses between rounds that bring some …
DRAIN_PAUSE_MAX_S = 3.2  # … doubling up to this while they bring none (waiting out leases and backoff)
SETTLE_PAUSE_S, SETTLE_PAUSE_MAX_S = 1.0, 8.0  # the same, while waiting for the journals to drop what no log keeps
SETTLE_LOOK_S = 0.5  # … a pause ending once they have (on the nodes' timers, not at a pull), looked at this often
_PublishRequest, _PubsubMessage = types.PublishRequest.pb(), types.PubsubMessage.pb()
_PullResponse = types.PullResponse.pb()
_Task, _node_get = asyncio.Task, NODE.get



class SimFailure(AssertionError):
    pass


class ClusterSim:
    def __init__(self, seed: int, nodes: int = 3, steps: int = 60, snapshot_entries: int = 40, spread: bool = False):
        self.seed, self.steps, self.snapshot_entries = seed, steps, snapshot_entries
        self.spread = spread  # topics laid out spread: each shard a bundle (and an owner) of its own
        self.rng = random.Random(seed)
        self.net = SimNet(self.rng)
        self.meta: LocalMetadata | None = None
        self.nodes = {f"n{i + 1}": SimNode(self, f"n{i + 1}", self.rng.uniform(-0.5, 0.5)) for i in range(nodes)}
        self.h = History()
        self.trace: tuple[int, float] | None = None  # set at the end of `run`
        self.topics = [f"{P}/topics/topic{i}" for i in range(2)]
        self.subs = {t.replace("/topics/", "/subscriptions/") + s: i for i, t in enumerate(self.topics)
                     for s in ("-plain", "-ordered")}
        self.dead_topic, self.dead_sub = f"{P}/topics/dead", f"{P}/subscriptions/dead"
        self.poison = {self.topics[0].replace("/topics/", "/subscriptions/") + "-poison": 0}
        self._seq = {k: 0 for k in KEYS}
        self._publishing: dict[tuple[int, str], asyncio.Lock] = {}
        self.faults: list[str] = []
        self.rolls = RollWatch()

    def sync_s(self) -> float:
        return self.rng.uniform(0.0002, 0.003)

    def fail(self, why: str) -> None:
        raise SimFailure(f"seed {self.seed}: {why}\n  faults: {'; '.join(self.faults[-12:])}")

    # --- the task registry ---------------------------------------------------------------------------------
    def _task_factory(self, loop, coro, context=None):
        task = _Task(coro, loop=loop, context=context)
        life = _node_get() if context is None else context.get(NODE)  # (the task runs in a copy of the current)
        if life is not None:
            if life.dead:
                task.cancel()
            else:  # (life.add(task), without its frame while no pruning is due)
                tasks = life.tasks
                tasks[task] = None
                if len(tasks) >= life.prune_at:
                    life.prune()
        return task

    # --- clients -----------------------------------------------------------------------------------------
    def _entry(self) -> SimNode:
        up = [n for n in self.nodes.values() if n.up and n.ready]
        return self.rng.choice(up or list(self.nodes.values()))

    async def _routed(self, log_id: int, fn, via: "SimNode | None" = None):
        """A client's call through a random node: served there if it owns the log, else forwarded once to the
        owner its routes name (as api.router does)."""
        entry = via or self._entry()
        self.h.calls += 1

        async def at(node: SimNode):
            if node.engine.owns(log_id):
                return await fn(node)
            address = node.cluster.address_of(log_id)
            owner = self.net.by_address.get(address) if address else None
            if owner is None or owner == node.id:
                raise _Refused("no owner")
            target = self.nodes[owner]
            if not self.net.reachable(node.id, owner):
                await asyncio.sleep(CALL_S)
                raise _Refused("forward timed out")
            return await target.call(lambda: _owned(target))

        async def _owned(node: SimNode):
            if not node.engine.owns(log_id):
                raise _Refused("moved")
            return await fn(node)

        async with simloop.deadline(CALL_S):  # (a client's deadline; no task of its own, as wait_for would make)
            return await entry.call(lambda: at(entry))

    def log_for(self, topic: str, key: str = "", shard: int = 0) -> int:
        """The log a call about `topic` goes to: its bundle's; spread, or a shard handed to another log (the load
        planner splits hot bundles), its key's shard's (or `shard`'s) — as a node's metadata says it now."""
        if key:
            shard = crc32c.crc32c(key.encode()) % SHARDS
        view = self._view()
        t = view.topics.get(topic)
        return shard_log(topic, shard, BUNDLES, self.spread) if t is None else view.shard_logs(t, BUNDLES)[shard]

    def _view(self):
        """The broker state of the first node up: its metadata log names each shard's log (nodes agree, once it
        has reached them; a call routed by an older view is refused and tried again, as a client's is)."""
        for n in self.nodes.values():  # (a loop, not next() over a generator: every client call asks)
            if n.up:
                return n.engine.state
        return next(iter(self.nodes.values())).engine.state

    def _spread(self, topic: str) -> bool:
        t = self._view().topics.get(topic)
        return self.spread or (t is not None and t.spread)

    async def _pull_and_ack(self, sub: str, topic: str, max_messages: int, settle, shard: int | None = None):
        """A Pull through a random node — spread, from one shard's owner (`shard`'s, else a random one's), which
        serves the shards it owns — and `settle(node, ack ids)` of what came, each ack id sent to its shard's owner
        (as api.spread splits them). (response, whether every settle call went through)"""
        if shard is None:
            shard = self.rng.randrange(SHARDS) if self._spread(topic) else 0
        rms = await self._routed(self.log_for(topic, shard=shard),
                                 lambda node: node.engine.delivery.pull(sub, max_messages, True))
        got = _PullResponse.FromString(b"".join(rms)).received_messages
        self.h.received += len(got)
        return got, lambda ms: self._by_shard(topic, ms, settle)

    async def _by_shard(self, topic: str, got, settle) -> None:
        groups: dict[int, list[str]] = {}
        for m in got:
            groups.setdefault(self.log_for(topic, shard=int(m.ack_id.split(".")[1]) & 63), []).append(m.ack_id)
        for log_id, ids in groups.items():
            await self._routed(log_id, lambda node, ids=ids: settle(node, ids))

    async def publish_at_owner(self, node: SimNode, topic: str, request: bytes) -> None:
        """A node's own publish (a dead letter) to a topic another node owns, forwarded as api.router does."""
        from pigeon.broker import commands

        log_id = self.log_for(topic, _PublishRequest.FromString(request).messages[0].ordering_key)
        address = node.cluster.address_of(log_id)
        owner = self.net.by_address.get(address) if address else None
        if owner is None or owner == node.id:
            raise Unavailable("no owner")
        if not self.net.reachable(node.id, owner):
            await asyncio.sleep(CALL_S)
            raise Unavailable("forward timed out")
        target, cmd = self.nodes[owner], commands.check_publish(request)

        async def owned():
            if not target.engine.owns(log_id):
                raise Unavailable("moved")
            await target.engine.publish(cmd.topic, cmd.request, cmd.count, cmd.ordering_key)
        try:
            await target.call(owned)
        except _Refused as e:
            raise Unavailable(str(e)) from None

    async def nack_all(self, sub: str) -> None:
        """The poison subscription's consumer: every message it gets it gives back at once."""
        try:
            got, settle = await self._pull_and_ack(sub, self.topics[self.poison[sub]], 100, lambda node, ids: (
                node.engine.delivery.modify_ack_deadline(sub, ids, 0)))
            if got:
                await settle(got)
        except (PigeonError, _Refused, asyncio.TimeoutError):
            return

    async def consume_dead(self) -> None:
        try:
            got, settle = await self._pull_and_ack(self.dead_sub, self.dead_topic, 100, lambda node, ids: (
                node.engine.delivery.acknowledge(self.dead_sub, ids)))
            self.h.dead.update(m.message.data.decode() for m in got)
            if got:
                await settle(got)
        except (PigeonError, _Refused, asyncio.TimeoutError):
            return

    async def publish(self, t: int, via: SimNode | None = None) -> None:
        """One publish of 1–3 messages with an ordering key; a key's publishes go one at a time, as an ordered
        publisher's do (per-key order is promised for publishes made in order)."""
        topic = self.topics[t]
        key = self.rng.choice(KEYS)
        async with self._publishing.setdefault((t, key), asyncio.Lock()):
            await self._publish(t, topic, key, via)

    async def _publish(self, t: int, topic: str, key: str, via: SimNode | None) -> None:
        n = self.rng.randint(1, 3)
        datas = []
        for _ in range(n):
            self._seq[key] += 1
            d = f"{t}:{key}:{self._seq[key]}"
            datas.append(d)
            self.h.keys[d], self.h.seq[d] = key, self._seq[key]
        raw = _PublishRequest(topic=topic, messages=[_PubsubMessage(data=d.encode(), ordering_key=key)
                                                     for d in datas]).SerializeToString()
        from pigeon.broker import commands

        cmd = commands.check_publish(raw)
        try:
            ids = await self._routed(self.log_for(topic, key), lambda node: node.engine.publish(
                cmd.topic, cmd.request, cmd.count, cmd.ordering_key, cmd.idempotency_keys, cmd.activations), via)
        except (PigeonError, _Refused, asyncio.TimeoutError):
            self.h.publish_failed += 1
            return
        for mid, d in zip(ids, datas):
            self.h.published[mid] = (t, d)

    def _shard_owners(self, topic: str) -> list[int]:
        """A shard of each log that holds shards of `topic` (a Pull to each reaches every shard)."""
        view = self._view()
        t = view.topics.get(topic)
        if t is None or not self._spread(topic):
            return [0]
        firsts: dict[int, int] = {}
        for shard, log_id in enumerate(view.shard_logs(t, BUNDLES)):
            firsts.setdefault(log_id, shard)
        return list(firsts.values())

    async def consume(self, sub: str, most: int = 20, shard: int | None = None, diligent: bool = False) -> None:
        """A subscriber's Pull and ack; it dies before acking now and then, unless `diligent`."""
        t = self.subs[sub]
        sent = asyncio.get_running_loop().time()
        try:
            got, settle = await self._pull_and_ack(sub, self.topics[t], most, lambda node, ids: (
                node.engine.delivery.acknowledge(sub, ids)), shard)
        except (PigeonError, _Refused, asyncio.TimeoutError):
            return
        h = self.h
        acked = h.acked.setdefault(sub, {})
        for m in got:
            mid = m.message.message_id
            stored = h.published.get(mid)
            if stored is not None and stored[1] != m.message.data.decode():
                self.fail(f"{sub}: message {mid} reads {m.message.data.decode()!r}, published as {stored[1]!r}")
            if mid in acked and acked[mid] < sent:
                self.fail(f"{sub}: {m.message.data.decode()} (id {mid}) delivered by a pull sent "
                          f"{sent - acked[mid]:.3f} s after its ack returned OK")
            h.delivered.setdefault(sub, set()).add(mid)
            if sub.endswith("-ordered"):
                d, firsts = m.message.data.decode(), h.firsts.setdefault(sub, set())
                if d not in firsts:
                    firsts.add(d)
                    h.first.setdefault(sub, []).append(d)
        if not got or (not diligent and self.rng.random() < 0.1):  # sometimes the consumer dies before acking
            return
        try:
            await settle(got)
        except (PigeonError, _Refused, asyncio.TimeoutError):
            return
        now = asyncio.get_running_loop().time()
        for m in got:
            acked.setdefault(m.message.message_id, now)

    # --- faults ------------------------------------------------------------------------------------------
    async def fault(self) -> None:
        r = self.rng.random()
        if r < MOVE_RATE:
            await self.move_shard()
            return
        r = (r - MOVE_RATE) / (1 - MOVE_RATE)
        up = [n for n in self.nodes.values() if n.up]
        down = [n for n in self.nodes.values() if not n.up]
        now = asyncio.get_running_loop().time()
        if r < 0.3 and len(up) > 1:
            n = self.rng.choice(up)
            self.faults.append(f"{now:.1f} crash {n.id}")
            n.crash()
        elif r < 0.55 and down:
            n = self.rng.choice(down)
            self.faults.append(f"{now:.1f} start {n.id}")
            n.start()
        elif r < 0.7 and not self.net.cut and not self.net.meta_cut and up:
            n = self.rng.choice(up)
            how = self.rng.random()
            if how < 0.4:  # from everything: its session ends, it cannot replicate
                self.faults.append(f"{now:.1f} cut {n.id} off")
                self.net.isolate(n.id)
            elif how < 0.7:  # from its peers only: it keeps its session (and steps down)
                self.faults.append(f"{now:.1f} cut {n.id} off its peers")
                self.net.isolate(n.id, from_meta=False)
            else:  # from the metadata store only: its session ends while it still reaches the members
                self.faults.append(f"{now:.1f} cut {n.id} off the metadata store")
                self.net.meta_cut.add(n.id)
        elif r < 0.85 and (self.net.cut or self.net.meta_cut):
            self.faults.append(f"{now:.1f} heal")
            self.net.heal()
        elif r < 0.93 and not self.net.meta_down:
            self.faults.append(f"{now:.1f} metadata store down")
            self.set_meta_down(True)
        elif self.net.meta_down:
            self.faults.append(f"{now:.1f} metadata store back")
            self.set_meta_down(False)

    async def move_shard(self) -> None:
        """An operator's `pigeon cluster move-shard`: a shard of a topic asked into another bundle (`homes`), which
        its owner hands it over to — again and again as the seed goes, on, or back."""
        if self.net.meta_down:
            return
        topic = self.rng.choice(self.topics + [self.dead_topic])
        shard, bundle = self.rng.randrange(SHARDS), self.rng.randrange(BUNDLES)
        now = asyncio.get_running_loop().time()
        self.faults.append(f"{now:.1f} move shard {shard} of {topic.rsplit('/', 1)[-1]} to bundle {bundle}")
        held = await self.meta.get(M.HOMES_KEY)
        homes = decode_homes(held.value if held else None)
        homes.setdefault(topic, {})[shard] = bundle
        await self.meta.put(M.HOMES_KEY, encode_homes(homes))

    def set_meta_down(self, down: bool) -> None:
        self.net.meta_down = down
        self.meta.hold(down)

    # --- the run -----------------------------------------------------------------------------------------
    async def start_cluster(self) -> None:
        """The metadata store and every node, until each has joined."""
        loop = asyncio.get_running_loop()
        loop.set_task_factory(self._task_factory)
        self.meta = LocalMetadata(clock=loop.time)
        for n in self.nodes.values():
            n.start()
        await self.until(lambda: all(n.ready for n in self.nodes.values()), 30, "the nodes to join")

    async def start_workload(self) -> None:
        """The cluster, its topics and subscriptions, every bundle owned."""
        await self.start_cluster()
        first = self.nodes["n1"]
        for t in self.topics + [self.dead_topic]:
            await first.call(lambda t=t: first.engine.create_topic(types.Topic.pb()(name=t)))
            if first.engine.state.topic(t).spread != self.spread:  # (every node has joined; the clients route by it)
                self.fail(f"{t} was laid out {'together' if self.spread else 'spread'}, not as the seed's layout says")
        Sub = types.Subscription.pb()
        subs = [Sub(name=s, topic=self.topics[t], ack_deadline_seconds=10, enable_message_ordering=s.endswith("-ordered"))
                for s, t in self.subs.items()]
        subs.append(Sub(name=self.dead_sub, topic=self.dead_topic, ack_deadline_seconds=10))
        subs += [Sub(name=s, topic=self.topics[t], ack_deadline_seconds=10,
                     dead_letter_policy=types.DeadLetterPolicy.pb()(dead_letter_topic=self.dead_topic,
                                                                    max_delivery_attempts=5))
                 for s, t in self.poison.items()]
        for sub in subs:
            await first.call(lambda sub=sub: first.engine.create_subscription(sub))
        await self.until(self.all_owned, 30, "every bundle to have an owner")

    def owner_of(self, t: int) -> SimNode | None:
        """The node serving topic `t`'s bundle now (None between owners)."""
        log_id = self.log_for(self.topics[t])
        return next((n for n in self.nodes.values() if n.up and n.ready and n.engine.owns(log_id)), None)

    async def run(self) -> History:
        await self.start_workload()
        for _ in range(self.steps):
            r = self.rng.random()
            work = []
            if r < FAULT_RATE:
                await self.fault()
            for _ in range(self.rng.randint(1, 3)):
                work.append(self.publish(self.rng.randrange(len(self.topics))))
            work.append(self.consume(self.rng.choice(list(self.subs))))
            if self.rng.random() < 0.3:
                work.append(self.nack_all(self.rng.choice(list(self.poison))))
                work.append(self.consume_dead())
            await asyncio.gather(*work)
            await asyncio.sleep(self.rng.uniform(0.01, 0.3))
            self.watch_rolls()
        await self.heal_all()
        await self.drain()
        self.check()
        await self.until(lambda: lists_short(self.nodes.values()), 120, "every log's ledger list to be cut short (snapshots, cuts)")
        await self.settle()
        self.trace = simloop.fingerprint()
        return self.h

    async def settle(self) -> None:
        """Consume whatever comes again (a lease that ran out after a crash) until every member's journals dropped
        what no log keeps: a subscriber that pulls from every shard's owner and acks all it gets (what is asked
        of the cluster here is to reclaim space once nothing is needed; a consumer that keeps dying before it acks
        an ordered key's batches, or misses a shard round after round, only holds it back)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4 * LOG_SNAPSHOT_S + limits.stray_check_s
        pause = SETTLE_PAUSE_S
        while not self.space_reclaimed():
            if loop.time() > deadline:
                self.fail(f"waited for every member's journal to drop what no log keeps; {self._describe()}; "
                          f"segments {self._segments()}")
            received = self.h.received
            await asyncio.gather(*(self.consume(s, shard=shard, diligent=True)
                                   for s in sorted(set(self.subs) - set(self.poison) - {self.dead_sub})
                                   for shard in self._shard_owners(self.topics[self.subs[s]])),
                                 *(self.nack_all(s) for s in self.poison), self.consume_dead())
            pause = self._pause(received, pause, SETTLE_PAUSE_S, SETTLE_PAUSE_MAX_S)
            await simloop.nap(min(pause, max(deadline - loop.time(), 0.0) + 0.05), self.space_reclaimed, SETTLE_LOOK_S)

    def _pause(self, received: int, pause: float, least: float, most: float) -> float:
        """The pause before a client's next round of pulls: the least while the last round brought messages, else
        twice the last (up to `most`) — nothing comes again before a lease or a backoff runs out, and an empty
        round costs the cluster as much as a full one."""
        return least if self.h.received > received else min(2 * pause, most)

    def _segments(self) -> dict[str, tuple[int, int]]:
        return {n.id: (len(n.store.writer.journal.starts), len(n.engine.journal.journal.starts))
                for n in self.nodes.values() if n.up and n.ready}

    def space_reclaimed(self) -> bool:
        """Every storage member's ledger journal and node journal keep a few segments once nothing is left to
        read: a ledger kept pins every segment after its first entry, so even a quiet log's ledgers must move on
        and be cut (the journals are shared by every log)."""
        return all(store <= 3 and node <= 3 for store, node in self._segments().values())

    async def heal_all(self) -> None:
        self.faults.append("heal everything")
        self.net.heal()
        if self.net.meta_down:
            self.set_meta_down(False)
        for n in self.nodes.values():
            if not n.up:
                n.start()
        await self.until(lambda: all(n.ready for n in self.nodes.values()), 60, "the nodes to start again")
        await self.until(self.all_owned, 60, "every bundle to have an owner")

    async def drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        pause = DRAIN_PAUSE_S
        while loop.time() < deadline:
            missing = self.h.missing(self.subs, self.poison)
            if not missing:
                return
            subs = {s for s, _ in missing}
            received = self.h.received
            await asyncio.gather(*(self.consume(s, DRAIN_PULL) for s in subs - set(self.poison) - {self.dead_sub}),
                                 *(self.nack_all(s) for s in subs & set(self.poison)), self.consume_dead())
            pause = self._pause(received, pause, DRAIN_PAUSE_S, DRAIN_PAUSE_MAX_S)
            await asyncio.sleep(min(pause, max(deadline - loop.time(), 0.0) + 0.05))

    def watch_rolls(self) -> None:
        if (storm := self.rolls.look(self.meta.kvs)) is not None:
            self.fail(storm)

    def check(self) -> None:
        self.watch_rolls()
        missing = self.h.missing(self.subs, self.poison)
        if missing:
            sub, mid = missing[0]
            self.fail(f"{len(missing)} acknowledged publishes never delivered, e.g. {self.h.published[mid][1]} "
                      f"(id {mid}) on {sub}")
        if (why := self.h.out_of_order()) is not None:
            self.fail(why)

    def all_owned(self) -> bool:
        owned = {}
        for n in self.nodes.values():
            if n.ready:
                for b in range(BUNDLES):
                    if n.engine.owns(b + 1):
                        owned[b] = n.id
        return len(owned) == BUNDLES

    async def until(self, ok, seconds: float, what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not ok():
            if loop.time() > deadline:
                self.fail(f"waited {seconds:g} s (virtual) for {what}; {self._describe()}")
            await asyncio.sleep(0.05)

    def _describe(self) -> str:
        """Who owns what, as the store and each node see it (for a failure's message)."""
        owners = {k.rsplit("/", 1)[-1]: v.value.decode() for k, v in self.meta.kvs.items() if "/owners/" in k}
        nodes = sorted(k.rsplit("/", 1)[-1] for k in self.meta.kvs if "/nodes/" in k)
        seen = []
        for n in self.nodes.values():
            if n.up and n.cluster is not None:
                seen.append(f"{n.id}: ready {n.ready}, owned {dict(n.cluster.owned)}, serving "
                            f"{sorted(b for b in range(BUNDLES) if n.engine.owns(b + 1))}")
            else:
                seen.append(f"{n.id}: down")
        return f"owner keys {owners}; node keys {nodes}; " + "; ".join(seen)



def run_seed(seed: int, steps: int = 100, spread: bool = False) -> ClusterSim:
    """One seed, start to end (`spread`: its topics laid out spread); SimFailure when a rule broke.

    The collector is off while the seed runs, and collects what the run left once it ends: a collection in the
    middle of a run comes when the allocations of whatever ran before in the process say, and it finalizes the
    async generators caught in cycles (some streams' request generators), whose aclose the loop then schedules —
    an event of the seed's run placed by the process's history. (Off, it also costs nothing: a run makes some
    million objects, few of them cycles, and the one collection of them at the end takes some 10 ms.)"""
    sim = ClusterSim(seed, steps=steps, spread=spread)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(sim)
    finally:
        for n in sim.nodes.values():
            n.process_gone()
        gc.collect()
        if collecting:
            gc.enable()


def _run(sim: ClusterSim) -> ClusterSim:
    seed = sim.seed
    try:
        simloop.run(sim.run())
    except SimFailure:
        raise
    except simloop.Stuck as e:
        raise SimFailure(f"seed {seed}: the simulated cluster is stuck ({e})\n  faults: {'; '.join(sim.faults)}")
    except Exception as e:  # a node's code raised where nothing catches it: a bug the run found
        raise SimFailure(f"seed {seed}: {type(e).__name__}: {e}\n{traceback.format_exc()}\n  faults: "
                         f"{'; '.join(sim.faults)}") from e
    return sim
