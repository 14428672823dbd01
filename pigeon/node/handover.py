"""A (topic, shard) pair handed from one bundle log to another, performed (docs/cluster.md, "Scale-out" 4.3; the
records' rules are broker.log_state's). Owns the steps and their order on a cluster node:

  1. the old home's owner lends B's ledgers to the pair (`lend`), commits `ShardOut(P, L, gen, image)` to its
     log B — built and committed with no await between, so the image is the pair's state at that point of B —
     and waits until B holds it (Qa members);
  2. it asks the new home L's owner to commit `ShardIn` (`accept`, over the storage service's peer call), which
     commits it only while L does not hold that hand-over's ShardIn already, and answers once L holds it;
  3. it commits `ShardHome(P, L, gen)` to the metadata log: every node routes P's calls to L from then on — and
     ends the topic's streams it holds, which go on through every shard's owner instead (api.merge).

Steps 2–3 are `finish`: retried until done, and redone by whoever owns B next (`resume`, after a takeover) from
the ShardOut it reads back — the image rides in the record. Until step 3 reaches a node, P's calls go to B's
owner, which refuses them (UNAVAILABLE: the client retries) — a pause, never a loss (invariant H1)."""

from __future__ import annotations

import asyncio
import logging

from pigeon.broker import images
from pigeon.core import limits
from pigeon.core.errors import FailedPrecondition, InvalidArgument, NotFound, PigeonError, Unavailable
from pigeon.node.ledger_upkeep import lend, unlend
from pigeon.node.log_reads import Unnamed
from pigeon.storage import formats
from pigeon.storage import records as R

log = logging.getLogger("pigeon.handover")


class HandOvers:
    def __init__(self, cluster):
        self.cluster = cluster  # node.cluster_node.ClusterNode
        self.engine = cluster.engine
        self._finishing: dict[tuple[int, int, int], asyncio.Task] = {}  # (topic, shard, gen) → its steps 2–3
        self._asked: dict[tuple[int, int], asyncio.Task] = {}  # (topic, shard) → a hand-over `homes` asked for
        self.done = 0  # hand-overs this node finished (steps 2–3), for the metrics

    def _serves(self, log_id: int) -> bool:
        """Whether this node serves `log_id` now: taken over, a ledger open (not the engine's `owns`, which says
        yes to every log until the node has joined: a node restarted under its old address would take a pair
        into a log it does not own, in its own journal alone)."""
        return self.cluster.logs.serving(log_id)

    # --- the old home's side ---------------------------------------------------------------------------------
    async def hand_over(self, topic: str, shard: int, to_log: int) -> int:
        """Hand shard `shard` of `topic` from its log (this node's) to bundle log `to_log`; answers once every
        node routes it there. The hand-over's number."""
        engine = self.engine
        engine.check_open()
        bundles = engine.config.bundles
        t = engine.state.topics.get(topic)
        if t is None:
            raise NotFound(f"Topic not found: {topic}")
        if not 0 <= shard < len(t.shards):
            raise InvalidArgument(f"The topic {topic} has {len(t.shards)} shards; there is no shard {shard}.")
        if not 1 <= to_log <= bundles:
            raise InvalidArgument(f"There is no bundle log {to_log}: the cluster's logs are 1..{bundles}.")
        if shard in t.away:
            raise Unavailable(f"Shard {shard} of {topic} is being handed over already; retry.")
        if (speaks := await self.cluster.logs.speaks()) < formats.CLUSTER_HANDOVER:
            raise FailedPrecondition(f"A node of the cluster speaks cluster format {speaks}: shards are handed "
                                     f"over from format {formats.CLUSTER_HANDOVER} on (upgrade every node first).")
        src = engine.state.shard_logs(t, bundles)[shard]
        if src == to_log:
            raise FailedPrecondition(f"Shard {shard} of {topic} is in log {to_log} already.")
        if not self._serves(src):
            raise Unavailable(f"Shard {shard} of {topic} is not this node's (its log {src} is another's); retry "
                              "at its owner.")
        uid = t.uid
        await lend(self.cluster.logs, src, uid, shard)  # B keeps the ledgers the pair names (S1 across logs)
        try:
            out = self._shard_out(topic, uid, shard, src, to_log)
        finally:  # (committed, the pair is away from B: its key is kept for it from then on, the mark not needed)
            unlend(self.cluster.logs, src, uid, shard)
        await engine.durable(log_id=src)
        log.info("shard %d of %s leaves log %d for log %d (hand-over %d, %d bytes of state)", shard, topic, src,
                 to_log, out.gen, len(out.images))
        await self.finish(out)
        return out.gen

    def _shard_out(self, topic: str, uid: int, shard: int, src: int, to_log: int) -> R.ShardOut:
        """Step 1's commit: the pair's image and its ShardOut, with no await between (the image is the pair's
        state where the record lands in the log)."""
        engine = self.engine
        engine.check_open()
        t = engine.state.topics.get(topic)
        ol = self.cluster.logs.logs.get(src)
        if t is None or t.uid != uid or shard in t.away or engine.state.shard_logs(t, engine.config.bundles)[shard] \
                != src or ol is None or not self._serves(src):
            raise Unavailable(f"Shard {shard} of {topic} changed meanwhile; retry.")
        try:
            image = images.pair_images(engine.state, t, shard,
                                       lambda pos: self.cluster.logs.reads.log_addresses(ol, pos))
        except Unnamed as e:
            raise Unavailable(f"Shard {shard} of {topic} cannot be handed over yet ({e}); retry.") from None
        out = R.ShardOut(uid, shard, src, to_log, t.gens.get(shard, 0) + 1, engine.clock.now(), image)
        engine.commit(out)
        return out

    def follow(self, wanted: dict[str, dict[int, int]]) -> None:
        """Start the hand-overs the `homes` key asks of this node: each pair named there whose log is this node's
        and not the bundle's it should be in (`pigeon cluster move-shard`, or the planner). One at a time a pair;
        one that failed is tried again at the next pass."""
        engine, bundles = self.engine, self.engine.config.bundles
        if self.cluster.logs.cluster_format < formats.CLUSTER_HANDOVER:  # (as last read: `hand_over` reads it anew)
            return
        for name, shards in wanted.items():
            t = engine.state.topics.get(name)
            if t is None or t.deleted:
                continue
            logs = engine.state.shard_logs(t, bundles)
            for shard, bundle in shards.items():
                key = (t.uid, shard)
                if not 0 <= shard < len(t.shards) or not 0 <= bundle < bundles or shard in t.away \
                        or logs[shard] == bundle + 1 or not self._serves(logs[shard]) or key in self._asked:
                    continue
                task = asyncio.get_running_loop().create_task(self._asked_for(name, shard, bundle + 1),
                                                              name=f"pigeon-handover-{t.uid}.{shard}")
                self._asked[key] = task
                task.add_done_callback(lambda _, key=key: self._asked.pop(key, None))

    async def _asked_for(self, topic: str, shard: int, log_id: int) -> None:
        try:
            await self.hand_over(topic, shard, log_id)
        except PigeonError as e:
            log.info("handing shard %d of %s to log %d: %s (tried again at the next pass)", shard, topic, log_id,
                     e.message)

    def resume(self, log_id: int) -> None:
        """A takeover of `log_id` read back a ShardOut whose pair no node homes yet: finish it (steps 2–3)."""
        for t in self.engine.state.topics_by_uid.values():
            for out in list(t.away.values()):
                if out.log == log_id:
                    self._start(out)

    def _start(self, out: R.ShardOut) -> asyncio.Task:
        key = (out.topic, out.shard, out.gen)
        task = self._finishing.get(key)
        if task is None or task.done():
            task = self._finishing[key] = asyncio.get_running_loop().create_task(
                self.finish(out), name=f"pigeon-handover-{out.topic}.{out.shard}")
            task.add_done_callback(lambda _: self._finishing.pop(key, None))
        return task

    async def finish(self, out: R.ShardOut) -> None:
        """Steps 2–3 of the hand-over `out` began, retried until every node routes the pair to its new home — or
        until this node no longer owns the old home (its next owner finishes) or the pair is not pending."""
        engine = self.engine
        while True:
            t = engine.state.topics_by_uid.get(out.topic)
            pending = None if t is None else t.away.get(out.shard)
            if pending is None or pending.gen != out.gen or not self._serves(out.log):
                return  # (homed meanwhile, through the metadata log; or B is another node's now)
            try:
                await self._shard_in(out)
                await engine.change(R.ShardHome(out.topic, out.shard, out.to, out.gen, engine.clock.now()))
                engine.shard_moved(t)
                self.done += 1
                log.info("shard %d of %s is homed in log %d (hand-over %d)", out.shard, t.name, out.to, out.gen)
                return
            except asyncio.CancelledError:
                raise
            except (PigeonError, OSError) as e:
                log.info("handing shard %d of topic %d to log %d: %s; trying again", out.shard, out.topic, out.to,
                         getattr(e, "message", e))
            except Exception as e:  # noqa: BLE001 — a peer's gRPC error: its owner is moving, or down
                log.info("handing shard %d of topic %d to log %d: %s; trying again", out.shard, out.topic, out.to,
                         e)
            await asyncio.sleep(limits.handover_retry_s)

    async def _shard_in(self, out: R.ShardOut) -> None:
        if self._serves(out.to):
            await self.accept(out)
            return
        address = self.cluster.address_of(out.to)
        if address is None or address == self.cluster.info.dial:
            raise Unavailable(f"Log {out.to} has no owner now.")
        await self.cluster.logs.client(address).shard_in(b"".join(out.parts()))

    # --- the new home's side ---------------------------------------------------------------------------------
    async def accept(self, out: R.ShardOut) -> None:
        """Commit the pair's ShardIn to `out.to` (this node's) — unless the state homes the pair there at this
        hand-over, or a later one, already: a ShardIn committed twice would load the image over the records the
        pair has had here since — and answer once the log holds it."""
        engine = self.engine
        engine.check_open()
        if not self._serves(out.to):
            raise Unavailable(f"Log {out.to} is not this node's; retry.")
        t = engine.state.topics_by_uid.get(out.topic)
        if t is None:
            return
        # in the log already — as this node committed it (a call that may still wait for it: this answer waits
        # too) or read it back — or superseded by a later hand-over. The log's content decides, not the pair's
        # home in the state: a ShardIn applied here that never became durable (the log was lost before) homed
        # the pair all the same (a reset of the log undoes that homing unless the log is known to hold the
        # ShardIn: broker.log_state._unland, confirm_landings)
        if engine.state.log_eras.get(out.to, {}).get((out.topic, out.shard), 0) >= out.gen \
                or t.gens.get(out.shard, 0) > out.gen:
            await engine.durable(log_id=out.to)
            engine.state.confirm_landings(out.to, (out.topic, out.shard, out.gen))
            return
        engine.commit(R.ShardIn(out.topic, out.shard, out.to, out.log, out.gen, engine.clock.now(), out.images))
        await engine.durable(log_id=out.to)  # (the log's quorum holds the ShardIn: no reset of the log undoes it)
        engine.state.confirm_landings(out.to, (out.topic, out.shard, out.gen))
        log.info("shard %d of %s comes into log %d from log %d (hand-over %d)", out.shard, t.name, out.to, out.log,
                 out.gen)

    async def close(self) -> None:
        tasks = list(self._finishing.values()) + list(self._asked.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
